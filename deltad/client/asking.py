"""Asking a human, durably: questions from `ask_human`, approvals for gated tool calls.

The journal owns a question's identity and its answer:
- `HUMAN_INTERACTION {phase: asked}` is written once per question; a resumed process rebuilds
  the same request (same request_id, same `expires_at`) from it, whichever mode asked first.
- `HUMAN_INTERACTION {phase: answered}` is the commit point for a reply: once it is journaled
  the answer is never taken again, and the mailbox files are only tidied afterwards.
Secrets are stored before the record and replaced in it by their handle.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from deltad.protocol import (
    ActionStatus,
    EventType,
    InputType,
    InteractionRequest,
    Journal,
    utcnow,
)
from deltad.protocol.models import GatedCall
from deltad.protocol.questions import (
    AnswerRejected,
    CallDecision,
    Decision,
    Reply,
    build_options,
    interpret_text,
)

from .faults import fault
from .interviewers import Interviewer
from .secrets import SecretStore, handle

ASK_HUMAN = "ask_human"
ASK_HUMAN_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": ASK_HUMAN,
        "description": (
            "Ask the human a question and wait for the answer: missing information, a "
            "confirmation before a risky step, or a secret. For secrets set sensitive=true; "
            "you then get a handle like ${secret:ID} to pass in tool arguments, never the value."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "The question shown to the human."},
                "input_type": {
                    "type": "string",
                    "enum": [t.value for t in InputType if t != InputType.APPROVAL],
                    "description": (
                        "text (default), password (hidden), confirmation or yes_no (yes/no), "
                        "choice (pick one of options)."
                    ),
                },
                "options": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "For choice: labels such as '[A] Approve' or 'R) Reject'.",
                },
                "default": {
                    "type": "string",
                    "description": "Answer used when nobody answers before timeout_seconds.",
                },
                "timeout_seconds": {
                    "type": "number",
                    "description": "How long to wait. Without a default, a timeout is reported "
                    "as TIMEOUT, which is not consent.",
                },
                "sensitive": {
                    "type": "boolean",
                    "description": "True when the answer must never be shown or logged.",
                },
                "allow_empty": {
                    "type": "boolean",
                    "description": "True when an empty answer is acceptable (text/password).",
                },
            },
            "required": ["prompt"],
        },
    },
}
MAX_TIMEOUT_SECONDS = 30 * 24 * 3600
NOT_CONSENT = "A timeout is not consent and not a refusal: do not retry the same action"


class Paused(Exception):
    def __init__(self, request: InteractionRequest) -> None:
        super().__init__(request.prompt)
        self.request = request


def question_from_args(raw: str, run_id: str, action_id: str) -> InteractionRequest | str:
    """Build the request for an `ask_human` call, or say (to the model) what is wrong."""
    try:
        args = json.loads(raw or "{}")
    except ValueError as e:
        return f"Error: arguments are not valid JSON: {e}"
    if not isinstance(args, dict) or not isinstance(args.get("prompt"), str):
        return "Error: ask_human needs a non-empty string 'prompt'"
    if not args["prompt"].strip():
        return "Error: ask_human needs a non-empty string 'prompt'"
    options = args.get("options") or []
    kind = args.get("input_type") or ("choice" if options else "text")
    if kind not in {t.value for t in InputType} or kind == InputType.APPROVAL:
        allowed = ", ".join(t.value for t in InputType if t != InputType.APPROVAL)
        return f"Error: input_type must be one of {allowed}"
    if kind == InputType.CHOICE and (
        not isinstance(options, list)
        or len(options) < 2
        or not all(isinstance(o, str) and o.strip() for o in options)
    ):
        return "Error: a choice needs 'options': a list of at least two labels"
    timeout = args.get("timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT_SECONDS
    ):
        return f"Error: timeout_seconds must be a number of seconds, 1 to {MAX_TIMEOUT_SECONDS}"
    now = utcnow()
    req = InteractionRequest(
        timestamp=now,
        prompt=args["prompt"],
        input_type=InputType(kind),
        sensitive=args.get("sensitive") in (True, "true"),
        allow_empty=args.get("allow_empty") in (True, "true"),
        run_id=run_id,
        action_id=action_id,
        options=build_options(options) if kind == InputType.CHOICE else [],
        timeout_seconds=timeout,
        expires_at=now + timedelta(seconds=timeout) if timeout else None,
    )
    if (default := args.get("default")) is not None:
        try:
            interpret_text(req, str(default))
        except AnswerRejected as e:
            return f"Error: default does not fit the question: {e}"
        req.default = str(default)
    return req


def approval_request(
    run_id: str, calls: list[GatedCall], timeout: float | None
) -> InteractionRequest:
    now = utcnow()
    names = ", ".join(c.tool_name for c in calls)
    return InteractionRequest(
        timestamp=now,
        prompt=f"Approve {len(calls)} tool call(s): {names}?",
        input_type=InputType.APPROVAL,
        run_id=run_id,
        action_id=calls[0].action_id,
        calls=calls,
        timeout_seconds=timeout,
        expires_at=now + timedelta(seconds=timeout) if timeout else None,
    )


def on_timeout(req: InteractionRequest) -> Reply:
    """Whoever notices first applies the same rule: the default if there is one; approvals
    are rejected; otherwise an explicit TIMEOUT."""
    if req.input_type == InputType.APPROVAL:
        return Reply(
            outcome="timeout",
            source="timeout",
            decisions=[
                CallDecision(
                    action_id=c.action_id,
                    decision=Decision.REJECT,
                    reason=f"no decision within {req.timeout_seconds:g} s",
                )
                for c in req.calls
            ],
        )
    if req.default is not None:
        reply = interpret_text(req, req.default)
        reply.outcome, reply.source = "timeout", "default"
        return reply
    return Reply(outcome="timeout", source="timeout")


def count_replies(journal: Journal, source: str) -> int:
    """How many recorded replies came from `source` (a resumed answers queue skips them)."""
    return sum(
        1
        for e in journal.events
        if e.type == EventType.HUMAN_INTERACTION
        and e.payload.get("phase") == "answered"
        and e.payload["reply"].get("source") == source
    )


class Asking:
    def __init__(
        self,
        journal: Journal,
        interviewer: Interviewer,
        secrets: SecretStore,
        validate: Callable[[InteractionRequest, Reply], None],
    ) -> None:
        self.journal = journal
        self.interviewer = interviewer
        self.secrets = secrets
        self.validate = validate

    # -- the journal's record -----------------------------------------------------------
    def _records(self, phase: str) -> list[dict[str, Any]]:
        return [
            e.payload
            for e in self.journal.events
            if e.type == EventType.HUMAN_INTERACTION and e.payload.get("phase") == phase
        ]

    def asked(self, action_id: str, kind: InputType | None = None) -> InteractionRequest | None:
        for p in reversed(self._records("asked")):
            req = InteractionRequest.model_validate(p["request"])
            ids = [c.action_id for c in req.calls] or [req.action_id]
            if action_id in ids and (kind is None or req.input_type == kind):
                return req
        return None

    def record_asked(self, req: InteractionRequest) -> InteractionRequest:
        self.journal.append(
            EventType.HUMAN_INTERACTION, {"phase": "asked", "request": req.model_dump(mode="json")}
        )
        return req

    def recorded_reply(self, request_id: str) -> Reply | None:
        for p in self._records("answered"):
            if p["request_id"] == request_id:
                return Reply.model_validate(p["reply"])
        return None

    def count(self, source: str) -> int:
        return count_replies(self.journal, source)

    def _record_answer(self, req: InteractionRequest, reply: Reply) -> None:
        reply.at = utcnow()
        if req.is_secret and reply.outcome == "answered" and reply.value is not None:
            self.secrets.put(req.action_id, reply.value)
            fault("after_secret")
            reply.value = handle(req.action_id)
        fault("before_journal")
        self.journal.append(
            EventType.HUMAN_INTERACTION,
            {
                "phase": "answered",
                "request_id": req.request_id,
                "action_id": req.action_id,
                "input_type": str(req.input_type),
                "reply": reply.model_dump(mode="json"),
            },
        )
        fault("after_journal")

    # -- getting a reply ----------------------------------------------------------------
    def obtain(self, req: InteractionRequest) -> Reply:
        """The reply to `req`: recorded already, or from the interviewers, or the timeout
        rule. Raises Paused when nobody can answer now."""
        if (reply := self.recorded_reply(req.request_id)) is not None:
            return reply
        while True:
            reply = self.interviewer.ask(req)
            if reply is None:
                if not req.expired():
                    raise Paused(req)
                reply = on_timeout(req)
            elif reply.outcome == "timeout":
                reply = on_timeout(req)
            try:
                self.validate(req, reply)
                break
            except AnswerRejected as e:
                if not self.interviewer.reject(req, str(e)):
                    if not req.expired():
                        raise Paused(req) from None
                    reply = on_timeout(req)  # never carries edits: nothing left to check
                    break
        self._record_answer(req, reply)
        return reply

    def settle(self, req: InteractionRequest) -> None:
        self.interviewer.settle(req)


def answer_observation(req: InteractionRequest, reply: Reply) -> tuple[ActionStatus, str]:
    """What the model is told about an ask_human reply."""
    if reply.outcome == "skipped":
        return ActionStatus.FAILED, (
            "No answer: the question was skipped (nobody was there to answer). Do not assume "
            "an answer; continue without it or stop."
        )
    if reply.outcome == "timeout" and reply.value is None:
        return ActionStatus.FAILED, (
            f"TIMEOUT: no answer within {req.timeout_seconds:g} seconds. {NOT_CONSENT} or ask "
            "the same question again; continue without it or stop."
        )
    if req.is_secret:
        return ActionStatus.SUCCESS, (
            f"The human answered. The answer is sensitive and is kept as {reply.value}: pass "
            "that handle in tool arguments where the value is needed; it is substituted when "
            "the tool runs."
        )
    text = reply.value or ""
    if reply.key:
        text = f"{reply.value} (option {reply.key})"
    if reply.outcome == "timeout":
        text += f"\n(No answer within {req.timeout_seconds:g} seconds: this is the default.)"
    return ActionStatus.SUCCESS, text


def refusal_observation(reply: Reply, decision: CallDecision, timeout: float | None) -> str:
    if reply.outcome == "timeout":
        return (
            f"Not approved: no decision within {timeout or 0:g} seconds, so the call was "
            f"rejected. {NOT_CONSENT}."
        )
    if reply.outcome == "skipped":
        return "Not approved: nobody answered the approval (skipped), so the call was not run."
    who = f" ({reply.answered_by})" if reply.answered_by else ""
    return (
        f"rejected by the human{who}: {decision.reason or 'no reason given'}. Do not retry "
        "this call unless the human asks for it."
    )
