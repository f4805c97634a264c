"""A finished run's outcome: how it ended, its final message, how long it took and who answered
what, for `delta status` and the API's run view.

Read from the journal (the run's `RUN_END` and its `HUMAN_INTERACTION` records) in blocks,
parsing only those lines, so a long run costs a scan, not a parse of every event; each as
its typed payload (protocol/viewing.py). Answers to
sensitive questions are never shown, not even as their handle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from deltad.protocol import InteractionRequest, JournalEvent, RunMetadata, RunStatus, Workspace, iso
from deltad.protocol.errors import ProtocolError
from deltad.protocol.events import Answered, Asked, RunEnd
from deltad.protocol.replies import Reply
from deltad.protocol.viewing import naming, payload_of

FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED})
MAX_ANSWERS = 50  # the most recent answers shown
WANTED = (b'"HUMAN_INTERACTION"', b'"RUN_END"')
SENSITIVE = "(sensitive: not shown)"


def answer_shown(reply: Reply, secret: bool) -> str:
    """What a reply said, for a person: never a secret; decisions one per call."""
    if reply.outcome in ("timeout", "skipped"):
        return str(reply.outcome)
    if secret:
        return SENSITIVE
    if reply.decisions:
        return ", ".join(
            f"{d.decision} {d.action_id}" + (f" ({d.reason})" if d.reason else "")
            for d in reply.decisions
        )
    return f"{reply.key}: {reply.value}" if reply.key else str(reply.value or "")


def answers_of(events: Iterable[JournalEvent]) -> tuple[list[dict[str, Any]], str | None]:
    """Who answered what (oldest first), and the last RUN_END's reason. Events the reader
    could not type are skipped."""
    asked: dict[str, InteractionRequest] = {}
    answers: list[dict[str, Any]] = []
    reason = None
    for e in events:
        if (end := payload_of(e, RunEnd)) is not None:
            reason = end.reason
        elif (q := payload_of(e, Asked)) is not None:
            asked[q.request.request_id] = q.request
        elif (a := payload_of(e, Answered)) is not None:
            req = asked.get(a.request_id)
            reply = a.reply
            answers.append(
                {
                    "request_id": a.request_id,
                    "prompt": req.prompt if req else None,
                    "node_id": a.node_id,
                    "answered_by": reply.answered_by,
                    "source": reply.source,
                    "channel": reply.channel,
                    "at": iso(reply.at) if reply.at else None,
                    "answer": answer_shown(reply, req is not None and req.is_secret),
                    "follow_up": reply.follow_up,  # reminders and escalation before it
                }
            )
    return answers, reason


def run_outcome(ws: Workspace, meta: RunMetadata) -> dict[str, Any] | None:
    """The outcome of a finished run (None while it is not finished)."""
    if meta.status not in FINISHED:
        return None
    try:
        answers, reason = answers_of(naming(ws.run(meta.run_id).journal, WANTED))
    except (OSError, ProtocolError):
        answers, reason = [], None
    duration = (meta.end_time - meta.start_time).total_seconds() if meta.end_time else None
    return {
        "status": str(meta.status),
        "final_message": reason if reason is not None else meta.error,
        "end_time": iso(meta.end_time) if meta.end_time else None,
        "duration_seconds": duration,
        "answers": answers[-MAX_ANSWERS:],
        "answers_total": len(answers),
    }
