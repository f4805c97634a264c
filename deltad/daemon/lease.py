"""Active/standby: one lease on shared state decides which daemon of a fleet acts.

The lease is an exclusive `flock` on one file (`ha.lease`), held by the active daemon for as
long as it runs: it dies with the process (a `kill -9` frees it at once) and, on NFSv4, the
client turns it into a byte-range lock the server arbitrates across hosts. A standby tries it
every `ha.poll_seconds` and does nothing else: no watch, no reconcile, no resume, no inbox.
Who holds it (host, pid, since) is written next to it (`<lease>.holder`) for `deltad status`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltad.protocol import iso, utcnow
from deltad.protocol.fsio import atomic_write

HOLDER_SUFFIX = ".holder"


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a lease: written by the holder, read by anyone."""

    host: str
    pid: int
    since: str

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.since}"


def holder_path(lease: Path) -> Path:
    return lease.with_name(lease.name + HOLDER_SUFFIX)


def read_holder(lease: Path) -> Holder | None:
    """The last holder written; None when there is none or it cannot be read."""
    try:
        doc = json.loads(holder_path(lease).read_bytes()[:4096])
        return Holder(str(doc["host"]), int(doc["pid"]), str(doc["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Lease:
    """The exclusive flock on `path`; `try_take` never blocks (the caller paces the tries)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.holder: Holder | None = None
        self.lost = False  # another daemon holds it now: this one stops (exit 1)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_take(self) -> bool:
        """True once this process holds the lease (it then says so next to it)."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        self.holder = Holder(socket.gethostname(), os.getpid(), iso(utcnow()))
        self._say_holder(self.holder)
        return True

    def _say_holder(self, holder: Holder) -> None:
        doc: dict[str, Any] = {"host": holder.host, "pid": holder.pid, "since": holder.since}
        # Durable: after a host dies, this is what the next holder and `deltad status` read.
        atomic_write(holder_path(self.path), (json.dumps(doc) + "\n").encode(), 0o644)

    def still_mine(self) -> bool:
        """False once the holder file names someone else: on NFS a host cut off for longer than
        the server's lease loses its lock without being told, and the daemon that took it over
        has written itself there. An unreadable holder file proves nothing (storage away)."""
        if self.holder is None:
            return False
        now = read_holder(self.path)
        return now is None or now == self.holder

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing drops the flock
            self._fd = None
