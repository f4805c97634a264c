"""What the feed must remember across a restart, in the state dir (the feed's producer, the
daemon's core, writes it; whoever serves the stream only reads the feed).

    <state_dir>/feed/events.jsonl     the last `cap` events, for `Last-Event-ID` replays
    <state_dir>/feed/announced.jsonl  per workspace, the question announced as open there

Both are append-only JSON lines, rewritten (atomically, fsync'd) when they hold twice what is
live, so each stays bounded: the event log by the event buffer's size (`http.event_buffer`,
1,000 by default), the announcements by the workspaces with an open question. An append is
one `write` on an O_APPEND descriptor: a crash of the daemon loses nothing written; a power
cut may lose what was written since the last fsync (at most `SYNC_EVERY` appends or
`SYNC_SECONDS`). The fsync that time calls for is made at the end of the loop's turn
(`sync_due`), after the turn's resumes have started, so an answer's resume never waits for it.
A line that does not parse (a torn last line after a power cut) is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from deltad.protocol.fsio import atomic_write

log = structlog.get_logger("deltad.feed")

FEED_DIR = "feed"
EVENTS_FILE = "events.jsonl"
ANNOUNCED_FILE = "announced.jsonl"
MAX_LINE_BYTES = 64 * 1024  # a longer line is not one this daemon wrote: skipped
SYNC_EVERY = 64
SYNC_SECONDS = 1.0


class _Lines:
    """One append-only JSON-lines file of the state dir, 0600."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._unsynced = 0
        self._synced_at = time.monotonic()
        self.count = 0  # lines in the file (read or appended)

    def read(self) -> Iterator[dict[str, Any]]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return
            for raw in f:
                self.count += 1
                if len(raw) > MAX_LINE_BYTES:
                    continue
                with contextlib.suppress(ValueError):
                    doc = json.loads(raw)
                    if isinstance(doc, dict):
                        yield doc

    def exists(self) -> bool:
        return self.path.exists()

    def append(self, doc: dict[str, Any]) -> None:
        if self._fd is None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            self._fd = os.open(self.path, flags, 0o600)
        os.write(self._fd, _line(doc))
        self.count += 1
        self._unsynced += 1
        if self._unsynced >= SYNC_EVERY:
            self.sync()

    def sync_due(self) -> None:
        """fsync what is unsynced once SYNC_SECONDS have passed since the last fsync."""
        if self._unsynced and time.monotonic() - self._synced_at >= SYNC_SECONDS:
            self.sync()

    def sync(self) -> None:
        if self._fd is not None and self._unsynced:
            os.fsync(self._fd)
        self._unsynced, self._synced_at = 0, time.monotonic()

    def rewrite(self, docs: list[dict[str, Any]]) -> None:
        """Replace the file with `docs` (atomic, fsync'd); appends go to the new file."""
        self.close()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(self.path, b"".join(_line(d) for d in docs), 0o600)
        self.count = len(docs)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.sync()
            os.close(self._fd)
            self._fd = None


def _line(doc: dict[str, Any]) -> bytes:
    # ensure_ascii: a workspace name that is not UTF-8 (surrogate escapes) survives as \\udcXX
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


class EventLog:
    """The last `cap` events and the floor: the id of the newest event no longer kept (events
    at or below it cannot be replayed). The first line of a rewritten file holds the floor."""

    def __init__(self, state_dir: Path, cap: int) -> None:
        self.cap = max(1, cap)
        self._file = _Lines(state_dir / FEED_DIR / EVENTS_FILE)
        self.floor = 0
        self._kept: list[dict[str, Any]] = []

    def load(self, start: int) -> list[dict[str, Any]]:
        """The kept events, oldest first (each: id, type, at, data). A new log starts with the
        floor `start` (the first id this daemon would give): whatever came before it, from a
        daemon that kept no log, is gone."""
        if not self._file.exists():
            self.floor = start
            self._file.rewrite([{"floor": start}])
            return []
        events = []
        for doc in self._file.read():
            if isinstance(doc.get("floor"), int):
                self.floor = max(self.floor, doc["floor"])
            elif isinstance(doc.get("id"), int) and isinstance(doc.get("type"), str):
                events.append(doc)
        events.sort(key=lambda d: d["id"])
        if len(events) > self.cap:
            self.floor = max(self.floor, events[-self.cap - 1]["id"])
            events = events[-self.cap :]
        self._kept = events
        return list(events)

    def append(self, doc: dict[str, Any]) -> None:
        self._file.append(doc)
        self._kept.append(doc)
        if len(self._kept) > self.cap:
            self.floor = max(self.floor, self._kept[-self.cap - 1]["id"])
            del self._kept[: len(self._kept) - self.cap]
        if self._file.count >= 2 * self.cap + 1:
            self._file.rewrite([{"floor": self.floor}, *self._kept])

    def sync_due(self) -> None:
        self._file.sync_due()

    def close(self) -> None:
        self._file.close()


class Announced:
    """Per workspace, the question announced (`request.created`) as open there and not yet
    closed: keyed by the workspace, so a request id copied into another workspace is that
    workspace's own question, announced there once too."""

    def __init__(self, state_dir: Path) -> None:
        self._file = _Lines(state_dir / FEED_DIR / ANNOUNCED_FILE)
        self.open: dict[str, str] = {}
        self.existed = False  # False: the first start with this file (an upgrade, a new dir)

    def load(self) -> dict[str, str]:
        self.existed = self._file.exists()
        for doc in self._file.read():
            ws, rid = doc.get("w"), doc.get("r")
            if not isinstance(ws, str):
                continue
            if isinstance(rid, str):
                self.open[ws] = rid
            else:
                self.open.pop(ws, None)
        if not self.existed:
            self._file.rewrite([])  # from now on the file says what was announced
        return self.open

    def put(self, ws: str, rid: str) -> None:
        if self.open.get(ws) != rid:
            self.open[ws] = rid
            self._write({"w": ws, "r": rid})

    def drop(self, ws: str) -> None:
        if self.open.pop(ws, None) is not None:
            self._write({"w": ws, "r": None})

    def _write(self, doc: dict[str, Any]) -> None:
        self._file.append(doc)
        if self._file.count >= 2 * len(self.open) + 1000:
            self._file.rewrite([{"w": w, "r": r} for w, r in self.open.items()])

    def sync(self) -> None:
        self._file.sync()

    def sync_due(self) -> None:
        self._file.sync_due()

    def close(self) -> None:
        self._file.close()
