"""A finished run's outcome: how it ended, its final message, how long it took and who answered
what, for `delta status` and the API's run view.

Read from the journal (the run's `RUN_END` and its `HUMAN_INTERACTION` records) in blocks,
parsing only those lines, so a long run costs a scan, not a parse of every event. Answers to
sensitive questions are never shown, not even as their handle.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deltad.protocol import RunMetadata, RunStatus, Workspace, iso, safefs
from deltad.protocol.errors import ProtocolError

FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED})
MAX_ANSWERS = 50  # the most recent answers shown
BLOCK = 1 << 20
WANTED = (b'"HUMAN_INTERACTION"', b'"RUN_END"')
SENSITIVE = "(sensitive: not shown)"


def _lines(path: Path) -> Iterator[bytes]:
    """The journal's lines naming an event type we read (no symlink, a regular file)."""
    fd = safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        rest = b""
        while block := os.read(fd, BLOCK):
            *whole, rest = (rest + block).split(b"\n")
            yield from (line for line in whole if any(w in line for w in WANTED))
        if any(w in rest for w in WANTED):
            yield rest
    finally:
        os.close(fd)


def _events(path: Path) -> Iterator[dict[str, Any]]:
    for line in _lines(path):
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a torn last line: the run's own reader deals with it
        if isinstance(e, dict) and isinstance(e.get("payload"), dict):
            yield e


def answer_shown(reply: dict[str, Any], secret: bool) -> str:
    """What a reply said, for a person: never a secret; decisions one per call."""
    if reply.get("outcome") in ("timeout", "skipped"):
        return str(reply["outcome"])
    if secret:
        return SENSITIVE
    if decisions := reply.get("decisions"):
        return ", ".join(
            f"{d.get('decision')} {d.get('action_id')}"
            + (f" ({d['reason']})" if d.get("reason") else "")
            for d in decisions
        )
    value = reply.get("value")
    return f"{reply['key']}: {value}" if reply.get("key") else str(value or "")


def answers_of(events: Iterator[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """Who answered what (oldest first), and the last RUN_END's reason."""
    asked: dict[str, dict[str, Any]] = {}
    answers: list[dict[str, Any]] = []
    reason = None
    for e in events:
        p = e["payload"]
        if e.get("type") == "RUN_END":
            reason = str(p.get("reason", ""))
        elif p.get("phase") == "asked" and isinstance(p.get("request"), dict):
            asked[str(p["request"].get("request_id"))] = p["request"]
        elif p.get("phase") == "answered" and isinstance(p.get("reply"), dict):
            req = asked.get(str(p.get("request_id")), {})
            secret = bool(req.get("sensitive")) or req.get("input_type") == "password"
            reply = p["reply"]
            answers.append(
                {
                    "request_id": p.get("request_id"),
                    "prompt": req.get("prompt"),
                    "node_id": p.get("node_id"),
                    "answered_by": reply.get("answered_by"),
                    "source": reply.get("source"),
                    "channel": reply.get("channel"),
                    "at": reply.get("at"),
                    "answer": answer_shown(reply, secret),
                }
            )
    return answers, reason


def run_outcome(ws: Workspace, meta: RunMetadata) -> dict[str, Any] | None:
    """The outcome of a finished run (None while it is not finished)."""
    if meta.status not in FINISHED:
        return None
    try:
        answers, reason = answers_of(_events(ws.run(meta.run_id).journal))
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
