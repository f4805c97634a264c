"""Pydantic models, one per on-disk file of the workspace protocol."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr

from .followup import FollowUp
from .process import OwnerProcess

# Re-exported: every module reads these from here.
from .stamps import RESPONDENT_NAME as RESPONDENT_NAME
from .stamps import Timestamp as Timestamp
from .stamps import iso as iso
from .stamps import respondent_problem as respondent_problem
from .stamps import utcnow as utcnow
from .states import RunStatus


class _Model(BaseModel):
    # Files written by newer versions may carry fields we do not know: keep them.
    model_config = ConfigDict(extra="allow")


class RunMetadata(_Model):
    run_id: str
    status: RunStatus
    task: str
    agent_ref: str
    start_time: Timestamp
    updated_at: Timestamp
    end_time: Timestamp | None = None
    iterations_completed: int = 0
    max_iterations: int | None = None
    max_steps: int | None = None  # a pipeline's node visits (--max-steps), else the graph's
    owner: OwnerProcess | None = None
    error: str | None = None
    # Why the run stopped, for programs: model_unavailable (transient: deltad retries it),
    # model_refused, model_output (a cut-off answer), or None.
    error_kind: str | None = None
    # Since when model calls have been failing transiently (deltad's give-up clock); cleared
    # by the next successful call.
    model_failing_since: Timestamp | None = None
    # A pipeline run: the DOT file it was started with (its copy is in the run's
    # configuration/pipeline.dot) and the node it is at, for `delta status`.
    pipeline: str | None = None
    current_node: str | None = None


class InputType(StrEnum):
    """The kind of question. The first three are the v1.2 kinds; old requests stay valid."""

    TEXT = "text"
    PASSWORD = "password"
    CONFIRMATION = "confirmation"
    YES_NO = "yes_no"
    CHOICE = "choice"
    APPROVAL = "approval"
    NUMBER = "number"
    DATE = "date"


# The kinds whose answer is a secret whatever `sensitive` says (kinds.py's `Kind.secret`; a unit
# test holds the two together). Here, so a question knows it without importing the vocabulary.
SECRET_INPUTS = frozenset({InputType.PASSWORD})


class Option(_Model):
    key: str = Field(min_length=1, max_length=1)
    label: str


class GatedCall(_Model):
    """A tool call waiting for a human decision."""

    action_id: str
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    resolved_command: str = ""


def _respondents(names: list[str]) -> list[str]:
    for n in names:
        if (why := respondent_problem(n)) is not None:
            raise ValueError(why)
    return list(dict.fromkeys(names))  # in order, once each


class ToolStep(_Model):
    """A tool call the agent made since the previous question, as the journal recorded it
    (secrets only as their handles), its result cut to a bound."""

    action_id: str
    tool_name: str
    arguments: Any = None
    status: str | None = None  # SUCCESS, FAILED, ERROR; None while it has no result
    result: str = ""


class QuestionContext(_Model):
    """What a person needs to decide with, built from the journal when the question is asked:
    the run's task, the agent's last message before asking, the tool calls since the previous
    question and, for a pipeline gate, the output of the node under review."""

    task: str = ""
    last_message: str | None = None
    tool_calls: list[ToolStep] = Field(default_factory=list)
    tool_calls_omitted: int = 0  # older calls since the previous question, left out
    reviewed_node: str | None = None
    reviewed_output: str | None = None


MAX_APPROVALS = 10  # a quorum larger than this is a typo, not a policy


class InteractionRequest(_Model):
    """`.delta/interaction/request.json`: one pending question.

    For `approval`, `calls` lists every gated call of the turn and `action_id` is the first.
    """

    request_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    timestamp: Timestamp = Field(default_factory=utcnow)
    prompt: str
    input_type: InputType = InputType.TEXT
    sensitive: bool = False
    allow_empty: bool = False  # text/password: an empty answer is a real answer
    run_id: str
    action_id: str
    options: list[Option] = Field(default_factory=list)
    default: str | None = None
    timeout_seconds: float | None = Field(default=None, gt=0)
    expires_at: Timestamp | None = None
    calls: list[GatedCall] = Field(default_factory=list)
    minimum: float | None = None  # number: the smallest answer accepted
    maximum: float | None = None  # number: the largest answer accepted
    earliest: date | None = None  # date: the earliest answer accepted
    latest: date | None = None  # date: the latest answer accepted
    node_id: str | None = None  # a pipeline's question: the node that asks it
    # Who may answer over HTTP: token names and group:NAMEs; empty is anyone the scope allows.
    respondents: Annotated[list[str], AfterValidator(_respondents)] = Field(default_factory=list)
    context: QuestionContext | None = None  # absent in requests older than it
    # Four eyes (deltad/inbox/quorum.py): answered over HTTP only once this many distinct
    # respondents agree; `owner_may_approve: false` refuses the workspace owner's own vote.
    approvals_required: int = Field(default=1, ge=1, le=MAX_APPROVALS)
    owner_may_approve: bool = True
    # Reminders, escalation and the SLA clock (protocol/followup.py); None: the daemon's.
    follow_up: FollowUp | None = None
    # The W3C traceparent `delta` was started with (TRACEPARENT: a tracing daemon's resume, or
    # an operator's tool): the question's trace joins it (deltad/tracing.py). Written only when
    # set, so a request without it is byte for byte what it was.
    traceparent: str | None = Field(default=None, exclude_if=lambda v: v is None)

    @property
    def is_secret(self) -> bool:
        return self.sensitive or self.input_type in SECRET_INPUTS

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and (now or utcnow()) >= self.expires_at


class EventType(StrEnum):
    RUN_START = "RUN_START"
    THOUGHT = "THOUGHT"
    ACTION_REQUEST = "ACTION_REQUEST"
    ACTION_RESULT = "ACTION_RESULT"
    SYSTEM_MESSAGE = "SYSTEM_MESSAGE"
    HUMAN_INTERACTION = "HUMAN_INTERACTION"
    RUN_END = "RUN_END"
    # Pipelines (deltad/pipeline/driver.py): a node began, its outcome (with the context
    # changes it makes), the edge taken, a human's message to the agent in an interactive node.
    NODE_START = "NODE_START"
    NODE_OUTCOME = "NODE_OUTCOME"
    EDGE_TAKEN = "EDGE_TAKEN"
    NODE_MESSAGE = "NODE_MESSAGE"


class ActionStatus(StrEnum):
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    ERROR = "ERROR"


class JournalEvent(_Model):
    seq: int
    timestamp: Timestamp
    type: EventType | str  # a reader refuses unknown types, naming the line (journal.py)
    payload: dict[str, Any] = Field(default_factory=dict)
    # The payload as its model (events.py), made when the line was checked; not serialised.
    _typed: Any = PrivateAttr(default=None)

    @property
    def typed_payload(self) -> Any:
        return self._typed

    @typed_payload.setter
    def typed_payload(self, value: Any) -> None:
        self._typed = value

    def __eq__(self, other: object) -> bool:  # the kept model is a cache, not a part of it
        if not isinstance(other, JournalEvent):
            return NotImplemented
        return (self.seq, self.timestamp, self.type, self.payload) == (
            other.seq,
            other.timestamp,
            other.type,
            other.payload,
        )

    __hash__ = None  # type: ignore[assignment]
