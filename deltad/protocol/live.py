"""The driving client's life, made visible in the mailbox the daemon already watches.

`delta run` opens `.delta/interaction/live` for writing once it holds the workspace lock and
keeps it open until it has released the lock. The kernel closes it however the process ends
(an exit, an exception, `kill -9`), and a close of a file open for writing is IN_CLOSE_WRITE
on the mailbox's one watch (fanotify's mark and watchdog report it too): the daemon looks at
the workspace then, so a dead client's RUNNING run is marked INTERRUPTED at once instead of
at the next liveness sweep or full reconcile.

The file is a hint, never a fact: the daemon does not read it, and decides from the run's
metadata, the owner's /proc entry and the workspace lock (runfacts.py, reconcile.py). Its
content (the pid and the time, one line) is for a person looking. A client that predates it
is still found dead by the reconcile, as before.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

from . import safefs
from .errors import UnsafeFile
from .layout import Workspace


class Live:
    """The live file, held open between `open()` (under the workspace lock) and `close()`
    (after the lock is released: at its close event the run's status is final and the lock
    free, so a clean exit is never taken for a death)."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._fd: int | None = None

    def open(self) -> None:
        """Best effort: a mailbox where it cannot be made (a FIFO or a symlink planted at its
        name, a read-only file system) only loses the early notice, never the run."""
        if self._fd is not None:
            return
        # O_NONBLOCK: a FIFO at the name fails (ENXIO) instead of waiting for a reader.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK
        try:
            fd = safefs.open_file(self.ws.live_file, flags, create_dirs=True)
        except (OSError, UnsafeFile):
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {time.time():.3f}\n".encode(), 0)
        except OSError:
            pass  # held open all the same: only the close matters
        self._fd = fd

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
