"""Resumes as processes on this host: what `fresh`, `command` and `fork` share behind the
job-handle seam (seam.py).

Everything about processes is private here: the pid and its start ticks (the handle's `ref`,
"PID:TICKS", tells a live job from a recycled pid), a pidfd per process (readable at its exit,
so the daemon's select sees it; without pidfds `poll_every` asks to be polled), the SIGTERM and
the SIGKILL after a cancel's grace, the resume log, and `<state_dir>/resumes.json`, the jobs in
flight, which the next daemon's `adopt()` reads back and checks against /proc. A job started
here is reported `Started` at its spawn time (a process runs at once: the timeout counts from
there). Subclasses say how a process starts and how its exit code arrives.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from deltad import platform
from deltad.clock import SYSTEM, Clock
from deltad.protocol.printable import show_path
from deltad.protocol.process import alive, proc_start_ticks

from .seam import BaseJobExecutor, Event, Exit, Handle, Identity, JobSpec, RequestKey, Started

log = structlog.get_logger("deltad.resumer")

MAX_PID = 1 << 22  # the kernel's limit: anything else recorded is not a process to watch
POLL_EVERY = 0.2  # seconds between looks for an exit no pidfd announces
RESUMES = "resumes.json"
MAX_RESUMES_BYTES = 4 * 1024 * 1024
LOGS = "resume-logs"


@dataclass(frozen=True)
class Switch:
    """The uid, gid and groups a process takes before it runs (Popen's user/group/...)."""

    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass
class Proc:
    """One job as a local process."""

    handle: Handle
    pid: int
    ticks: int | None  # /proc/PID/stat start time: tells it from a recycled pid
    pidfd: int | None
    spawned_at: float  # wall clock: reported as the job's start
    adopted: bool = False  # not our child (an earlier daemon's, a dead fork server's): no code
    reported: bool = False  # its Started went out
    rc: int | None = None
    exited: bool = False


@dataclass(frozen=True)
class Left:
    """A job an earlier daemon recorded in `resumes.json`."""

    key: RequestKey
    executor: str
    pid: int
    ticks: int
    spawned_at: float


# -- decisions -----------------------------------------------------------------------------------
def switch_to(identity: Identity, daemon_uid: int) -> Switch | None:
    """Whom the process becomes: nobody else when it runs as the daemon's own user (a non-root
    daemon may not even call setgroups), else the owner's uid, gid and groups."""
    if identity.uid == daemon_uid:
        return None
    return Switch(identity.uid, identity.gid, tuple(identity.groups))


def ref_of(pid: int, ticks: int | None) -> str:
    return f"{pid}:{ticks}" if ticks is not None else str(pid)


def handle_of(
    key: RequestKey,
    executor: str,
    pid: int,
    ticks: int | None,
    more: tuple[tuple[str, int | str], ...] = (),
) -> Handle:
    return Handle(key, executor, ref_of(pid, ticks), shown=(("pid", pid), *more))


def may_adopt(left: Left, known: Iterable[str]) -> bool:
    """Worth a look in /proc: a pid the kernel can have, a job not already ours."""
    return 0 < left.pid < MAX_PID and left.key.name not in known


def log_path(state_dir: Path, ws: Path) -> Path:
    """The resume log: one append-only file per workspace in the daemon's state dir."""
    return state_dir / LOGS / (hashlib.sha256(os.fsencode(ws)).hexdigest()[:16] + ".log")


# -- resumes.json --------------------------------------------------------------------------------
def save(state_dir: Path, procs: Iterable[Proc]) -> None:
    """Advisory (without it a restarted daemon still finds the run RUNNING with a live owner):
    replaced atomically, not fsynced."""
    rows = [
        {
            "workspace": str(p.handle.key.workspace),
            "run_id": p.handle.key.run_id,
            "request": p.handle.key.request,
            "attempt": p.handle.key.attempt,
            "executor": p.handle.executor,
            "pid": p.pid,
            "start_ticks": p.ticks,
            "spawned_at": p.spawned_at,
        }
        for p in procs
        if p.ticks is not None
    ]
    path = state_dir / RESUMES
    tmp = path.with_name(f".{RESUMES}.{os.getpid()}")
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, path)


