"""Driving a pipeline run: node after node, each step journaled before the next begins.

Each turn folds the journal's new events into the run's state (`PipelineEngine.state`: each
event once, never a replay per step, so a step costs the same at node 10 and at node 10,000)
and does the one next thing: begin a node (NODE_START), run the node in progress to its
outcome (NODE_OUTCOME, with its context changes), or route that outcome (EDGE_TAKEN; a retry
begins the node again). A crash between any two of these resumes at the right step; a node
that finished is never run again.

Routing follows the attractor spec: a RETRY begins the node again, after the spec's backoff,
while `max_retries` allows, then is a FAIL (a PARTIAL_SUCCESS with `allow_partial`); a FAIL
takes only an edge whose condition holds, else the node's (then the graph's) `retry_target` /
`fallback_retry_target`, else the run FAILS with the reason.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from deltad.engine import Engine, RunContext
from deltad.engine import Outcome as RunOutcome
from deltad.engine.hooks import Point
from deltad.engine.interviewers import Interviewer
from deltad.engine.limits import over_steps
from deltad.pacing import Pacing, equal_jitter
from deltad.protocol import EventType, RunStatus, save_metadata
from deltad.protocol.events import RunEnd, typed
from deltad.protocol.fsio import atomic_write

from . import manager, parallel
from .fidelity import DEFAULT, compose
from .gates import one_line
from .llmnode import start_payload
from .load import load_child_text, read_dot
from .model import Graph, Kind, Node
from .nodes import AgentLoader, NodeRun, codergen, run_node
from .outcome import Outcome, Status
from .problems import GraphError
from .routing import Step, select_edge
from .state import Branch, Decided, Lane, State, Visit, outcome_payload, replay

# The spec's standard retry policy (§3.6): 200 ms, doubled per attempt, at most 60 s. Short
# enough to wait in-process: a crash during a wait waits again on resume.
BACKOFF_INITIAL_SECONDS = 0.2
BACKOFF_CAP_SECONDS = 60.0


def backoff_seconds(attempt: int, r: float) -> float:
    """The wait before attempt `attempt` (2, 3, ...) of a node, jittered by `r` in [0, 1)."""
    return equal_jitter(Pacing(BACKOFF_INITIAL_SECONDS, BACKOFF_CAP_SECONDS).delay(attempt - 1), r)


def compose_prompt(node: Node, goal: str, context: Mapping[str, Any]) -> str:
    """A codergen node's prompt ($goal expanded) at the default fidelity (compact)."""
    text = (node.attrs.get("prompt") or node.label).replace("$goal", goal)
    return compose(text, DEFAULT, goal, "", context, ())


def after_attempt(outcome: Outcome, attempt: int, max_retries: int, allow_partial: bool) -> Outcome:
    """The outcome to record (§3.5): a RETRY with no retry left is a FAIL that says so, or a
    PARTIAL_SUCCESS when the node allows partial results; anything else as it is."""
    if outcome.status != Status.RETRY or attempt <= max_retries:
        return outcome
    why = outcome.failure_reason or "retry"
    spent = f"after {attempt} attempt(s) (max_retries {max_retries})"
    if allow_partial:
        return replace(
            outcome,
            status=Status.PARTIAL_SUCCESS,
            notes=f"{why}; retries exhausted {spent}, partial accepted",
        )
    return replace(outcome, status=Status.FAIL, failure_reason=f"{why}; gave up {spent}")


