"""Spawning `delta run --work-dir WS`, bounded, timed, reaped, with backoff.

Single-threaded by design: the main loop calls `start_ready`, selects on `fds()` (a pidfd per
child, readable when it exits), and calls `reap` and `enforce_timeouts`. Children run in their
own session (`start_new_session`) so a daemon restart or a Ctrl-C on its terminal does not
take them down; their fds are not inherited (close_fds), so they never hold the daemon's lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from deltad.protocol import exitcodes

from .config import DaemonConfig
from .tenancy import Launch

log = structlog.get_logger("deltad.resumer")

KILL_GRACE_SECONDS = 10.0

BUSY = exitcodes.BUSY
WAITING = exitcodes.WAITING


def exit_meaning(rc: int) -> str:
    if rc < 0:
        return (
            f"killed_by_{signal.Signals(-rc).name}" if -rc in signal.valid_signals() else "killed"
        )
    return exitcodes.MEANING.get(rc, "unexpected")


def resolve_program(name: str) -> str:
    """`delta` next to this interpreter first (the same virtualenv), then PATH."""
    if os.sep in name:
        return name
    sibling = Path(sys.executable).parent / name
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which(name) or name


def build_argv(template: list[str], workspace: Path, run_id: str | None) -> list[str]:
    argv = [
        part.replace("{workspace}", str(workspace)).replace("{run_id}", run_id or "")
        for part in template
    ]
    argv[0] = resolve_program(argv[0])
    return argv


@dataclass
class Child:
    workspace: Path
    run_id: str | None
    proc: subprocess.Popen[bytes]
    pidfd: int | None
    started: float
    deadline: float
    term_sent: float | None = None
    timed_out: bool = False
    spawned_at: float = field(default_factory=time.time)  # wall clock, to compare with files

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Finished:
    child: Child
    rc: int
    duration_ms: int

    @property
    def failed(self) -> bool:
        return self.child.timed_out or (
            self.rc not in exitcodes.RUN_OUTCOMES and self.rc != exitcodes.BUSY
        )


class Resumer:
    def __init__(self, config: DaemonConfig) -> None:
        self.configure(config)
        self.pending: deque[tuple[Path, str | None, Launch]] = deque()
        self._pending_set: set[Path] = set()
        self.children: dict[Path, Child] = {}

    def configure(self, config: DaemonConfig) -> None:
        self._template = config.resume_command
        self._max = config.max_parallel_resumes
        self._timeout = config.resume_timeout_seconds
        self._logs = config.state_dir / "resume-logs"

    # -- queue ------------------------------------------------------------------------------
    def busy_with(self, ws: Path) -> bool:
        return ws in self._pending_set or ws in self.children

    def submit(self, ws: Path, run_id: str | None, launch: Launch) -> bool:
        if self.busy_with(ws):
            return False
        self.pending.append((ws, run_id, launch))
        self._pending_set.add(ws)
        return True

    def can_start(self) -> bool:
        return bool(self.pending) and len(self.children) < self._max

    def start_ready(self) -> None:
        while self.pending and len(self.children) < self._max:
            ws, run_id, launch = self.pending.popleft()
            self._pending_set.discard(ws)
            self._spawn(ws, run_id, launch)

    # -- children ---------------------------------------------------------------------------
    def _spawn(self, ws: Path, run_id: str | None, launch: Launch) -> None:
        argv = build_argv(self._template, ws, run_id)
        try:
            out = self._output_file(ws)
        except OSError as e:
            log.error("resume_log_unavailable", workspace=str(ws), error=e.strerror)
            out = subprocess.DEVNULL
        try:
            who = launch.identity
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=ws,
                env=launch.env,
                user=who.user,
                group=who.group,
                extra_groups=who.extra_groups,
                umask=0o077,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            log.error(
                "resume_spawn_failed",
                workspace=str(ws),
                run_id=run_id,
                program=argv[0],
                error=e.strerror,
            )
            return
        finally:
            if isinstance(out, int) and out >= 0:
                os.close(out)
        now = time.monotonic()
        child = Child(ws, run_id, proc, _pidfd(proc.pid), now, now + self._timeout)
        self.children[ws] = child
        log.info(
            "resume_spawned",
            workspace=str(ws),
            run_id=run_id,
            pid=proc.pid,
            uid=who.runs_as.uid,
            user=who.runs_as.name,
        )

    def _output_file(self, ws: Path) -> int:
        """The child's stdout/stderr: one append-only file per workspace in the state dir."""
        self._logs.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(str(ws).encode()).hexdigest()[:16] + ".log"
        fd = os.open(
            self._logs / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        os.write(fd, f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} resume {ws}\n".encode())
        return fd

    def fds(self) -> list[int]:
        return [c.pidfd for c in self.children.values() if c.pidfd is not None]

    def reap(self) -> list[Finished]:
        done: list[Finished] = []
        for ws, child in list(self.children.items()):
            rc = child.proc.poll()
            if rc is None:
                continue
            del self.children[ws]
            if child.pidfd is not None:
                os.close(child.pidfd)
            ms = int((time.monotonic() - child.started) * 1000)
            done.append(Finished(child, rc, ms))
            log.info(
                "resume_exited",
                workspace=str(ws),
                run_id=child.run_id,
                pid=child.pid,
                exit_code=rc,
                outcome=exit_meaning(rc),
                timed_out=child.timed_out,
                duration_ms=ms,
            )
        return done

    def enforce_timeouts(self, now: float) -> None:
        for child in self.children.values():
            if child.term_sent is None and now >= child.deadline:
                child.timed_out = True
                child.term_sent = now
                log.warning(
                    "resume_timeout",
                    workspace=str(child.workspace),
                    run_id=child.run_id,
                    pid=child.pid,
                    timeout_s=self._timeout,
                )
                _signal_group(child.pid, signal.SIGTERM)
            elif child.term_sent is not None and now >= child.term_sent + KILL_GRACE_SECONDS:
                _signal_group(child.pid, signal.SIGKILL)

    def next_deadline(self) -> float | None:
        times = [
            c.deadline if c.term_sent is None else c.term_sent + KILL_GRACE_SECONDS
            for c in self.children.values()
        ]
        return min(times, default=None)

    def detach_all(self) -> list[int]:
        """On shutdown after the grace budget: leave the children running (their own session
        keeps them alive) and forget them; the next daemon checks them by owner pid."""
        pids = [c.pid for c in self.children.values()]
        for child in self.children.values():
            if child.pidfd is not None:
                os.close(child.pidfd)
        self.children.clear()
        return pids


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # old kernel: the main loop falls back to polling children


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