def load(state_dir: Path, executor: str) -> list[Left]:
    """What the previous daemon left; anything unreadable counts as nothing. Rows of an older
    deltad (no request, attempt or executor) read as the first attempt of `executor`."""
    try:
        fd = os.open(state_dir / RESUMES, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            rows = json.loads(f.read(MAX_RESUMES_BYTES))
        return [
            Left(
                RequestKey(
                    Path(r["workspace"]),
                    r["run_id"] or "",
                    str(r.get("request", "resume")),
                    int(r.get("attempt", 0)),
                ),
                str(r.get("executor", executor)),
                int(r["pid"]),
                int(r["start_ticks"]),
                float(r["spawned_at"]),
            )
            for r in rows
        ]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


# -- the executor --------------------------------------------------------------------------------
class LocalJobs(BaseJobExecutor):
    """A `JobExecutor` of local processes; subclasses implement `start` and may refine
    `collect`, `signal` and `watched`."""

    name = "local"

    def __init__(self, state_dir: Path, clock: Clock = SYSTEM) -> None:
        self.state_dir = state_dir
        self.clock = clock
        self.poll_every: float | None = None
        self.procs: dict[str, Proc] = {}  # by key name: submit is idempotent on the key

    # -- what subclasses provide ------------------------------------------------------------
    def start(self, spec: JobSpec, log_fd: int) -> tuple[int, str]:
        """Start the process; its pid and the executor that started it. SubmitError else."""
        raise NotImplementedError

    def collect(self, proc: Proc) -> None:
        """Learn whether `proc` exited (and its code). An adopted process has none to give."""
        if proc.adopted and not alive(proc.pid, proc.ticks):
            proc.exited = True

    def signal(self, proc: Proc, sig: signal.Signals) -> None:
        signal_group(proc.pid, sig)

    def watched(self, proc: Proc) -> bool:
        """Its exit shows on its pidfd (not on another fd, like the fork server's socket)."""
        return True

    def running(self, proc: Proc) -> bool:
        """It runs the job now (`Started` may go out); a forked child still setting up not."""
        return True

    # -- the seam ---------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> Handle:
        if (known := self.procs.get(spec.key.name)) is not None:
            return known.handle
        out = open_log(spec.key.workspace, spec.log or log_path(self.state_dir, spec.key.workspace))
        try:
            pid, by = self.start(spec, out)
        finally:
            os.close(out)
        ticks = proc_start_ticks(pid)
        handle = handle_of(spec.key, by, pid, ticks, self.shown_of(pid))
        proc = Proc(handle, pid, ticks, pidfd(pid), self.clock.time())
        self.procs[spec.key.name] = proc
        self._changed()
        return proc.handle

    def shown_of(self, pid: int) -> tuple[tuple[str, int | str], ...]:
        """More of a new process for its handle's `shown` (the log's `resume_spawned`)."""
        return ()

    def poll(self, now: float) -> list[Event]:
        events: list[Event] = []
        ended = False
        for name, proc in list(self.procs.items()):
            if not proc.reported and self.running(proc):
                proc.reported = True
                events.append(Started(proc.handle, proc.spawned_at))
            self.collect(proc)
            if proc.exited:
                del self.procs[name]
                close_fd(proc.pidfd)
                events.append(Exit(proc.handle, None if proc.adopted else proc.rc))
                ended = True
        if ended:
            self._changed()
        return events

    def cancel(self, handle: Handle, force: bool) -> None:
        proc = self.procs.get(handle.key.name)
        if proc is None or proc.handle != handle:
            return
        self.signal(proc, signal.SIGKILL if force else signal.SIGTERM)

    def adopt(self) -> list[Handle]:
        adopted = []
        for left in load(self.state_dir, self.name):
            if not may_adopt(left, self.procs) or not alive(left.pid, left.ticks):
                continue
            fd = pidfd(left.pid)
            if not alive(left.pid, left.ticks):  # the pidfd may name a recycled pid: check again
                close_fd(fd)
                continue
            handle = handle_of(left.key, left.executor, left.pid, left.ticks)
            proc = Proc(handle, left.pid, left.ticks, fd, left.spawned_at, adopted=True)
            self.procs[left.key.name] = proc
            adopted.append(handle)
        self._changed()
        return adopted

    def fds(self) -> list[int]:
        return [p.pidfd for p in self.procs.values() if p.pidfd is not None and self.watched(p)]

    def due(self, now: float) -> float | None:
        """A Started to report: now."""
        return now if any(not p.reported and self.running(p) for p in self.procs.values()) else None

    def close(self) -> None:
        """Let go: the processes run on (own sessions), recorded for the next daemon."""
        save(self.state_dir, self.procs.values())
        for proc in self.procs.values():
            close_fd(proc.pidfd)
        self.procs.clear()

    # -- bookkeeping ------------------------------------------------------------------------
    def _changed(self) -> None:
        save(self.state_dir, self.procs.values())
        self.refresh_polling()

    def refresh_polling(self) -> None:
        blind = any(p.pidfd is None and self.watched(p) for p in self.procs.values())
        self.poll_every = POLL_EVERY if blind else None


def open_log(ws: Path, path: Path) -> int:
    """The process's stdout/stderr: the append-only resume log, or /dev/null if it cannot be
    opened (logged). The caller closes it once the process has its copy."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(path, flags, 0o600)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        os.write(fd, f"--- {stamp} resume {show_path(ws)}\n".encode())
        return fd
    except OSError as e:
        log.error("resume_log_unavailable", workspace=str(ws), error=e.strerror)
    return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


def pidfd(pid: int) -> int | None:
    return platform.pidfd_open(pid)  # None: the executor asks to be polled instead


def close_fd(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
