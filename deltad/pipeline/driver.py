"""Driving a pipeline run: node after node, each step journaled before the next begins.

Each turn brings the run's state up to date with the journal's new events (`state.feed`: a step
costs the same at node 10 and at node 10,000) and does the one next thing: begin a node
(NODE_START), run the node in progress to its outcome (NODE_OUTCOME, with its context
changes), or route that outcome (EDGE_TAKEN; a retry begins the node again). A crash between
any two of these resumes at the right step; a node that finished is never run again.

Routing follows the attractor spec: a RETRY begins the node again while `max_retries` allows,
then is a FAIL; a FAIL takes only an edge whose condition holds, else the node's (then the
graph's) `retry_target` / `fallback_retry_target`, else the run FAILS with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from deltad.engine import Engine, RunContext
from deltad.engine import Outcome as RunOutcome
from deltad.engine.interviewers import Interviewer
from deltad.engine.limits import over_steps
from deltad.protocol import EventType, RunStatus, save_metadata

from .fidelity import DEFAULT, compose
from .gates import one_line
from .llmnode import start_payload
from .model import Graph, Kind, Node
from .nodes import AgentLoader, NodeRun, run_node
from .outcome import Outcome, Status
from .routing import Step, select_edge
from .state import Decided, State, Visit, feed, outcome_payload, replay


def compose_prompt(node: Node, goal: str, context: Mapping[str, Any]) -> str:
    """A codergen node's prompt ($goal expanded) at the default fidelity (compact)."""
    text = (node.attrs.get("prompt") or node.label).replace("$goal", goal)
    return compose(text, DEFAULT, goal, "", context, ())


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
        state = replay((), self.start)  # kept up to date: each event is added once
        fed = 0
        while True:
            ctx.guard.checkpoint()
            if (end := ctx.history.ended()) is not None:
                p = end.payload  # crashed after RUN_END but before the status write
                return self.finish(RunStatus(p["status"]), p.get("reason", ""), journal=False)
            fed = feed(state, ctx.journal.events, fed)
            if (stop := self._step(state)) is not None:
                return stop

    def _step(self, state: State) -> RunOutcome | None:
        if state.visit is not None:
            result = run_node(
                NodeRun(self.ctx, self.interviewer, self.graph, state.visit, self.agents)
            )
            if isinstance(result, RunOutcome):
                return result
            self._record(state.visit, result)
            return None
        if state.decided is not None:
            return self._route(state.decided, state)
        assert state.at is not None
        if self.graph.nodes[state.at].kind == Kind.EXIT:
            return self._exit(state)
        return self._begin(state.at, 1, state)

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
        if not unmet:
            last = str(state.context.get("last_response") or "")
            return self.finish(RunStatus.COMPLETED, last or f"the pipeline reached {state.at}")
        gate, target = unmet[0], self._retry_target(unmet[0])
        why = f"goal gate {gate.id} did not succeed ({state.last[gate.id]})"
        if target is None:
            return self.finish(RunStatus.FAILED, why)
        assert state.at is not None
        self._take(state.at, target, "goal_gate", why)
        return None

    def _begin(self, node_id: str, attempt: int, state: State) -> RunOutcome | None:
        """Begin a visit of `node_id`, unless the run has made all the visits it may."""
        ctx, node = self.ctx, self.graph.nodes[node_id]
        if (why := over_steps(state.steps, self.max_steps)) is not None:
            return self.finish(RunStatus.FAILED, f"{why}; next was {node_id}")
        ctx.ensure_running()
        ctx.journal.append(
            EventType.NODE_START,
            {
                "node": node_id,
                "kind": str(node.kind),
                "attempt": attempt,
                **start_payload(self.graph, node, state, ctx.meta.task, ctx.meta.run_id),
                "iterations_before": ctx.history.thoughts,
            },
        )
        ctx.meta.current_node = node_id
        save_metadata(ctx.paths.metadata, ctx.meta)
        return None

    def _record(self, visit: Visit, outcome: Outcome) -> None:
        node = self.graph.nodes[visit.node]
        if outcome.status == Status.RETRY and visit.attempt > node.max_retries:
            why = outcome.failure_reason or "retry"
            outcome = replace(
                outcome,
                status=Status.FAIL,
                failure_reason=f"{why}; gave up after {visit.attempt} attempt(s) "
                f"(max_retries {node.max_retries})",
            )
        self.ctx.ensure_running()
        self.ctx.journal.append(EventType.NODE_OUTCOME, outcome_payload(node.id, outcome))

    def _route(self, decided: Decided, state: State) -> RunOutcome | None:
        node, outcome, context = self.graph.nodes[decided.node], decided.outcome, state.context
        if outcome.status == Status.RETRY:  # _record made it a FAIL once retries ran out
            return self._begin(node.id, decided.attempt + 1, state)
        sel = select_edge(self.graph, node.id, outcome, context)
        if outcome.status == Status.FAIL and sel.step != Step.CONDITION:
            target = self._retry_target(node)
            why = outcome.failure_reason or "it failed"
            if target is None:
                return self.finish(RunStatus.FAILED, f"node {node.id} failed: {one_line(why)}")
            self._take(node.id, target, "retry_target", f"{node.id} failed: {why}")
            return None
        if sel.edge is None:
            last = str(context.get("last_response") or "")
            return self.finish(RunStatus.COMPLETED, last or f"the pipeline ended at {node.id}")
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

    def _take(self, source: str, target: str, step: str, reason: str) -> None:
        self.ctx.ensure_running()
        self.ctx.journal.append(
            EventType.EDGE_TAKEN,
            {"source": source, "target": target, "step": step, "reason": one_line(reason)},
        )
