"""A `JobExecutor` (seam.py: job handles, no pids) driven by the resumer as an `Executor`.

The resumer's table keeps one `Child` per workspace; here each carries the job's `Handle`
instead of a process. Rules that differ from local processes:

- the resume timeout counts from `Started` (the job running), not from the submit: a job
  queued on a busy cluster is not timed out for waiting;
- `poll` is called every `poll_every` seconds (engines without descriptors), else when
  one of `fds()` is readable;
- adoption asks the engine (`adopt()`), not `resumes.json` (a handle has no pid to record);
  while the engine cannot be asked, `jobs_known` is False (runs on other hosts are then left
  as they are: decide.py) and adoption is tried again every `poll_every`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from ..clock import SYSTEM, Clock
from .base import Child, Finished, Job, Orphan
from .seam import Exit, Handle, Identity, JobExecutor, JobSpec, RequestKey, Started, SubmitError

log = structlog.get_logger("deltad.resumer")


@dataclass
class JobChild(Child):
    """A resume run as a job: no pid (0, logged as none), the engine's handle instead."""

    handle: Handle | None = None
    timeout: float = math.inf  # seconds of running allowed, counted from Started


def spec_of(job: Job, attempt: int) -> JobSpec:
    who = job.launch.identity
    identity = Identity(
        uid=who.runs_as.uid if who.user is None else who.user,
        gid=who.runs_as.gid if who.group is None else who.group,
        groups=tuple(who.extra_groups or ()),
        user=who.runs_as.name,
    )
    key = RequestKey(job.workspace, job.run_id or "", "resume", attempt)
    # No `log`: the daemon's resume log lives in its own state dir (root's, on its host), which
    # the job (the owner, on a compute node) cannot write; the engine keeps the job's output
    # (Slurm: `log_dir`, per owner).
    return JobSpec(key, list(job.argv), identity, dict(job.launch.env), job.timeout, None)


class SeamExecutor:
    """The resumer's `Executor` on top of a `JobExecutor`."""

    def __init__(self, inner: JobExecutor, max_parallel: int = 1, clock: Clock = SYSTEM) -> None:
        self.inner = inner
        self.clock = clock
        self.name = inner.name
        self.max_parallel = max_parallel
        self.poll_every = inner.poll_every
        self.children: dict[Path, Child] = {}
        # Each resume is a new key (attempt, 32 bits): a job that ended is never found again.
        # Seconds since the epoch to start with, so a restarted daemon does not reuse them.
        self._attempts = itertools.count(int(clock.time()) % (1 << 32))
        self._ended: list[Finished] = []
        self.jobs_known = True  # False while adopt() could not ask the engine
        self._adopt_again = 0.0  # monotonic: when to try adopt() again

    def slots(self) -> int:
        return max(0, self.max_parallel - len(self.children))

    def submit(self, job: Job) -> Child | None:
        if (running := self.children.get(job.workspace)) is not None:
            return running
        try:
            handle = self.inner.submit(spec_of(job, next(self._attempts)))
        except SubmitError as e:
            log.error("resume_spawn_failed", workspace=str(job.workspace), error=str(e))
            return None
        except Exception as e:  # a third-party executor's bug must not stop the daemon
            error = f"{type(e).__name__}: {e}"
            log.error("resume_spawn_failed", workspace=str(job.workspace), error=error)
            return None
        now = self.clock.monotonic()
        child = JobChild(job.workspace, job.run_id, 0, None, now, math.inf, timeout=job.timeout)
        child.handle = handle
        self.children[job.workspace] = child
        return child

    def fds(self) -> list[int]:
        return self.inner.fds()

    def needs_polling(self) -> bool:
        return (bool(self.children) or not self.jobs_known) and self.poll_every is not None

    def reap(self) -> list[Finished]:
        if not self.jobs_known and self.clock.monotonic() >= self._adopt_again:
            self._adopt_late()
        for event in self.inner.poll(self.clock.time()):
            child = self._child_of(event.handle)
            if child is None:
                continue
            if isinstance(event, Started):
                # wall clock -> monotonic: the timeout runs from when the job began running
                started = self.clock.monotonic() - max(0.0, self.clock.time() - event.at)
                child.started, child.deadline = started, started + child.timeout
            elif isinstance(event, Exit):
                self._ended.append(self._finish(child, event))
        done, self._ended = self._ended, []
        return done

    def _child_of(self, handle: Handle) -> JobChild | None:
        child = self.children.get(handle.key.workspace)
        if isinstance(child, JobChild) and child.handle == handle:
            return child
        return None

    def _finish(self, child: JobChild, event: Exit) -> Finished:
        del self.children[child.workspace]
        child.exited, child.exit_code = True, event.rc
        child.timed_out = child.timed_out or event.timed_out
        ms = int((self.clock.monotonic() - child.started) * 1000) if child.started else 0
        return Finished(child, event.rc, max(0, ms))

    def cancel(self, child: Child, grace: float) -> None:
        child.term_sent = self.clock.monotonic()
        if isinstance(child, JobChild) and child.handle is not None:
            self.inner.cancel(child.handle, grace)

    def tick(self, now: float) -> None:
        pass  # the engine carries out a cancel's grace itself

    def next_due(self) -> float | None:
        return None

    def adopt(self, orphans: Iterable[Orphan]) -> list[Child]:
        try:
            handles = self.inner.adopt()
        except Exception as e:  # the engine away (SubmitError), or a third-party bug
            error = str(e) if isinstance(e, SubmitError) else f"{type(e).__name__}: {e}"
            if self.jobs_known:
                detail = "runs on other hosts are left as they are until it answers"
                log.warning("resume_adopt_failed", error=error, detail=detail)
            self.jobs_known = False
            self._adopt_again = self.clock.monotonic() + (self.poll_every or 5.0)
            return []
        self.jobs_known = True
        adopted: list[Child] = []
        now = self.clock.monotonic()
        # Newest first (attempts count up across restarts): an ended Job a daemon failed to
        # delete must not stand for the workspace in place of the resume that runs now.
        for handle in sorted(handles, key=lambda h: h.key.attempt, reverse=True):
            ws = handle.key.workspace
            if ws in self.children:
                continue
            child = JobChild(ws, handle.key.run_id or None, 0, None, now, math.inf, adopted=True)
            child.handle = handle
            self.children[ws] = child
            adopted.append(child)
        return adopted

    def _adopt_late(self) -> None:
        for child in self.adopt(()):
            log.info(
                "resume_adopted",
                workspace=str(child.workspace),
                run_id=child.run_id,
                pid=None,
                detail="found once the engine answered; watched to its exit",
            )

    def detach_all(self) -> list[int]:
        self.children.clear()
        return []

    def started_by(self, child: Child) -> str:
        return self.name

    def reload(self) -> None:
        pass

    def close(self) -> None:
        self.inner.close()
