"""The manager loop (attractor spec §4.11): a `house` node supervising a child pipeline.

The child is the graph in `stack.child_dotfile` (a graph attribute, relative to the DOT file).
It runs in this run, in this process, node by node: its events are the run's journal lines,
marked `child` (the manager node's id), so a resume after a crash picks the child up where it
stood and never runs a finished child node again; its gates reach the run's mailbox like any
gate. A cycle is one child node finished (its NODE_OUTCOME): after each, the manager observes
the child (`stack.child.*` in its context) and judges, as the spec's loop does: the child
completed is a SUCCESS, the child failed a FAIL, `manager.stop_condition` holding a SUCCESS,
`manager.max_cycles` cycles without any of these a FAIL. Every judgement is a pure function
of the journal, so a resumed process judges as the first one would have.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from . import values
from .conditions import Condition, ConditionError, parse_condition
from .model import Graph, Kind, Node
from .outcome import Outcome, Status
from .problems import Code, Problem
from .state import State

ACTIONS = ("observe", "steer", "wait")
DEFAULT_MAX_CYCLES = 1000  # the spec's default
MAX_CYCLES_LIMIT = 1_000_000
MANAGER_KEYS = (
    "manager.poll_interval",
    "manager.max_cycles",
    "manager.stop_condition",
    "manager.actions",
    "stack.child_autostart",
)


@dataclass(frozen=True)
class Settings:
    """A manager node's loop, read from its attributes."""

    max_cycles: int
    stop: Condition | None
    observe: bool  # off: the child still runs, its telemetry is not put in the context


def settings_of(node: Node) -> Settings:
    """The node's loop settings; raises ValueError naming the attribute that is wrong."""
    attrs = node.attrs
    try:
        cycles = values.integer(attrs.get("manager.max_cycles", str(DEFAULT_MAX_CYCLES)))
    except ValueError as e:
        raise ValueError(f"manager.max_cycles: {e}") from None
    if not 1 <= cycles <= MAX_CYCLES_LIMIT:
        raise ValueError(f"manager.max_cycles: must be from 1 to {MAX_CYCLES_LIMIT}")
    text = attrs.get("manager.stop_condition", "").strip()
    try:
        stop = parse_condition(text) if text else None
    except ConditionError as e:
        raise ValueError(f"manager.stop_condition {text[:60]!r}: {e}") from None
    return Settings(cycles, stop, "observe" in actions_of(node))


def actions_of(node: Node) -> list[str]:
    raw = node.attrs.get("manager.actions", "observe,wait")
    return [a.strip() for a in raw.split(",") if a.strip()]


# -- observing and judging (pure) -----------------------------------------------------------
@dataclass(frozen=True)
class Child:
    """What the manager sees of its child: `stack.child.*` (§5.1's `stack.*` keys)."""

    status: str  # running, completed or failed
    outcome: str  # the latest child node's outcome; at the end, success or fail
    current_node: str
    cycles: int  # child nodes finished
    last_response: str = ""
    reason: str = ""  # why it failed

    def telemetry(self) -> dict[str, Any]:
        found = {
            "stack.child.status": self.status,
            "stack.child.outcome": self.outcome,
            "stack.child.current_node": self.current_node,
            "stack.child.cycles": self.cycles,
        }
        if self.last_response:
            found["stack.child.last_response"] = self.last_response
        if self.reason:
            found["stack.child.failure_reason"] = self.reason
        return found


def observe(child: State, start: str) -> Child:
    """What the manager observes of its child, from the child's state: a cycle is a child
    node that finished (its start node aside)."""
    last = child.stages[-1].status if child.stages else ""
    finished = child.stages[-1].node if child.stages else ""  # an outcome not routed yet
    current = child.visit.node if child.visit else child.at or finished
    said = str(child.context.get("last_response") or "")
    cycles = sum(1 for s in child.stages if s.node != start)
    if child.finished is not None:
        status, why = child.finished
        outcome = "success" if status == "completed" else "fail"
        return Child(status, outcome, current, cycles, said, why)
    return Child("running", last, current, cycles, said)


def judge(settings: Settings, child: Child, context: Mapping[str, Any]) -> Outcome | None:
    """The manager node's outcome after the cycles so far, or None: let the child go on."""
    seen = child.telemetry() if settings.observe else {}
    if child.status == "completed":
        return Outcome(Status.SUCCESS, context_updates=seen, notes="child completed")
    if child.status == "failed":
        why = f"child failed: {child.reason}" if child.reason else "child failed"
        return Outcome(Status.FAIL, context_updates=seen, failure_reason=why)
    if settings.stop is not None and settings.stop.holds("", "", {**context, **seen}):
        return Outcome(
            Status.SUCCESS,
            context_updates=seen,
            notes=f"stop condition {settings.stop.text!r} satisfied",
        )
    if child.cycles >= settings.max_cycles:
        return Outcome(
            Status.FAIL,
            context_updates=seen,
            failure_reason=f"max cycles ({settings.max_cycles}) exceeded",
        )
    return None


# -- check --------------------------------------------------------------------------------
def problems(graph: Graph) -> Iterator[Problem]:
    """A manager node needs the graph's `stack.child_dotfile` and readable settings; the
    `manager.*` attributes belong on manager nodes. (load.py checks the child's file.)"""
    managers = graph.of_kind(Kind.MANAGER)
    for n in graph.nodes.values():
        if n.kind == Kind.MANAGER:
            continue
        for key in MANAGER_KEYS:
            if key in n.attrs:
                yield Problem(
                    f"{key} applies to house (manager loop) nodes only",
                    n.where(key),
                    n.subject,
                    code=Code.NODE_ATTR,
                )
    for n in managers:
        if graph.child_dotfile is None:
            yield Problem(
                "a manager loop needs the graph attribute stack.child_dotfile (the child "
                "pipeline's DOT file)",
                n.pos,
                n.subject,
                code=Code.NODE_ATTR,
            )
        try:
            settings_of(n)
        except ValueError as e:
            key = str(e).split(" ", 1)[0].rstrip(":")
            yield Problem(str(e), n.where(key), n.subject, code=Code.BAD_VALUE)
        if unknown := [a for a in actions_of(n) if a not in ACTIONS]:
            yield Problem(
                f"manager.actions {', '.join(unknown)[:60]!r}: use {', '.join(ACTIONS)}",
                n.where("manager.actions"),
                n.subject,
                code=Code.BAD_VALUE,
            )
        if (t := n.attrs.get("manager.poll_interval")) is not None:
            try:
                values.duration(t)
            except ValueError as e:
                yield Problem(
                    f"manager.poll_interval: {e}",
                    n.where("manager.poll_interval"),
                    n.subject,
                    code=Code.BAD_VALUE,
                )
