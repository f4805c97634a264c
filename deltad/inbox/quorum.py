"""Four eyes: a question with `approvals_required: N` is answered only once N distinct people
agree. Each network answer (the API, the page, a bulk answer, a mail reply) is a *vote*; the
votes are kept beside the question, `.delta/interaction/approvals.json`, bound to its
`request_id` (as delegation.json is), and the answer file is written once, through the one
answering path (`answering.submit`), when they agree, naming every voter.

`decide` is the rule (pure, tested from a table in tests/unit/test_quorum.py):

- a vote is per person (a token's `person`, default its name; the person a mail or Slack
  sender maps to): the same one twice is refused (409 `already_voted`), whatever it says;
- with `owner_may_approve: false`, the workspace owner's approving vote (or choice) is refused
  (403 `owner_may_not_approve`); the owner may still reject;
- **fail closed**: one rejection (a `reject` or `cancel` of any call) is written at once as the
  answer, with the approvals given before it recorded beside it;
- otherwise the vote is counted with those that agree with it exactly: for an approval the
  same decision on every call with the same digest (an edit's digest is over its arguments, so
  an edit agrees only with the same edit, never with a plain approve); for any other kind the
  same answer (the same option key for a choice). N agreeing votes → decided: the answer is
  written. Fewer → pending: the vote is recorded, nothing is answered (a disagreeing choice
  waits until N agree on one option, or the deadline);
- a deadline that passes with partial votes applies the question's own timeout rule; the
  votes stay on record (the daemon's timeout receipt lists them).

`cast` is the shell: read, decide, write (atomically, by the root core: the inbox process
never writes a workspace), under one lock so two votes at once are counted one after the other.
It is the one place a vote is recorded, whatever carried it (the API, the page, MCP, a mail, a
Slack click): each counted vote is a receipt of its own in the audit log (`kind: vote`, its
channel and `origin`: the token, the mail's Message-ID, the Slack user and message), appended
under the same lock so the log's order is the order the votes were counted, and one
`approval_vote` log line.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from deltad.protocol import InteractionRequest, Mailbox, Workspace, iso, utcnow
from deltad.protocol.calldigest import DigestMismatch, bind
from deltad.protocol.printable import show_path
from deltad.protocol.questions import interpret_json
from deltad.protocol.replies import AnswerRejected, Decision

from . import audit as auditlog
from . import auditnotes
from .answer_body import AnswerIn, AnswerWaiting, Misfit, SubmitError, TooLarge
from .answering import Submitted, check, open_question, own_keys, submit
from .ballots import (
    MAX_BYTES,
    MAX_VOTES,
    Record,
    Verdict,
    Vote,
    encoded,
    owner_of,
    read,
    required_of,
    shown,
    write,
)
from .receipts import vote_receipt

log = structlog.get_logger("deltad.quorum")


class AlreadyVoted(SubmitError):
    code, http = "already_voted", 409


class OwnerMayNotApprove(SubmitError):
    code, http = "owner_may_not_approve", 403


class NoVoter(SubmitError):
    """A signed link names nobody: it cannot be one of several distinct approvers."""

    code, http = "not_a_respondent", 403


# -- the rule (pure) ------------------------------------------------------------------------
@dataclass(frozen=True)
class Refused:
    error: SubmitError


@dataclass(frozen=True)
class Pending:
    votes: list[Vote]  # all, the new one last


@dataclass(frozen=True)
class Decided:
    votes: list[Vote]  # all, the new one last
    by: list[Vote]  # those the answer stands on (the agreeing ones, or the rejection)
    answer: Vote  # whose answer document is written


Outcome = Refused | Pending | Decided


def decide(
    required: int,
    votes: Sequence[Vote],
    new: Vote,
    *,
    owner: str | None,
    owner_may_approve: bool,
) -> Outcome:
    """What vote `new` does to a question needing `required` agreeing votes, given `votes`
    already cast; `owner`: the workspace owner's identity (a user name)."""
    if any(v.by == new.by for v in votes):
        return Refused(AlreadyVoted(f"{new.by} has already voted on this question"))
    if not owner_may_approve and owner is not None and new.by == owner and new.verdict != "reject":
        return Refused(
            OwnerMayNotApprove(
                f"{new.by} owns this workspace and may not approve its own run's request"
            )
        )
    if len(votes) >= MAX_VOTES:
        return Refused(AlreadyVoted(f"this question has {MAX_VOTES} votes already"))
    cast = [*votes, new]
    if new.verdict == "reject":
        return Decided(cast, [new], new)  # fail closed: one rejection rejects at once
    agreeing = [v for v in cast if v.verdict == new.verdict and v.agree == new.agree]
    if len(agreeing) >= required:
        return Decided(cast, agreeing, new)
    return Pending(cast)


