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

import os
from collections.abc import Callable

from deltad import tracing
from deltad.protocol import EventType, InteractionRequest, followup, seal, utcnow
from deltad.protocol.kinds import kind_of, on_timeout
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
        self._keys: list[bytes] | None = None
        self._said: set[tuple[str, str]] = set()  # journal records refused, said once each

    def record_asked(self, req: InteractionRequest) -> InteractionRequest:
        """Journal the question once, with the context a person decides with (from the journal
        as it stands, so a question asked again after a crash carries the same)."""
        if req.context is None:
            req.context = question_context(self.ctx.journal.events, self.ctx.meta.task, req.prompt)
        if req.traceparent is None:  # the trace this run is part of, if any (deltad/tracing.py)
            req.traceparent = tracing.checked(os.environ.get(tracing.ENV))
        if (agents := self.ctx.agent.config.follow_up) is not None:  # the question's own win
            req.follow_up = req.follow_up.over(agents) if req.follow_up else agents
        self.ctx.journal.append(
            EventType.HUMAN_INTERACTION, {"phase": "asked", "request": req.model_dump(mode="json")}
        )
        return req

    def keys(self) -> list[bytes]:
        """The daemon's public keys (protocol/seal.py), read once; none when unknown here."""
        if self._keys is None:
            try:
                self._keys = seal.trusted_keys()
            except seal.BadKey as e:
                self.ctx.warn(f"{seal.ENV}: {e}; no signed answer can be checked")
                self._keys = []
        return self._keys

    def signed(self, req: InteractionRequest) -> bool:
        """Does only an answer the daemon signed count (protocol/seal.py)? A gated question, or
        an approval under an agent policy that gates it as the policy stands: a question line
        appended to the journal cannot make an approval ungated."""
        policy = self.ctx.agent.config.approval
        approval = kind_of(req.input_type).per_call  # the vocabulary tells an approval
        return seal.gated(req) or (approval and policy is not None and policy.gated)

    def take(self, req: InteractionRequest) -> Reply | None:
        """The reply to `req`, committed and with the mailbox tidied, or None when nobody can
        answer now (the run pauses). For a gated question (`signed`) only an answer the daemon
        signed counts, taken from the mailbox or read back from the journal."""
        signed = self.signed(req)
        reply = self.recorded(req, signed)
        if reply is None:
            reply = self._obtain(req, signed)
            if reply is None:
                return None
            self._record(req, reply)
        self.ctx.ensure_running()
        self.ctx.hooks.reached(Point.AFTER_STATUS)
        self.interviewer.settle(req, reply)
        return reply

    def recorded(self, req: InteractionRequest, signed: bool | None = None) -> Reply | None:
        """The reply on record: the first, or for a gated question the first whose seal checks
        out. A record this process did not write (an appended line) is said and skipped; the
        question then waits for a signed answer as if it were not there."""
        replies = self.ctx.history.replies_to(req.request_id)
        if not (self.signed(req) if signed is None else signed):
            return replies[0] if replies else None
        for reply in replies:
            if (why := seal.problem(req, reply, self.keys())) is None:
                return reply
            if (said := (req.request_id, why)) not in self._said:
                self._said.add(said)
                self.ctx.warn(
                    f"a reply to question {req.request_id} in the journal is not taken: {why}"
                )
        return None

    def _obtain(self, req: InteractionRequest, signed: bool = False) -> Reply | None:
        while True:
            reply = self.interviewer.ask(req)
            if reply is None:
                return on_timeout(req) if req.expired() else None
            if reply.outcome == "timeout":
                return on_timeout(req)
            if signed and (why := seal.problem(req, reply, self.keys())) is not None:
                if reply.source != "mailbox" or (reply.seal and not self.keys()):
                    # The terminal or a script cannot sign; a sealed file that cannot be
                    # checked here is left for the daemon's resume, which can.
                    self.ctx.warn(f"the answer to question {req.request_id} is not taken: {why}")
                    return None
                self.interviewer.reject(req, why)  # set aside (response.rejected-*), said
                return None
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
