"""`delta`: run an agent in a workspace; pause for a human; resume from disk alone."""

from __future__ import annotations

import getpass
import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from deltad import __version__, logs
from deltad.pipeline.cli import pipeline as pipeline_group
from deltad.protocol import (
    Busy,
    EventType,
    InputType,
    InteractionRequest,
    Mailbox,
    ProtocolError,
    RunMetadata,
    RunStatus,
    Workspace,
    iso,
    load_metadata,
    owner_alive,
    read_journal,
    read_regular_text,
)
from deltad.protocol.fsio import MAX_MAILBOX_BYTES
from deltad.protocol.questions import AnswerRejected, interpret_json, interpret_text

from . import exitcodes
from .agent import load_agent
from .errors import DeltaError, UsageError
from .runner import RunOptions, drive, guidance
from .signals import InterruptGuard

WORK_DIR = click.option(
    "--work-dir",
    "-w",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default="current directory",
    help="The workspace directory.",
)


def _fail(message: str, code: int) -> None:
    click.echo(f"delta: error: {message}", err=True)
    sys.exit(code)


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """User errors become one line on stderr and the documented exit code; no traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Busy as e:
            _fail(f"{e} (exit {exitcodes.BUSY}: try again when it is done)", exitcodes.BUSY)
        except DeltaError as e:
            _fail(str(e), e.exit_code)
        except ProtocolError as e:
            _fail(str(e), exitcodes.USAGE)
        except PermissionError as e:
            _fail(f"permission denied: {e.filename}", exitcodes.FAILED)
        except OSError as e:
            _fail(f"{e.strerror or e}: {e.filename or ''}".rstrip(": "), exitcodes.FAILED)

    return wrapper


@click.group(
    help="Run Delta Engine agents that can pause for a human and resume from disk.",
    epilog=exitcodes.HELP,
)
@click.version_option(__version__, prog_name="delta")
def main() -> None:
    logs.configure(level="warning", fmt="json")  # until a run's engine.log takes over


@main.command("run", epilog=exitcodes.HELP)
@click.option("--agent", "-a", help="Agent directory (config.yaml + system_prompt.md).")
@click.option("--task", "-t", help="The task for a new run.")
@WORK_DIR
@click.option("-i", "--interactive", is_flag=True, help="Ask questions on this terminal.")
@click.option("--new", is_flag=True, help="Start a new run even if the latest can be resumed.")
@click.option("--run-id", help="Resume this run instead of the latest.")
@click.option("--max-iterations", type=click.IntRange(min=1), help="Cap the run's iterations.")
@click.option(
    "--retry",
    is_flag=True,
    help="Resume a run the model endpoint FAILED (after fixing the key, model or endpoint).",
)
@click.option(
    "--auto-approve",
    is_flag=True,
    help="Answer every question for CI: yes, the first option, approve. Never a secret.",
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
    work_dir: Path,
    interactive: bool,
    new: bool,
    run_id: str | None,
    max_iterations: int | None,
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
    )
    sys.exit(drive(opts, guard, sys.stdout, sys.stderr))


def _load(ws: Workspace, run_id: str | None = None) -> RunMetadata:
    rid = run_id or ws.latest_run_id()
    if rid is None:
        raise UsageError(f"no runs in {ws.root}")
    try:
        return load_metadata(ws.run(rid).metadata)
    except FileNotFoundError:
        raise UsageError(f"run {rid} has no metadata.json") from None


def _pending(ws: Workspace, meta: RunMetadata) -> InteractionRequest | None:
    req = Mailbox(ws).read_request()
    return req if req is not None and req.run_id == meta.run_id else None


def _status_doc(ws: Workspace, meta: RunMetadata) -> dict[str, Any]:
    req = _pending(ws, meta)
    answer = None
    if req is not None:
        a = Mailbox(ws).read_answer(req, secret=True)
        answer = {"state": str(a.state), **({"reason": a.reason} if a.reason else {})}
    alive = owner_alive(meta.owner) if meta.status == RunStatus.RUNNING else None
    return {
        "workspace": str(ws.root),
        "run_id": meta.run_id,
        "status": str(meta.status),
        "task": meta.task,
        "agent_ref": meta.agent_ref,
        "iterations_completed": meta.iterations_completed,
        "start_time": iso(meta.start_time),
        "updated_at": iso(meta.updated_at),
        "end_time": iso(meta.end_time) if meta.end_time else None,
        "error": meta.error,
        "owner_alive": alive,
        "pending": req.model_dump(mode="json") if req else None,
        "response": answer,
        "answer_error": Mailbox(ws).last_refusal() if req else None,
    }


@main.command("status")
@WORK_DIR
@click.option("--run-id", help="Show this run instead of the latest.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly
def status_cmd(work_dir: Path, run_id: str | None, as_json: bool) -> None:
    """Show the latest run's status and its pending question."""
    ws = Workspace.at(work_dir)
    meta = _load(ws, run_id)
    doc = _status_doc(ws, meta)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    status = doc["status"]
    if doc["owner_alive"] is False:
        status += " (its process is gone: it crashed; `delta run` resumes it)"
    click.echo(f"Run:        {meta.run_id}\nStatus:     {status}\nTask:       {meta.task}")
    click.echo(f"Agent:      {meta.agent_ref}\nIterations: {meta.iterations_completed}")
    click.echo(f"Updated:    {doc['updated_at']}")
    if meta.error:
        click.echo(f"Reason:     {meta.error}")
    if (req := _pending(ws, meta)) is not None:
        click.echo(guidance(ws, meta.run_id, req))
        if doc["response"]["state"] == "ready":
            click.echo("  An answer is waiting in response.txt; `delta run` will take it.")
        elif doc["response"].get("reason"):
            click.echo(f"  The answer file is not usable: {doc['response']['reason']}")
        if doc["answer_error"]:
            click.echo(f"  Last answer was not taken: {doc['answer_error']}")


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
        click.echo(req.prompt)
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


