"""Slack's Block Kit from the vocabulary of questions (deltad/protocol/kinds.py): pure functions
of a question, tested from a table (tests/unit/test_slack_blocks.py).

A question is drawn from its kind's `form` (the same description the inbox page draws from),
so a new kind that uses the page's controls needs nothing here:

    keys        one button per answer (yes/no, confirmation, choice)
    decisions   one button per decision on every gated call (approve, reject, cancel run);
                a decision that takes a reason (reject) opens a modal asking for it; `edit`
                is the page's (a link): arguments are not edited in a chat message
    input       one button opening a modal: a text box, a number box or a date picker
    secret      nothing to answer with: a link to the page (never a secret through Slack)

Every button's value is `<ref>:<key>`: `ref` names the question in the channel's own state
(deltad/outbound/slack.py), `key` the form's key ('' for a typed answer). Nothing in a button
is trusted for more than that: the answer is rebuilt from the question on disk, checked by the
answering path, and who pressed it is what Slack signed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from deltad.inbox import AnswerIn
from deltad.outbound.base import Closed, Question
from deltad.protocol import InteractionRequest, kinds
from deltad.protocol.replies import AnswerRejected, CallDecision, Decision

ANSWER = "deltad.answer"  # a button that answers at once
OPEN = "deltad.open"  # a button that opens a modal (typed answer, a reason)
PAGE = "deltad.page"  # a link button (Slack still posts an action for it: ignored)
MODAL = "deltad.modal"  # the modal's callback id
INPUT_BLOCK, INPUT_ACTION = "answer", "value"
TEXT_MAX = 2900  # a section's text is at most 3000 characters
BUTTON_TEXT_MAX = 75
BUTTONS_MAX = 24  # an actions block holds 25 elements: one left for the page's link
PLAIN_INPUT_MAX = 3000


def escape(text: str) -> str:
    """mrkdwn's three control characters (Slack's own escaping rule)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cut(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: max(0, limit - 1)].rstrip() + "…"


def _plain(text: str, limit: int = BUTTON_TEXT_MAX) -> dict[str, Any]:
    return {"type": "plain_text", "text": cut(text, limit) or " ", "emoji": True}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": cut(text, TEXT_MAX) or " "}}


def _context(lines: list[str]) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": x} for x in lines]}


def _button(text: str, action: str, value: str, style: str = "") -> dict[str, Any]:
    b: dict[str, Any] = {"type": "button", "text": _plain(text), "action_id": action}
    b["value"] = value
    if style in ("primary", "danger"):
        b["style"] = style
    return b


@dataclass(frozen=True)
class Button:
    """What one button of a question does: answer at once (`answer`), or open a modal."""

    key: str
    label: str
    opens: bool
    style: str = ""


def buttons(req: InteractionRequest) -> list[Button]:
    """The question's buttons, from its kind's form (none for a secret)."""
    if req.is_secret:
        return []
    form = kinds.form(req)
    if form.control == "input":
        return [Button("", "Answer…", opens=True, style="primary")]
    out = []
    for k in form.keys:
        if k.decision == Decision.EDIT:
            continue  # arguments are edited on the page
        label = f"{k.label}…" if k.reason else k.label
        out.append(Button(k.key, label, opens=k.reason, style=k.style))
    return out[:BUTTONS_MAX]


def question_message(
    q: Question, ref: str, context_chars: int, page_url: str | None
) -> tuple[str, list[dict[str, Any]]]:
    """The message's fallback text and its blocks."""
    req = q.request
    text = cut(f"Question: {req.prompt}", 150)
    blocks: list[dict[str, Any]] = [_section(f"*Question:* {escape(req.prompt)}")]
    lines = []
    ctx = req.context
    task = (ctx.task if ctx is not None and ctx.task else None) or q.task
    if task and context_chars:
        lines.append(f"*Task:* {escape(cut(task, context_chars))}")
    if ctx is not None and ctx.last_message and context_chars:
        lines.append(f"*The agent said:* {escape(cut(ctx.last_message, context_chars))}")
    if lines:
        blocks.append(_section("\n".join(lines)))
    if req.calls:
        shown = []
        for c in req.calls[:10]:
            what = c.resolved_command or ", ".join(f"{k}={v!r}" for k, v in c.arguments.items())
            shown.append(f"• `{escape(cut(c.tool_name, 80))}` {escape(cut(what, 300))}")
        if len(req.calls) > 10:
            shown.append(f"… and {len(req.calls) - 10} more (on the page)")
        blocks.append(_section("*Calls waiting for a decision:*\n" + "\n".join(shown)))
    if req.options and kinds.form(req).control == "keys":  # the options, by key
        listed = "\n".join(f"*[{escape(o.key)}]* {escape(o.label)}" for o in req.options)
        blocks.append(_section(listed))
    hint = kinds.kind_of(req.input_type).bounds(req)
    about = [f"{req.input_type.value} · request `{escape(req.request_id)}`"]
    if hint:
        about.append(escape(hint))
    if req.expires_at is not None:
        about.append(f"expires {req.expires_at:%Y-%m-%d %H:%M} UTC")
    if req.is_secret:
        about.append("this question asks for a secret: it is answered on the page, never here")
    blocks.append(_context(about))
    elements = [
        _button(b.label, OPEN if b.opens else ANSWER, f"{ref}:{b.key}", b.style)
        for b in buttons(req)
    ]
    if page_url is not None:
        link = _button("Open on the page", PAGE, f"{ref}:page")
        link["url"] = page_url
        elements.append(link)
    if elements:
        blocks.append({"type": "actions", "block_id": f"deltad:{ref}", "elements": elements})
    return text, blocks


