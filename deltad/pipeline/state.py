"""Where a pipeline run stands, replayed from its journal alone.

The journal records each step once: NODE_START (a node began; its seq names the visit and
the questions asked in it), NODE_OUTCOME (its outcome and the context changes it makes, in
one line), EDGE_TAKEN (where it goes next). Replaying them gives the context and the one
next thing to do, so a process that crashed anywhere resumes at the right node and never runs
again what had finished. The spec's built-in context keys (§5.1: `graph.goal`, `current_node`,
`outcome`, `preferred_label`, `internal.retry_count.<node>`) are derived from the same lines,
so a resume sees the values the crashed process saw.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from deltad.protocol import EventType
from deltad.protocol.models import JournalEvent

from .outcome import Outcome, Status


@dataclass(frozen=True)
class Visit:
    """A node that began and has no outcome yet."""

    node: str
    seq: int  # its NODE_START: names the visit (and its questions) for good
    attempt: int
    prompt: str


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

    def add(self, e: JournalEvent) -> None:
        p = e.payload
        match e.type:
            case EventType.NODE_START:
                self.at, self.decided = None, None
                self.context["current_node"] = p["node"]  # built-in keys (§5.1)
                self.context[f"internal.retry_count.{p['node']}"] = int(p.get("attempt", 1)) - 1
                self.visit = Visit(
                    p["node"],
                    e.seq,
                    int(p.get("attempt", 1)),
                    str(p.get("prompt", "")),
                )
                self.steps += 1
                if self.visit.attempt == 1:
                    self.path.append(p["node"])
            case EventType.NODE_OUTCOME:
                self.context.update(p.get("context_updates") or {})
                self.context["outcome"] = p["status"]
                self.context["preferred_label"] = p.get("preferred_label", "")
                attempt = self.visit.attempt if self.visit else 1
                self.visit, self.decided = None, Decided(p["node"], attempt, outcome_of(p))
                self.last[p["node"]] = self.decided.outcome.status
            case EventType.EDGE_TAKEN:
                self.decided, self.at = None, p["target"]
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


def replay(events: Iterable[JournalEvent], start: str, goal: str = "") -> State:
    """The state after `events`; a run with none begins at `start`, its goal in the
    context as `graph.goal`."""
    state = State(at=start, context={"graph.goal": goal})
    for e in events:
        state.add(e)
    return state
