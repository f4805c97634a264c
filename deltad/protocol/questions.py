"""Turning what a human wrote into a `Reply`, or refusing it.

`interpret_text` and `interpret_json` never guess: an answer that does not fit the question
raises `AnswerRejected` with a one-line reason, and the caller leaves the question pending.
How each input type reads an answer is its entry in `kinds`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .accelerators import build_options, parse_accelerator
from .kinds import kind_of, read_text, shown
from .models import InteractionRequest
from .replies import AnswerRejected, CallDecision, Decision, Reply, StructuredAnswer

__all__ = [
    "AnswerRejected",
    "CallDecision",
    "Decision",
    "Reply",
    "StructuredAnswer",
    "build_options",
    "interpret_json",
    "interpret_text",
    "parse_accelerator",
    "shown",
]


def interpret_text(req: InteractionRequest, text: str) -> Reply:
    return read_text(req, text)


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


def statement(req: InteractionRequest, doc: Mapping[str, Any]) -> dict[str, Any]:
    """What the seal of answer document `doc` (response.json) covers (protocol/seal.py): the
    document without its `seal`, a secret's answer left out (the journal keeps the statement;
    it never keeps a secret)."""
    said = {k: v for k, v in doc.items() if k != "seal"}
    if req.is_secret and said.get("answer") is not None:
        said["answer"] = None
    return said


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
            # Quoted: the id comes from the file and may hold a newline or escape sequence.
            f"response.json answers request {doc.request_id}, but the pending question is "
            f"{req.request_id}"
        )
    per_call = kind_of(req.input_type).per_call
    if per_call and doc.decisions is not None:
        reply = Reply(decisions=_check_decisions(req, doc.decisions))
    elif doc.answer is not None:
        reply = interpret_text(req, doc.answer)
    else:
        need = "decisions" if per_call else "answer"
        raise AnswerRejected(f"response.json has no {need!r}")
    reply.answered_by = doc.answered_by
    reply.comment = doc.comment
    reply.channel = doc.channel
    reply.delegations = doc.delegations
    reply.approvals = doc.approvals
    if doc.seal is not None:
        reply.seal = {"statement": statement(req, obj), **doc.seal}
    return reply
