"""Typed payloads of the journal's events: what each event type must carry.

The journal is the run's source of truth and is also a file a person can edit. Each line's
payload is checked against its type's model when the journal is read, so a hand-edited or
damaged line is one clear error naming the line, never a KeyError deep in the engine.
An unknown event type is refused by the reader (journal.py). Extra fields are allowed.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from .models import ActionStatus, EventType, InteractionRequest, JournalEvent
from .questions import Reply
from .states import RunStatus


class _Payload(BaseModel):
    model_config = ConfigDict(extra="allow")


class RunStart(_Payload):
    run_id: str
    task: str
    agent_ref: str


class Function(_Payload):
    name: str
    arguments: str


class ToolCall(_Payload):
    id: str
    function: Function


class Thought(_Payload):
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    llm_invocation_ref: str | None = None


class ActionRequest(_Payload):
    action_id: str
    tool_name: str
    tool_args: Any = None
    resolved_command: str = ""


class ActionResult(_Payload):
    action_id: str
    status: ActionStatus
    observation_content: str


class SystemMessage(_Payload):
    level: str = "INFO"
    content: str
    context_cut: dict[str, Any] | None = None  # engine/budget.py: what a model call left out


class Asked(_Payload):
    phase: Literal["asked"]
    request: InteractionRequest


class Answered(_Payload):
    phase: Literal["answered"]
    request_id: str
    action_id: str
    reply: Reply
    input_type: str | None = None  # as it was asked (absent in older journals)
    node_id: str | None = None  # a pipeline's question: the node that asked it


class RunEnd(_Payload):
    status: RunStatus
    reason: str = ""


class NodeStart(_Payload):
    node: str
    kind: str
    attempt: int = 1
    prompt: str = ""  # a codergen node's whole prompt, as the model is given it
    iterations_before: int = 0  # the run's iterations when the node began (its own cap)
    llm: dict[str, Any] | None = None  # the node's model settings
    system_prompt: str | None = None  # an orchestra.yaml agent's, as composed when it began
    thread: str | None = None  # the conversation it belongs to (None: its own, the node's)
    thread_history: list[tuple[int, int]] | None = None  # the thread's visits: (start, outcome)
    deadline: str | None = None  # a codergen node's timeout, as an ISO time
    branch: int | None = None  # in a parallel node's branch: its index
    child: str | None = None  # in a child pipeline: its manager node


class NodeOutcome(_Payload):
    node: str
    status: Literal["success", "partial_success", "retry", "fail", "skipped"]
    preferred_label: str = ""
    suggested_next_ids: list[str] = Field(default_factory=list)
    context_updates: dict[str, Any] = Field(default_factory=dict)
    notes: str = ""
    failure_reason: str = ""
    branch: int | None = None
    child: str | None = None  # in a child pipeline: its manager node


class EdgeTaken(_Payload):
    source: str
    target: str
    step: str
    reason: str = ""
    branch: int | None = None
    result: dict[str, Any] | None = None  # a branch's end: what it hands to its fan-in
    child: str | None = None  # in a child pipeline: its manager node
    goal: str = ""  # a child pipeline's start: its goal
    status: str = ""  # a child pipeline's end: completed or failed


class NodeMessage(_Payload):
    node: str
    text: str


PAYLOADS: dict[str, type[BaseModel]] = {
    EventType.RUN_START: RunStart,
    EventType.THOUGHT: Thought,
    EventType.ACTION_REQUEST: ActionRequest,
    EventType.ACTION_RESULT: ActionResult,
    EventType.SYSTEM_MESSAGE: SystemMessage,
    EventType.RUN_END: RunEnd,
    EventType.NODE_START: NodeStart,
    EventType.NODE_OUTCOME: NodeOutcome,
    EventType.EDGE_TAKEN: EdgeTaken,
    EventType.NODE_MESSAGE: NodeMessage,
}


def check_payload(type_: str, payload: dict[str, Any]) -> BaseModel | None:
    """The payload as its type's model; raise ValueError (pydantic's ValidationError) when
    `payload` does not fit `type_`. None for a type without a model."""
    if type_ == EventType.HUMAN_INTERACTION:
        model: type[BaseModel] = Asked if payload.get("phase") == "asked" else Answered
    elif (found := PAYLOADS.get(type_)) is not None:
        model = found
    else:
        return None
    return model.model_validate(payload)


P = TypeVar("P", bound=BaseModel)


def typed(event: JournalEvent, model: type[P]) -> P:
    """`event`'s payload as `model`: the one the journal reader made when it checked the line,
    else made now (and kept). Consumers read fields, not dict keys."""
    kept = event.typed_payload
    if isinstance(kept, model):
        return kept
    made = model.model_validate(event.payload)
    event.typed_payload = made
    return made
