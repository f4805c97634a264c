"""Thinking: one model call, from the journal's conversation to a journaled THOUGHT.

The request body and the reply (or the error) are kept under `io/invocations/<ref>/`. A reply
cut off by the provider (`finish_reason` length or content_filter) is journaled as a
SYSTEM_MESSAGE, not a THOUGHT: a resume asks again instead of replaying half a message, and a
truncated tool call never runs.
"""

from __future__ import annotations

import bisect
import json
import uuid
from collections.abc import Sequence
from typing import Any

from deltad.errors import LLMError
from deltad.protocol import EventType, iso, safefs, save_metadata, utcnow
from deltad.protocol.events import NodeStart, typed
from deltad.protocol.fsio import compact_json, write_record
from deltad.protocol.models import JournalEvent

from . import budget
from .ask_human import ASK_HUMAN_TOOL
from .context import RunContext

CUT_OFF = {
    "length": (
        "the model's answer was cut off at llm.max_tokens (finish_reason: length); raise "
        "max_tokens in the agent's config and run `delta run` to ask again"
    ),
    "content_filter": (
        "the model's answer was withheld by the provider's content filter (finish_reason: "
        "content_filter); `delta run` asks again"
    ),
}


class CutOff(LLMError):
    """The model stopped before a usable answer (finish_reason length or content_filter)."""


def messages(ctx: RunContext, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation so far, from the journal alone, within the context budget: turns
    before the latest recorded cut are replaced by its note; if the rest does not fit, a new
    cut is decided and journaled first (engine/budget.py). In a pipeline each node is its own
    conversation: its prompt (from its NODE_START) and what followed it; a cut made in an
    earlier node does not apply."""
    events = ctx.journal.events
    task, since, thread = ctx.meta.task, 0, []
    for e in reversed(events):
        if e.type == EventType.NODE_START:
            start = typed(e, NodeStart)
            task, since = start.prompt or task, e.seq
            thread = thread_messages(events, start.thread_history or [])
            break
    head: list[dict[str, Any]] = [
        {"role": "system", "content": ctx.agent.system_prompt},
        *thread,
        {"role": "user", "content": task},
    ]
    cut = budget.last_cut(events, since)
    if cut is not None and cut.through_seq < since:
        cut = None
    limit = budget.budget_of(ctx.agent.config.llm, tools)
    fixed = sum(budget.estimate(m) for m in head)  # a thread's history is never cut
    note = budget.estimate(budget.note_message(cut)) if cut else 0
    after = max(since, cut.through_seq if cut else 0)
    turns = budget.turns_after(events, after, stop_above=limit)
    new = budget.plan(events, turns, limit, fixed + note, cut, since=since)
    if new is not None:
        turns = [t for t in turns if t.first_seq > new.through_seq]
        kept = fixed + sum(t.tokens for t in turns)
        ctx.journal.append(EventType.SYSTEM_MESSAGE, new.payload(limit, kept))
        cut = new
    notes = [budget.note_message(cut)] if cut else []
    return head + notes + [m for t in turns for m in t.messages]


def thread_messages(
    events: Sequence[JournalEvent], history: Sequence[Sequence[int]]
) -> list[dict[str, Any]]:
    """A pipeline thread's earlier conversation (fidelity full): for each earlier visit, from
    its NODE_START to its NODE_OUTCOME, its prompt and its turns, message for message."""
    out: list[dict[str, Any]] = []
    for start, end in history:
        lo = bisect.bisect_left(events, start, key=lambda e: e.seq)
        hi = bisect.bisect_right(events, end, key=lambda e: e.seq)
        if lo >= hi:
            continue
        out.append({"role": "user", "content": typed(events[lo], NodeStart).prompt})
        out += [m for t in budget.turns_after(events[lo:hi], start) for m in t.messages]
    return out


def think(ctx: RunContext) -> dict[str, Any]:
    """Call the model and journal its THOUGHT; returns the THOUGHT's payload. Raises the
    model's errors (LLMError and its kinds, CutOff) after recording them."""
    ctx.ensure_running()
    tools = [t.schema() for t in ctx.agent.tools.values()] + [ASK_HUMAN_TOOL]
    msgs = messages(ctx, tools)
    ref = f"{ctx.journal.next_seq:05d}_{uuid.uuid4().hex[:8]}"
    record = ctx.paths.invocations / ref
    safefs.mkdirs(record)
    body = compact_json(ctx.model.request_body(msgs, tools))
    write_record(record / "request.json", body)  # the very bytes sent
    try:
        with ctx.guard.window():
            reply = ctx.model.complete(msgs, tools, body)
    except LLMError as e:
        write_record(record / "error.json", compact_json(_error_record(e)))
        raise
    write_record(record / "response.json", compact_json(reply.raw))
    if ctx.meta.model_failing_since is not None:  # the outage is over
        ctx.meta.model_failing_since = None
        save_metadata(ctx.paths.metadata, ctx.meta)
    if reply.finish_reason in CUT_OFF:
        ctx.journal.append(
            EventType.SYSTEM_MESSAGE,
            {
                "level": "ERROR",
                "content": CUT_OFF[reply.finish_reason],
                "finish_reason": reply.finish_reason,
                "llm_invocation_ref": ref,
            },
        )
        raise CutOff(CUT_OFF[reply.finish_reason])
    payload = {
        "content": reply.content or "",
        "tool_calls": unique_ids(ctx, reply.tool_calls),
        "llm_invocation_ref": ref,
        "finish_reason": reply.finish_reason,
    }
    ctx.journal.append(EventType.THOUGHT, payload)
    return payload


def unique_ids(ctx: RunContext, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Some local servers reuse ids like "call_0" every turn; results and secret handles need
    ids unique within the run, so clashes are renamed here, once, before journaling."""
    seen = set(ctx.history.call_ids)
    out = []
    for i, c in enumerate(calls):
        cid = str(c.get("id") or "")
        if not cid or cid in seen or len(cid) > 100:
            cid = f"call_{ctx.journal.next_seq}_{i}"
        seen.add(cid)
        fn = c.get("function") or {}
        args = fn.get("arguments") or "{}"
        if not isinstance(args, str):  # some servers send an object
            args = json.dumps(args)
        out.append(
            {
                "id": cid,
                "type": "function",
                "function": {"name": str(fn.get("name", "")), "arguments": args},
            }
        )
    return out


def _error_record(e: LLMError) -> dict[str, Any]:
    return {
        "kind": getattr(e, "kind", "model_error"),
        "status": getattr(e, "status", None),
        "attempts": getattr(e, "attempts", None),
        "message": str(e),
        "at": iso(utcnow()),
    }
