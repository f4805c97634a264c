"""Delegation: a respondent hands a question to another token, a group or a person (a token
name, or `oidc:NAME` for someone who signs in through the provider), with a note. Kept in the
question's mailbox, `.delta/interaction/delegation.json`, beside `request.json` and bound to
its `request_id`: it survives restarts, `delta status`, the API and the page read it from the
disk, and a later question in the same workspace ignores it.

Who may answer after a delegation: the question's respondents *and* every delegate (the
delegator keeps the right: a hand-over is not a lock-out). A question that names no respondents
stays open to anyone; its delegation records who is asked to answer. Respondents' rules still
apply to delegating: only someone who may answer may delegate, and only to a token name or a
`group:NAME` that the token table knows or, when `http.oidc` is configured, to a person
`oidc:NAME` or any `group:NAME` deltad can name (the provider's people and groups cannot be
listed: like a respondent, they are taken as named). A signed link names nobody, so it cannot
delegate.

`refusal` is the decision (pure); `delegate` is the shell; handover.py keeps the record.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from deltad.protocol import Mailbox, Workspace, followup, iso, utcnow
from deltad.protocol.models import InteractionRequest
from deltad.protocol.safefs import publish

from . import auditnotes
from .answer_body import SubmitError
from .answering import open_question
from .handover import MAX_DELEGATIONS, Delegation, Record, answerers, path_of, read
from .oidc import GROUP as GROUP_NAME
from .oidc import PREFIX as PERSON
from .oidc import TEXT as PERSON_NAME
from .respondents import GROUP, Answerer, may_answer
from .respondents import refusal as respondent_refusal

MAX_NOTE = 2000  # characters


class NotAllowed(SubmitError):
    """Someone who may not answer this question tried to hand it over."""

    code, http = "not_a_respondent", 403


class UnknownDelegate(SubmitError):
    code, http = "unknown_delegate", 422


def refusal(
    respondents: Sequence[str],
    delegations: Sequence[Delegation],
    who: Answerer | None,
    to: str,
    known: Collection[str],
    note: str,
    people: bool = False,
) -> SubmitError | None:
    """Why `who` may not hand the question to `to`, or None. `known`: the token names and the
    `group:NAME`s the token table has; `people`: whether `http.oidc` is configured (then an
    `oidc:NAME` or a `group:NAME` deltad can name is taken as named)."""
    allowed = answerers(respondents, delegations)
    if who is None:
        return NotAllowed("a signed link names nobody: log in to hand a question over")
    if not may_answer(allowed, who):
        return NotAllowed(f"only {', '.join(allowed)} may hand this question over, not {who.name}")
    why = target_refusal(to, known, people)
    if why is not None:
        return why
    if to == who.name or to in who.also:
        return UnknownDelegate("a question cannot be handed to the one handing it over")
    if len(note) > MAX_NOTE:
        return UnknownDelegate(f"the note is over {MAX_NOTE} characters")
    if len(delegations) >= MAX_DELEGATIONS:
        return UnknownDelegate(f"this question was handed over {MAX_DELEGATIONS} times already")
    return None


def target_refusal(to: str, known: Collection[str], people: bool) -> SubmitError | None:
    """Why `to` is no one a question can be handed to, or None."""
    if to.startswith(PERSON):
        if not people:
            return UnknownDelegate(f"{to!r} names a person signed in through OIDC: not configured")
        if not PERSON_NAME.fullmatch(to.removeprefix(PERSON)):
            return UnknownDelegate(f"{to!r} is not a name deltad keeps (letters, digits, . _ @ -)")
        return None
    if to in known:
        return None
    if people and to.startswith(GROUP) and GROUP_NAME.fullmatch(to.removeprefix(GROUP)):
        return None  # a group of the provider's (its groups claim), as respondents name it
    what = "group" if to.startswith(GROUP) else "token"
    return UnknownDelegate(f"no {what} named {to!r} in the token table")


def delegate(
    ws: Workspace,
    request_id: str,
    to: str,
    *,
    who: Answerer | None,
    known: Collection[str],
    note: str = "",
    people: bool = False,
    audit: Path | None = None,
    channel: str = "http",
    origin: dict[str, str] | None = None,
) -> tuple[InteractionRequest, list[Delegation]]:
    """Hand open question `request_id` to `to`; returns the question and all its hand-overs.
    Raises a SubmitError (the question is not open, `who` may not, `to` is unknown). Each
    hand-over made is an entry in `audit` (`kind: handover`; None: no receipts), after it is
    written."""
    req = open_question(ws, request_id)
    had = read(ws, request_id)
    asked = followup.respondents_with(
        req.respondents, followup.read(ws.interaction_dir, request_id)
    )
    # An escalated-to respondent may hand on.
    why = refusal(asked, had, who, to, known, note, people)
    if why is not None:
        raise why
    assert who is not None
    now = Delegation(by=who.name, to=to, note=note, at=iso(utcnow()))
    rec = Record(request_id=request_id, delegations=[*had, now])
    publish(path_of(ws), (rec.model_dump_json(indent=2) + "\n").encode(), replace=True)
    auditnotes.handover(
        audit, ws.root, request_id, by=who.name, to=to, note=note, channel=channel, origin=origin
    )
    return req, rec.delegations


def current(ws: Workspace) -> list[Delegation]:
    """The pending question's hand-overs (none when nothing is pending)."""
    req = Mailbox(ws).read_request()
    return read(ws, req.request_id) if req is not None else []


def refuse_respondent(ws: Workspace, request_id: str, who: Answerer | None) -> str | None:
    """The check the answer routes make before submitting: the pending question's respondents
    and delegates against `who`. A question no longer pending is left to the answering path
    to report."""
    req = Mailbox(ws).read_request()
    if req is None or req.request_id != request_id:
        return None
    # An escalation (protocol/followup.py) adds respondents as a hand-over adds delegates.
    asked = followup.respondents_with(
        req.respondents, followup.read(ws.interaction_dir, request_id)
    )
    return respondent_refusal(answerers(asked, read(ws, request_id)), who)
