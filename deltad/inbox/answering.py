"""The one answering path: every channel that answers a question (a person's `delta respond`,
the HTTP API, the web page, a signed link, a pipeline gate) goes through `submit`, which
checks the answer against the question exactly as the engine will and writes the answer file
atomically. The daemon then resumes the run the same way whoever wrote it.

`submit` is a compare-and-set on `request_id`: it answers that question or none, and without
`force` it never replaces an answer already waiting (a second submitter gets AnswerWaiting).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deltad import tracing
from deltad.agent import Agent, check_edits, load_agent
from deltad.errors import UsageError
from deltad.protocol import InteractionRequest, Mailbox, Workspace, seal
from deltad.protocol.calldigest import DigestMismatch, bind
from deltad.protocol.journal import replied
from deltad.protocol.mailbox import MAX_MAILBOX_BYTES, structured_bytes
from deltad.protocol.questions import interpret_json, interpret_text
from deltad.protocol.replies import AnswerRejected
from deltad.protocol.seal import gated

from .answer_body import (
    AlreadyAnswered,
    AnswerIn,
    AnswerWaiting,
    Expired,
    Misfit,
    NotPending,
    TooLarge,
    Unsigned,
)
from .handover import read, shown
from .trust import agent_problem
from .views import OPEN, NoRun, load_run

MAX_ANSWER_BYTES = MAX_MAILBOX_BYTES  # what the resume reads: a bigger answer is refused there

if TYPE_CHECKING:
    from .sealing import Sealer

# The daemon's signing key (sealing.py), set by the root core as it starts; None in any other
# process (`delta respond`, as the owner, cannot sign: a gated question refuses its answer).
sealer: Sealer | None = None


@dataclass(frozen=True)
class Submitted:
    request: InteractionRequest
    path: Path  # the answer file written


def open_question(ws: Workspace, request_id: str | None = None) -> InteractionRequest:
    """The question `request_id` (None: whichever is pending) if it can still be answered."""
    req = Mailbox(ws).read_request()
    if req is None or (request_id is not None and req.request_id != request_id):
        raise NotPending(
            f"nothing is waiting for an answer in {ws.root}"
            if request_id is None
            else f"question {request_id} is not pending in {ws.root}"
        )
    try:
        meta = load_run(ws, req.run_id)
    except NoRun:
        raise NotPending(f"question {req.request_id} belongs to no run") from None
    if meta.status not in OPEN and req.expired():
        raise Expired(f"question {req.request_id} expired at {req.expires_at}")
    if meta.status not in OPEN:
        raise AlreadyAnswered(f"run {meta.run_id} is {meta.status}; its question is no longer open")
    # A gated question's recorded answer counts only when this daemon sealed it: a line the
    # agent appended to the journal leaves the question open to people.
    counts = seal.counts(req, [sealer.public] if sealer is not None else _trusted())
    if replied(ws.run(req.run_id).journal, req.request_id, counts=counts):
        raise AlreadyAnswered(
            f"question {req.request_id} is already answered (the journal has the reply); "
            f"`delta run --work-dir {ws.root}` continues the run"
        )
    if req.expired():
        raise Expired(f"question {req.request_id} expired at {req.expires_at}")
    return req


def agent_of(ws: Workspace, agent_ref: str) -> Agent | None:
    """The run's agent, for its tool schemas, if it can be loaded and its owner could read it
    as it is (`trust.agent_problem`); None otherwise."""
    return agent_and_problem(ws, agent_ref)[0]


def agent_and_problem(ws: Workspace, agent_ref: str) -> tuple[Agent | None, str | None]:
    """The run's agent, or None and one line saying why it was not read."""
    try:
        owner = os.stat(ws.root).st_uid
    except (OSError, ValueError) as e:
        return None, f"the workspace cannot be read: {e}"
    why = agent_problem(agent_ref, owner)
    if why is not None:
        return None, why
    try:
        return load_agent(agent_ref), None
    except UsageError as e:
        return None, str(e)


def check(ws: Workspace, req: InteractionRequest, body: AnswerIn | str) -> None:
    """Misfit unless the answer fits: the kind's reading, then the engine's own checks (edited
    arguments against the tool's schema, when the agent can be loaded)."""
    try:
        if isinstance(body, str):
            reply = interpret_text(req, body if req.is_secret else body.strip())
        else:
            doc = {"request_id": req.request_id, **body.model_dump(exclude_none=True, mode="json")}
            reply = interpret_json(req, json.dumps(doc))
        if reply.decisions:
            try:
                agent = agent_of(ws, load_run(ws, req.run_id).agent_ref)
            except NoRun:
                agent = None
            if agent is None:
                return  # the run itself will say what is wrong when it resumes
            check_edits(agent, req, reply)
    except AnswerRejected as e:
        raise Misfit(str(e)) from None