class PipelineEngine(Engine):
    def __init__(
        self, ctx: RunContext, interviewer: Interviewer, graph: Graph, agents: AgentLoader
    ) -> None:
        super().__init__(ctx, interviewer)
        self.interviewer = interviewer
        self.graph = graph
        self.agents = agents
        start = graph.start
        assert start is not None  # validation refuses a graph without one start
        self.start = start.id
        self.max_steps = ctx.meta.max_steps or graph.max_steps  # delta run --max-steps first
        self.goal = ctx.meta.task  # what `$goal` means in this graph's prompts
        self.tag: dict[str, str] = {}  # marks the journal lines of a child pipeline
        self._children: dict[str, ChildEngine] = {}
        self._state = State()
        self._seen = -1  # events folded into _state: the journal is read once, not per step
        self.sleep: Callable[[float], None] = time.sleep

    def state(self) -> State:
        """Where the run stands: the journal's events folded in once each, in order."""
        events = self.ctx.journal.events
        if self._seen < 0:
            self._state, self._seen = replay((), self.start, self.ctx.meta.task), 0
        for e in events[self._seen :]:
            self._state.add(e)
        self._seen = len(events)
        return self._state

    def drive(self) -> RunOutcome:
        ctx = self.ctx
        if not ctx.history.started:
            ctx.journal.append(
                EventType.RUN_START,
                {
                    "run_id": ctx.meta.run_id,
                    "task": ctx.meta.task,
                    "agent_ref": ctx.meta.agent_ref,
                    "pipeline": self.graph.name or "",
                },
            )
        self._drop_answered_request()
        while True:
            ctx.guard.checkpoint()
            if (end := ctx.history.ended()) is not None:
                p = typed(end, RunEnd)  # crashed after RUN_END but before the status write
                return self.finish(p.status, p.reason, journal=False)
            if (stop := self._step(self.state())) is not None:
                return stop

    def _step(self, state: State) -> RunOutcome | None:
        if state.visit is not None:
            return self._run_visit(state, state.visit)
        if state.decided is not None:
            return self._route(state.decided, state)
        assert state.at is not None
        if self.graph.nodes[state.at].kind == Kind.EXIT:
            return self._exit(state)
        return self._begin(state.at, 1, state)

    def _run_visit(
        self, state: State, visit: Visit, branch: int | None = None
    ) -> RunOutcome | None:
        """Run the node in progress to its outcome (journaled), or to a pause."""
        match self.graph.nodes[visit.node].kind:
            case Kind.PARALLEL if branch is None:
                return self._parallel(state, visit)
            case Kind.FAN_IN if branch is None:
                return self._fan_in(state, visit)
            case Kind.MANAGER if branch is None and not self.tag:
                return self._manager(state, visit)
        result = run_node(NodeRun(self.ctx, self.interviewer, self.graph, visit, self.agents))
        if isinstance(result, RunOutcome):
            return result  # paused; in a branch, the other branches' steps are journaled
        self._record(visit, result, branch)
        return None

    # -- parallel branches (parallel.py decides; here they are journaled) --------------------
    def _parallel(self, state: State, visit: Visit) -> RunOutcome | None:
        """One step of a parallel node: fan out (an EDGE_TAKEN per branch), step the branch
        `schedule` picks, or, every branch over, join them into the node's outcome."""
        edges, fan = self.graph.outgoing(visit.node), state.fan
        begun = len(fan.branches) if fan is not None and fan.node == visit.node else 0
        if fan is None or begun < len(edges):
            for i, e in enumerate(edges[begun:], start=begun):
                self._take(visit.node, e.target, "fan_out", f"branch {i + 1} of {len(edges)}", i)
            return None
        lanes = [
            parallel.Lane(
                b.visit is not None or b.decided is not None, b.at, b.result is not None, b.begun
            )
            for b in fan.branches
        ]
        limit = parallel.max_parallel_of(self.graph.nodes[visit.node])
        if (pick := parallel.schedule(lanes, self.graph, limit or 1)) is None:
            policy = self.graph.nodes[visit.node].attrs.get("join_policy", "wait_all")
            results = [b.result or {} for b in fan.branches]
            self._record(visit, parallel.join(results, policy))
            return None
        return self._branch_step(state, fan.branches[pick], pick)

    def _fan_in(self, state: State, visit: Visit) -> RunOutcome | None:
        """The heuristic's pick (§4.9); with a `prompt`, the model ranks the branches (their
        results are in its prompt) and its reply's outcome and context updates prevail."""
        picked = parallel.fan_in(state.context)
        if not self.graph.nodes[visit.node].prompt or picked.status == Status.FAIL:
            self._record(visit, picked)
            return None
        run = NodeRun(self.ctx, self.interviewer, self.graph, visit, self.agents)
        said = codergen(run)
        if isinstance(said, RunOutcome):
            return said
        updates = {**picked.context_updates, **said.context_updates}
        self._record(visit, replace(said, context_updates=updates))
        return None

    def _branch_step(self, state: State, b: Branch, i: int) -> RunOutcome | None:
        if b.visit is not None:
            return self._run_visit(state, b.visit, i)
        if b.decided is None:
            assert b.at is not None
            if self._ends_branch(b.at):  # an edge straight to the fan-in: an empty branch
                self._end_branch(b, i, b.at, b.at, Outcome(Status.SUCCESS, notes="empty branch"))
                return None
            return self._begin(b.at, 1, state, branch=i)
        node, outcome = self.graph.nodes[b.decided.node], b.decided.outcome
        if outcome.status == Status.RETRY:
            return self._retry(node.id, b.decided.attempt + 1, state, i)
        sel = select_edge(self.graph, node.id, outcome, b.context)
        target = sel.edge.target if sel.edge else ""
        failed = outcome.status == Status.FAIL and sel.step != Step.CONDITION
        if failed or not target or self._ends_branch(target):
            self._end_branch(b, i, node.id, target, outcome)
        else:
            self._take(node.id, target, str(sel.step), sel.reason, i)
        return None

    def _ends_branch(self, node_id: str) -> bool:
        return self.graph.nodes[node_id].kind in (Kind.FAN_IN, Kind.EXIT)

    def _end_branch(self, b: Branch, i: int, last: str, target: str, outcome: Outcome) -> None:
        """The branch is over: its result, for the join, in the line that ends it."""
        self.ctx.ensure_running()
        self._append(
            EventType.EDGE_TAKEN,
            {
                "source": last,
                "target": target,
                "step": "branch_end",
                "reason": f"branch {b.start} ended at {last} ({outcome.status})",
                "branch": i,
                "result": parallel.branch_result(b.start, last, outcome),
            },
        )

    def _exit(self, state: State) -> RunOutcome | None:
        """The exit: done, unless a goal gate that ran did not succeed (attractor §3.4): then
        its retry target, else the run fails."""
        self.ctx.ensure_running()
        met = (Status.SUCCESS, Status.PARTIAL_SUCCESS)
        unmet = [  # a goal gate never visited has nothing to say
            n
            for n in self.graph.nodes.values()
            if n.goal_gate and state.last.get(n.id, Status.SUCCESS) not in met
        ]
        assert state.at is not None
        if not unmet:
            last = str(state.context.get("last_response") or "")
            return self._end(
                RunStatus.COMPLETED, last or f"the pipeline reached {state.at}", state.at
            )
        gate, target = unmet[0], self._retry_target(unmet[0])
        why = f"goal gate {gate.id} did not succeed ({state.last[gate.id]})"
        if target is None:
            return self._end(RunStatus.FAILED, why, state.at)
        self._take(state.at, target, "goal_gate", why)
        return None

    def _retry(
        self,
        node_id: str,
        attempt: int,
        state: State,
        branch: int | None = None,
    ) -> RunOutcome | None:
        """Wait the backoff (§3.6), then begin the node again. The wait is in-process: at most
        60 s, and a signal still stops the run at the checkpoint after it."""
        delay = backoff_seconds(attempt, random.random())
        if over_steps(state.steps, self.max_steps) is None:
            self.sleep(delay)
            self.ctx.guard.checkpoint()
        return self._begin(node_id, attempt, state, delay, branch)

    def _begin(
        self,
        node_id: str,
        attempt: int,
        state: State,
        backoff: float = 0.0,
        branch: int | None = None,
    ) -> RunOutcome | None:
        """Begin a visit of `node_id`, unless the run has made all the visits it may."""
        ctx, node = self.ctx, self.graph.nodes[node_id]
        if (why := over_steps(state.steps, self.max_steps)) is not None:
            return self.finish(RunStatus.FAILED, f"{why}; next was {node_id}")
        ctx.ensure_running()
        lane: Lane = state
        if branch is not None:
            assert state.fan is not None  # a branch runs only while its parallel node does
            lane = state.fan.branches[branch]
        self._append(
            EventType.NODE_START,
            {
                "node": node_id,
                "kind": str(node.kind),
                "attempt": attempt,
                **start_payload(self.graph, node, state, lane, self.goal, ctx.meta.run_id),
                "iterations_before": ctx.history.thoughts,
                **({"backoff_seconds": round(backoff, 3)} if backoff else {}),
                **({} if branch is None else {"branch": branch}),
            },
        )
        ctx.meta.current_node = node_id
        save_metadata(ctx.paths.metadata, ctx.meta)
        return None

    def _record(self, visit: Visit, outcome: Outcome, branch: int | None = None) -> None:
        node = self.graph.nodes[visit.node]
        outcome = after_attempt(outcome, visit.attempt, node.max_retries, node.allow_partial)
        self.ctx.ensure_running()
        payload = outcome_payload(node.id, outcome)
        self._append(
            EventType.NODE_OUTCOME, payload if branch is None else {**payload, "branch": branch}
        )
        self.ctx.hooks.reached(Point.AFTER_OUTCOME)

    def _route(self, decided: Decided, state: State) -> RunOutcome | None:
        node, outcome, context = self.graph.nodes[decided.node], decided.outcome, state.context
        if outcome.status == Status.RETRY:  # _record made it a FAIL once retries ran out
            return self._retry(node.id, decided.attempt + 1, state)
        if node.kind == Kind.PARALLEL and outcome.status != Status.FAIL:
            target = parallel.fan_in_of(self.graph, node.id)
            assert target is not None  # validation refuses a parallel node without one
            self._take(node.id, target, "fan_in", outcome.notes or "branches joined")
            return None
        sel = select_edge(self.graph, node.id, outcome, context)
        if outcome.status == Status.FAIL and sel.step != Step.CONDITION:
            target = self._retry_target(node)
            why = outcome.failure_reason or "it failed"
            if target is None:
                return self._end(
                    RunStatus.FAILED, f"node {node.id} failed: {one_line(why)}", node.id
                )
            self._take(node.id, target, "retry_target", f"{node.id} failed: {why}")
            return None
        if sel.edge is None:
            last = str(context.get("last_response") or "")
            return self._end(
                RunStatus.COMPLETED, last or f"the pipeline ended at {node.id}", node.id
            )
        if sel.edge.loop_restart:  # §2.7: the pipeline starts afresh at the edge's target
            why = f"loop_restart: {sel.reason}; the pipeline starts afresh at {sel.edge.target}"
            self._take(node.id, sel.edge.target, "loop_restart", why)
            return None
        self._take(node.id, sel.edge.target, str(sel.step), sel.reason)
        return None

    def _retry_target(self, node: Node) -> str | None:
        g = self.graph
        found = (
            node.retry_target
            or node.fallback_retry_target
            or g.retry_target
            or g.fallback_retry_target
        )
        return found if found in g.nodes else None

    def _take(
        self, source: str, target: str, step: str, reason: str, branch: int | None = None
    ) -> None:
        self.ctx.ensure_running()
        payload = {"source": source, "target": target, "step": step, "reason": one_line(reason)}
        self._append(
            EventType.EDGE_TAKEN, payload if branch is None else {**payload, "branch": branch}
        )

    def _append(self, kind: EventType, payload: dict[str, Any]) -> None:
        self.ctx.journal.append(kind, {**payload, **self.tag})

    def _end(self, status: RunStatus, why: str, at: str) -> RunOutcome | None:
        """The pipeline is over at node `at`: the run ends (a child pipeline's manager goes on)."""
        return self.finish(status, why)

    # -- the manager loop (manager.py judges; here the child is stepped and journaled) --------
    def _manager(self, state: State, visit: Visit) -> RunOutcome | None:
        """One step of a manager node: start its child, judge the child as it stands (the
        node's outcome), or step the child once (a node begun, run, or routed)."""
        node = self.graph.nodes[visit.node]
        sub = self._child_engine(node)
        if isinstance(sub, str):  # the child's file went bad since the check: the node fails
            self._record(visit, Outcome(Status.FAIL, failure_reason=sub))
            return None
        child = state.child if state.child is not None and state.child.node == node.id else None
        if child is None:
            self._start_child(node, sub)
            return None
        seen = manager.observe(child.state, sub.start)
        if (verdict := manager.judge(manager.settings_of(node), seen, state.context)) is not None:
            self._record(visit, verdict)
            return None
        return sub._step(child.state)

    def _start_child(self, node: Node, sub: ChildEngine) -> None:
        self.ctx.ensure_running()
        name = f" {sub.graph.name}" if sub.graph.name else ""
        self._append(
            EventType.EDGE_TAKEN,
            {
                "source": node.id,
                "target": sub.start,
                "step": "child_start",
                "reason": f"the child pipeline{name} starts",
                "goal": sub.goal,
            },
        )

    def _child_engine(self, node: Node) -> ChildEngine | str:
        """The engine of the node's child pipeline, from the run's copy of the child's file
        (made when the child first starts); a reason when it cannot be read."""
        if (found := self._children.get(node.id)) is not None:
            return found
        try:
            graph = child_graph(self.ctx.paths.configuration, node.id, self.graph)
        except GraphError as e:
            return f"the child pipeline cannot run: {e.lines()[0]}"
        sub = ChildEngine(self, graph, node.id)
        self._children[node.id] = sub
        return sub


