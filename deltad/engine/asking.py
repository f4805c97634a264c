"""The commit protocol of a human reply: one ingestion order for every question.

The journal owns a question's identity and its answer:
- `HUMAN_INTERACTION {phase: asked}` is written once per question; a resumed process rebuilds
  the same request (same request_id, same `expires_at`) from it, whichever mode asked first.
- `HUMAN_INTERACTION {phase: answered}` is the commit point for a reply: once it is journaled
  the answer is never taken again.
Order, for `ask_human` questions and approvals alike: secret (0600 store) → `answered` record
(fsynced) → status RUNNING → the mailbox is tidied (answer, then question) → the caller
journals the ACTION_RESULT(s). A crash anywhere repeats the step before the commit point, or
uses the recorded reply after it — never the answer file twice.
"""

from __future__ import annotations

from collections.abc import Callable

from deltad.protocol import EventType, InteractionRequest, followup, utcnow
from deltad.protocol.kinds import on_timeout
from deltad.protocol.replies import AnswerRejected, Reply

from .briefing import question_context
from .context import RunContext
from .hooks import Point
from .interviewers import Interviewer
from .secrets import handle

Validate = Callable[[InteractionRequest, Reply], None]


class Asking:
    def __init__(self, ctx: RunContext, interviewer: Interviewer, validate: Validate) -> None:
        self.ctx = ctx
        self.interviewer = interviewer
        self.validate = validate  # checks the engine makes beyond the kind (edits vs schema)

    def record_asked(self, req: InteractionRequest) -> InteractionRequest:
        """Journal the question once, with the context a person decides with (from the journal
        as it stands, so a question asked again after a crash carries the same)."""
        if req.context is None:
            req.context = question_context(self.ctx.journal.events, self.ctx.meta.task, req.prompt)
        if (agents := self.ctx.agent.config.follow_up) is not None:  # the question's own win
            req.follow_up = req.follow_up.over(agents) if req.follow_up else agents
        self.ctx.journal.append(
            EventType.HUMAN_INTERACTION, {"phase": "asked", "request": req.model_dump(mode="json")}
        )
        return req

    def take(self, req: InteractionRequest) -> Reply | None:
        """The reply to `req`, committed and with the mailbox tidied, or None when nobody can
        answer now (the run pauses)."""
        reply = self.ctx.history.reply(req.request_id)
        if reply is None:
            reply = self._obtain(req)
            if reply is None:
                return None
            self._record(req, reply)
        self.ctx.ensure_running()
        self.ctx.hooks.reached(Point.AFTER_STATUS)
        self.interviewer.settle(req, reply)
        return reply

    def _obtain(self, req: InteractionRequest) -> Reply | None:
        while True:
            reply = self.interviewer.ask(req)
            if reply is None:
                return on_timeout(req) if req.expired() else None
            if reply.outcome == "timeout":
                return on_timeout(req)
            try:
                self.validate(req, reply)
                return reply
            except AnswerRejected as e:
                if not self.interviewer.reject(req, str(e)):
                    # A timeout reply carries no edits: nothing left to check.
                    return on_timeout(req) if req.expired() else None

    def _record(self, req: InteractionRequest, reply: Reply) -> None:
        reply.at = utcnow()
        # What the daemon did before this reply (reminders, escalation), kept beside the
        # question where it may write; into the journal with the reply (the history shows it).
        if (done := followup.read(self.ctx.ws.interaction_dir, req.request_id)) is not None:
            reply.follow_up = done.shown()
        if req.is_secret and reply.outcome == "answered" and reply.value is not None:
            self.ctx.secrets.put(req.action_id, reply.value)
            self.ctx.hooks.reached(Point.AFTER_SECRET)
            reply.value = handle(req.action_id)
        self.ctx.hooks.reached(Point.BEFORE_JOURNAL)
        self.ctx.journal.append(
            EventType.HUMAN_INTERACTION,
            {
                "phase": "answered",
                "request_id": req.request_id,
                "action_id": req.action_id,
                "input_type": str(req.input_type),
                "reply": reply.model_dump(mode="json"),
                **({"node_id": req.node_id} if req.node_id else {}),
            },
        )
        self.ctx.hooks.reached(Point.AFTER_JOURNAL)
