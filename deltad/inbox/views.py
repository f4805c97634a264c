"""What a person (or a program) sees of a workspace: its run's status, the pending question,
and how to answer it. `delta status`, `delta run`'s pause message and the HTTP API all read
through here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from deltad.protocol import (
    InteractionRequest,
    Mailbox,
    RunMetadata,
    RunStatus,
    Workspace,
    followup,
    iso,
    load_metadata,
    owner_alive,
    safefs,
)
from deltad.protocol.errors import ProtocolError
from deltad.protocol.kinds import kind_of
from deltad.protocol.printable import shell_quote, show, show_path

from .ballots import read as quorum_read
from .ballots import shown as quorum_shown
from .handover import read, shown
from .outcome import run_outcome

OPEN = frozenset({RunStatus.WAITING_FOR_INPUT, RunStatus.INTERRUPTED, RunStatus.RUNNING})


class NoRun(ProtocolError):
    """The workspace has no run (or not the one named)."""


class Pending(BaseModel):
    """A question as a person sees it: the request (options, gated calls, default, deadline)
    and its run's task and agent."""

    workspace: str
    request: InteractionRequest
    task: str
    agent: str
    answer_waiting: bool
    last_refusal: str | None = None
    delegations: list[dict[str, str]] = []
    approvals: dict[str, Any] | None = None  # four eyes: {required, given} (quorum.py)
    follow_up: dict[str, Any] | None = None  # reminders and escalation (followup.json)


def _workspace(ws: Workspace | Path | str) -> Workspace:
    return ws if isinstance(ws, Workspace) else Workspace.at(ws)


def load_run(ws: Workspace | Path | str, run_id: str | None = None) -> RunMetadata:
    w = _workspace(ws)
    rid = run_id or w.latest_run_id()
    if rid is None:
        raise NoRun(f"no runs in {w.root}")
    try:
        return load_metadata(w.run(rid).metadata)
    except FileNotFoundError:
        raise NoRun(f"run {rid} has no metadata.json") from None


def pending(ws: Workspace | Path | str) -> Pending | None:
    """The open question in `ws`, or None. A question whose run has ended is not open."""
    with safefs.reusing_dirs():  # a dozen reads in three directories: one handle each
        return _pending(_workspace(ws))


def _pending(w: Workspace) -> Pending | None:
    mailbox = Mailbox(w)
    req = mailbox.read_request()
    if req is None:
        return None
    try:
        meta = load_run(w, req.run_id)
    except NoRun:
        return None
    if meta.status not in OPEN:
        return None
    agent = Path(meta.agent_ref).name
    return Pending(
        workspace=str(w.root),
        request=req,
        task=meta.task,
        agent=agent,
        answer_waiting=mailbox.answer_file() is not None,
        last_refusal=mailbox.last_refusal(),
        delegations=shown(read(w, req.request_id)),
        approvals=quorum_shown(req, quorum_read(w, req.request_id)),
        follow_up=follow_up_shown(w, req),
    )


def status(ws: Workspace | Path | str, run_id: str | None = None) -> dict[str, Any]:
    """The document `delta status --json` prints."""
    w = _workspace(ws)
    meta = load_run(w, run_id)
    mailbox = Mailbox(w)
    req = mailbox.read_request()
    req = req if req is not None and req.run_id == meta.run_id else None
    answer = None
    if req is not None:
        a = mailbox.read_answer(req, secret=True)
        answer = {"state": str(a.state), **({"reason": a.reason} if a.reason else {})}
    alive = owner_alive(meta.owner) if meta.status == RunStatus.RUNNING else None
    return {
        "workspace": show_path(w.root),
        "run_id": meta.run_id,
        "status": str(meta.status),
        "task": meta.task,
        "agent_ref": meta.agent_ref,
        "iterations_completed": meta.iterations_completed,
        "start_time": iso(meta.start_time),
        "updated_at": iso(meta.updated_at),
        "end_time": iso(meta.end_time) if meta.end_time else None,
        "error": meta.error,
        "error_kind": meta.error_kind,
        "pipeline": meta.pipeline,
        "current_node": meta.current_node,
        "owner_alive": alive,
        "pending": req.model_dump(mode="json") if req else None,
        "response": answer,
        "answer_error": mailbox.last_refusal() if req else None,
        # Who the question was handed to (delegation.json), oldest first.
        "delegations": shown(read(w, req.request_id)) if req else [],
        # Four eyes: the votes given so far and how many are needed (approvals.json).
        "approvals": quorum_shown(req, quorum_read(w, req.request_id)) if req else None,
        # Reminded when, escalated to whom and when, due when (followup.json; protocol/followup.py).
        "follow_up": follow_up_shown(w, req) if req else None,
        "set_aside": mailbox.stale_answers(),
        "outcome": run_outcome(w, meta),  # a finished run's final message and answers
    }


def follow_up_shown(ws: Workspace, req: InteractionRequest) -> dict[str, Any] | None:
    """What was done about the question (reminders, escalation) and when it is due (its SLA),
    or None when it asks for neither."""
    rec = followup.read(ws.interaction_dir, req.request_id)
    due = followup.sla_due(req.timestamp, req.follow_up)
    if rec is None and due is None:
        return None
    doc = rec.shown() if rec is not None else {"reminders": [], "escalated": None}
    doc.pop("request_id", None)
    if doc.get("sla_due_at") is None:
        doc["sla_due_at"] = iso(due) if due is not None else None
    return doc


def guidance(ws: Workspace, run_id: str, req: InteractionRequest) -> str:
    """What to tell a person about a pending question, with commands they can paste."""
    q = shell_quote  # every string from a file is shown escaped (names are bytes)
    wd = q(str(ws.root))
    kind = kind_of(req.input_type)
    lines = [
        f"Run {show(run_id)} is waiting for input.",
        f"  Question: {show(req.prompt)}",
        f"  Expects:  {kind.expects}",
    ]
    if req.node_id:
        lines.insert(1, f"  Node:     {show(req.node_id)} (pipeline)")
    lines += [f"    [{show(o.key)}] {show(o.label)}" for o in req.options]
    for c in req.calls:
        lines += [
            f"    {show(c.action_id)}: {show(c.tool_name)} {json.dumps(c.arguments)}",
            f"      runs: {show(c.resolved_command)}",
        ]
    if req.is_secret:
        lines.append("  Sensitive: kept in a 0600 file under the run, never shown to the model.")
    if req.expires_at is not None:
        then = kind.after_deadline(req)
        lines.append(f"  Deadline: {iso(req.expires_at)} (then: {then})")
    respond = f"delta respond --work-dir {wd}"
    example = None if req.is_secret else kind.example(req)
    if kind.per_call:
        first = q(req.calls[0].action_id)
        lines += [
            f"  Answer:   {respond} --approve        (or --reject --reason TEXT, --cancel)",
            f"       or:  {respond} --decide {first}=approve --edit ID JSON ...",
            f"       or:  echo approve > {q(str(ws.response_file))}",
        ]
    elif example is None:
        # Never on a command line (shell history, the process list) nor through `echo >`.
        lines.append(f"  Answer:   {respond}   (asks with typing hidden; writes a 0600 file)")
    else:
        lines += [
            f"  Answer:   {respond} {q(example)}",
            f"       or:  echo {q(example)} > {q(str(ws.response_file))}",
        ]
    lines.append(f"  Continue: delta run --work-dir {wd}   (deltad does this by itself)")
    return "\n".join(lines)
