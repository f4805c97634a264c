"""The built-in `ask_human` tool: its schema (built from the question kinds), the question an
`ask_human` call asks, and what the model is told about the reply."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from deltad.protocol import (
    ActionStatus,
    InputType,
    InteractionRequest,
    atomic_write_text,
    followup,
    utcnow,
)
from deltad.protocol.history import Call
from deltad.protocol.kinds import (
    NOT_CONSENT,
    asked_type,
    kind_of,
    model_arguments,
    model_description,
    model_kinds,
)
from deltad.protocol.models import respondent_problem
from deltad.protocol.replies import AnswerRejected, Reply

from .asking import Asking
from .context import ASK_HUMAN, RunContext, parse_args
from .hooks import Point

MAX_TIMEOUT_SECONDS = 30 * 24 * 3600


FOLLOW_UP_ARGUMENTS: dict[str, Any] = {
    "remind_after_seconds": {
        "type": "number",
        "description": "Remind the respondents this long after asking, and again as long "
        "after each reminder (at most max_reminders times). Default: the agent's setting.",
    },
    "max_reminders": {"type": "integer", "description": "Reminders at most (default 3)."},
    "escalate_after_seconds": {
        "type": "number",
        "description": "With escalate_to: this long after asking, those people are asked too.",
    },
    "escalate_to": {
        "type": "array",
        "items": {"type": "string"},
        "description": "Token names or group:NAME added as respondents on escalation.",
    },
    "sla_seconds": {
        "type": "number",
        "description": "When the answer is due (shown to people; ends nothing, unlike "
        "timeout_seconds).",
    },
}


def _schema() -> dict[str, Any]:
    properties: dict[str, Any] = {
        "prompt": {"type": "string", "description": "The question shown to the human."},
        "input_type": {
            "type": "string",
            "enum": [t.value for t in model_kinds()],
            "description": model_description(),
        },
        "default": {
            "type": "string",
            "description": "Answer used when nobody answers before timeout_seconds.",
        },
        "timeout_seconds": {
            "type": "number",
            "description": "How long to wait. Without a default, a timeout is reported as "
            "TIMEOUT, which is not consent.",
        },
        "sensitive": {
            "type": "boolean",
            "description": "True when the answer must never be shown or logged.",
        },
        "allow_empty": {
            "type": "boolean",
            "description": "True when an empty answer is acceptable (text/password).",
        },
        "respondents": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Who may answer over the inbox: token names or group:NAME "
            "(default: anyone allowed to see the question).",
        },
    }
    properties |= FOLLOW_UP_ARGUMENTS
    properties |= model_arguments()
    return {
        "type": "function",
        "function": {
            "name": ASK_HUMAN,
            "description": (
                "Ask the human a question and wait for the answer: missing information, a "
                "confirmation before a risky step, or a secret. For secrets set sensitive=true; "
                "you then get a handle like ${secret:ID} to pass in tool arguments, never the "
                "value."
            ),
            "parameters": {"type": "object", "properties": properties, "required": ["prompt"]},
        },
    }


ASK_HUMAN_TOOL: dict[str, Any] = _schema()


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
    allowed = [t.value for t in model_kinds()]
    name = args.get("input_type") or asked_type(args)
    if name not in allowed:
        return f"Error: input_type must be one of {', '.join(allowed)}"
    kind = kind_of(InputType(name))
    extra = kind.from_args(args)
    if isinstance(extra, str):
        return extra
    timeout = args.get("timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT_SECONDS
    ):
        return f"Error: timeout_seconds must be a number of seconds, 1 to {MAX_TIMEOUT_SECONDS}"
    respondents = args.get("respondents") or []
    if not isinstance(respondents, list):
        return "Error: respondents must be a list of token names or group:NAME"
    if bad := next((w for n in respondents if (w := respondent_problem(n))), None):
        return f"Error: {bad}"
    follow = followup.from_args(args)
    if isinstance(follow, str):
        return follow
    now = utcnow()
    req = InteractionRequest(
        timestamp=now,
        prompt=args["prompt"],
        input_type=InputType(name),
        sensitive=args.get("sensitive") in (True, "true"),
        allow_empty=args.get("allow_empty") in (True, "true"),
        run_id=run_id,
        action_id=action_id,
        timeout_seconds=timeout,
        expires_at=now + timedelta(seconds=timeout) if timeout else None,
        respondents=respondents,
        follow_up=follow,
        **extra,
    )
    if (default := args.get("default")) is not None:
        try:
            kind.read(req, str(default))
        except AnswerRejected as e:
            return f"Error: default does not fit the question: {e}"
        req.default = str(default)
    return req


def observation(req: InteractionRequest, reply: Reply) -> tuple[ActionStatus, str]:
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


def ask(ctx: RunContext, asking: Asking, call: Call) -> InteractionRequest | None:
    """Handle an ask_human call. Returns the request when the run must pause for it."""
    recorded = ctx.history.asked(call.id)
    req = recorded or question_from_args(call.arguments, ctx.meta.run_id, call.id)
    if call.id not in ctx.history.requested:
        ctx.request(call, parse_args(call.arguments), ASK_HUMAN)
    if isinstance(req, str):  # the model asked badly: tell it, do not pause
        ctx.ensure_running()
        ctx.result(call, ActionStatus.ERROR, req)
        return None
    if recorded is None:
        asking.record_asked(req)
    reply = asking.take(req)
    if reply is None:
        return req
    status, said = observation(req, reply)
    ctx.result(call, status, said)
    ctx.hooks.reached(Point.AFTER_RESULT)
    record = ctx.record_dir(call)
    atomic_write_text(record / "command.txt", f"ask_human ({req.request_id})\n")
    atomic_write_text(record / "stdout.log", said)
    return None
