"""Times and respondent names: the leaf values the question's models and its follow-up both
read (models imports followup; neither imports the other's module back)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _aware(dt: datetime) -> datetime:
    # Files are written with "Z"; a hand-written naive time is read as UTC rather than as
    # local time (whose conversion fails for year 1 and differs between hosts).
    try:
        return (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:
        raise ValueError("date out of range") from None


Timestamp = Annotated[datetime, AfterValidator(_aware)]


RESPONDENT_NAME = r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}"  # a token's name (deltad token add)
# A person signed in through OIDC is `oidc:<email or sub>` (deltad/inbox/oidc.py).
_RESPONDENT = re.compile(rf"(?:group:|oidc:)?{RESPONDENT_NAME}")


def respondent_problem(name: object) -> str | None:
    """Why `name` is not a respondent (a token name, `oidc:PERSON` or `group:NAME`), or None."""
    if isinstance(name, str) and _RESPONDENT.fullmatch(name):
        return None
    return (
        f"respondent {str(name)[:40]!r} is not a token name, oidc:PERSON or group:NAME "
        "(letters, digits and . _ @ -, up to 64)"
    )
