"""`delta`: run an agent in a workspace; pause for a human; resume from disk alone."""

from __future__ import annotations

import getpass
import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from deltad import __version__, inbox, logs
from deltad.engine import EnvCheckpoints
from deltad.engine.signals import InterruptGuard
from deltad.errors import DeltaError, UsageError, UsageErrors
from deltad.pipeline.cli import pipeline as pipeline_group
from deltad.protocol import (
    Busy,
    InteractionRequest,
    ProtocolError,
    Workspace,
    exitcodes,
    iso,
    load_metadata,
    read_regular_text,
)
from deltad.protocol.exitcodes import RESUMED_BY
from deltad.protocol.fsio import MAX_MAILBOX_BYTES
from deltad.protocol.kinds import kind_of
from deltad.protocol.printable import shell_quote, show, show_path

from . import display
from .runner import RunOptions, drive

WORK_DIR = click.option(
    "--work-dir",
    "-w",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default="current directory",
    help="The workspace directory.",
)


def _fail(message: str, code: int, lines: list[str] | None = None) -> None:
    for line in lines or [message]:  # each line escaped: a file cannot add lines of its own
        click.echo(f"delta: error: {show(line)}", err=True)
    sys.exit(code)


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """User errors become one line on stderr and the documented exit code; no traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # not SystemExit (a pause's 101): it passes, importing nothing
            _fail_friendly(e)
            raise

    return wrapper


def _fail_friendly(e: Exception) -> None:
    """Exit with `e`'s line and code when it is a user error; return when it is not. The
    inbox's errors are looked up only here, so that an exit without an error (every resume's
    end) does not import the inbox's answering models for an `except` clause."""
    if isinstance(e, Busy):
        _fail(f"{e} (exit {exitcodes.BUSY}: try again when it is done)", exitcodes.BUSY)
    elif isinstance(e, UsageErrors):
        _fail(str(e), e.exit_code, e.lines)
    elif isinstance(e, DeltaError):
        _fail(str(e), e.exit_code)
    elif isinstance(e, inbox.SubmitError | ProtocolError):
        _fail(str(e), exitcodes.USAGE)
    elif isinstance(e, PermissionError):
        _fail(f"permission denied: {e.filename}", exitcodes.FAILED)
    elif isinstance(e, OSError):
        _fail(f"{e.strerror or e}: {e.filename or ''}".rstrip(": "), exitcodes.FAILED)


@click.group(
    help="Run Delta Engine agents that can pause for a human and resume from disk.",
    epilog=exitcodes.HELP,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="delta")
def main() -> None:
    logs.configure(level="warning", fmt="json")  # until a run's engine.log takes over