# -- reading a vote ---------------------------------------------------------------------------
def vote_of(req: InteractionRequest, body: AnswerIn, by: str, channel: str) -> Vote:
    """`body` as a vote (Misfit when it does not fit the question): for an approval its
    decisions with their digests, else the kind's reading of the answer."""
    doc: dict[str, Any] = body.model_dump(exclude_none=True, mode="json")
    try:
        reply = interpret_json(req, json.dumps({"request_id": req.request_id, **doc}))
        if reply.decisions:
            bound = bind(req, reply.decisions)
            doc["decisions"] = [d.model_dump(exclude_none=True, mode="json") for d in bound]
            stops = any(d.decision in (Decision.REJECT, Decision.CANCEL) for d in bound)
            verdict: Verdict = "reject" if stops else "approve"
            agree = json.dumps(
                [[d.action_id, str(d.decision), d.digest] for d in bound], separators=(",", ":")
            )
        else:
            verdict = "answer"
            agree = json.dumps([reply.key, reply.value], separators=(",", ":"))
    except (AnswerRejected, DigestMismatch) as e:
        raise Misfit(str(e)) from None
    return Vote(by=by, channel=channel, at=iso(utcnow()), verdict=verdict, agree=agree, answer=doc)


# -- the shell --------------------------------------------------------------------------------
_lock = threading.Lock()  # every vote is cast in the one core process: one at a time
# Told each vote's outcome (`pending`, `answered`, `refused`): the daemon's /metrics counter
# (CoreMetrics.vote), set by the service; None in a process without one.
observer: Callable[[str], None] | None = None


def _count(outcome: str) -> None:
    if observer is not None:
        observer(outcome)


@dataclass(frozen=True)
class Cast:
    """What a vote did: `submitted` when it completed the answer (written), else None;
    `approvals`: the question's votes as shown."""

    request: InteractionRequest
    submitted: Submitted | None
    approvals: dict[str, Any] | None
    outcome: Literal["answered", "pending"]


def cast(
    ws: Workspace | Path | str,
    request_id: str,
    body: AnswerIn,
    *,
    by: str | None,
    channel: str,
    shown_as: str | None = None,
    audit: Path | None = None,
    origin: dict[str, str] | None = None,
) -> Cast:
    """Answer question `request_id` as `by` through `channel`: at once when it needs one
    answer (recorded as answered by `shown_as`, default `by`: a signed link is "signed link"
    but no voter), else as a vote (see the module's rule). Raises a SubmitError. A counted
    vote is appended to `audit` (None: no receipts) with `origin`, what the channel knows of
    where it came from (see `record`). A refusal is recorded too (`kind: refused`, its code;
    bounded: inbox/auditnotes.py), once here for every channel."""
    try:
        return _cast(ws, request_id, body, by, channel, shown_as, audit, origin)
    except SubmitError as e:
        root = ws.root if isinstance(ws, Workspace) else Path(ws)
        auditnotes.refused(
            audit,
            root,
            request_id,
            e.code,
            str(e),
            channel=channel,
            by=shown_as or by,
            voter=by,
            origin=origin,
        )
        raise


