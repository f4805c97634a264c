"""Questions and answers: accelerator keys, and turning what a human wrote into a decision.

`interpret` never guesses: an answer that does not fit the question raises `AnswerRejected`
with a one-line reason, and the caller leaves the question pending.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .models import InputType, InteractionRequest, Option, Timestamp

_ACCEL = (
    re.compile(r"^\s*\[(\w)\]\s*(.+)$"),  # [A] Approve
    re.compile(r"^\s*(\w)\)\s*(.+)$"),  # A) Approve
    re.compile(r"^\s*(\w)\s+-\s+(.+)$"),  # A - Approve
)


class AnswerRejected(ValueError):
    """The answer does not fit the question; the message says why."""


def parse_accelerator(text: str) -> tuple[str | None, str]:
    """`[A] Approve` / `A) Approve` / `A - Approve` → ("A", "Approve"); else (None, text)."""
    for pattern in _ACCEL:
        if m := pattern.match(text):
            return m.group(1).upper(), m.group(2).strip()
    return None, text.strip()


def build_options(labels: list[str]) -> list[Option]:
    """Keys are unique and case-insensitive: a clash takes the label's next free character."""
    used: set[str] = set()
    options = []
    for raw in labels:
        key, label = parse_accelerator(raw)
        candidates = ([key] if key else []) + [c.upper() for c in label if c.isalnum()]
        candidates += [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
        chosen = next(c for c in candidates if c not in used)
        used.add(chosen)
        options.append(Option(key=chosen, label=label))
    return options


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"
    CANCEL = "cancel"


class CallDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action_id: str
    decision: Decision
    arguments: dict[str, Any] | None = None
    reason: str | None = None


class StructuredAnswer(BaseModel):
    """`response.json`."""

    model_config = ConfigDict(extra="forbid")
    request_id: str
    answer: str | None = None
    decisions: list[CallDecision] | None = None
    answered_by: str | None = None


class Reply(BaseModel):
    """What a human (or a stand-in) said, normalised for the engine."""

    outcome: Literal["answered", "timeout", "skipped"] = "answered"
    value: str | None = None  # text, "yes"/"no", or the chosen option's label
    key: str | None = None  # the chosen option's key
    decisions: list[CallDecision] = Field(default_factory=list)
    answered_by: str | None = None
    source: str = "human"
    at: Timestamp | None = None


YES = {"y", "yes", "approve", "approved"}
NO = {"n", "no", "reject", "rejected"}


def shown(req: InteractionRequest, text: str) -> str:
    """How a refusal may quote an answer: never when the question is sensitive."""
    return "the answer" if req.is_secret else repr(text.strip()[:40])


def _yes_no(req: InteractionRequest, text: str) -> str:
    word = text.strip().lower()
    if word in {"y", "yes"}:
        return "yes"
    if word in {"n", "no"}:
        return "no"
    raise AnswerRejected(f"{shown(req, text)} must be yes or no")


def _choice(req: InteractionRequest, text: str) -> Reply:
    wanted = text.strip().lower()
    for opt in req.options:
        full = f"[{opt.key}] {opt.label}".lower()
        if wanted in (opt.key.lower(), opt.label.lower(), full):
            return Reply(value=opt.label, key=opt.key)
    listed = ", ".join(f"{o.key}) {o.label}" for o in req.options)
    raise AnswerRejected(f"{shown(req, text)} is not one of the options: {listed}")


def _all_calls(req: InteractionRequest, text: str) -> Reply:
    """Plain-text approval: one word for every call; `reject: reason` carries a reason."""
    word, _, reason = text.strip().partition(":")
    word = word.strip().lower()
    if word in YES:
        decision = Decision.APPROVE
    elif word in NO:
        decision = Decision.REJECT
    elif word == "cancel":
        decision = Decision.CANCEL
    else:
        raise AnswerRejected(
            f"{shown(req, text)} is not approve, reject[: reason] or cancel "
            "(use response.json for per-call decisions or edits)"
        )
    return Reply(
        decisions=[
            CallDecision(action_id=c.action_id, decision=decision, reason=reason.strip() or None)
            for c in req.calls
        ]
    )


def _check_decisions(req: InteractionRequest, decisions: list[CallDecision]) -> list[CallDecision]:
    pending = [c.action_id for c in req.calls]
    given = [d.action_id for d in decisions]
    if unknown := sorted(set(given) - set(pending)):
        raise AnswerRejected(f"no pending call with action_id {unknown[0]!r}")
    if len(given) != len(set(given)):
        raise AnswerRejected("more than one decision for the same call")
    if missing := [a for a in pending if a not in given]:
        raise AnswerRejected(f"no decision for call {missing[0]!r}; decide every call")
    for d in decisions:
        if d.decision == Decision.EDIT and d.arguments is None:
            raise AnswerRejected(f"edit of {d.action_id!r} needs arguments")
    order = {a: i for i, a in enumerate(pending)}
    return sorted(decisions, key=lambda d: order[d.action_id])


def interpret_text(req: InteractionRequest, text: str) -> Reply:
    kind = req.input_type
    if kind in (InputType.CONFIRMATION, InputType.YES_NO):
        return Reply(value=_yes_no(req, text))
    if kind == InputType.CHOICE:
        return _choice(req, text)
    if kind == InputType.APPROVAL:
        return _all_calls(req, text)
    if not text.strip() and not req.allow_empty:
        # `touch response.txt`, an editor's first save, `: > response.txt`: not an answer.
        raise AnswerRejected("the answer is empty (this question does not accept an empty answer)")
    return Reply(value=text)


def interpret_json(req: InteractionRequest, raw: str) -> Reply:
    try:
        obj = json.loads(raw)
        json.dumps(obj, ensure_ascii=False).encode("utf-8")  # a lone surrogate ("\ud800")
        doc = StructuredAnswer.model_validate(obj)
    except ValidationError as e:
        raise AnswerRejected(f"response.json: {e.errors()[0]['msg']}") from None
    except RecursionError:
        raise AnswerRejected("response.json: nested too deeply") from None
    except UnicodeError:
        raise AnswerRejected("response.json: holds text that is not valid Unicode") from None
    except ValueError:
        raise AnswerRejected("response.json: not valid JSON") from None
    if doc.request_id != req.request_id:
        raise AnswerRejected(
            f"response.json answers request {doc.request_id}, but the pending question is "
            f"{req.request_id}"
        )
    if req.input_type == InputType.APPROVAL and doc.decisions is not None:
        reply = Reply(decisions=_check_decisions(req, doc.decisions))
    elif doc.answer is not None:
        reply = interpret_text(req, doc.answer)
    else:
        need = "decisions" if req.input_type == InputType.APPROVAL else "answer"
        raise AnswerRejected(f"response.json has no {need!r}")
    reply.answered_by = doc.answered_by
    return reply
