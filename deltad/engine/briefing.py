"""The context a question carries (`request.json`'s `context`), built from the journal alone.

A person deciding needs more than the prompt: the run's task, what the agent said last, which
tools it called since the previous question and what they returned, and for a pipeline gate
the output of the node under review. Everything comes from the journal's recorded values (tool
output is redacted before it is journaled, arguments hold secret handles, never values), so a
question asked again after a crash carries the same context. Bounded: a few dozen kilobytes
whatever the run did.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from deltad.protocol import EventType, JournalEvent
from deltad.protocol.events import (
    ActionRequest,
    ActionResult,
    NodeOutcome,
    NodeStart,
    Thought,
    typed,
)
from deltad.protocol.models import QuestionContext, ToolStep

from .context import ASK_HUMAN

MAX_TOOL_CALLS = 20  # the most recent ones since the previous question
RESULT_CHARS = 2000  # of each tool result
ARGUMENT_CHARS = 1000  # of each call's arguments, as JSON
TASK_CHARS = 2000
MESSAGE_CHARS = 4000  # the agent's last message
REVIEWED_CHARS = 8000  # a gate's reviewed node output
TOTAL_CHARS = 32_000  # the whole context, as JSON; the oldest calls go first past it
GATE_KIND = "wait.human"  # a NODE_START's kind for a pipeline gate
CUT_MARK = "… [cut: "
OUTPUT_KEYS = ("last_response", "tool.output")  # what a codergen or tool node leaves


def bounded(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}{CUT_MARK}{len(text) - limit} more characters]"


def _arguments(raw: Any) -> Any:
    shown = json.dumps(raw, ensure_ascii=False)
    return raw if len(shown) <= ARGUMENT_CHARS else bounded(shown, ARGUMENT_CHARS)


def _since_last_question(events: Sequence[JournalEvent]) -> Sequence[JournalEvent]:
    for i in range(len(events) - 1, -1, -1):
        if events[i].type == EventType.HUMAN_INTERACTION:
            return events[i + 1 :]
    return events


def tool_steps(events: Sequence[JournalEvent]) -> list[ToolStep]:
    """Every tool call (ask_human aside) since the previous question, with its result."""
    steps: dict[str, ToolStep] = {}
    for e in _since_last_question(events):
        if e.type == EventType.ACTION_REQUEST:
            req = typed(e, ActionRequest)
            if req.tool_name != ASK_HUMAN:
                steps[req.action_id] = ToolStep(
                    action_id=req.action_id,
                    tool_name=req.tool_name,
                    arguments=_arguments(req.tool_args),
                )
        elif e.type == EventType.ACTION_RESULT:
            res = typed(e, ActionResult)
            if step := steps.get(res.action_id):
                step.status = str(res.status)
                step.result = bounded(res.observation_content, RESULT_CHARS)
    return list(steps.values())


def last_message(events: Sequence[JournalEvent]) -> str | None:
    """The agent's latest words (a THOUGHT's text), if it said anything."""
    for e in reversed(events):
        if e.type == EventType.THOUGHT and (text := typed(e, Thought).content):
            return bounded(text, MESSAGE_CHARS)
    return None


def _lane(e: JournalEvent) -> tuple[object, object]:
    """The pipeline lane of a node event: its child pipeline and parallel branch, if any."""
    return e.payload.get("child"), e.payload.get("branch")


def _in_view(outcome: tuple[object, object], gate: tuple[object, object]) -> bool:
    """Whether a gate in lane `gate` reviews an outcome of lane `outcome`: in a branch (or a
    child pipeline), its own lane's or the enclosing one's, never a sibling branch's."""
    return all(g is None or o is None or o == g for o, g in zip(outcome, gate, strict=True))


def reviewed(events: Sequence[JournalEvent]) -> tuple[str, str] | None:
    """At a pipeline gate: (node, output) of the last node before it, in its own lane, that
    left an output (a gate in a parallel branch reviews its branch, not another's)."""
    gate: tuple[object, object] | None = None
    for e in reversed(events):
        if e.type == EventType.NODE_START and gate is None:
            if typed(e, NodeStart).kind != GATE_KIND:
                return None  # the question is asked inside a working node, not at a gate
            gate = _lane(e)
        elif e.type == EventType.NODE_OUTCOME and gate is not None and _in_view(_lane(e), gate):
            outcome = typed(e, NodeOutcome)
            for key in OUTPUT_KEYS:
                if isinstance(found := outcome.context_updates.get(key), str) and found:
                    return outcome.node, bounded(found, REVIEWED_CHARS)
    return None


def _size(ctx: QuestionContext) -> int:
    return len(json.dumps(ctx.model_dump(mode="json"), ensure_ascii=False))


def question_context(
    events: Sequence[JournalEvent], task: str, prompt: str = ""
) -> QuestionContext:
    """The context of a question asked now, after `events` (the journal as read). A last
    message the prompt begins with (an interactive node asks with it) is not repeated."""
    steps = tool_steps(events)
    omitted = max(0, len(steps) - MAX_TOOL_CALLS)
    said = last_message(events)
    ctx = QuestionContext(
        task=bounded(task, TASK_CHARS),
        last_message=None if said and prompt.startswith(said.split(CUT_MARK)[0].strip()) else said,
        tool_calls=steps[omitted:],
        tool_calls_omitted=omitted,
    )
    if (found := reviewed(events)) is not None:
        ctx.reviewed_node, ctx.reviewed_output = found
        said = (ctx.last_message or "").split(CUT_MARK)[0]
        if said and ctx.reviewed_output.startswith(said):
            ctx.last_message = None  # the node's final message is its output: shown once
    while ctx.tool_calls and _size(ctx) > TOTAL_CHARS:
        ctx.tool_calls.pop(0)
        ctx.tool_calls_omitted += 1
    return ctx
