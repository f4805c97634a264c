"""The Think-Act-Observe loop, driven from the journal.

Each turn asks the journal's read model what is pending (the last THOUGHT's tool calls without
a result) and does the next thing: run the ungated calls, put the gated ones to a human, ask
the model. Nothing is kept between turns but the journal, so a resumed process and the one
that paused make the same decision. Pausing and canceling are values the steps return, not
exceptions; the model's failures are exceptions from the model seam, handled in `drive`.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltad.agent import check_edits
from deltad.errors import LLMError
from deltad.protocol import (
    ActionStatus,
    CorruptFile,
    EventType,
    InteractionRequest,
    RunStatus,
    UnsafeFile,
    exitcodes,
    save_metadata,
    utcnow,
)
from deltad.protocol.events import RunEnd, Thought, typed
from deltad.protocol.history import Call
from deltad.protocol.kinds import kind_of
from deltad.protocol.replies import Reply

from . import ask_human, gate
from .act import act
from .asking import Asking
from .context import ASK_HUMAN, RunContext
from .interviewers import Interviewer, settle_mailbox
from .limits import over_iterations
from .llm import ModelRefused, ModelUnavailable
from .think import CutOff, think

EXIT_BY_STATUS = {
    RunStatus.COMPLETED: exitcodes.COMPLETED,
    RunStatus.FAILED: exitcodes.FAILED,
    RunStatus.CANCELED: exitcodes.CANCELED,
    RunStatus.WAITING_FOR_INPUT: exitcodes.WAITING,
}


@dataclass
class Outcome:
    status: RunStatus
    exit_code: int
    message: str = ""
    request: InteractionRequest | None = None


class Engine:
    def __init__(self, ctx: RunContext, interviewer: Interviewer) -> None:
        self.ctx = ctx
        self.asking = Asking(ctx, interviewer, self.validate_reply)
        self.max_iterations = ctx.meta.max_iterations or ctx.agent.config.max_iterations

    def validate_reply(self, req: InteractionRequest, reply: Reply) -> None:
        check_edits(self.ctx.agent, req, reply)

    def drive(self) -> Outcome:
        ctx = self.ctx
        if not ctx.history.started:
            ctx.journal.append(
                EventType.RUN_START,
                {"run_id": ctx.meta.run_id, "task": ctx.meta.task, "agent_ref": ctx.meta.agent_ref},
            )
        self._drop_answered_request()
        # A crash may have cut the metadata write after a THOUGHT: the journal's count stands.
        ctx.meta.iterations_completed = ctx.history.thoughts
        try:
            return self._loop()
        except ModelUnavailable as e:
            return self._stop_resumable(str(e), e.kind, exitcodes.MODEL_UNAVAILABLE)
        except CutOff as e:
            return self._stop_resumable(str(e), "model_output", exitcodes.FAILED)
        except ModelRefused as e:
            out = self.finish(RunStatus.FAILED, str(e), error_kind=e.kind)
            if e.config_var:  # a configuration problem, like a missing key
                out.exit_code = exitcodes.USAGE
            return out
        except LLMError as e:
            return self.finish(RunStatus.FAILED, str(e), error_kind="model_refused")

    def _loop(self) -> Outcome:
        ctx, history = self.ctx, self.ctx.history
        while True:
            ctx.guard.checkpoint()
            if (end := history.ended()) is not None:
                # Crashed after RUN_END but before the status write: finish that write.
                p = typed(end, RunEnd)
                return self.finish(p.status, p.reason, journal=False)
            if pending := history.pending_calls():
                if (stop := self._turn(pending)) is not None:
                    return stop
                continue
            last = history.last_thought
            if last is not None and not (thought := typed(last, Thought)).tool_calls:
                return self.completed(thought.content or "")
            if (why := over_iterations(history.thoughts, self.max_iterations)) is not None:
                return self.finish(RunStatus.FAILED, why)
            think(ctx)
            self._count_iteration()

    def _turn(self, pending: list[Call]) -> Outcome | None:
        """The pending calls of one turn: ungated ones first (ask_human among them, in order),
        then the gated ones, decided together."""
        ctx = self.ctx
        waiting = gate.gated(ctx, pending)
        for call in pending:
            if call in waiting:
                continue
            if call.name == ASK_HUMAN:
                if (req := ask_human.ask(ctx, self.asking, call)) is not None:
                    return self._pause(req)
            else:
                act(ctx, call)
            ctx.guard.checkpoint()
        if waiting:
            decided = gate.decide(ctx, self.asking, waiting)
            if isinstance(decided, gate.Canceled):
                return self._cancel(decided.by)
            if decided is not None:
                return self._pause(decided)
        return None

    # -- what a pipeline node changes (deltad/pipeline/nodes.py) ---------------------------------
    def completed(self, message: str) -> Outcome:
        """The model answered without calling a tool: the task is done."""
        return self.finish(RunStatus.COMPLETED, message)

    def _count_iteration(self) -> None:
        """Show the journal's count of model calls in the metadata (`delta status`)."""
        self.ctx.meta.iterations_completed = self.ctx.history.thoughts
        save_metadata(self.ctx.paths.metadata, self.ctx.meta)

    # -- how a drive ends ------------------------------------------------------------------------
    def finish(
        self, status: RunStatus, reason: str, *, journal: bool = True, error_kind: str | None = None
    ) -> Outcome:
        ctx = self.ctx
        ctx.ensure_running()
        if journal:
            ctx.journal.append(EventType.RUN_END, {"status": str(status), "reason": reason})
        failed = status != RunStatus.COMPLETED
        ctx.set_status(
            status, end_time=utcnow(), error=reason if failed else None, error_kind=error_kind
        )
        return Outcome(status, EXIT_BY_STATUS.get(status, exitcodes.FAILED), reason)

    def _stop_resumable(self, reason: str, kind: str, code: int) -> Outcome:
        """The model could not give a usable answer now: nothing recorded is lost, and the run
        waits, INTERRUPTED, for `delta run` (or deltad's model retries, for outages)."""
        ctx = self.ctx
        ctx.note(f"stopped: {reason}", "WARN")
        since = ctx.meta.model_failing_since or utcnow()
        ctx.set_status(
            RunStatus.INTERRUPTED, error=reason, error_kind=kind, model_failing_since=since
        )
        return Outcome(RunStatus.INTERRUPTED, code, reason)

    def _cancel(self, by: str) -> Outcome:
        for call in self.ctx.history.pending_calls():
            self.ctx.result(call, ActionStatus.ERROR, f"Not run: the run was canceled by {by}.")
        return self.finish(RunStatus.CANCELED, f"canceled by {by}")

    def _pause(self, req: InteractionRequest) -> Outcome:
        ctx = self.ctx
        if ctx.meta.status != RunStatus.WAITING_FOR_INPUT:
            ctx.ensure_running()
            ctx.set_status(RunStatus.WAITING_FOR_INPUT)
            ctx.note(f"paused: waiting for human input (request {req.request_id})")
        return Outcome(RunStatus.WAITING_FOR_INPUT, exitcodes.WAITING, req.prompt, req)

    def _drop_answered_request(self) -> None:
        """Tidy a mailbox a crash left behind: its question already has a recorded reply and
        nothing is pending on it any more."""
        ctx = self.ctx
        try:
            req = ctx.mailbox.read_request()
        except (CorruptFile, UnsafeFile):
            return
        if req is None or req.run_id != ctx.meta.run_id:
            return
        reply = self.asking.recorded(req)  # for a gated question, only a signed one
        if reply is None:
            return
        ids = [c.action_id for c in req.calls] or [req.action_id]
        if all(a in ctx.history.results for a in ids) or kind_of(req.input_type).per_call:
            if reply.source == "mailbox":
                ctx.mailbox.discard_answer()  # the very answer that was recorded
            else:  # answered elsewhere: a file here is a second answer, kept and reported
                settle_mailbox(ctx.mailbox, None, ctx.warn)
            ctx.mailbox.withdraw()