def _check_edits(meta: RunMetadata, req: InteractionRequest, doc: dict[str, Any]) -> None:
    """Catch an edit that does not fit the tool now, not after the run resumes."""
    try:
        agent = load_agent(meta.agent_ref)
    except UsageError:
        return  # the run itself will say what is wrong when it resumes
    names = {c.action_id: c.tool_name for c in req.calls}
    for d in doc.get("decisions") or []:
        tool = agent.tools.get(names.get(d["action_id"], ""))
        if d["decision"] == "edit" and tool is not None:
            try:
                tool.check_args(d.get("arguments"))
            except ValueError as e:
                raise UsageError(f"--edit {d['action_id']} ({tool.name}): {e}") from None


def _already_answered(ws: Workspace, req: InteractionRequest) -> bool:
    """A crash after the reply was journaled leaves the question file behind for a moment."""
    events = read_journal(ws.run(req.run_id).journal).events
    return any(
        e.type == EventType.HUMAN_INTERACTION
        and e.payload.get("phase") == "answered"
        and e.payload.get("request_id") == req.request_id
        for e in events
    )


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
) -> None:
    """Answer the pending question.

    Text answers go to response.txt; --choice and approval decisions go to response.json.
    Both are written atomically. With no answer given, asks on the terminal (hidden for
    secrets) or reads stdin.
    """
    ws = Workspace.at(work_dir)
    mailbox = Mailbox(ws)
    req = mailbox.read_request()
    if req is None:
        raise UsageError(f"nothing is waiting for an answer in {ws.root}")
    meta = load_metadata(ws.run(req.run_id).metadata)
    if meta.status not in (RunStatus.WAITING_FOR_INPUT, RunStatus.INTERRUPTED, RunStatus.RUNNING):
        raise UsageError(f"run {meta.run_id} is {meta.status}; its question is no longer open")
    if _already_answered(ws, req):
        raise UsageError(
            f"question {req.request_id} is already answered (the journal has the reply); "
            f"`delta run --work-dir {ws.root}` continues the run"
        )
    if mailbox.answer_file() is not None and not force:
        raise UsageError(
            f"an answer is already waiting in {mailbox.answer_file()}; pass --force to replace it"
        )
    structured = bool(everyone or decide or edit or choice or answered_by)
    if req.input_type == InputType.APPROVAL and not structured and text is None and file is None:
        raise UsageError("this question needs --approve, --reject, --cancel or --decide")
    try:
        if structured:
            doc: dict[str, Any] = {"request_id": req.request_id}
            if req.input_type == InputType.APPROVAL:
                doc["decisions"] = _decisions(req, everyone, decide, edit, reason)
            else:
                doc["answer"] = choice if choice is not None else _answer_text(req, text, file)
            if answered_by:
                doc["answered_by"] = answered_by
            interpret_json(req, json.dumps(doc))
            _check_edits(meta, req, doc)
            mailbox.write_structured(doc)
        else:
            answer = _answer_text(req, text, file)
            interpret_text(req, answer.strip() if not req.is_secret else answer)
            mailbox.write_answer(answer)
    except AnswerRejected as e:
        raise UsageError(str(e)) from None
    if req.is_secret and (text is not None or choice is not None):
        click.echo(
            "delta: note: a secret given on the command line can stay in shell history and was "
            "visible in the process list; next time run `delta respond` with no answer (hidden "
            "prompt) or `--file -`.",
            err=True,
        )
    click.echo(
        f"Answer saved for run {req.run_id}. Continue with: delta run --work-dir "
        f"{ws.root} (deltad picks it up by itself)."
    )


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
        click.echo(f"no runs in {ws.root}")
    latest = ws.latest_run_id() if rows else None
    for r in rows:
        mark = "*" if r["run_id"] == latest else " "
        task = (r.get("task") or r.get("error", "")).replace("\n", " ")
        click.echo(f"{mark} {r['run_id']}  {r['status']:<17} {task[:60]}")


main.add_command(pipeline_group)
