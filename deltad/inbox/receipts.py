"""What a decision's receipt says (daemon/audit.py keeps them): who answered, through which
channel, what, when, on which request, and for an approval the digest of each call approved.

Taken by the root core as it queues the resume of an answered question: every channel's answer
(the HTTP API, the page, a signed link, `delta respond`, a file written by hand) passes there.
The answer is read as the resume will read it (the mailbox's no-follow, size-capped reader);
a secret's value is never read into a receipt."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deltad.inbox import answering, ballots
from deltad.protocol import InteractionRequest, Mailbox, Workspace, iso, utcnow
from deltad.protocol.calldigest import DigestMismatch, bind
from deltad.protocol.mailbox import Answer, AnswerState
from deltad.protocol.printable import show_path
from deltad.protocol.questions import interpret_json, interpret_text
from deltad.protocol.replies import AnswerRejected, Reply


def what_of(req: InteractionRequest, name: str, text: str) -> tuple[dict[str, Any], Reply | None]:
    """What an answer file says, as a receipt records it, and the reply it reads as (None: it
    does not fit; the resume refuses it). Pure."""
    if req.is_secret:
        return {"secret": "answered (the value is not recorded)"}, None
    try:
        reply = interpret_json(req, text) if name.endswith(".json") else interpret_text(req, text)
    except AnswerRejected as e:
        return {"misfit": str(e)}, None
    if reply.decisions:
        calls = {c.action_id: c for c in req.calls}
        try:
            bound = bind(req, reply.decisions)
        except DigestMismatch as e:
            return {"misfit": str(e)}, reply
        decisions = []
        for d in bound:
            call = calls.get(d.action_id)
            one: dict[str, Any] = {
                "action_id": d.action_id,
                "tool_name": call.tool_name if call else None,
                "decision": str(d.decision),
            }
            if d.digest:
                one["digest"] = d.digest
            if d.arguments is not None:
                one["arguments"] = d.arguments
            if d.reason:
                one["reason"] = d.reason
            decisions.append(one)
        return {"decisions": decisions}, reply
    what: dict[str, Any] = {"answer": reply.value}
    if reply.key is not None:
        what["key"] = reply.key
    return what, reply


def receipt(
    ws_path: Path,
    run_id: str | None,
    *,
    expired: bool = False,
    answered: tuple[InteractionRequest, Answer] | None = None,
) -> dict[str, Any] | None:
    """The receipt of the answer waiting in `ws_path`, or (`expired`) of its question's deadline
    passing unanswered (None: no question or answer to record). `answered`: the question and
    the answer as the look that decided the resume read them (not read again)."""
    ws = Workspace.at(ws_path)
    mailbox = Mailbox(ws)
    if answered is not None and not expired:
        return _decision(ws_path, run_id, *answered)
    req = mailbox.read_request()
    if req is None:
        return None
    if expired:
        timed = timeout_receipt(ws_path, run_id, req)
        rec = ballots.read(ws, req.request_id, answering.own_keys())  # four eyes: the partial votes
        if rec is not None and rec.votes:
            timed["votes"] = [{"by": v.by, "verdict": v.verdict, "at": v.at} for v in rec.votes]
        return timed
    return _decision(ws_path, run_id, req, mailbox.read_answer(req, secret=req.is_secret))


def _decision(
    ws_path: Path, run_id: str | None, req: InteractionRequest, answer: Answer
) -> dict[str, Any] | None:
    if answer.state not in (AnswerState.READY, AnswerState.REFUSED):
        return None
    doc: dict[str, Any] = {}
    if answer.state is AnswerState.READY and answer.path.suffix == ".json" and not req.is_secret:
        try:
            loaded = json.loads(answer.text)
            doc = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            doc = {}
    if answer.state is AnswerState.READY:
        what, reply = what_of(req, answer.path.name, answer.text)
    else:
        what, reply = {"refused": answer.reason}, None
    fields: dict[str, Any] = {
        "kind": "decision",
        "at": iso(utcnow()),
        "workspace": show_path(ws_path),
        "run_id": run_id or req.run_id,
        "request_id": req.request_id,
        "input_type": str(req.input_type),
        "channel": _text(doc.get("channel")) or ("file" if not doc else None),
        "answered_by": _text(doc.get("answered_by")) or (reply.answered_by if reply else None),
        "file": answer.path.name,
        "file_uid": answer.uid,
        "what": what,
    }
    if answer.mtime_ns:
        fields["answered_at"] = iso_ns(answer.mtime_ns)
    return {k: v for k, v in fields.items() if v is not None}


def timeout_receipt(ws_path: Path, run_id: str | None, req: InteractionRequest) -> dict[str, Any]:
    """Nobody answered by the deadline: the question's timeout rule decides (the run applies
    it: the default, a rejection, or a failed run). Pure."""
    fields: dict[str, Any] = {
        "kind": "timeout",
        "at": iso(utcnow()),
        "workspace": show_path(ws_path),
        "run_id": run_id or req.run_id,
        "request_id": req.request_id,
        "input_type": str(req.input_type),
        "channel": "deadline",
        "what": {"timeout": f"no answer by {iso(req.expires_at) if req.expires_at else '?'}"},
    }
    return fields


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def iso_ns(ns: int) -> str:
    return iso(datetime.fromtimestamp(ns / 1e9, UTC))


def vote_receipt(
    ws_path: Path,
    req: InteractionRequest,
    by: str,
    channel: str,
    vote: dict[str, Any],
    approvals: dict[str, Any],
    outcome: str,
) -> dict[str, Any]:
    """Four eyes: one person's vote on a question needing several (inbox/quorum.py), as the
    core records it when the vote is cast — counted (`outcome: pending`) or completing the
    answer (`answered`: the decision's own receipt follows when the daemon takes it). Pure."""
    what, _ = what_of(req, "response.json", json.dumps({"request_id": req.request_id, **vote}))
    return {
        "kind": "vote",
        "at": iso(utcnow()),
        "workspace": show_path(ws_path),
        "run_id": req.run_id,
        "request_id": req.request_id,
        "input_type": str(req.input_type),
        "channel": channel,
        "answered_by": by,
        "what": what,
        "quorum": {
            "required": approvals["required"],
            "given": [v["by"] for v in approvals["given"]],
            "outcome": outcome,
        },
    }
