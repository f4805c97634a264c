"""Reminders and escalation of an open question (docs/inbox.md, "Reminders and escalation").

What a question asks for (`FollowUp`, in `request.json` as `follow_up`: from the `ask_human`
arguments, else the agent's `follow_up:` section, else the daemon's), and what the daemon did
about it (`Record`, `.delta/interaction/followup.json`, beside the question and bound to its
`request_id`, like `delegation.json`). The daemon keeps its own copy in its state dir (what it
decides from); the one beside the question is what the answering path (escalated respondents
may answer), `delta status`, the API and the page read, and what the engine copies into the
journal with the reply (`Reply.follow_up`), so the history says who was reminded and when.

Every duration is in seconds, like `timeout_seconds`; the SLA clock (`sla_seconds`) is
separate from the timeout: it ends nothing, it says when the question is due, and once it has
passed the daemon says so (`request.overdue`), once.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import UnsafeFile
from .fsio import read_regular
from .stamps import Timestamp, respondent_problem

FILE = "followup.json"
MAX_BYTES = 64 * 1024
MAX_SECONDS = 30 * 24 * 3600.0  # as a question's timeout
MAX_REMINDERS = 100
DEFAULT_MAX_REMINDERS = 3
MAX_ESCALATE_TO = 20


def _names(names: list[str]) -> list[str]:
    for n in names:
        if (why := respondent_problem(n)) is not None:
            raise ValueError(why)
    if len(names) > MAX_ESCALATE_TO:
        raise ValueError(f"at most {MAX_ESCALATE_TO} names")
    return list(dict.fromkeys(names))


Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


class FollowUp(BaseModel):
    """When to remind the respondents (every `remind_after_seconds`, at most `max_reminders`
    times), when to escalate (`escalate_after_seconds`, once: `escalate_to` become respondents
    too) and when the question is due (`sla_seconds` after it was asked). Unset keys take the
    next level's value (the agent's, then the daemon's)."""

    model_config = ConfigDict(extra="forbid")
    remind_after_seconds: Seconds | None = None
    max_reminders: int | None = Field(default=None, ge=0, le=MAX_REMINDERS)
    escalate_after_seconds: Seconds | None = None
    escalate_to: Annotated[list[str] | None, AfterValidator(lambda v: v and _names(v))] = None
    sla_seconds: Seconds | None = None

    @model_validator(mode="after")
    def _pair(self) -> FollowUp:
        if self.escalate_to and self.escalate_after_seconds is None:
            raise ValueError("escalate_to needs escalate_after_seconds")
        return self

    def over(self, base: FollowUp | None) -> FollowUp:
        """These settings, each unset one taken from `base`."""
        if base is None:
            return self
        mine = self.model_dump(exclude_none=True)
        return FollowUp.model_validate(base.model_dump(exclude_none=True) | mine)

    @property
    def empty(self) -> bool:
        return not self.model_dump(exclude_none=True)


ARG_KEYS = (
    "remind_after_seconds",
    "max_reminders",
    "escalate_after_seconds",
    "escalate_to",
    "sla_seconds",
)


def from_args(args: dict[str, Any]) -> FollowUp | str | None:
    """The follow-up an `ask_human` call asks for (None: none of its keys), or what is wrong
    with it, in one line for the model."""
    given = {k: args[k] for k in ARG_KEYS if args.get(k) is not None}
    if not given:
        return None
    for k in ("remind_after_seconds", "escalate_after_seconds", "sla_seconds", "max_reminders"):
        if isinstance(given.get(k), bool):
            return f"Error: {k} must be a number"
    try:
        return FollowUp.model_validate(given)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "follow-up"
        return f"Error: {where}: {first['msg'].removeprefix('Value error, ')}"


# What carried a reminder or an escalation to people: the channels configured to ("email",
# "slack", "teams", "pagerduty", "webhook", "command"); [] when none is (it was recorded and
# shown on the page, and nobody was told); None in a record from before this was kept.
Via = Annotated[list[str] | None, Field(max_length=8)]


class Escalation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at: Timestamp
    to: list[str]
    via: Via = None


class Record(BaseModel):
    """`followup.json`: what the daemon did about question `request_id`."""

    model_config = ConfigDict(extra="forbid")
    request_id: str
    reminders: list[Timestamp] = Field(default_factory=list, max_length=MAX_REMINDERS)
    reminders_via: Via = None  # what carried the last reminder
    escalated: Escalation | None = None
    sla_due_at: Timestamp | None = None
    overdue_at: Timestamp | None = None  # when the daemon said it was past its SLA

    def shown(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def path_of(interaction_dir: Path) -> Path:
    return interaction_dir / FILE


def read(interaction_dir: Path, request_id: str) -> Record | None:
    """The record of question `request_id` (None when the file is about another question,
    missing or damaged: a damaged record widens nothing and blocks nothing)."""
    try:
        raw = read_regular(path_of(interaction_dir), MAX_BYTES)
        rec = Record.model_validate(json.loads(raw))
    except (FileNotFoundError, UnsafeFile, OSError, ValueError, ValidationError, RecursionError):
        return None
    return rec if rec.request_id == request_id else None


def escalated_to(rec: Record | None) -> list[str]:
    return list(rec.escalated.to) if rec is not None and rec.escalated is not None else []


def respondents_with(respondents: list[str], rec: Record | None) -> list[str]:
    """Who may answer after an escalation: the respondents plus whom it escalated to; a
    question open to anyone ([]) stays open to anyone."""
    if not respondents:
        return []
    return list(dict.fromkeys([*respondents, *escalated_to(rec)]))


def sla_due(asked: datetime, follow: FollowUp | None) -> datetime | None:
    if follow is None or follow.sla_seconds is None:
        return None
    return asked + timedelta(seconds=follow.sla_seconds)
