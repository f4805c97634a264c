"""Running one node of a pipeline: its handler, from the journal, pausing the usual way.

Each handler returns the node's `Outcome`, or the run's (`RunOutcome`) when the run must stop
here: paused for a human (request.json, exit 101), interrupted, or ended by the model.

    codergen      the agent's Think-Act-Observe loop on the node's prompt; its final message
                  goes into the context, and states the outcome when it holds a status
                  block. Its tools, approvals and ask_human pause as in a run.
    interactive   each agent message is a free-text question; /done and /approve end the
                  node SUCCESS, /reject FAIL, anything else goes back to the agent. Every
                  human turn is journaled (the commit point of its answer, then a NODE_MESSAGE)
    wait.human    a `choice` question in the mailbox; its timeout is a durable `expires_at`
    tool          `tool_command` in the workspace; not re-run if a crash cut it short
    conditional, start: nothing to do; the edges' conditions route
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import assert_never

from deltad.agent import Agent, Invocation
from deltad.engine import Engine, RunContext
from deltad.engine import Outcome as RunOutcome
from deltad.engine.asking import Asking
from deltad.engine.interviewers import Interviewer
from deltad.engine.llm import ChatModel, tuned
from deltad.engine.sandbox import plan
from deltad.engine.tools import kill_orphan, run_tool, write_record
from deltad.errors import LLMError, UsageError
from deltad.protocol import (
    ActionStatus,
    EventType,
    InputType,
    InteractionRequest,
    RunStatus,
    exitcodes,
    utcnow,
)
from deltad.protocol.events import ActionResult, typed
from deltad.protocol.history import Call
from deltad.protocol.replies import Reply

from .gates import Gate, gate
from .interactive import AUTO_APPROVE_REPLY, ending
from .lanes import Holding
from .llmnode import Bounded, NodeTimedOut
from .model import Graph, Kind, Node
from .outcome import Outcome, Status, parse_reply
from .state import Visit

AgentLoader = Callable[[Path], tuple[Agent, ChatModel]]
CONTEXT_TEXT_LIMIT = 8000  # a response kept in the context (and shown in later prompts)
TOOL_TIMEOUT_SECONDS = 600.0  # a tool node without `timeout`
ENDINGS_HINT = "(reply to the agent; /done or /approve ends this step, /reject fails it)"


class NodeEngine(Engine):
    """The engine's loop for one codergen node: a final message ends the node, not the run
    (its outcome is RUNNING: the run goes on). `max_iterations` counts the model calls of the
    whole run, every node's: reaching it ends the run FAILED, as in any run. The cap is the
    run's (`--max-iterations`, else the run's agent's), also in a node with its own agent."""

    def __init__(self, ctx: RunContext, interviewer: Interviewer, max_iterations: int) -> None:
        super().__init__(ctx, interviewer)
        self.interviewer = interviewer
        self.max_iterations = max_iterations

    def completed(self, message: str) -> RunOutcome:
        return RunOutcome(RunStatus.RUNNING, 0, message)

    def pause(self, req: InteractionRequest) -> RunOutcome:
        return self._pause(req)

    def _pause(self, req: InteractionRequest) -> RunOutcome:
        if isinstance(self.interviewer, Holding) and self.interviewer.held:
            # A branch's question held back: the branch stops, the run does not (no status).
            return RunOutcome(RunStatus.WAITING_FOR_INPUT, exitcodes.WAITING, req.prompt, req)
        return super()._pause(req)


