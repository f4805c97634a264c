"""Where a pipeline run stands, replayed from its journal alone.

The journal records each step once: NODE_START (a node began; its seq names the visit and
the questions asked in it), NODE_OUTCOME (its outcome and the context changes it makes, in
one line), EDGE_TAKEN (where it goes next). Replaying them gives the context and the one
next thing to do, so a process that crashed anywhere resumes at the right node and never runs
again what had finished.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deltad.protocol import EventType
from deltad.protocol.models import JournalEvent

from .fidelity import Stage
from .outcome import Outcome, Status


@dataclass(frozen=True)
class Visit:
    """A node that began and has no outcome yet."""

    node: str
    seq: int  # its NODE_START: names the visit (and its questions) for good
    attempt: int
    prompt: str
    llm: dict[str, str] = field(default_factory=dict)  # the node's model settings, as recorded
    thread: str = ""  # the conversation it belongs to (fidelity full continues one)
    history: tuple[tuple[int, int], ...] = ()  # the thread's earlier visits: (start, outcome)
    deadline: str = ""  # a codergen node's timeout, as an ISO time ("" for none)


@dataclass(frozen=True)
class Decided:
    """A node's outcome, not yet routed."""

    node: str
    attempt: int
    outcome: Outcome


@dataclass
class State:
    context: dict[str, Any] = field(default_factory=dict)
    at: str | None = None  # the node to begin next
    visit: Visit | None = None
    decided: Decided | None = None
    path: list[str] = field(default_factory=list)  # nodes begun, in order (first attempts)
    last: dict[str, Status] = field(default_factory=dict)  # each node's latest outcome
    steps: int = 0  # node visits begun (every NODE_START, retries too): what max_steps bounds
    stages: list[Stage] = field(default_factory=list)  # finished visits, for summaries
    came_from: str | None = None  # the source of the edge taken to `at` (None: no edge)
    thread: str | None = None  # the latest visit's thread
    threads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # its visits

    def add(self, e: JournalEvent) -> None:
        p = e.payload
        match e.type:
            case EventType.NODE_START:
                self.at, self.decided = None, None
                self.visit = Visit(
                    p["node"],
                    e.seq,
                    int(p.get("attempt", 1)),
                    str(p.get("prompt", "")),
                    dict(p.get("llm") or {}),
                    str(p.get("thread") or p["node"]),
                    tuple((int(a), int(b)) for a, b in p.get("thread_history") or ()),
                    str(p.get("deadline") or ""),
                )
                self.thread = self.visit.thread
                self.steps += 1
                if self.visit.attempt == 1:
                    self.path.append(p["node"])
            case EventType.NODE_OUTCOME:
                self.context.update(p.get("context_updates") or {})
                attempt = self.visit.attempt if self.visit else 1
                if self.visit is not None:
                    ran = (self.visit.seq, e.seq)
                    self.threads.setdefault(self.visit.thread, []).append(ran)
                self.visit, self.decided = None, Decided(p["node"], attempt, outcome_of(p))
                self.last[p["node"]] = self.decided.outcome.status
                self.stages.append(Stage(p["node"], p["status"], str(p.get("notes") or "")))
            case EventType.EDGE_TAKEN:
                self.decided, self.at = None, p["target"]
                jumped = p.get("step") in ("retry_target", "goal_gate")  # not along an edge
                self.came_from = None if jumped else p["source"]
            case _:
                pass


def outcome_of(payload: dict[str, Any]) -> Outcome:
    return Outcome(
        Status(payload["status"]),
        preferred_label=payload.get("preferred_label", ""),
        suggested_next_ids=tuple(payload.get("suggested_next_ids") or ()),
        context_updates=payload.get("context_updates") or {},
        notes=payload.get("notes", ""),
        failure_reason=payload.get("failure_reason", ""),
    )


def outcome_payload(node: str, outcome: Outcome) -> dict[str, Any]:
    return {
        "node": node,
        "status": outcome.status.value,
        "preferred_label": outcome.preferred_label,
        "suggested_next_ids": list(outcome.suggested_next_ids),
        "context_updates": dict(outcome.context_updates),
        "notes": outcome.notes,
        "failure_reason": outcome.failure_reason,
    }


def feed(state: State, events: Sequence[JournalEvent], fed: int) -> int:
    """Add the events after the first `fed` to `state` (the journal's list only grows while a
    process drives the run); returns how many are in now."""
    for i in range(fed, len(events)):
        state.add(events[i])
    return len(events)


def replay(events: Iterable[JournalEvent], start: str) -> State:
    """The state after `events`; a run with none begins at `start`."""
    state = State(at=start)
    for e in events:
        state.add(e)
    return state
