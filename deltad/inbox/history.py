"""`GET /v1/history`: what people answered and how runs ended, read from the journals (so it
survives a reload of the page and a restart of the daemon). Bounded: the latest run of each
workspace the token may see, the most recently written journals first, at most JOURNALS_MAX
of them, each read from its end within `journal_tail`'s budget; the newest `limit` entries
are returned. An answer's value is not shown when the question was sensitive (a password is
never echoed); who answered and when always are. A run's end carries its final message (what
`/v1/runs/{id}`'s outcome calls `final_message`: the RUN_END's reason — the last message at
COMPLETED, why it stopped otherwise), cut to FINAL_MESSAGE_MAX characters, and its duration."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deltad import inbox
from deltad.inbox.context import Context, visible
from deltad.inbox.schemas import History
from deltad.inbox.tokens import Identity
from deltad.protocol import InteractionRequest, JournalEvent, RunStatus, Workspace
from deltad.protocol.errors import ProtocolError
from deltad.protocol.events import Answered, Asked, RunEnd
from deltad.protocol.models import iso
from deltad.protocol.printable import json_safe, show_path
from deltad.protocol.replies import CallDecision, Decision
from deltad.protocol.viewing import payload_of, tail

JOURNAL_TAIL_BYTES = 256 * 1024
JOURNAL_TAIL_EVENTS = 50
JOURNALS_MAX = 64  # journal tails read per call at most (each up to JOURNAL_TAIL_BYTES)
# A final message in the history is a preview: 100 entries stay small; the whole message is in
# `/v1/runs/{id}` and `delta status`.
FINAL_MESSAGE_MAX = 2000


def bounded(text: str | None, cap: int = FINAL_MESSAGE_MAX) -> tuple[str | None, bool]:
    """`text` cut to `cap` characters, and whether it was cut."""
    if text is None or len(text) <= cap:
        return text, False
    return text[: cap - 1] + "…", True


def duration_seconds(started: datetime | None, ended: datetime) -> float | None:
    """Seconds from the run's start to an end at `ended`, if the start is known: the
    outcome's `duration_seconds` rule (start to end), for each end in a journal."""
    if started is None:
        return None
    return max(0.0, (ended - started).total_seconds())


def entries(
    workspace: str,
    run_id: str,
    events: Iterable[JournalEvent],
    started: datetime | None = None,
) -> list[dict[str, Any]]:
    """History entries of one run's journal events, oldest first (pure: tested from tables);
    `started` is the run's start time (its metadata's), for the durations. Events the reader
    could not type are skipped."""
    asked: dict[str, InteractionRequest] = {}
    out: list[dict[str, Any]] = []
    for e in events:
        if (q := payload_of(e, Asked)) is not None:
            asked[q.request.request_id] = q.request
        elif (a := payload_of(e, Answered)) is not None:
            out.append(_answered(workspace, run_id, e, a, asked.get(a.request_id)))
        elif (end := payload_of(e, RunEnd)) is not None:
            out.append(_ended(workspace, run_id, e, end, started))
    return out


def _ended(
    workspace: str, run_id: str, e: JournalEvent, end: RunEnd, started: datetime | None
) -> dict[str, Any]:
    final, cut = bounded(end.reason or None)
    return {
        "kind": "run_ended",
        "at": iso(e.timestamp),
        "workspace": workspace,
        "run_id": run_id,
        "status": str(end.status),
        # Why it stopped, for a run that did not complete; a completed run's is its message.
        "reason": None if end.status == RunStatus.COMPLETED else final,
        "final_message": final,
        "final_message_truncated": cut,
        "duration_seconds": duration_seconds(started, e.timestamp),
    }


def _decision(d: CallDecision, request: InteractionRequest | None) -> dict[str, Any]:
    """A decision on a gated call; an edit with what it changed (the call as asked and as run),
    so a person can see what was approved. Never for a sensitive question (no request: none)."""
    out: dict[str, Any] = {"action_id": d.action_id, "decision": str(d.decision)}
    call = next((c for c in request.calls if c.action_id == d.action_id), None) if request else None
    if call is not None:
        out["tool_name"] = call.tool_name
        if d.decision == Decision.EDIT and d.arguments is not None:
            out["asked_arguments"], out["arguments"] = call.arguments, d.arguments
    if d.reason:
        out["reason"] = d.reason
    return out


def _answered(
    workspace: str, run_id: str, e: JournalEvent, a: Answered, request: InteractionRequest | None
) -> dict[str, Any]:
    reply = a.reply
    secret = request is None or request.is_secret
    return {
        "kind": "answered",
        "at": iso(reply.at or e.timestamp),
        "workspace": workspace,
        "run_id": run_id,
        "request_id": a.request_id,
        "input_type": a.input_type,
        "prompt": request.prompt if request else None,
        "outcome": reply.outcome,
        "answered_by": reply.answered_by,
        "channel": reply.channel or reply.source,
        "answer": None if secret else reply.value,
        "decisions": [_decision(d, request) for d in reply.decisions],
        "delegations": reply.delegations or [],
        "approvals": reply.approvals or [],  # four eyes: every vote that made the answer
        "follow_up": reply.follow_up,  # reminded when, escalated to whom and when
    }


def history(ctx: Context, who: Identity, limit: int) -> History:
    """Journals newest first (by mtime: no entry in a journal is newer than its last write),
    read until no unread journal can hold one of the newest `limit` entries, or JOURNALS_MAX."""
    journals = sorted(_journals(ctx, who), key=lambda j: j[0], reverse=True)
    found: list[dict[str, Any]] = []
    for read, (mtime, ws, run_id, journal) in enumerate(journals):
        if read >= JOURNALS_MAX or complete(found, mtime, limit):
            break
        found += entries(show_path(ws), run_id, journal_tail(journal), _started(ws, run_id))
        found.sort(key=lambda d: str(d.get("at") or ""), reverse=True)
    return History(history=json_safe(found[:limit]))


def complete(found: list[dict[str, Any]], next_mtime: float, limit: int) -> bool:
    """Whether the newest `limit` entries are known: a journal last written at `next_mtime`
    (and every older one) holds nothing newer than the `limit`-th found (sorted newest first)."""
    if len(found) < limit:
        return False
    last = str(found[limit - 1].get("at") or "")
    return last >= iso(datetime.fromtimestamp(next_mtime, UTC))


def _started(ws: Path, run_id: str) -> datetime | None:
    """The run's start time from its metadata (None if it cannot be read: no durations)."""
    try:
        return inbox.load_run(ws, run_id).start_time
    except (ProtocolError, OSError, ValueError):
        return None


def _journals(ctx: Context, who: Identity) -> Iterator[tuple[float, Path, str, Path]]:
    for v in ctx.feed.index.views():
        if v.run_id is None or not visible(who, v.workspace):
            continue
        try:
            journal = Workspace(Path(v.workspace)).run(v.run_id).journal
            mtime = os.stat(journal).st_mtime
        except (ProtocolError, OSError):
            continue  # not a run id, or no journal yet: nothing to read
        yield mtime, Path(v.workspace), v.run_id, journal


def journal_tail(path: Path) -> list[JournalEvent]:
    """The last events of a journal, read from its end within a fixed budget, typed. The
    journal holds secrets only as handles (`${secret:ID}`), so it is shown as it is."""
    return tail(path, JOURNAL_TAIL_BYTES, JOURNAL_TAIL_EVENTS)
