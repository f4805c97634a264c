"""One driver per workspace.

The v1.2 layout gives a workspace one mailbox and one LATEST, so the lock is per workspace,
which is stronger than per run. `flock` belongs to the open file description: it dies with
the process (no stale locks), and Python's fds are not inherited by tools (PEP 446).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from . import safefs
from .errors import Busy


class WorkspaceLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = safefs.open_file(self.path, os.O_RDWR | os.O_CREAT, create_dirs=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise Busy(
                f"workspace {self.path.parent.parent} is busy: process {holder} is driving "
                "a run in it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for humans only
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> WorkspaceLock:
        self.acquire()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
