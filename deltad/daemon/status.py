"""The daemon's state directory: the single-instance lock and the status snapshot.

`deltad status` reads `status.json`, which the running daemon rewrites atomically (at most about
once a second, only when something changed). The lock file says whether a daemon is alive:
`flock` dies with the process, so a stale status file is recognised as such.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from deltad.protocol import Busy, WorkspaceLock, atomic_write_json

LOCK_NAME = "deltad.lock"
STATUS_NAME = "status.json"
LIST_CAP = 1000  # entries per list in status.json; counts are always complete


class AlreadyRunning(Exception):
    pass


class StateDirLock:
    """The same flock as a workspace lock (it dies with the process), on the state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        self._lock = WorkspaceLock(self.path)

    def acquire(self) -> None:
        try:
            self._lock.acquire()
        except Busy:
            holder = self.path.read_text(errors="replace").strip() or "?"
            raise AlreadyRunning(
                f"another deltad (pid {holder}) is already running with state dir "
                f"{self.path.parent}; stop it first or use a different state_dir"
            ) from None

    def release(self) -> None:
        self._lock.release()


def daemon_running(state_dir: Path) -> bool:
    """True if some process holds the state dir lock (probing takes it only for an instant)."""
    try:
        fd = os.open(state_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write_status(state_dir: Path, snapshot: dict[str, Any]) -> None:
    # 0600: it lists every workspace and its problems; `deltad status` runs as the daemon's user.
    atomic_write_json(state_dir / STATUS_NAME, snapshot, 0o600)


def read_status(state_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((state_dir / STATUS_NAME).read_text(encoding="utf-8"))
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def capped(items: list[Any]) -> list[Any]:
    return items[:LIST_CAP]
