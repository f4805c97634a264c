"""The follow-up rule, pure: when the daemon next re-notifies an open question's respondents or
escalates it (protocol/followup.py says what a question asks for). `decide` reads it; the
durable record of what was done is `followup.Store`.

`next_step`: the settings (`Plan`), when the question was asked, what was done (`Done`) and the
wall time → the action due now (if any) and when the next one is due. Tested from a table
(tests/unit/test_followup.py). Clock: wall time, as `request.json`'s `timestamp` and
`expires_at` are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from deltad.core.facts import Done
from deltad.protocol.followup import DEFAULT_MAX_REMINDERS, FollowUp

MIN_INTERVAL = 60.0  # seconds between two reminders of one question, at least (the default)
MAX_PER_HOUR = 10  # reminders of one question in any hour, at most (the default)


@dataclass(frozen=True)
class Plan:
    """A question's settings, the daemon's defaults filled in (seconds; None: not asked for)."""

    remind_after: float | None = None
    max_reminders: int = DEFAULT_MAX_REMINDERS
    escalate_after: float | None = None
    escalate_to: tuple[str, ...] = ()
    sla: float | None = None

    per_hour: int = MAX_PER_HOUR  # reminders in any hour, at most

    @classmethod
    def of(
        cls,
        asked: FollowUp | None,
        defaults: FollowUp | None,
        floor: float = MIN_INTERVAL,
        per_hour: int = MAX_PER_HOUR,
    ) -> Plan | None:
        """The settings the question asked for over the daemon's, its reminders no more often
        than `floor` seconds (whatever a question says: it is the model's or the owner's)."""
        f = asked.over(defaults) if asked is not None else defaults
        if f is None or f.empty:
            return None
        remind = f.remind_after_seconds
        return cls(
            None if remind is None else max(remind, floor),
            DEFAULT_MAX_REMINDERS if f.max_reminders is None else f.max_reminders,
            f.escalate_after_seconds,
            tuple(f.escalate_to or ()),
            f.sla_seconds,
            per_hour,
        )

    @property
    def acts(self) -> bool:
        reminds = self.remind_after is not None and self.max_reminders > 0
        return reminds or self.escalates or self.sla is not None

    @property
    def escalates(self) -> bool:
        return self.escalate_after is not None and bool(self.escalate_to)


Action = Literal["remind", "escalate", "overdue"]


@dataclass(frozen=True)
class Step:
    action: Action | None  # due now (None: nothing now)
    due: float | None  # when the next action is due (None: nothing more to do)


def next_step(plan: Plan, asked: float, done: Done, now: float, deadline: float | None) -> Step:
    """The action due at `now`, or when the next one is. Escalation is once, `escalate_after`
    after asking; reminders follow the last notice (the question, the last reminder or the
    escalation, which notifies too) by `remind_after`, at most `max_reminders` of them. Nothing
    is due at or after the question's `deadline` (it ends then); on a tie, escalation first.
    The SLA's passing (`sla` after asking) is said once; it ends nothing."""
    due: list[tuple[float, int, Action]] = []
    if plan.escalates and done.escalated_at is None:
        assert plan.escalate_after is not None
        due.append((asked + plan.escalate_after, 0, "escalate"))
    if plan.remind_after is not None and len(done.reminders) < plan.max_reminders:
        last = max([asked, *done.reminders, *([done.escalated_at] if done.escalated_at else [])])
        at = last + plan.remind_after
        if len(done.reminders) >= plan.per_hour:  # an hour after the per_hour-th last one
            at = max(at, sorted(done.reminders)[-plan.per_hour] + 3600.0)
        due.append((at, 1, "remind"))
    if plan.sla is not None and done.overdue_at is None:
        due.append((asked + plan.sla, 2, "overdue"))
    due = [d for d in due if deadline is None or d[0] < deadline]
    if not due:
        return Step(None, None)
    at, _, action = min(due)
    return Step(action, at) if at <= now else Step(None, at)


def after(done: Done, action: Action, now: float) -> Done:
    """What was done, once `action` is."""
    if action == "remind":
        return replace(done, reminders=(*done.reminders, now))
    if action == "overdue":
        return replace(done, overdue_at=now)
    return replace(done, escalated_at=now)
