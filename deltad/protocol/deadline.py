"""When a question expires: the journal decides, for `delta` and `deltad` alike.

`request.json` is a copy of the question for people and for the daemon's scheduling; the
journal's `HUMAN_INTERACTION {phase: asked}` record is the fact. The client rebuilds the request
it acts on from that record, so the daemon resumes a run for its deadline only when that
record's `expires_at` has passed, and a `request.json` that says otherwise is reported (once)
instead of being resumed for again and again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .models import InteractionRequest, iso

# What the copy must say as the journal does for the daemon to act on it.
FACTS = ("run_id", "action_id", "expires_at")


@dataclass(frozen=True)
class Deadline:
    expired: bool  # the journal's deadline has passed: a resume applies the timeout rule
    at: datetime | None  # the journal's deadline (None: never, or no such question)
    problem: str | None = None  # why request.json is not believed, in one line


def _shown(value: object) -> str:
    if isinstance(value, datetime):
        try:
            return iso(value)
        except OverflowError:  # year 1 at -12:00 has no UTC form
            return value.isoformat()
    return repr(value)


def disagreement(posted: InteractionRequest, asked: InteractionRequest) -> str | None:
    """How `request.json` (`posted`) differs from the journal's `asked` record of the same
    request id, in one line; None when they agree on every fact."""
    for name in FACTS:
        mine, fact = getattr(posted, name), getattr(asked, name)
        if mine != fact:
            return (
                f"request.json says {name} {_shown(mine)}, but the journal asked request "
                f"{asked.request_id} with {name} {_shown(fact)}: the journal's is used"
            )
    return None


def judge_expiry(
    posted: InteractionRequest, asked: InteractionRequest | None, now: datetime
) -> Deadline:
    """Whether the pending question has expired, decided by the journal's record of it."""
    if asked is None:
        return Deadline(
            False,
            None,
            f"request.json names request {posted.request_id!r}, which the journal never "
            "asked: not resumed for its deadline",
        )
    return Deadline(asked.expired(now), asked.expires_at, disagreement(posted, asked))
