"""Resuming `delta run --work-dir WS`: queued, bounded, timed, reaped, with backoff.

Single-threaded by design: the main loop calls `start_ready`, selects on `fds()` (readable when
a child may have exited: pidfds, the fork server's socket), and calls `reap` and
`enforce_timeouts`. The executor (`executors/`) starts each child in its own session, so a
daemon restart or a Ctrl-C on its terminal does not take it down, with no fd of the daemon's
(it never holds the daemon's lock).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import sys
from collections import Counter, deque
from collections.abc import ValuesView
from pathlib import Path

import structlog

from deltad.protocol import exitcodes

from .config import DaemonConfig
from .executors import Child, Executor, Finished, Job, exit_meaning, make_executor, orphans, resolve
from .slots import Slots, held_by_owner_cap, pick_next
from .tenancy import Launch

log = structlog.get_logger("deltad.resumer")

KILL_GRACE_SECONDS = 10.0
UNKNOWN_OWNER = -1  # an adopted resume whose workspace is gone: counted, as nobody's

Queued = tuple[Path, str | None, Launch]

BUSY = exitcodes.BUSY
WAITING = exitcodes.WAITING

__all__ = ["BUSY", "WAITING", "Child", "Finished", "Resumer", "build_argv", "exit_meaning"]


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


class Resumer:
    """The resume queue (a workspace at most once, served fairly by owner: `slots.py`), the
    parallelism caps, timeouts and logging; how a resume is started is its executor's business
    (`executors/`)."""

    def __init__(self, config: DaemonConfig) -> None:
        self._executor: Executor | None = None
        self.configure(config)
        self._queued: dict[Path, Queued] = {}  # in arrival order
        self._waiting: dict[int, deque[tuple[int, Path]]] = {}  # owner -> (arrival, ws)
        self._arrivals = itertools.count()
        self._told: dict[int, int] = {}  # owner -> how many of its first waiting were logged
        self._owner_of: dict[Path, int] = {}  # a running resume's owner

    def configure(self, config: DaemonConfig) -> None:
        self._template = config.resume_command
        self._max = config.max_parallel_resumes
        self._slots = Slots.of(self._max, config.max_parallel_resumes_per_owner)
        if (asked := config.max_parallel_resumes_per_owner or 0) > self._max:
            log.warning(
                "resume_slots_clamped",
                max_parallel_resumes_per_owner=asked,
                max_parallel_resumes=self._max,
                detail="one owner may use every slot",
            )
        self._timeout = config.resume_timeout_seconds
        self._state_dir = config.state_dir
        self._logs = config.state_dir / "resume-logs"
        kind = resolve(config.executor, build_argv(self._template, Path("/"), None))
        if self._executor is None:
            self._kind = kind
            self._options = config.executors.get(kind, {})
            return
        self._executor.max_parallel = self._max
        if kind != self._kind:
            log.warning(
                "executor_change_ignored",
                running=self._kind,
                configured=kind,
                detail="changing the executor needs a restart",
            )
        else:
            self._executor.reload()

    @property
    def executor(self) -> Executor:
        """Made at first use, after the daemon holds its state-dir lock: a second daemon that
        is refused never starts a fork server or adopts anything."""
        if self._executor is None:
            self._executor = make_executor(self._kind, self._options, self._max)
            log.info("executor_ready", executor=self._executor.name)
            self._adopt()
        return self._executor

    @property
    def children(self) -> dict[Path, Child]:
        # The first look (the startup reconcile) adopts what an earlier daemon left running.
        return self.executor.children

    def _adopt(self) -> None:
        assert self._executor is not None
        for child in self._executor.adopt(orphans.load(self._state_dir)):
            log.info(
                "resume_adopted",
                workspace=str(child.workspace),
                run_id=child.run_id,
                pid=child.pid or None,
                detail="left running by an earlier deltad; watched to its exit",
            )
        self._save()

    def _save(self) -> None:
        orphans.save(self._state_dir, self.children.values())

    # -- queue ------------------------------------------------------------------------------
    @property
    def pending(self) -> ValuesView[Queued]:
        """The queued resumes, (workspace, run id, launch), in arrival order."""
        return self._queued.values()

    def busy_with(self, ws: Path) -> bool:
        return ws in self._queued or ws in self.children

    def submit(self, ws: Path, run_id: str | None, launch: Launch, owner: int) -> bool:
        """Queue a resume of `ws`; `owner` (the workspace owner's uid) is whose slot it takes."""
        if self.busy_with(ws):
            return False
        self._queued[ws] = (ws, run_id, launch)
        self._waiting.setdefault(owner, deque()).append((next(self._arrivals), ws))
        return True

    def can_start(self) -> bool:
        if not self._waiting:
            return False
        return pick_next(self._heads(), self._running(), self._slots) is not None

    def start_ready(self) -> None:
        started = False
        while self._waiting and self.executor.slots() > 0:
            owner = pick_next(self._heads(), self._running(), self._slots)
            if owner is None:
                break
            ws, run_id, launch = self._queued.pop(self._dequeue(owner))
            started |= self._spawn(ws, run_id, launch, owner)
        self._tell_waits()
        if started:
            self._save()

    def _heads(self) -> dict[int, int]:
        """Each owner with a resume waiting -> the arrival number of its oldest."""
        return {owner: queue[0][0] for owner, queue in self._waiting.items()}

    def _running(self) -> dict[int, int]:
        return Counter(self._owner(ws) for ws in self.children)

    def _owner(self, ws: Path) -> int:
        if (owner := self._owner_of.get(ws)) is None:  # adopted: the workspace's owner
            try:
                owner = os.lstat(ws).st_uid
            except OSError:
                owner = UNKNOWN_OWNER
            self._owner_of[ws] = owner
        return owner

    def _dequeue(self, owner: int) -> Path:
        queue = self._waiting[owner]
        _, ws = queue.popleft()
        if not queue:
            del self._waiting[owner]
        if (told := self._told.pop(owner, 0)) and queue:
            self._told[owner] = told - 1  # the logged ones are the first of the queue
        return ws

    def _tell_waits(self) -> None:
        """Log each resume that waits only for its owner's slot, once."""
        running = self._running()
        for owner in held_by_owner_cap(self._heads(), running, self._slots):
            queue = self._waiting[owner]
            for _, ws in itertools.islice(queue, self._told.get(owner, 0), None):
                log.info(
                    "resume_waits_for_owner_slot",
                    workspace=str(ws),
                    run_id=self._queued[ws][1],
                    uid=owner,
                    running=running[owner],
                    max_parallel_resumes_per_owner=self._slots.per_owner,
                )
            self._told[owner] = len(queue)

    # -- children ---------------------------------------------------------------------------
    def _spawn(self, ws: Path, run_id: str | None, launch: Launch, owner: int) -> bool:
        job = Job(
            ws, run_id, build_argv(self._template, ws, run_id), launch, self._timeout, self._log(ws)
        )
        if ws in self.children:
            return False  # already running (adopted): submit is idempotent, say nothing
        child = self.executor.submit(job)
        if child is None:
            return False
        self._owner_of[ws] = owner
        who = launch.identity
        log.info(
            "resume_spawned",
            workspace=str(ws),
            run_id=run_id,
            pid=child.pid or None,
            uid=who.runs_as.uid,
            user=who.runs_as.name,
            executor=self.executor.started_by(child),
        )
        return True

    def _log(self, ws: Path) -> Path:
        """The child's stdout/stderr: one append-only file per workspace in the state dir."""
        return self._logs / (hashlib.sha256(os.fsencode(ws)).hexdigest()[:16] + ".log")

    def fds(self) -> list[int]:
        return self.executor.fds()

    def reap(self) -> list[Finished]:
        if self._executor is None:
            return []
        done = self._executor.reap()
        for fin in done:
            child, rc = fin.child, fin.rc
            self._owner_of.pop(child.workspace, None)
            log.info(
                "resume_exited",
                workspace=str(child.workspace),
                run_id=child.run_id,
                pid=child.pid or None,
                exit_code=rc,
                outcome=fin.meaning,
                timed_out=child.timed_out,
                duration_ms=fin.duration_ms,
            )
        if done:
            self._save()
        return done

    def enforce_timeouts(self, now: float) -> None:
        if self._executor is None:
            return
        for child in self.children.values():
            if child.term_sent is None and now >= child.deadline:
                child.timed_out = True
                log.warning(
                    "resume_timeout",
                    workspace=str(child.workspace),
                    run_id=child.run_id,
                    pid=child.pid or None,
                    timeout_s=self._timeout,
                )
                self._executor.cancel(child, KILL_GRACE_SECONDS)
        self._executor.tick(now)

    def next_poll(self, now: float) -> float | None:
        """When `reap` must look again although no fd is readable (engines without fds)."""
        ex = self._executor
        if ex is None or ex.poll_every is None or not ex.needs_polling():
            return None
        return now + ex.poll_every

    def next_deadline(self) -> float | None:
        if self._executor is None:
            return None
        times = [c.deadline for c in self.children.values() if c.term_sent is None]
        if (due := self._executor.next_due()) is not None:
            times.append(due)
        return min(times, default=None)

    def detach_all(self) -> list[int]:
        """On shutdown after the grace budget: leave the children running (their own session
        keeps them alive) and forget them; the next daemon adopts them (`resumes.json`)."""
        if self._executor is None:
            return []
        self._save()
        self._owner_of.clear()
        pids = self._executor.detach_all()
        self._executor.close()
        return pids