def _cast(
    ws: Workspace | Path | str,
    request_id: str,
    body: AnswerIn,
    by: str | None,
    channel: str,
    shown_as: str | None,
    audit: Path | None,
    origin: dict[str, str] | None,
) -> Cast:
    w = ws if isinstance(ws, Workspace) else Workspace.at(ws)
    req = open_question(w, request_id)
    need = required_of(req)
    if need <= 1:
        done = submit(w, request_id, body, answered_by=shown_as or by, channel=channel)
        return Cast(req, done, None, "answered")
    if by is None:
        raise NoVoter(
            f"this question needs {need} approvals by people who log in; a signed link "
            "names nobody: log in"
        )
    with _lock:
        req = open_question(w, request_id)
        if (waiting := Mailbox(w).answer_file()) is not None:
            raise AnswerWaiting(f"an answer is already waiting in {waiting}")
        check(w, req, body)
        new = vote_of(req, body, by, channel)
        rec = read(w, request_id, own_keys()) or Record(request_id=request_id, required=need)
        outcome = decide(
            need,
            rec.votes,
            new,
            owner=owner_of(w),
            owner_may_approve=req.owner_may_approve,
        )
        if isinstance(outcome, Refused):
            _count("refused")
            raise outcome.error
        rec = Record(request_id=request_id, required=need, votes=outcome.votes)
        if isinstance(outcome, Pending):
            if (
                len(data := encoded(rec, _sign())) > MAX_BYTES
            ):  # never a record too big to read back
                _count("refused")
                raise TooLarge(f"the votes on this question would be over {MAX_BYTES} bytes")
            _count("pending")
            write(w, data)
            counted = Cast(req, None, shown(req, rec), "pending")
            record(audit, w.root, counted, body, shown_as or by, by, channel, origin)
            return counted
        voters = [
            {"by": v.by, "channel": v.channel, "at": v.at, "verdict": v.verdict}
            for v in outcome.votes
        ]
        answer = AnswerIn.parse(outcome.answer.answer)
        done = submit(
            w,
            request_id,
            answer,
            answered_by=", ".join(v.by for v in outcome.by),
            channel=channel,
            approvals=voters,
        )
        _count("answered")
        rec.decided = True
        # After the answer: a crash between leaves the answer, which names every voter (and a
        # record too big to keep is left as it was, for the same reason).
        if len(data := encoded(rec, _sign())) <= MAX_BYTES:
            write(w, data)
        counted = Cast(req, done, shown(req, rec), "answered")
        record(audit, w.root, counted, body, shown_as or by, by, channel, origin)
        return counted


def _sign() -> Callable[[dict[str, Any]], dict[str, str]] | None:
    from . import answering

    return None if answering.sealer is None else answering.sealer.seal_votes


def record(
    audit: Path | None,
    ws: Path,
    done: Cast,
    body: AnswerIn,
    answered_by: str,
    voter: str,
    channel: str,
    origin: dict[str, str] | None,
) -> None:
    """A counted vote's receipt (`kind: vote`) into the audit log and its `approval_vote` line,
    for every channel alike. The vote stands when the log will not take it (it is on record
    beside the question; `audit_failed` says the log has a gap); the answer it may complete
    still gets the decision's receipt before any resume (core/service.py), so no run resumes
    without one."""
    assert done.approvals is not None
    if audit is not None:
        vote = body.model_dump(exclude_none=True, mode="json")
        fields = vote_receipt(
            ws, done.request, answered_by, channel, vote, done.approvals, done.outcome
        )
        if voter != answered_by:
            fields["voter"] = voter
        if origin:
            fields["origin"] = dict(origin)
        try:
            entry = auditlog.append(audit, fields)
            log.info("audit_appended", workspace=show_path(ws), seq=entry["seq"], kind="vote")
        except Exception as e:  # the vote is counted; a log that cannot continue says so
            log.error("audit_failed", workspace=show_path(ws), error=str(e))
    log.info(
        "approval_vote",
        workspace=show_path(ws),
        request_id=done.request.request_id,
        by=answered_by,
        voter=voter,
        channel=channel,
        outcome=done.outcome,
        given=len(done.approvals["given"]),
        required=done.approvals["required"],
    )


def answer_or_vote(
    ws: Path,
    request_id: str | None,
    body: AnswerIn,
    *,
    answered_by: str | None = None,
    channel: str | None = None,
    voter: str | None = None,
    origin: dict[str, str] | None = None,
    audit: Path | None = None,
) -> Submitted | None:
    """`cast` as a channel calls the answering path (outbound/base.py `Answer`): `voter` is
    the person as respondents name them (the channel's mapping: the same name as their token,
    so one person is one vote on every channel), else the sender; `origin` what the channel
    knows of the vote's source, for its receipt; `audit` the log (the hub binds it). None when
    the vote was recorded and the question still waits for others."""
    w = Workspace.at(ws)
    rid = request_id if request_id is not None else open_question(w).request_id
    by = voter or answered_by
    return cast(
        w,
        rid,
        body,
        by=by,
        channel=channel or "other",
        shown_as=answered_by,
        audit=audit,
        origin=origin,
    ).submitted
