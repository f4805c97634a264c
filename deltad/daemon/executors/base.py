"""The executor seam: how a resume is started, watched, cancelled and adopted.

The daemon decides *that* a workspace is resumed; an executor decides *how*. Every executor
tracks its children the same way (a pidfd per child where the kernel has them, so the main
loop's select sees each exit), and differs in how a child is started, how its exit code
arrives and how a signal reaches it. A cluster executor plugs in here next.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from deltad import platform
from deltad.protocol import exitcodes
from deltad.protocol.process import alive, proc_start_ticks

from ..tenancy import Launch

MAX_PID = 1 << 22  # the kernel's limit: anything else recorded is not a process to watch


@dataclass(frozen=True)
class Job:
    """One resume to start: the command (placeholders filled in), where, as whom, logging where."""

    workspace: Path
    run_id: str | None
    argv: list[str]
    launch: Launch
    timeout: float
    log: Path | None  # the resume log (stdout and stderr); None: /dev/null


@dataclass
class Child:
    workspace: Path
    run_id: str | None
    pid: int
    pidfd: int | None
    started: float  # monotonic
    deadline: float  # monotonic: the resume timeout
    term_sent: float | None = None
    kill_at: float | None = None  # monotonic: SIGKILL if still alive (cancel's grace)
    timed_out: bool = False
    adopted: bool = False  # left by an earlier daemon (or a dead fork server): no exit code
    spawned_at: float = field(default_factory=time.time)  # wall clock, to compare with files
    exit_code: int | None = None  # filled in when the executor learns it
    exited: bool = False
    ticks: int | None = None  # start time (/proc/PID/stat): tells it from a recycled pid


@dataclass
class Finished:
    child: Child
    rc: int | None  # None: the exit code is not known (an adopted child)
    duration_ms: int

    @property
    def meaning(self) -> str:
        """completed, failed, busy, waiting, killed_by_SIGTERM, ... or unknown."""
        return exit_meaning(self.rc)

    @property
    def failed(self) -> bool:
        if self.child.timed_out:
            return True
        if self.rc is None:
            return False  # unknown: what the run left on disk decides
        return self.rc not in exitcodes.RUN_OUTCOMES and self.rc != exitcodes.BUSY


@dataclass(frozen=True)
class Orphan:
    """A resume an earlier daemon started and left running (recorded in the state dir)."""

    workspace: Path
    run_id: str | None
    pid: int
    start_ticks: int  # /proc/PID/stat field 22: tells a live orphan from a recycled pid
    spawned_at: float
    deadline_wall: float


def exit_meaning(rc: int | None) -> str:
    if rc is None:
        return "unknown"
    if rc < 0:
        try:  # a real-time signal (or an engine's odd status) has no name: "killed"
            return f"killed_by_{signal.Signals(-rc).name}"
        except ValueError:
            return "killed"
    return exitcodes.MEANING.get(rc, "unexpected")


class Executor(Protocol):
    """What the resumer needs of an executor. Single-threaded: called from the main loop."""

    name: str
    max_parallel: int
    children: dict[Path, Child]
    poll_every: float | None  # how often `reap` must be called while `needs_polling()`

    def slots(self) -> int:
        """How many more resumes may start now."""
        ...

    def submit(self, job: Job) -> Child | None:
        """Start `job`. Idempotent on workspace + run: a workspace already running returns its
        child unchanged. None: it could not be started (logged)."""
        ...

    def fds(self) -> list[int]:
        """Readable when something may have exited (for the main loop's select)."""
        ...

    def needs_polling(self) -> bool:
        """True when some exit would not show up on fds() (no pidfds on this kernel)."""
        ...

    def reap(self) -> list[Finished]:
        """The children that exited since the last call, with their exit codes."""
        ...

    def cancel(self, child: Child, grace: float) -> None:
        """SIGTERM to the child's process group now, SIGKILL after `grace` seconds."""
        ...

    def tick(self, now: float) -> None:
        """Carry out what is due (a cancel's SIGKILL)."""
        ...

    def next_due(self) -> float | None: ...

    def adopt(self, orphans: Iterable[Orphan]) -> list[Child]:
        """Track resumes an earlier daemon left running (exit code unknown)."""
        ...

    def detach_all(self) -> list[int]:
        """Forget every child, leaving it running (its own session keeps it alive)."""
        ...

    def started_by(self, child: Child) -> str:
        """The executor name to log for `child` (a fallback may have started it)."""
        ...

    def reload(self) -> None:
        """The configuration was reloaded (the fork server restarts for new resumes)."""
        ...

    def close(self) -> None: ...


class Tracker:
    """What every executor shares: the children by workspace, pidfds, cancel with grace,
    adopting orphans. Subclasses start children and learn exit codes."""

    name = "base"
    poll_every: float | None = 0.2  # without pidfds, how often to look for exited children

    def __init__(self, max_parallel: int) -> None:
        self.max_parallel = max_parallel
        self.children: dict[Path, Child] = {}

    def slots(self) -> int:
        return max(0, self.max_parallel - len(self.children))

    def fds(self) -> list[int]:
        return [c.pidfd for c in self.children.values() if c.pidfd is not None]

    def needs_polling(self) -> bool:
        return any(c.pidfd is None for c in self.children.values())

    def track(self, job: Job, pid: int) -> Child:
        now = time.monotonic()
        child = Child(job.workspace, job.run_id, pid, pidfd(pid), now, now + job.timeout)
        child.ticks = proc_start_ticks(pid)
        self.children[job.workspace] = child
        return child

    # -- exits ------------------------------------------------------------------------------
    def collect(self, child: Child) -> None:
        """Learn whether `child` exited (and its code). Subclasses override."""
        if child.adopted and not alive(child.pid, child.ticks):
            child.exited = True

    def reap(self) -> list[Finished]:
        done: list[Finished] = []
        for ws, child in list(self.children.items()):
            self.collect(child)
            if not child.exited:
                continue
            del self.children[ws]
            if child.pidfd is not None:
                os.close(child.pidfd)
            ms = int((time.monotonic() - child.started) * 1000)
            done.append(Finished(child, None if child.adopted else child.exit_code, ms))
        return done

    # -- signals ----------------------------------------------------------------------------
    def signal(self, child: Child, sig: signal.Signals) -> None:
        signal_group(child.pid, sig)

    def cancel(self, child: Child, grace: float) -> None:
        now = time.monotonic()
        child.term_sent = now
        child.kill_at = now + grace
        self.signal(child, signal.SIGTERM)

    def tick(self, now: float) -> None:
        for child in self.children.values():
            if child.kill_at is not None and now >= child.kill_at:
                child.kill_at = None
                self.signal(child, signal.SIGKILL)

    def next_due(self) -> float | None:
        return min((c.kill_at for c in self.children.values() if c.kill_at), default=None)

    # -- restarts ---------------------------------------------------------------------------
    def adopt(self, orphans: Iterable[Orphan]) -> list[Child]:
        adopted = []
        now_wall, now = time.time(), time.monotonic()
        for o in orphans:
            if o.workspace in self.children or not 0 < o.pid < MAX_PID:
                continue
            if not alive(o.pid, o.start_ticks):
                continue
            fd = pidfd(o.pid)
            if not alive(o.pid, o.start_ticks):  # the pidfd may name a recycled pid: check again
                if fd is not None:
                    os.close(fd)
                continue
            deadline = now + (o.deadline_wall - now_wall)
            child = Child(o.workspace, o.run_id, o.pid, fd, now, deadline, adopted=True)
            child.spawned_at, child.ticks = o.spawned_at, o.start_ticks
            self.children[o.workspace] = child
            adopted.append(child)
        return adopted

    def detach_all(self) -> list[int]:
        pids = [c.pid for c in self.children.values()]
        for child in self.children.values():
            if child.pidfd is not None:
                os.close(child.pidfd)
        self.children.clear()
        return pids

    def started_by(self, child: Child) -> str:
        return self.name

    def reload(self) -> None:
        pass

    def close(self) -> None:
        pass


def pidfd(pid: int) -> int | None:
    return platform.pidfd_open(pid)  # None: the main loop falls back to polling


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