@dataclass
class NodeRun:
    """What a handler needs: the run, the graph, and the visit it is running."""

    ctx: RunContext
    interviewer: Interviewer
    graph: Graph
    visit: Visit
    agents: AgentLoader

    @property
    def node(self) -> Node:
        return self.graph.nodes[self.visit.node]

    def context_for_node(self) -> RunContext:
        """The run's context with this node's agent (its `agent` attribute, if any) and the
        model settings its NODE_START recorded (stylesheet and attributes)."""
        ctx = self.ctx
        if self.node.agent is not None and self.node.id not in self.graph.orchestra:
            agent, model = self.agents(self.node.agent)
            ctx = replace(ctx, agent=agent, model=model)
        if self.visit.system_prompt:  # an orchestra agent: the run agent's tools, its prompt
            ctx = replace(ctx, agent=replace(ctx.agent, system_prompt=self.visit.system_prompt))
        if not self.visit.llm:
            return ctx
        try:
            model = tuned(ctx.model, self.visit.llm, ctx.agent.config.providers)
        except LLMError as e:  # the agent's providers changed since the run was checked
            raise UsageError(f"node {self.node.id}: {e}") from None
        return replace(ctx, model=model)

    def engine(self, ctx: RunContext) -> NodeEngine:
        run = self.ctx  # the run's own agent sets the cap, not a node's `agent`
        limit = run.meta.max_iterations or run.agent.config.max_iterations
        return NodeEngine(ctx, self.interviewer, limit)

    def question(
        self, action_id: str, build: Callable[[], InteractionRequest]
    ) -> tuple[InteractionRequest, Reply | None]:
        """Ask once (durably: the journal keeps the question), then take the reply (None:
        nobody can answer now)."""
        ctx = self.ctx
        asking = Asking(ctx, self.interviewer, lambda req, reply: None)
        req = ctx.history.asked(action_id) or asking.record_asked(build())
        return req, asking.take(req)


Result = Outcome | RunOutcome


def run_node(run: NodeRun) -> Result:
    match run.node.kind:
        case Kind.CODERGEN:
            return codergen(run)
        case Kind.WAIT_HUMAN:
            return wait_human(run)
        case Kind.TOOL:
            return tool(run)
        case Kind.START | Kind.CONDITIONAL | Kind.EXIT:
            return Outcome(Status.SUCCESS)
        case Kind.PARALLEL | Kind.FAN_IN | Kind.MANAGER:  # the driver runs these; not here
            why = f"a {run.node.kind} node inside a branch or a child is not supported"
            return Outcome(Status.FAIL, failure_reason=why)
        case _:
            assert_never(run.node.kind)


# -- codergen and interactive ---------------------------------------------------------------
def responded(node: Node, message: str, status: Status = Status.SUCCESS, why: str = "") -> Outcome:
    text = message[:CONTEXT_TEXT_LIMIT]
    return Outcome(
        status,
        context_updates={"last_stage": node.id, "last_response": text, f"response.{node.id}": text},
        notes=message,
        failure_reason=why,
    )


def from_reply(node: Node, message: str) -> Outcome:
    """The outcome the model's final message states (plain prose: SUCCESS), with its context
    updates beside the node's response."""
    said = parse_reply(message)
    kept = responded(node, message, said.status, said.failure_reason)
    return replace(
        said,
        context_updates={**said.context_updates, **kept.context_updates},
        notes=said.notes or kept.notes,
    )


def codergen(run: NodeRun) -> Result:
    ctx = run.context_for_node()
    if run.visit.deadline and run.node.timeout is not None:  # the recorded deadline stands
        deadline = datetime.fromisoformat(run.visit.deadline)
        ctx = replace(ctx, model=Bounded(ctx.model, deadline, run.node.timeout))
    try:
        return _codergen(run, ctx)
    except NodeTimedOut as e:
        return Outcome(Status.FAIL, failure_reason=str(e))


def _codergen(run: NodeRun, ctx: RunContext) -> Result:
    while True:
        engine = run.engine(ctx)
        out = engine.drive()
        if out.status != RunStatus.RUNNING:
            return out  # paused, interrupted, or the run ended (max_iterations, a refusal)
        if not run.node.interactive:
            return from_reply(run.node, out.message)
        said = converse(run, engine, out.message)
        if said is not None:
            return said


def converse(run: NodeRun, engine: NodeEngine, message: str) -> Result | None:
    """One human turn of an interactive node: the node's outcome, a pause, or None when the
    reply went back to the agent (journaled: the next turn starts from it)."""
    ctx, node = run.ctx, run.node
    thought = ctx.history.last_thought
    assert thought is not None  # the engine stops on a final message
    action_id = f"{node.id}@{run.visit.seq}.{thought.seq}"

    def build() -> InteractionRequest:
        shown = message.strip() or "(the agent sent an empty message)"
        return InteractionRequest(
            prompt=f"{shown}\n\n{ENDINGS_HINT}",
            input_type=InputType.TEXT,
            run_id=ctx.meta.run_id,
            action_id=action_id,
            node_id=node.id,
        )

    req, reply = run.question(action_id, build)
    if reply is None:
        return engine.pause(req)
    if reply.outcome != "answered":
        return responded(node, message, Status.FAIL, f"human {reply.outcome}: no reply")
    text = AUTO_APPROVE_REPLY if reply.source == "auto" else (reply.value or "")
    if (status := ending(text)) is not None:
        why = "rejected by the human (/reject)" if status == Status.FAIL else ""
        return responded(node, message, status, why)
    ctx.journal.append(EventType.NODE_MESSAGE, {"node": node.id, "text": text})
    return None