class ChildEngine(PipelineEngine):
    """A manager node's child pipeline, driven a step at a time by its parent: its journal
    lines are marked `child`, and its end is a journal line the manager judges, not the
    run's end."""

    def __init__(self, parent: PipelineEngine, graph: Graph, manager_node: str) -> None:
        super().__init__(parent.ctx, parent.interviewer, graph, parent.agents)
        self.max_steps = parent.max_steps
        self.goal = graph.goal or parent.goal
        self.tag = {"child": manager_node}
        self.sleep = parent.sleep

    def _end(self, status: RunStatus, why: str, at: str) -> RunOutcome | None:
        self.ctx.ensure_running()
        ended = "completed" if status == RunStatus.COMPLETED else "failed"
        self._append(
            EventType.EDGE_TAKEN,
            {"source": at, "target": "", "step": "child_end", "status": ended, "reason": why},
        )
        return None


def child_graph(configuration: Path, node_id: str, parent: Graph) -> Graph:
    """The child pipeline as the run first read it: the run's copy of `stack.child_dotfile`
    (`configuration/child.<node>.dot`), made from the original on first use."""
    assert parent.child_dotfile is not None  # validation refuses a manager without one
    copy = configuration / f"child.{node_id}.dot"
    if not copy.exists():
        atomic_write(copy, read_dot(parent.child_dotfile).encode("utf-8"))
    text = read_dot(copy)
    return load_child_text(text, str(copy), parent.child_dotfile.resolve().parent)
