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
from deltad.protocol.events import Asked, EdgeTaken, NodeOutcome, NodeStart, typed
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
    system_prompt: str = ""  # an orchestra.yaml agent's, as recorded ("" for the run agent's)


@dataclass(frozen=True)
class Decided:
    """A node's outcome, not yet routed."""

    node: str
    attempt: int
    outcome: Outcome


@dataclass
class Lane:
    """A line of nodes: the run's own, or one branch of a parallel node."""

    context: dict[str, Any] = field(default_factory=dict)
    at: str | None = None  # the node to begin next
    visit: Visit | None = None
    decided: Decided | None = None
    came_from: str | None = None  # the source of the edge taken to `at` (None: no edge)
    thread: str | None = None  # the latest visit's thread


@dataclass
class Branch(Lane):
    start: str = ""  # the branch's first node (its id in parallel.results)
    result: dict[str, Any] | None = None  # set when the branch ended
    begun: bool = False  # a node of it began (it counts against the node's max_parallel)
    asking: str | None = None  # the request id of its node's unanswered question


@dataclass
class Fan:
    """A parallel node's branches, while they run (until its own NODE_OUTCOME)."""

    node: str
    seq: int = 0  # its first fan_out line: the branches' lanes of the journal begin there
    branches: list[Branch] = field(default_factory=list)


@dataclass
class State(Lane):
    path: list[str] = field(default_factory=list)  # nodes begun, in order (first attempts)
    last: dict[str, Status] = field(default_factory=dict)  # each node's latest outcome
    steps: int = 0  # node visits begun (every NODE_START, retries too): what max_steps bounds
    stages: list[Stage] = field(default_factory=list)  # finished visits, for summaries
    threads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # their visits
    fan: Fan | None = None
    child: ChildRun | None = None  # a manager node's child pipeline, while it runs
    finished: tuple[str, str] | None = None  # a child pipeline's end: (completed|failed, why)

    def lane(self, branch: int | None, fan_out: bool = False) -> Lane:
        """The lane an event belongs to: a branch's (its `branch` index), else the run's."""
        if branch is not None and self.fan is not None and not fan_out:
            return self.fan.branches[branch]
        return self

    def add(self, e: JournalEvent) -> None:
        if e.type == EventType.EDGE_TAKEN and e.payload.get("step") == "child_start":
            p = typed(e, EdgeTaken)
            child = State(context={"graph.goal": p.goal}, at=p.target)
            child.steps = self.steps  # max_steps bounds the run's visits, the child's too
            self.child = ChildRun(p.source, child)
            return
        if e.payload.get("child") is not None and self.child is not None:
            self.child.state.add(e)
            self.steps = max(self.steps, self.child.state.steps)
            return
        match e.type:
            case EventType.NODE_START:
                self.began(e.seq, typed(e, NodeStart))
            case EventType.NODE_OUTCOME:
                self.ended(e.seq, typed(e, NodeOutcome))
            case EventType.EDGE_TAKEN:
                self.went(typed(e, EdgeTaken), e.seq)
            case EventType.HUMAN_INTERACTION if e.payload.get("branch") is not None:
                self.asked_in(e)
            case _:
                pass

    def began(self, seq: int, p: NodeStart) -> None:
        lane = self.lane(p.branch)
        lane.at, lane.decided = None, None
        lane.context["current_node"] = p.node  # built-in keys (§5.1)
        lane.context[f"internal.retry_count.{p.node}"] = p.attempt - 1
        lane.visit = Visit(
            p.node,
            seq,
            p.attempt,
            p.prompt,
            {k: str(v) for k, v in (p.llm or {}).items()},
            p.thread or p.node,
            tuple(p.thread_history or ()),
            p.deadline or "",
            p.system_prompt or "",
        )
        lane.thread = lane.visit.thread
        if isinstance(lane, Branch):
            lane.begun = True
        self.steps += 1
        if lane.visit.attempt == 1:
            self.path.append(p.node)

    def ended(self, seq: int, p: NodeOutcome) -> None:
        lane = self.lane(p.branch)
        lane.context.update(p.context_updates)
        lane.context["outcome"] = p.status
        lane.context["preferred_label"] = p.preferred_label
        attempt = lane.visit.attempt if lane.visit else 1
        if lane.visit is not None:
            self.threads.setdefault(lane.visit.thread, []).append((lane.visit.seq, seq))
        self.stages.append(Stage(p.node, p.status, p.notes))
        lane.visit, lane.decided = None, Decided(p.node, attempt, outcome_of(p))
        self.last[p.node] = lane.decided.outcome.status
        if lane is self:
            self.fan = None  # a parallel node's outcome: its branches are over
            self.child = None  # a manager node's: its child is over

    def asked_in(self, e: JournalEvent) -> None:
        """A question of a branch's node: the branch is blocked on it until it is answered."""
        lane = self.lane(e.payload.get("branch"))
        if not isinstance(lane, Branch):
            return
        if e.payload.get("phase") == "asked":
            lane.asking = typed(e, Asked).request.request_id
        elif lane.asking == e.payload.get("request_id"):
            lane.asking = None

    def went(self, p: EdgeTaken, seq: int = 0) -> None:
        lane = self.lane(p.branch, fan_out=p.step == "fan_out")
        if p.step == "fan_out":
            if self.fan is None or self.fan.node != p.source:
                self.fan = Fan(p.source, seq)
            self.fan.branches.append(
                Branch(
                    context=dict(self.context),
                    at=p.target,
                    came_from=p.source,
                    thread=self.thread,
                    start=p.target,
                )
            )
        elif p.step == "branch_end":
            assert isinstance(lane, Branch)
            lane.result, lane.decided, lane.at = p.result or {}, None, None
        elif p.step == "child_end":
            self.finished = (p.status or "failed", p.reason)
            lane.decided, lane.visit, lane.at = None, None, None
        elif p.step == "loop_restart":
            self.restart(p.target)
        else:
            lane.decided, lane.at = None, p.target
            jumped = p.step in ("retry_target", "goal_gate")  # not along an edge
            lane.came_from = None if jumped else p.source

    def restart(self, target: str) -> None:
        """A loop_restart edge (§2.7): the pipeline begins afresh at `target`: a new context
        (the goal kept), no outcomes, stages or threads of the earlier pass."""
        goal = self.context.get("graph.goal", "")
        self.context, self.last, self.stages, self.threads = {"graph.goal": goal}, {}, [], {}
        self.decided, self.visit, self.came_from, self.thread = None, None, None, None
        self.at = target


@dataclass
class ChildRun:
    """A manager node's child pipeline: its own state, folded from the events marked
    `child`."""

    node: str  # the manager node
    state: State


def outcome_of(p: NodeOutcome) -> Outcome:
    return Outcome(
        Status(p.status),
        preferred_label=p.preferred_label,
        suggested_next_ids=tuple(p.suggested_next_ids),
        context_updates=dict(p.context_updates),
        notes=p.notes,
        failure_reason=p.failure_reason,
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
    state = State(context={"graph.goal": goal}, at=start)
    for e in events:
        state.add(e)
    return state
