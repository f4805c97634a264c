"""The core's stages of a question's trace (deltad/tracing.py; docs/daemon.md, "Traces"): from
the feed's events (announced, reminded, escalated) and from the resumes the daemon starts
(answered or expired, then the resume, its context handed to `delta run` as TRACEPARENT).

A question answered before the loop looked at it is never announced (the feed says nothing of
it), so its root is recorded by whichever comes first: its announcement or its resume.

Everything here runs on the loop and only hands finished spans to the tracer's queue. With
tracing off the service holds no `Traces` at all."""

from __future__ import annotations

from pathlib import Path

from deltad import tracing
from deltad.core.facts import Verdict
from deltad.inbox.feed import FeedEvent
from deltad.protocol import EventType, ProtocolError, Workspace
from deltad.protocol.viewing import tail
from deltad.tracing import Question, Stage

STAGES = {"request.reminder": "remind", "request.escalated": "escalate"}
# Of a resumed run's journal, what is read for the answered call's ACTION_RESULT: its end,
# bounded (the result follows the answer's record at the resume's start).
JOURNAL_TAIL_BYTES = 256 * 1024
JOURNAL_TAIL_EVENTS = 400
Attributes = dict[str, str | int | bool]


class Traces:
    def __init__(self, tracer: tracing.Tracer) -> None:
        self.tracer = tracer
        # Per workspace, its pending question as last seen: id, carried context, asked at.
        self._seen: dict[str, tuple[str, str | None, float | None, str | None]] = {}
        # Per workspace, its resume in flight: the question, the span's id, when submitted.
        self._resumes: dict[Path, tuple[Question, int, float, str]] = {}
        self._asked: dict[str, str] = {}  # per workspace, the question whose root is recorded

    def saw(self, ws: Path, v: Verdict) -> None:
        """A look's verdict, before its effects: what the events it causes are about."""
        if v.request_id is not None:
            self._seen[str(ws)] = (v.request_id, v.traceparent, v.created, v.input_type)

    def forget(self, ws: Path) -> None:
        self._seen.pop(str(ws), None)
        self._asked.pop(str(ws), None)
        self._resumes.pop(ws, None)

    def _ask(self, q: Question, asked: float | None, attrs: Attributes) -> None:
        """The question's root, once: from its asking (request.json's timestamp) until the
        daemon took note of it (its announcement, or its resume when nothing announced it)."""
        if self._asked.get(q.workspace) == q.request_id:
            return
        self._asked[q.workspace] = q.request_id
        now = tracing.now()
        stage = Stage("ask_human", asked or now, now, attrs, span_id=q.ask_span_id)
        self.tracer.record(q, stage)

    def question(self, ws: str, request_id: str) -> Question:
        seen = self._seen.get(ws)
        carried = seen[1] if seen is not None and seen[0] == request_id else None
        return Question(ws, request_id, carried)

    def event(self, e: FeedEvent) -> None:
        """The feed's subscriber (on the loop, as it publishes)."""
        rid = e.data.get("request_id")
        if not e.workspace or not isinstance(rid, str):
            return
        q, now = self.question(e.workspace, rid), tracing.now()
        run_id = e.data.get("run_id")
        base: Attributes = {"deltad.run_id": run_id} if isinstance(run_id, str) else {}
        if isinstance(kind := e.data.get("input_type"), str):
            base["deltad.input_type"] = kind
        if e.type == "request.created":
            seen = self._seen.get(e.workspace)
            self._ask(q, seen[2] if seen is not None and seen[0] == rid else None, base)
            self.tracer.record(q, Stage("announce", now, now, base | {"deltad.event_id": e.id}))
        elif (name := STAGES.get(e.type)) is not None:
            self.tracer.record(q, Stage(name, now, now, base | {"deltad.event_id": e.id}))

    def resuming(
        self, ws: Path, v: Verdict, reason: str, answered_at: float | None, *, fresh: bool
    ) -> str | None:
        """A resume is submitted for an answer (written at `answered_at`) or an expiry: those
        stages (`fresh`: not a retry of the same), and the TRACEPARENT its `delta run` is given
        (None: it closes no question, as a resume of an interrupted run)."""
        if v.request_id is None or reason not in ("answer", "question_expired"):
            return None
        q = Question(str(ws), v.request_id, v.traceparent)
        if not q.sampled:
            return None
        base: Attributes = {"deltad.run_id": v.run_id} if v.run_id else {}
        if v.input_type:
            base["deltad.input_type"] = v.input_type
        self._ask(q, v.created, base)
        if fresh and reason == "answer":
            at = answered_at or tracing.now()
            attrs = base | ({"deltad.channel": v.channel} if v.channel else {})
            links = self.tracer.callers_of(q.workspace, q.request_id)
            self.tracer.record(q, Stage("answer", at, at, attrs, links=links))
        elif fresh:
            at = v.deadline or tracing.now()
            self.tracer.record(q, Stage("expire", at, at, base))
        span_id = tracing.new_span_id()
        self._resumes[ws] = (q, span_id, tracing.now(), reason)
        return q.context(span_id)

    def resumed(self, ws: Path, run_id: str | None, rc: int | None, meaning: str) -> None:
        """The resume ended: its span, from submitted to the exit (lost if the daemon restarted
        meanwhile: nothing of it is kept on disk)."""
        if (r := self._resumes.pop(ws, None)) is None:
            return
        q, span_id, start, reason = r
        attrs: dict[str, str | int | bool] = {"deltad.reason": reason, "deltad.exit": meaning}
        if run_id:
            attrs["deltad.run_id"] = run_id
        if rc is not None:
            attrs["deltad.exit_code"] = rc
        self.tracer.record(q, Stage("resume", start, tracing.now(), attrs, span_id=span_id))
        if run_id:
            self._result(q, span_id, ws, run_id)

    def _result(self, q: Question, resume: int, ws: Path, run_id: str) -> None:
        """The ACTION_RESULT the resumed run journaled for the answered call, as the resume's
        child `action_result` at its journal time: read by the daemon from the journal's end
        (bounded), so `delta run` needs no exporter. None found there (a long resume past the
        tail's budget, a run that failed before it): no span."""
        try:
            journal = Workspace.at(ws).run(run_id).journal
            events = tail(journal, JOURNAL_TAIL_BYTES, JOURNAL_TAIL_EVENTS)
        except (ProtocolError, OSError, ValueError):
            return
        action = next(
            (
                e.payload.get("action_id")
                for e in events
                if e.type == EventType.HUMAN_INTERACTION
                and e.payload.get("phase") == "answered"
                and e.payload.get("request_id") == q.request_id
            ),
            None,
        )
        if not isinstance(action, str):
            return
        for e in events:
            if e.type == EventType.ACTION_RESULT and e.payload.get("action_id") == action:
                at = e.timestamp.timestamp()
                attrs: Attributes = {"deltad.action_id": action, "deltad.run_id": run_id}
                if isinstance(status := e.payload.get("status"), str):
                    attrs["deltad.status"] = status
                self.tracer.record(q, Stage("action_result", at, at, attrs, parent_id=resume))
                return