def submit(
    ws: Workspace | Path | str,
    request_id: str | None,
    body: AnswerIn | str,
    *,
    answered_by: str | None = None,
    channel: str | None = None,
    force: bool = False,
    approvals: list[dict[str, str]] | None = None,
) -> Submitted:
    """Answer question `request_id` (None: the pending one) in `ws`. A `str` body is plain text
    (`response.txt`); an AnswerIn is structured (`response.json`, with `answered_by` and
    `channel` recorded). Raises a SubmitError; writes nothing unless the answer fits.
    A question needing several approvals (four eyes) is answered over the network through
    `quorum.cast`, which calls this once the votes agree; here (the file mailbox) it is not
    counted: whoever can write the mailbox is trusted, as with respondents."""
    w = ws if isinstance(ws, Workspace) else Workspace.at(ws)
    req = open_question(w, request_id)
    mailbox = Mailbox(w)
    if not force and (waiting := mailbox.answer_file()) is not None:
        raise AnswerWaiting(
            f"an answer is already waiting in {waiting}; pass --force to replace it"
        )
    plain = isinstance(body, str) and answered_by is None and channel is None
    data = body.encode() if isinstance(body, str) and plain else None
    # A structured answer to a handed-over question says so (plain text stays as it is).
    handed = None if plain else shown(read(w, req.request_id))
    doc = None if plain else answer_document(req, body, answered_by, channel, handed)
    if doc is not None and approvals:
        doc["approvals"] = approvals  # four eyes: every vote that made it (quorum.py)
    if doc is not None and not isinstance(body, str) and body.decisions:
        try:  # each approval bound to the exact call it approves (protocol/calldigest.py)
            bound = bind(req, body.decisions)
        except DigestMismatch as e:
            raise Misfit(str(e)) from None
        doc["decisions"] = [d.model_dump(exclude_none=True, mode="json") for d in bound]
    if doc is not None and sealer is not None:
        doc["seal"] = sealer.seal(req, doc)  # the last field: it covers all the others
    elif gated(req):
        raise Unsigned(
            f"question {req.request_id} {why_gated(req)}: it is answered through deltad's inbox "
            "(`delta respond --inbox URL` with your token in DELTA_INBOX_TOKEN, the page, the "
            "API or a channel), which signs the answer; an answer written here would be refused"
        )
    size = len(data) if data is not None else len(structured_bytes(doc or {}))
    if size > MAX_ANSWER_BYTES:
        raise TooLarge(
            f"the answer file would be {size} bytes, over the {MAX_ANSWER_BYTES}-byte limit"
        )
    check(w, req, body)
    if doc is None:
        written = mailbox.write_answer(str(body), replace=force)
        path = w.response_file
    else:
        written = mailbox.write_structured(doc, replace=force)
        path = w.response_json
    if not written:
        raise AnswerWaiting("another answer was written first; it is waiting to be taken")
    if (caller := tracing.calling.get()) is not None:  # the answer's span links to its caller
        tracing.current.caller(str(w.root), req.request_id, caller)
    return Submitted(req, path)


def own_keys() -> list[bytes] | None:
    """The key this process signs with, to check what it signed (None: not the core)."""
    return None if sealer is None else [sealer.public]


def _trusted() -> list[bytes]:
    try:
        return seal.trusted_keys()
    except seal.BadKey:
        return []  # then no recorded answer counts: the question stays open


def why_gated(req: InteractionRequest) -> str:
    if req.approvals_required > 1:
        return f"needs {req.approvals_required} approvals"
    if req.respondents:
        return "names who may answer it"
    return "may not be approved by the workspace's owner"


def answer_document(
    req: InteractionRequest,
    body: AnswerIn | str,
    answered_by: str | None,
    channel: str | None,
    delegations: list[dict[str, str]] | None = None,
) -> dict[str, object]:
    """`response.json` for an answer: the request id, the answer, who and through what, and
    the hand-overs it went through (delegation.py)."""
    doc: dict[str, object] = {"request_id": req.request_id}
    doc |= (
        {"answer": body}
        if isinstance(body, str)
        else body.model_dump(exclude_none=True, mode="json")
    )
    if answered_by:
        doc["answered_by"] = answered_by
    if channel:
        doc["channel"] = channel
    if delegations:
        doc["delegations"] = delegations
    return doc