# -- human gates ----------------------------------------------------------------------------
def gate_request(g: Gate, run_id: str, action_id: str) -> InteractionRequest:
    node = g.node
    now = utcnow()
    default, _ = g.resolve_default()
    return InteractionRequest(
        timestamp=now,
        prompt=g.question,
        input_type=InputType.CHOICE,
        run_id=run_id,
        action_id=action_id,
        options=g.options(),
        default=default.key if default else None,
        timeout_seconds=node.timeout,
        expires_at=now + timedelta(seconds=node.timeout) if node.timeout else None,
        node_id=node.id,
        respondents=list(g.respondents),
        approvals_required=g.approvals_required,
    )


def wait_human(run: NodeRun) -> Result:
    g = gate(run.graph, run.node.id)
    if not g.choices:
        return g.on_skipped()  # "No outgoing edges for human gate" (validation refuses it)
    action_id = f"{run.node.id}@{run.visit.seq}"
    req, reply = run.question(action_id, lambda: gate_request(g, run.ctx.meta.run_id, action_id))
    if reply is None:
        return run.engine(run.ctx).pause(req)
    match reply.outcome:
        case "timeout":
            return g.on_timeout()
        case "skipped":
            return g.on_skipped()
        case "answered":
            chosen = g.on_answer(reply.key or reply.value or "")
            if chosen is None:  # the choice kind refuses misfits first; never a fallback
                raise UsageError(f"the answer {reply.value!r} is not a choice of {run.node.id}")
            return chosen


# -- tools ----------------------------------------------------------------------------------
def tool(run: NodeRun) -> Result:
    ctx, node = run.ctx, run.node
    call = Call(f"{node.id}@{run.visit.seq}", "tool_command", "")
    command = node.tool_command or ""
    if call.id in ctx.history.results:  # finished before a crash: its result stands
        return _tool_outcome(_result_status(run, call.id), "")
    record = ctx.record_dir(call)
    if call.id in ctx.history.requested:  # started before a crash: never run twice
        kill_orphan(record)
        why = "interrupted before it finished; not re-run (check the workspace)"
        ctx.result(call, ActionStatus.ERROR, why)
        return Outcome(Status.FAIL, failure_reason=f"tool_command {why}")
    ctx.ensure_running()
    ctx.request(call, {"tool_command": command}, command)
    inv = Invocation(["sh", "-c", command], None, {})
    limit = node.timeout or TOOL_TIMEOUT_SECONDS
    sandbox = plan(ctx.agent, ctx.ws.root, None, protect=(Path(ctx.meta.agent_ref),))
    done = run_tool(inv, ctx.ws.root, limit, record, ctx.guard.window, sandbox=sandbox)
    redact = ctx.secrets.redactor()  # a secret the run was given never reaches its records
    done.stdout, done.stderr = redact(done.stdout), redact(done.stderr)
    write_record(record, command, done, redact)
    ok = done.exit_code == 0 and not done.error and not done.timed_out
    status = ActionStatus.SUCCESS if ok else ActionStatus.FAILED
    ctx.result(call, status, done.observation())
    return _tool_outcome(status, done.stdout)


def _result_status(run: NodeRun, action_id: str) -> ActionStatus:
    for e in reversed(run.ctx.journal.events):
        if (
            e.type == EventType.ACTION_RESULT
            and (r := typed(e, ActionResult)).action_id == action_id
        ):
            return r.status
    return ActionStatus.ERROR


def _tool_outcome(status: ActionStatus, stdout: str) -> Outcome:
    updates = {"tool.output": stdout[:CONTEXT_TEXT_LIMIT]} if stdout else {}
    if status == ActionStatus.SUCCESS:
        return Outcome(Status.SUCCESS, context_updates=updates)
    return Outcome(Status.FAIL, context_updates=updates, failure_reason="tool_command failed")
