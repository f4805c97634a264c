"""What the core decides from: the facts of one look at a workspace, as frozen values.

`reconcile.inspect` (the shell: it reads the disk) makes them, `decide.decide` (pure) reads
them, and the service hands them from one to the other. This module imports nothing of the
shell, so the rules can be read and tested without it (tests/unit/test_decide.py); the shell
imports it, never the reverse. A verdict is made once, with its final values
(`dataclasses.replace` where a look learns more).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import TYPE_CHECKING

from deltad.core.backoff import AnswerSig
from deltad.protocol.followup import FollowUp
from deltad.protocol.runfacts import RemoteOwner
from deltad.protocol.states import RunStatus

if TYPE_CHECKING:  # a resume's question and answer, carried (no fact of this module's)
    from deltad.protocol.mailbox import Answer
    from deltad.protocol.models import InteractionRequest


class Action(Enum):
    NONE = "none"
    RESUME = "resume"
    MARK_INTERRUPTED = "mark_interrupted"
    GONE = "gone"


class State(StrEnum):
    IDLE = "idle"  # no run yet
    WAITING = "waiting"  # a question, no (complete) answer
    ANSWERED = "answered"  # a complete answer: resume
    EXPIRED = "expired"  # the question's deadline passed with no usable answer: resume
    RUNNING = "running"  # owner alive (or on another host)
    INTERRUPTED = "interrupted"
    DONE = "done"  # completed, failed or canceled
    PROBLEM = "problem"  # something on disk is wrong; logged once
    GONE = "gone"


@dataclass(frozen=True)
class Owner:
    """Whom a workspace belongs to, and so whom its resume runs as (looked up and checked by
    `tenancy`)."""

    uid: int
    gid: int
    name: str
    home: str
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """What one look at a workspace found on disk (`reconcile.inspect`)."""

    action: Action
    state: State
    run_id: str | None = None
    status: RunStatus | None = None
    problem: str | None = None
    answer_sig: AnswerSig | None = None
    owner_pid: int | None = None
    elsewhere: RemoteOwner | None = None  # RUNNING on another host (judged from its job)
    request_id: str | None = None
    input_type: str | None = None  # of the pending question (the inbox's filters)
    created: float | None = None  # the pending question's timestamp (the inbox's order)
    deadline: float | None = None  # the pending question's expires_at (the inbox's due soon)
    owner: Owner | None = None  # who a resume runs as (checked: see tenancy)
    error_kind: str | None = None  # INTERRUPTED runs: why (model_unavailable: deltad retries)
    failing_since: float | None = None  # wall time the model started failing (give-up clock)
    # When to look again even without an event: an answer still settling, or the pending
    # question's `expires_at` (the client applies the timeout rule when it is resumed then).
    wake_at: float | None = None
    unparsed: bool = False  # the problem: a state file did not parse (it may be half written)
    channel: str | None = None  # an answer's: who wrote the file (the metrics' label)
    follow_up: FollowUp | None = None  # the pending question's reminders and escalation
    traceparent: str | None = None  # the pending question's carried trace, checked (tracing.py)
    # A resume's question and answer as the look read them: its receipt is made of these, not
    # read again (the second agreeing look's; the child reads the answer itself anyway).
    answered: tuple[InteractionRequest, Answer] | None = field(
        default=None, compare=False, repr=False
    )


@dataclass(frozen=True)
class Exited:
    """A resume child of this workspace has just exited."""

    run_id: str | None
    rc: int | None
    failed: bool
    timed_out: bool = False
    job: str | None = None  # a job on an engine (a cluster) ended: how, in one line


@dataclass(frozen=True)
class Done:
    """What was done about one question's follow-up (wall times): reminders, escalation."""

    reminders: tuple[float, ...] = ()
    escalated_at: float | None = None
    overdue_at: float | None = None  # the SLA's passing was said


@dataclass(frozen=True)
class Facts:
    """One look at a workspace: what `inspect` saw (`seen`), or the error looking raised."""

    seen: Verdict | None = None
    busy: bool = False  # a resume of it is queued or running
    exited: Exited | None = None
    error: str | None = None  # one line: looking (or acting) raised this
    jobs_known: bool = True  # False: the executor's engine could not say which jobs exist
    followed: Done = field(default_factory=Done)  # reminders, escalation of the question
