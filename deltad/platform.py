"""What is Linux-only, in one place, behind one switch (after trio's single platform check).

`LINUX` is true on Linux unless `DELTAD_PLATFORM=other` is set, which hides every Linux-only
piece so the fallbacks run (the tests use it to check deltad still imports and works
elsewhere). Callers ask here instead of `sys.platform`, and call these helpers instead of
`os.pipe2`, `os.pidfd_open`, `F_SETLEASE` or `/proc`:

| Linux                               | elsewhere                                   |
|-------------------------------------|---------------------------------------------|
| `os.pipe2(O_NONBLOCK | O_CLOEXEC)`  | `os.pipe()` made non-blocking (PEP 446) |
| pidfds (an exit is readable)        | None: the executor polls                    |
| `F_SETLEASE` (who writes a file)    | None: unknown, the settle rule decides      |
| `/proc` (owner liveness, ticks)     | the pid alone                               |
| inotify, fanotify                   | the watchdog backend                        |
| the warm fork executor              | the fresh executor                          |
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

SWITCH = "DELTAD_PLATFORM"


def _linux() -> bool:
    forced = os.environ.get(SWITCH)
    if forced in ("linux", "other"):
        return forced == "linux" and sys.platform.startswith("linux")
    return sys.platform.startswith("linux")


LINUX = _linux()


def nonblocking_pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose ends never block (wake-ups, signal delivery)."""
    if LINUX:
        return os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    r, w = os.pipe()  # non-inheritable already (PEP 446)
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def pidfd_open(pid: int) -> int | None:
    """A descriptor readable when `pid` exits, or None (no pidfds here, or already gone)."""
    if not LINUX:
        return None
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def has_proc() -> bool:
    """/proc with per-process stat files (Linux)."""
    return LINUX and os.path.isdir("/proc/self")


def read_lease_free(fd: int) -> bool | None:
    """Whether nobody has the file open for writing (a read lease is granted), None when the
    kernel cannot tell (not Linux, no lease permission, NFS)."""
    if not LINUX:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as e:
        return False if e.errno == errno.EAGAIN else None
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return True