@main.command("run", epilog=exitcodes.HELP)
@click.option("--agent", "-a", help="Agent directory (config.yaml + system_prompt.md).")
@click.option("--task", "-t", help="The task for a new run (a pipeline's $goal).")
@click.option(
    "--pipeline",
    "-p",
    type=click.Path(dir_okay=False),
    help="Run this pipeline (a DOT graph; see docs/pipelines.md) with --agent's model and tools.",
)
@WORK_DIR
@click.option("-i", "--interactive", is_flag=True, help="Ask questions on this terminal.")
@click.option("--new", is_flag=True, help="Start a new run even if the latest can be resumed.")
@click.option("--run-id", help="Resume this run instead of the latest.")
@click.option(
    "--max-iterations",
    type=click.IntRange(min=1),
    help="Cap the run's model calls (all of a pipeline's nodes, across resumes).",
)
@click.option(
    "--max-steps",
    type=click.IntRange(min=1, max=1_000_000),
    help="Cap a pipeline run's node visits (default: the graph's max_steps, else 1000).",
)
@click.option(
    "--retry",
    is_flag=True,
    help="Resume a run the model endpoint FAILED (after fixing the key, model or endpoint).",
)
@click.option(
    "--auto-approve",
    is_flag=True,
    help="Answer every question for CI: its default, else yes, the first option, approve. "
    "Never a secret.",
)
@click.option(
    "--answers",
    "answers",
    type=click.Path(dir_okay=False),
    help="Scripted answers (YAML/JSON list); when they run out: SKIPPED.",
)
@friendly
def run_cmd(
    agent: str | None,
    task: str | None,
    pipeline: str | None,
    work_dir: Path,
    interactive: bool,
    new: bool,
    run_id: str | None,
    max_iterations: int | None,
    max_steps: int | None,
    auto_approve: bool,
    answers: str | None,
    retry: bool,
) -> None:
    """Start a run, or resume the latest one that is waiting, interrupted or crashed.

    With no --agent/--task, resumes the workspace's latest run when it is WAITING_FOR_INPUT
    (and response.txt is there), INTERRUPTED, or RUNNING with its process dead.
    """
    if sum([interactive, auto_approve, answers is not None]) > 1:
        raise UsageError("choose one of -i, --auto-approve and --answers")
    guard = InterruptGuard()
    guard.install()
    if retry and new:
        raise UsageError("--retry resumes a failed run; --new starts another: choose one")
    opts = RunOptions(
        work_dir,
        agent,
        task,
        new,
        run_id,
        interactive,
        max_iterations,
        auto_approve,
        answers,
        retry=retry,
        pipeline=pipeline,
        max_steps=max_steps,
        hooks=EnvCheckpoints.from_env(os.environ),  # DELTA_FAULT / DELTA_HOLD, for tests
        by_daemon=os.environ.get(RESUMED_BY) == "deltad",
    )
    sys.exit(drive(opts, guard, sys.stdout, sys.stderr))


