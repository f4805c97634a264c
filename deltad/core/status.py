"""The daemon's state directory: the single-instance lock and the status snapshot.

`deltad status` reads `status.json`, which the running daemon rewrites atomically (at most about
once a second, only when something changed). The lock file says whether a daemon is alive:
`flock` dies with the process, so a stale status file is recognised as such.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterable
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any

from deltad.protocol import Busy, WorkspaceLock, iso
from deltad.protocol.fsio import atomic_write
from deltad.protocol.printable import json_safe
from deltad.protocol.process import alive

LOCK_NAME = "deltad.lock"
STATUS_NAME = "status.json"
STANDBY_PREFIX = "standby."
LIST_CAP = 1000  # entries per list in status.json; counts are always complete


class AlreadyRunning(Exception):
    pass


class StateDirLock:
    """The same flock as a workspace lock (it dies with the process), on the state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        self._lock = WorkspaceLock(self.path)

    def acquire(self) -> None:
        # The state dir holds keys and receipts: 0700 however it is made (the unit's
        # StateDirectory= does; `deltad serve` by hand must too, whatever the umask says).
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    write_status_file(state_dir / STATUS_NAME, snapshot)


def write_status_file(path: Path, snapshot: dict[str, Any]) -> None:
    # 0600: it lists every workspace and its problems; `deltad status` runs as the daemon's user.
    # Not fsynced: it is rewritten every second while anything changes and nothing is decided
    # from it; two fsyncs a second were the loop's time on a busy disk.
    data = (json.dumps(json_safe(snapshot), indent=2, ensure_ascii=False) + "\n").encode()
    atomic_write(path, data, 0o600, durable=False)


def standby_path(state_dir: Path) -> Path:
    """A standby's own status file: the fleet may share the state dir (and status.json is the
    active's), so each standby writes one named by its host and pid, removed when it ends."""
    return state_dir / f"{STANDBY_PREFIX}{socket.gethostname()}.{os.getpid()}.json"


def read_standbys(state_dir: Path) -> list[dict[str, Any]]:
    """The standbys' status files; on this host, one whose process is gone (kill -9) is
    skipped. One on another host is shown as it says (its age is in `started_at`)."""
    found = []
    here = socket.gethostname()
    try:
        names = sorted(p for p in state_dir.glob(f"{STANDBY_PREFIX}*.json"))
    except OSError:
        return []
    for path in names:
        try:
            doc = json.loads(path.read_bytes()[:65536])
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        pid = doc.get("pid")
        if doc.get("host") == here and not (isinstance(pid, int) and alive(pid, None)):
            continue
        found.append(doc)
    return found


def touch_status(state_dir: Path) -> None:
    """The heartbeat of a status that did not change: its file's time, not a rewrite (an idle
    loop spent half its CPU rewriting the same file). Raises OSError."""
    os.utime(state_dir / STATUS_NAME)


def read_status(state_dir: Path) -> dict[str, Any] | None:
    """status.json, its `updated_at` the later of the one written and the file's time (the
    daemon touches the file to say "still so")."""
    path = state_dir / STATUS_NAME
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        touched = datetime.fromtimestamp(os.stat(path).st_mtime, UTC)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    with contextlib.suppress(TypeError, ValueError):
        if touched > datetime.fromisoformat(str(doc.get("updated_at")).replace("Z", "+00:00")):
            doc["updated_at"] = iso(touched)
    return doc


def capped(items: Iterable[Any]) -> list[Any]:
    """The first LIST_CAP of `items` (an iterator is not run further)."""
    return list(islice(items, LIST_CAP))
