"""An approval bound to the call it approved: a digest of the exact tool call (its name and
its arguments, after any edit) that the answering path writes into each approving decision
and the engine checks again before it runs the call (engine/gate.py). A call that changed on
disk between the question and the resume (an edited journal, a swapped request) is then not
run: its digest no longer matches.

The digest is `sha256:` + hex of SHA-256 over canonical JSON of `{"tool_name", "arguments"}`:
keys sorted at every level, no insignificant whitespace, ASCII (`\\uXXXX` escapes), numbers as
Python's json writes them. Pure."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .models import GatedCall, InteractionRequest
from .replies import CallDecision, Decision

PREFIX = "sha256:"


def canonical(tool_name: str, arguments: Any) -> bytes:
    """The bytes a call's digest is taken over."""
    doc = {"tool_name": tool_name, "arguments": arguments}
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def call_digest(tool_name: str, arguments: Any) -> str:
    return PREFIX + hashlib.sha256(canonical(tool_name, arguments)).hexdigest()


def shown_arguments(raw: str | None) -> dict[str, Any]:
    """A model's raw JSON arguments as an approval shows them (`GatedCall.arguments`): the
    object, or `{"_raw": ...}` when they are not one."""
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        return {"_raw": raw}
    return args if isinstance(args, dict) else {"_raw": args}


def approved_digest(call: GatedCall, decision: CallDecision) -> str | None:
    """The digest an approving decision binds (None for reject and cancel): the call as asked,
    or with the edit's arguments."""
    if decision.decision == Decision.APPROVE:
        return call_digest(call.tool_name, call.arguments)
    if decision.decision == Decision.EDIT:
        return call_digest(call.tool_name, decision.arguments or {})
    return None


class DigestMismatch(ValueError):
    """A decision's digest names another call than the one asked (one line)."""


def bind(req: InteractionRequest, decisions: list[CallDecision]) -> list[CallDecision]:
    """The decisions with each approving one's digest of the call it approves; a digest the
    answer already carries must be that one (DigestMismatch: the call changed since the
    answerer saw it)."""
    calls = {c.action_id: c for c in req.calls}
    out = []
    for d in decisions:
        call = calls.get(d.action_id)
        want = approved_digest(call, d) if call is not None else None
        if want is None:
            out.append(d.model_copy(update={"digest": None}))
            continue
        if d.digest is not None and d.digest != want:
            raise DigestMismatch(
                f"decision for {d.action_id!r}: digest {d.digest} is not the call's {want} "
                "(the call changed since it was shown)"
            )
        out.append(d.model_copy(update={"digest": want}))
    return out