@main.command("status")
@WORK_DIR
@click.option("--run-id", help="Show this run instead of the latest.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly
def status_cmd(work_dir: Path, run_id: str | None, as_json: bool) -> None:
    """Show the latest run's status and its pending question."""
    ws = Workspace.at(work_dir)
    doc = inbox.status(ws, run_id)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    _print_status(ws, doc)


def _print_status(ws: Workspace, doc: dict[str, Any]) -> None:
    """`delta status` for a person: every string from a file is shown escaped."""
    status = doc["status"]
    if doc["owner_alive"] is False:
        status += " (its process is gone: it crashed; `delta run` resumes it)"
    run, task, agent = show(doc["run_id"]), show(doc["task"]), show(doc["agent_ref"])
    click.echo(f"Run:        {run}\nStatus:     {status}\nTask:       {task}")
    click.echo(f"Agent:      {agent}\nIterations: {doc['iterations_completed']}")
    click.echo(f"Updated:    {doc['updated_at']}")
    if doc.get("pipeline"):
        node = show(doc["current_node"] or "-")
        click.echo(f"Pipeline:   {show(doc['pipeline'])}\nNode:       {node}")
    if doc["error"]:
        click.echo(f"Reason:     {show(doc['error'])}")
    if doc["pending"] is not None:
        req = InteractionRequest.model_validate(doc["pending"])
        click.echo(inbox.guidance(ws, doc["run_id"], req))
        if lines := display.question_lines(doc["pending"]):
            click.echo("\n".join(lines))
        if doc["response"]["state"] == "ready":
            click.echo("  An answer is waiting in response.txt; `delta run` will take it.")
        elif doc["response"].get("reason"):
            click.echo(f"  The answer file is not usable: {show(doc['response']['reason'])}")
        for d in doc.get("delegations") or []:
            note = f": {show(d['note'])}" if d["note"] else ""
            click.echo(f"  Handed:   by {show(d['by'])} to {show(d['to'])} at {d['at']}{note}")
        if line := display.approvals_line(doc.get("approvals")):
            click.echo(line)
        for line in display.follow_up_lines(doc.get("follow_up")):
            click.echo(line)
        if doc["answer_error"]:
            click.echo(f"  Last answer was not taken: {show(doc['answer_error'])}")
    if ended := display.outcome_lines(doc.get("outcome")):
        click.echo("\n".join(ended))
    if doc["set_aside"]:
        names = ", ".join(map(show_path, doc["set_aside"][-5:]))
        click.echo(
            f"Set aside:  {len(doc['set_aside'])} answer file(s) no open question was waiting "
            f"for, kept in .delta/interaction/ ({names})"
        )


def _answer_text(req: InteractionRequest, text: str | None, file: str | None) -> str:
    if text is not None and file is not None:
        raise UsageError("give the answer as TEXT or --file, not both")
    if file == "-":
        data = sys.stdin.read(MAX_MAILBOX_BYTES + 1)
    elif file is not None:
        data = read_regular_text(Path(file))
    elif text is not None:
        data = text
    elif sys.stdin.isatty():
        click.echo(show(req.prompt))  # from a file: no forged lines
        data = getpass.getpass("> ") if req.is_secret else input("> ")
    else:
        data = sys.stdin.read(MAX_MAILBOX_BYTES + 1)
    if len(data.encode()) > MAX_MAILBOX_BYTES:
        raise UsageError(f"the answer is over the {MAX_MAILBOX_BYTES}-byte limit")
    return data


def _decisions(
    req: InteractionRequest,
    everyone: str | None,
    decide: tuple[str, ...],
    edit: tuple[tuple[str, str], ...],
    reason: str | None,
) -> list[dict[str, Any]]:
    """Per-call decisions; calls not named take `everyone`'s decision."""
    chosen: dict[str, dict[str, Any]] = {}
    for item in decide:
        action_id, _, word = item.partition("=")
        chosen[action_id] = {"action_id": action_id, "decision": word.strip().lower()}
    for action_id, raw in edit:
        try:
            args = json.loads(raw)
        except ValueError:
            raise UsageError(f"--edit {action_id}: arguments are not valid JSON") from None
        chosen[action_id] = {"action_id": action_id, "decision": "edit", "arguments": args}
    for call in req.calls:
        if call.action_id not in chosen and everyone:
            chosen[call.action_id] = {"action_id": call.action_id, "decision": everyone}
    for d in chosen.values():
        if d["decision"] == "reject" and reason:
            d["reason"] = reason
    return list(chosen.values())


@main.command("respond")
@click.argument("text", required=False)
@click.option("--file", "file", help="Read the answer from this file ('-' for stdin).")
@click.option("--choice", help="Pick an option of a choice question by key or label.")
@click.option("--approve", "everyone", flag_value="approve", help="Approve every pending call.")
@click.option("--reject", "everyone", flag_value="reject", help="Reject every pending call.")
@click.option("--cancel", "everyone", flag_value="cancel", help="Cancel the run.")
@click.option(
    "--decide",
    multiple=True,
    metavar="ID=approve|reject|cancel",
    help="Decide one call (repeatable); others take --approve/--reject.",
)
@click.option(
    "--edit",
    nargs=2,
    multiple=True,
    metavar="ID JSON",
    help="Run this call with new arguments (repeatable).",
)
@click.option("--reason", help="Why: given to the model with a rejection.")
@click.option("--as", "answered_by", help="Who answers (recorded in the journal).")
@WORK_DIR
@click.option("--force", is_flag=True, help="Replace an answer that is already waiting.")
@click.option(
    "--all-under",
    "all_under",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Answer every question waiting in the workspaces under this directory with the same "
    "answer (all of one kind and options); a line per one not answered.",
)
@click.option("--only", metavar="GLOB", help="With --all-under: only workspaces matching GLOB.")
@click.option(
    "--inbox",
    "inbox_url",
    metavar="URL",
    envvar="DELTA_INBOX_URL",
    help="Answer through deltad's inbox at URL (its HTTP API, as the token in DELTA_INBOX_TOKEN) "
    "instead of writing the answer file: the daemon checks and signs it. A question with "
    "respondents or four eyes is answered only so. Default: $DELTA_INBOX_URL.",
)
@friendly
def respond_cmd(
    text: str | None,
    file: str | None,
    choice: str | None,
    everyone: str | None,
    decide: tuple[str, ...],
    edit: tuple[tuple[str, str], ...],
    reason: str | None,
    answered_by: str | None,
    work_dir: Path,
    force: bool,
    all_under: Path | None,
    only: str | None,
    inbox_url: str | None,
) -> None:
    """Answer the pending question.

    Text answers go to response.txt; --choice and approval decisions go to response.json.
    Both are written atomically. With no answer given, asks on the terminal (hidden for
    secrets) or reads stdin. With --all-under, answers many workspaces' questions at once.
    """
    args = (text, file, choice, everyone, decide, edit, reason, answered_by, force)
    if inbox_url and (all_under is not None or answered_by or force):
        raise UsageError("--inbox answers one question as the token's person (no --as, --force)")
    if all_under is not None:
        sys.exit(_respond_all(all_under, only, *args))
    if only is not None:
        raise UsageError("--only goes with --all-under")
    ws = Workspace.at(work_dir)
    req = inbox.open_question(ws)
    _respond_one(ws, req, *args, inbox_url=inbox_url)


def _respond_one(
    ws: Workspace,
    req: InteractionRequest,
    text: str | None,
    file: str | None,
    choice: str | None,
    everyone: str | None,
    decide: tuple[str, ...],
    edit: tuple[tuple[str, str], ...],
    reason: str | None,
    answered_by: str | None,
    force: bool,
    quiet: bool = False,
    inbox_url: str | None = None,
) -> None:
    structured = bool(everyone or decide or edit or choice or answered_by)
    per_call = kind_of(req.input_type).per_call
    if per_call and not structured and text is None and file is None:
        raise UsageError("this question needs --approve, --reject, --cancel or --decide")
    if inbox_url:
        if per_call:
            sent: dict[str, Any] = {"decisions": _decisions(req, everyone, decide, edit, reason)}
        else:
            sent = {"answer": choice if choice is not None else _answer_text(req, text, file)}
        said = through_inbox(inbox_url, ws, req, sent)
        if not quiet:
            click.echo(said)
        return
    if structured:
        if per_call:
            body = inbox.AnswerIn.parse(
                {"decisions": _decisions(req, everyone, decide, edit, reason)}
            )
        else:
            body = inbox.AnswerIn(
                answer=choice if choice is not None else _answer_text(req, text, file)
            )
        inbox.submit(ws, req.request_id, body, answered_by=answered_by, channel="cli", force=force)
    else:
        inbox.submit(ws, req.request_id, _answer_text(req, text, file), force=force)
    if quiet:
        return
    if req.is_secret and (text is not None or choice is not None):
        click.echo(
            "delta: note: a secret given on the command line can stay in shell history and was "
            "visible in the process list; next time run `delta respond` with no answer (hidden "
            "prompt) or `--file -`.",
            err=True,
        )
    click.echo(
        f"Answer saved for run {show(req.run_id)}. Continue with: delta run --work-dir "
        f"{shell_quote(str(ws.root))} (deltad picks it up by itself)."
    )


def through_inbox(url: str, ws: Workspace, req: InteractionRequest, body: dict[str, Any]) -> str:
    """POST the answer to the inbox's API as the token in DELTA_INBOX_TOKEN (never argv); what
    it did, in one line, or a UsageError with the inbox's own code and detail."""
    import httpx

    token = os.environ.get("DELTA_INBOX_TOKEN", "")
    if not token:
        raise UsageError("--inbox needs the token in DELTA_INBOX_TOKEN (never on the command line)")
    where = f"{url.rstrip('/')}/v1/requests/{req.request_id}/answer"
    try:
        r = httpx.post(
            where,
            params={"workspace": str(ws.root)},
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
    except httpx.HTTPError as e:
        raise UsageError(f"the inbox at {url} cannot be reached: {e}") from None
    try:
        doc = r.json()
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    if r.status_code != 202:
        code = doc.get("code") or doc.get("title") or r.reason_phrase
        raise UsageError(
            f"the inbox refused the answer ({r.status_code} {code}): {doc.get('detail', '')}"
        )
    if doc.get("answered") is False and isinstance(doc.get("approvals"), dict):
        votes = doc["approvals"]
        return (
            f"Vote counted for run {show(req.run_id)}: {len(votes.get('given', []))} of "
            f"{votes.get('required')} approvals; the question waits for the others."
        )
    return f"Answer taken by the inbox for run {show(req.run_id)}; deltad resumes it by itself."


def _respond_all(
    root: Path,
    only: str | None,
    text: str | None,
    file: str | None,
    choice: str | None,
    everyone: str | None,
    decide: tuple[str, ...],
    edit: tuple[tuple[str, str], ...],
    reason: str | None,
    answered_by: str | None,
    force: bool,
) -> int:
    """`--all-under`: one answer for each question waiting under `root`, each through
    `submit` as if answered alone; those of another kind or options than the first, or that
    refuse the answer, get a line each. Exit 0 when every one was answered, else 1."""
    if text is None and file is not None:
        text, file = _answer_text_once(file), None  # read once, not once per workspace
    if decide or edit:  # they name one question's calls
        raise UsageError("--all-under takes --approve, --reject or --cancel, not --decide/--edit")
    first: str | None = None
    answered, failed = 0, 0
    for path in inbox.waiting_under(root, only):
        try:
            ws = Workspace.at(path)
            req = inbox.open_question(ws)
            mine = inbox.shape(req)
            first = first or mine
            if mine != first:
                raise UsageError("another kind of question, or other options, than the first")
            if req.is_secret:
                raise UsageError("a sensitive question is answered one at a time")
            given = text is not None or choice is not None
            if not given and not kind_of(req.input_type).per_call:
                raise UsageError("give the answer as TEXT, --file or --choice")
            _respond_one(
                ws, req, text, file, choice, everyone, (), (), reason, answered_by, force, True
            )
            answered += 1
        except (inbox.SubmitError, DeltaError, ProtocolError, OSError) as e:
            failed += 1
            click.echo(f"delta: not answered: {show_path(path)}: {show(str(e))}", err=True)
    click.echo(f"Answered {answered} question(s); {failed} not answered.")
    return exitcodes.FAILED if failed or not answered else exitcodes.COMPLETED


def _answer_text_once(file: str) -> str:
    data = sys.stdin.read(MAX_MAILBOX_BYTES + 1) if file == "-" else read_regular_text(Path(file))
    if len(data.encode()) > MAX_MAILBOX_BYTES:
        raise UsageError(f"the answer is over the {MAX_MAILBOX_BYTES}-byte limit")
    return data


@main.command("runs")
@WORK_DIR
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly
def runs_cmd(work_dir: Path, as_json: bool) -> None:
    """List the runs in the workspace, oldest first."""
    ws = Workspace.at(work_dir)
    rows = []
    for rid in ws.run_ids():
        try:
            meta = load_metadata(ws.run(rid).metadata)
            rows.append(
                {
                    "run_id": rid,
                    "status": str(meta.status),
                    "start_time": iso(meta.start_time),
                    "task": meta.task,
                    "iterations_completed": meta.iterations_completed,
                }
            )
        except (FileNotFoundError, ProtocolError) as e:
            rows.append({"run_id": rid, "status": "UNREADABLE", "error": str(e)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no runs in {show_path(ws.root)}")
    latest = ws.latest_run_id() if rows else None
    for r in rows:
        mark = "*" if r["run_id"] == latest else " "
        task = show(str(r.get("task") or r.get("error", ""))[:60])
        click.echo(f"{mark} {show(str(r['run_id']))}  {r['status']:<17} {task}")


main.add_command(pipeline_group)
