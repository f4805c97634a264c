"""Who owns a run, and is that process still alive?

A bare pid lies after reuse or reboot; (pid, start time in clock ticks since boot, boot id,
hostname) does not: a reused pid necessarily has a later start time.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cache

from pydantic import BaseModel

from deltad import platform


class OwnerProcess(BaseModel):
    pid: int
    start_ticks: int | None = None  # field 22 of /proc/<pid>/stat
    boot_id: str | None = None
    hostname: str


@cache
def boot_id() -> str | None:
    if not platform.has_proc():
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


# The kernel sets PF_EXITING (field 9's flags) as a process starts to exit, before it closes
# its files: a process seen with it never runs its own code again. A dying `delta run`'s
# `live` file close (protocol/live.py) can be read before the process is a zombie.
PF_EXITING = 0x4


@dataclass(frozen=True)
class ProcStat:
    state: bytes  # field 3: R, S, D, Z (zombie), X (dead), ...
    start_ticks: int | None  # field 22: the start time in clock ticks since boot
    flags: int = 0  # field 9: the kernel's PF_* flags

    @property
    def dead(self) -> bool:
        return self.state in (b"Z", b"X")

    @property
    def exiting(self) -> bool:
        """Dead, or on its way there: it will never run its own code again."""
        return self.dead or bool(self.flags & PF_EXITING)


def proc_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat, read once: the one parser of it (owner liveness, the executors)."""
    if not 0 < pid <= MAX_PID or not platform.has_proc():
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parens: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    if not fields:
        return None
    try:
        ticks: int | None = int(fields[19])  # field 22 overall; 3 is the first after comm
    except (ValueError, IndexError):
        ticks = None
    try:
        flags = int(fields[6])  # field 9
    except (ValueError, IndexError):
        flags = 0
    return ProcStat(fields[0], ticks, flags)


def proc_start_ticks(pid: int) -> int | None:
    st = proc_stat(pid)
    return st.start_ticks if st is not None else None


def alive(pid: int, ticks: int | None) -> bool:
    """Alive and not a zombie; with `ticks`, also the same process (not a recycled pid).
    Without /proc: the pid alone."""
    if not platform.has_proc():
        return 0 < pid <= MAX_PID and _pid_exists(pid)
    st = proc_stat(pid)
    if st is None or st.dead:
        return False
    return ticks is None or st.start_ticks == ticks


def current_owner() -> OwnerProcess:
    pid = os.getpid()
    return OwnerProcess(
        pid=pid, start_ticks=proc_start_ticks(pid), boot_id=boot_id(), hostname=socket.gethostname()
    )


# Linux caps pid_max at 2^22; a pid outside 1..that (0, -1, 2^31 from a hand-edited file)
# names no process of its own, and os.kill would signal a group or overflow.
MAX_PID = 1 << 22


def owner_alive(owner: OwnerProcess | None) -> bool | None:
    """True/False when decidable here; None when the owner is on another host."""
    if owner is None or not 0 < owner.pid <= MAX_PID:
        return False
    if owner.hostname != socket.gethostname():
        return None
    if owner.boot_id and boot_id() and owner.boot_id != boot_id():
        return False
    st = proc_stat(owner.pid)
    if st is None or st.start_ticks is None:
        return _pid_exists(owner.pid)  # no /proc: fall back to the pid alone
    if st.exiting:
        return False
    return owner.start_ticks is None or st.start_ticks == owner.start_ticks


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
