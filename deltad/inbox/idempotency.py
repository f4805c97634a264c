"""Idempotency-Key records in the state dir, so that a retried answer after a restart gets its
original 202 (docs/inbox.md, "Idempotency-Key").

    <state_dir>/idempotency.jsonl   0600; one JSON line per answer given a key

A record lives `TTL_SECONDS` (24 hours) and at most `MAX_KEYS` (10,000) are kept, the oldest
first out; the file is append-only and rewritten (atomically, fsync'd) when it holds twice what
is live. Each record is fsync'd before the 202 goes out. Records hold the receipt (never the
answer) and the body's digest sealed with a random salt kept in the file, so the file gives no
dictionary check of a short secret answer. A line that does not parse is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from deltad import keys
from deltad.protocol.fsio import atomic_write

FILE = "idempotency.jsonl"
TTL_SECONDS = 24 * 3600.0
MAX_KEYS = 10_000
MAX_LINE_BYTES = 64 * 1024

Key = tuple[str, str, str]  # (token name, Idempotency-Key, request id)


class Record:
    __slots__ = ("at", "doc", "sealed", "workspace")

    def __init__(self, workspace: str, sealed: str, doc: dict[str, Any], at: float) -> None:
        self.workspace, self.sealed, self.doc, self.at = workspace, sealed, doc, at


class KeyLog:
    """The records, oldest first, and the file that keeps them (None: memory only)."""

    def __init__(self, path: Path | None, ttl: float = TTL_SECONDS, cap: int = MAX_KEYS) -> None:
        self.path, self.ttl, self.cap = path, ttl, cap
        self.records: dict[Key, Record] = {}
        self.salt = secrets.token_bytes(16)
        self._lines = 0
        if path is not None:
            self._load(path)

    def seal(self, body_digest: str) -> str:
        return keys.sign(self.salt, None, body_digest).hex()

    def get(self, key: Key, now: float) -> Record | None:
        rec = self.records.get(key)
        if rec is not None and now - rec.at > self.ttl:
            return None
        return rec

    def put(self, key: Key, rec: Record) -> None:
        self.records.pop(key, None)
        self.records[key] = rec
        self._trim(rec.at)
        if self.path is None:
            return
        if self._lines >= 2 * len(self.records) + 100:
            self._rewrite(self.path)
        else:
            self._append(self.path, _line(key, rec))

    def _trim(self, now: float) -> None:
        while self.records:
            oldest_key = next(iter(self.records))
            oldest = self.records[oldest_key]
            if len(self.records) <= self.cap and now - oldest.at <= self.ttl:
                break
            del self.records[oldest_key]

    # -- the file ---------------------------------------------------------------------------
    def _load(self, path: Path) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            self._rewrite(path)
            return
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError(f"{path} is not a regular file")
            for raw in f:
                self._lines += 1
                if len(raw) > MAX_LINE_BYTES:
                    continue
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self._take(json.loads(raw))
        self._trim(time.time())

    def _take(self, doc: dict[str, Any]) -> None:
        if "salt" in doc:
            self.salt = bytes.fromhex(doc["salt"])
            return
        who, key, rid = doc["k"]
        rec = Record(str(doc["w"]), str(doc["s"]), dict(doc["doc"]), float(doc["t"]))
        self.records.pop((who, key, rid), None)
        self.records[(str(who), str(key), str(rid))] = rec

    def _rewrite(self, path: Path) -> None:
        head = json.dumps({"salt": self.salt.hex()}).encode() + b"\n"
        body = b"".join(_line(k, r) for k, r in self.records.items())
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, head + body, 0o600)
        self._lines = 1 + len(self.records)

    def _append(self, path: Path, data: bytes) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)  # before the 202: a retry after a crash finds it
        finally:
            os.close(fd)
        self._lines += 1


def _line(key: Key, rec: Record) -> bytes:
    doc = {"k": list(key), "w": rec.workspace, "s": rec.sealed, "doc": rec.doc, "t": rec.at}
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()