def closed_message(
    prompt: str, closed: Closed, at: datetime, slack_user: str | None
) -> tuple[str, list[dict[str, Any]]]:
    """The message once its question is closed: who answered, through what, when."""
    when = f"{at:%Y-%m-%d %H:%M:%S} UTC"
    if closed.how == "expired":
        line = f"Expired at {when}, unanswered."
    elif slack_user is not None:
        line = f"Answered by <@{slack_user}> in Slack at {when}."
    elif closed.answered_by:
        via = f" ({escape(closed.channel)})" if closed.channel else ""
        line = f"Answered by {escape(closed.answered_by)}{via} at {when}."
    else:
        line = f"Answered elsewhere at {when}."
    text = cut(f"{line} {prompt}", 150)
    return text, [_section(f"*Question:* {escape(prompt)}"), _context([line])]


def answer_of(req: InteractionRequest, key: str) -> AnswerIn:
    """The answer a button stands for, rebuilt from the question (AnswerRejected: no such
    button on this question, as a hand-made payload could claim)."""
    for k in kinds.form(req).keys:
        if k.key != key or k.decision == Decision.EDIT:
            continue
        if k.decision is not None:
            return decisions(req, k.decision, None)
        if k.answer is not None:
            return AnswerIn(answer=k.answer)
    raise AnswerRejected(f"this question has no button {key!r}")


def decisions(req: InteractionRequest, decision: Decision, reason: str | None) -> AnswerIn:
    """One decision for every gated call (as a one-word answer by mail would be)."""
    calls = [
        CallDecision(action_id=c.action_id, decision=decision, reason=reason) for c in req.calls
    ]
    return AnswerIn(decisions=calls)


def modal(req: InteractionRequest, ref: str, key: str) -> dict[str, Any]:
    """The modal a button opens: a typed answer (`key` ''), or the reason for a decision."""
    meta = f"{ref}:{key}"
    title = _plain("Answer the question", 24)
    base = {
        "type": "modal",
        "callback_id": MODAL,
        "private_metadata": meta,
        "title": title,
        "submit": _plain("Answer", 24),
        "close": _plain("Cancel", 24),
    }
    prompt = _section(f"*Question:* {escape(req.prompt)}")
    if key:
        field = {
            "type": "plain_text_input",
            "action_id": INPUT_ACTION,
            "multiline": True,
            "max_length": PLAIN_INPUT_MAX,
        }
        label = _plain("Reason (optional)", 2000)
        why = {"type": "input", "block_id": INPUT_BLOCK, "optional": True}
        return base | {"blocks": [prompt, why | {"label": label, "element": field}]}
    element: dict[str, Any]
    asked = kinds.form(req).type  # the input the page shows (protocol/kinds.py), not the kind
    if asked == "number":
        element = {"type": "number_input", "action_id": INPUT_ACTION, "is_decimal_allowed": True}
        if req.minimum is not None:
            element["min_value"] = f"{req.minimum:g}"
        if req.maximum is not None:
            element["max_value"] = f"{req.maximum:g}"
    elif asked == "date":
        element = {"type": "datepicker", "action_id": INPUT_ACTION}
        if req.default and re.fullmatch(r"\d{4}-\d{2}-\d{2}", req.default):
            element["initial_date"] = req.default
    else:
        element = {
            "type": "plain_text_input",
            "action_id": INPUT_ACTION,
            "multiline": True,
            "max_length": PLAIN_INPUT_MAX,
        }
        if req.default:
            element["initial_value"] = cut(req.default, PLAIN_INPUT_MAX)
    hint = kinds.kind_of(req.input_type).bounds(req)
    block: dict[str, Any] = {
        "type": "input",
        "block_id": INPUT_BLOCK,
        "label": _plain("Your answer", 2000),
        "element": element,
        "optional": req.allow_empty,
    }
    if hint:
        block["hint"] = _plain(hint, 2000)
    return base | {"blocks": [prompt, block]}


def submitted(req: InteractionRequest, key: str, values: dict[str, Any]) -> AnswerIn:
    """The answer a modal's state holds (AnswerRejected when it holds none)."""
    field = values.get(INPUT_BLOCK, {}).get(INPUT_ACTION, {})
    if not isinstance(field, dict):
        raise AnswerRejected("the form holds no answer")
    value = field.get("selected_date") if field.get("type") == "datepicker" else field.get("value")
    if value is not None and not isinstance(value, str):
        raise AnswerRejected("the form's answer is not text")
    if key:
        for k in kinds.form(req).keys:
            if k.key == key and k.decision is not None and k.decision != Decision.EDIT:
                return decisions(req, k.decision, (value or "").strip() or None)
        raise AnswerRejected(f"this question has no button {key!r}")
    return AnswerIn(answer=value or "")
