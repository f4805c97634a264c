"""Resuming `delta run --work-dir WS`: queued, bounded, timed, reaped, with backoff.

Single-threaded by design: the main loop calls `start_ready`, selects on `fds()` (readable when
a job may have changed: pidfds, the fork server's socket, a remote executor's worker), calls
`reap` every turn and `enforce_timeouts`. The resumer speaks only the job-handle seam
(`executors/seam.py`): it submits a `JobSpec` under a `RequestKey` it chose, keeps the `Handle`,
and learns from `poll` when the job started running (its timeout counts from then) and how it
ended. Pids, pidfds and `resumes.json` are the local executors' own business
(`executors/local.py`).

The resumer holds the seam's rules in one place: every call into an executor is wrapped (an
executor's exception fails that resume, or that one call, with a logged reason, never the
daemon); time handed to it is monotonic; a resume that times out gets TERM, then KILL after
`KILL_GRACE_SECONDS` (the resumer's timer, not the executor's); a submit the engine refused is
tried again after a `Pacing` delay until it is taken, said once.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, ValuesView
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from deltad.clock import SYSTEM, Clock
from deltad.core.argv import build_argv
from deltad.core.config import DaemonConfig
from deltad.core.slots import Slots, held_by_owner_cap, pick_next
from deltad.core.tenancy import Launch
from deltad.executors import (
    Exit,
    Handle,
    JobExecutor,
    Started,
    exit_meaning,
    make_executor,
    resolve,
)
from deltad.executors.seam import (
    AdoptPending,
    BaseJobExecutor,
    Identity,
    JobSpec,
    Refused,
    RequestKey,
    SubmitError,
)
from deltad.pacing import Pacing
from deltad.protocol import exitcodes

if TYPE_CHECKING:
    from deltad.metrics import CoreMetrics

log = structlog.get_logger("deltad.resumer")

KILL_GRACE_SECONDS = 10.0
# A submit the engine refused (or could not be asked about) is tried again after this: short,
# so a resume is taken within seconds of the engine's return, not at the next full reconcile.
SUBMIT_RETRY = Pacing(base=0.5, cap=4.0)
UNKNOWN_OWNER = -1  # an adopted resume whose workspace is gone: counted, as nobody's

Queued = tuple[Path, str | None, Launch]

BUSY = exitcodes.BUSY
WAITING = exitcodes.WAITING

__all__ = ["BUSY", "WAITING", "Finished", "InFlight", "Resumer", "build_argv", "exit_meaning"]


@dataclass
class InFlight:
    """A resume submitted (or adopted) and not yet ended, as the daemon sees it: a handle."""

    handle: Handle
    spawned_at: float  # wall clock: submitted (adopted: when it started), to compare with files
    started: float | None = None  # monotonic: the job began running (Started)
    deadline: float = math.inf  # monotonic: the resume timeout; none while queued
    term_sent: float | None = None  # monotonic: TERM sent (a timeout); KILL after the grace
    kill_sent: bool = False
    timed_out: bool = False
    adopted: bool = False  # left by an earlier daemon: its exit code may be unknown
    # What submitting it took, to submit it again when the engine refuses it later (Refused);
    # None for an adopted job.
    again: tuple[str | None, Launch, int, str] | None = None  # run id, launch, owner, request

    @property
    def workspace(self) -> Path:
        return self.handle.key.workspace

    @property
    def run_id(self) -> str | None:
        return self.handle.key.run_id or None


@dataclass(frozen=True)
class Finished:
    resume: InFlight
    rc: int | None  # None: the exit code is not known (an adopted job, a purged record)
    duration_ms: int
    detail: str = ""  # the engine's words

    @property
    def meaning(self) -> str:
        """completed, failed, busy, waiting, killed_by_SIGTERM, ... or unknown."""
        return exit_meaning(self.rc)

    @property
    def failed(self) -> bool:
        return failed(self.rc, self.resume.timed_out)


def failed(rc: int | None, timed_out: bool) -> bool:
    """A timeout, or an exit code that is no outcome of a run; 75 (busy) is not a failure, and
    an unknown code leaves it to what the run left on disk."""
    if timed_out:
        return True
    if rc is None:
        return False
    return rc not in exitcodes.RUN_OUTCOMES and rc != exitcodes.BUSY


def _always() -> bool:
    return True


def started_at(now_mono: float, now_wall: float, at_wall: float) -> float:
    """The monotonic time of a wall-clock start reported at `at_wall` (never in the future)."""
    return now_mono - max(0.0, now_wall - at_wall)


def spec_of(
    ws: Path,
    run_id: str | None,
    argv: list[str],
    launch: Launch,
    timeout: float,
    attempt: int,
    request: str = "resume",
) -> JobSpec:
    who = launch.identity
    identity = Identity(
        uid=who.runs_as.uid if who.user is None else who.user,
        gid=who.runs_as.gid if who.group is None else who.group,
        groups=tuple(who.extra_groups or ()),
        user=who.runs_as.name,
    )
    key = RequestKey(ws, run_id or "", request, attempt)
    # No `log`: a local executor keeps its resume logs in the daemon's state dir; a job on
    # another host (the owner, on a compute node) cannot write there, the engine keeps its output.
    return JobSpec(key, list(argv), identity, dict(launch.env), timeout, None)


def shown(handle: Handle) -> dict[str, Any]:
    """What a log line says of a job: its executor's id for it, and what the executor adds."""
    return {"job": handle.ref, **dict(handle.shown)}


def newest_first(handles: Iterable[Handle]) -> list[Handle]:
    """Of the jobs an engine lists, the newest first (attempts count up across restarts): an
    ended job a daemon failed to delete must not stand for its workspace in place of the
    resume that runs now."""
    return sorted(handles, key=lambda h: h.key.attempt, reverse=True)


class Resumer:
    """The resume queue (a workspace at most once, served fairly by owner: `slots.py`), the
    parallelism caps, timeouts and logging; how a resume is started is its executor's business
    (`executors/`), reached only through the job-handle seam."""

    def __init__(self, config: DaemonConfig, clock: Clock = SYSTEM) -> None:
        self.clock = clock
        self._executor: JobExecutor | None = None
        self.configure(config)
        self._queued: dict[Path, Queued] = {}  # in arrival order
        self._waiting: dict[int, deque[tuple[int, Path]]] = {}  # owner -> (arrival, ws)
        self._arrivals = itertools.count()
        self._told: dict[int, int] = {}  # owner -> how many of its first waiting were logged
        self._owner_of: dict[Path, int] = {}  # a running resume's owner
        self._requests: dict[Path, str] = {}  # a queued resume's request (its key's part)
        self._in_flight: dict[Path, InFlight] = {}
        # Each resume is a new key (attempt, 32 bits): a job that ended is never found again.
        # Seconds since the epoch to start with, so a restarted daemon does not reuse them.
        self._attempts = itertools.count(int(clock.time()) % (1 << 32))
        self.jobs_known = True  # False while the executor's adopt() could not ask its engine
        self._adopt_again = 0.0  # monotonic: when to try adopt() again
        self.metrics: CoreMetrics | None = None  # set by the service (deltad/metrics.py)
        self._answered_at: dict[Path, float] = {}  # a queued answer's file time (wall)
        self.fence: Callable[[], bool] = _always  # may this daemon submit now? (HA: lease.py)
        self._adopt_pending = False  # adopt() waits for a worker's first answer: ask every turn
        self._adopt_said = False  # resume_adopt_failed logged (once until adoption works)
        self._retry_at: dict[Path, float] = {}  # a queued resume's next submit (monotonic)
        self._failures: dict[Path, int] = {}  # failed submits in a row, by workspace
        self._said: dict[str, str] = {}  # a seam call -> the failure last logged for it

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
        kind = resolve(config.executor, build_argv(self._template, Path("/"), None))
        if self._executor is None:
            self._kind = kind
            self._options = config.executors.get(kind, {})
            return
        if kind != self._kind:
            log.warning(
                "executor_change_ignored",
                running=self._kind,
                configured=kind,
                detail="changing the executor needs a restart",
            )
        else:
            self._guard("reload", self._executor.reload)

    @property
    def executor(self) -> JobExecutor:
        """Made at first use, after the daemon holds its state-dir lock: a second daemon that
        is refused never starts a fork server or adopts anything."""
        if self._executor is None:
            self._executor = make_executor(self._kind, self._options, self._state_dir)
            if isinstance(self._executor, BaseJobExecutor):
                self._executor.fence = lambda: self.fence()  # the lease's, whenever asked
            log.info("executor_ready", executor=self._executor.name)
            self._adopt()
        return self._executor

    @property
    def children(self) -> dict[Path, InFlight]:
        """The resumes in flight, by workspace. The first look (the startup reconcile) adopts
        what an earlier daemon left running."""
        self.executor  # noqa: B018 - made (and adopting) on first use
        return self._in_flight

    def _adopt(self, late: bool = False) -> None:
        """Take over the jobs the engine still lists for this daemon. An engine that cannot be
        asked is no crash: `jobs_known` is False (runs on other hosts are then left as they
        are: decide.py), said once, and adoption is tried again every `poll_every`."""
        assert self._executor is not None
        try:
            handles = self._executor.adopt()
        except AdoptPending:  # a worker's first answer is on its way: asked again at its news
            self.jobs_known, self._adopt_pending = False, True
            return
        except Exception as e:  # the engine away (SubmitError), or a third-party bug
            self._adopt_pending = False
            self._adopt_failed(str(e) if isinstance(e, SubmitError) else f"{type(e).__name__}: {e}")
            return
        self.jobs_known, self._adopt_pending, self._adopt_said = True, False, False
        detail = (
            "found once the engine answered; watched to its exit"
            if late
            else "left running by an earlier deltad; watched to its exit"
        )
        for handle in newest_first(handles):
            ws = handle.key.workspace
            if ws in self._in_flight:
                continue
            # Queued while the engine had not yet said which jobs exist (the startup reconcile
            # runs first): the adopted job is that resume. Left queued, it would start once the
            # adopted job ended — a second job of one answer (seen when the owner's slot cap
            # held it back until then).
            self._unqueue(ws)
            self._in_flight[ws] = InFlight(handle, self.clock.time(), adopted=True)
            log.info(
                "resume_adopted",
                workspace=str(ws),
                run_id=handle.key.run_id or None,
                **shown(handle),
                detail=detail,
            )

    def _adopt_failed(self, error: str) -> None:
        if not self._adopt_said:  # once, until adoption works
            detail = "runs on other hosts are left as they are until it answers"
            log.warning("resume_adopt_failed", error=error, detail=detail)
            if self.metrics is not None and self._executor is not None:
                self.metrics.executor_errors.labels(self._executor.name, "adopt").inc()
        self.jobs_known, self._adopt_said = False, True
        assert self._executor is not None
        every = self._executor.poll_every
        self._adopt_again = self.clock.monotonic() + (every if every is not None else 5.0)

    # -- queue ------------------------------------------------------------------------------
    @property
    def pending(self) -> ValuesView[Queued]:
        """The queued resumes, (workspace, run id, launch), in arrival order."""
        return self._queued.values()

    def counts(self) -> tuple[int, int]:
        """(in flight, queued): plain lengths, read by the metrics' scrape from its thread."""
        return len(self._in_flight), len(self._queued)

    def engine_counts(self) -> tuple[str, Mapping[str, int]]:
        """The executor's own counts (a watch's re-lists...), for the metrics' scrape: none
        before the executor is made (the scrape never makes it)."""
        executor = self._executor
        if not isinstance(executor, BaseJobExecutor):
            return self._kind, {}
        return executor.name, executor.counts()

    def busy_with(self, ws: Path) -> bool:
        return ws in self._queued or ws in self.children

    def submit(
        self,
        ws: Path,
        run_id: str | None,
        launch: Launch,
        owner: int,
        request: str = "resume",
        answered_at: float | None = None,
    ) -> bool:
        """Queue a resume of `ws`; `owner` (the workspace owner's uid) is whose slot it takes;
        `request` (the request id answered, or why: "interrupted") goes into the job's key;
        `answered_at` (wall time of the answer file's last write) times answer → start."""
        if self.busy_with(ws):
            return False
        if answered_at is not None:
            self._answered_at[ws] = answered_at
        self._queued[ws] = (ws, run_id, launch)
        self._requests[ws] = request
        self._waiting.setdefault(owner, deque()).append((next(self._arrivals), ws))
        return True

    def can_start(self) -> bool:
        if not self.jobs_known:  # see start_ready
            return False
        if not self._waiting:
            return any(at <= self.clock.monotonic() for at in self._retry_at.values())
        return pick_next(self._heads(), self._running(), self._slots) is not None

    def slots(self) -> int:
        return max(0, self._max - len(self.children))

    def start_ready(self) -> None:
        """Submit what the slots allow. Nothing while the engine has not told which of this
        daemon's jobs exist (`adopt` pending or failing): a resume submitted then could double
        one an earlier daemon left running; they wait in the queue."""
        if self._executor is None or not self.jobs_known:
            self.executor  # noqa: B018 - made (and adopting) on first use
            if not self.jobs_known:
                return
        self._retry_due()
        # The HA fence (lease.py), right before each submit: a daemon that froze since its
        # lease was last renewed submits nothing until the renewal says it is still its own.
        while self._waiting and self.slots() > 0 and self.fence():
            owner = pick_next(self._heads(), self._running(), self._slots)
            if owner is None:
                break
            ws, run_id, launch = self._queued.pop(self._dequeue(owner))
            answered_at = self._answered_at.pop(ws, None)
            spawned = self._spawn(ws, run_id, launch, owner, self._requests.pop(ws, "resume"))
            if spawned and self.metrics is not None:
                ex = self._in_flight[ws].handle.executor
                self.metrics.resume_started(ex, answered_at, self.clock.time())
        self._tell_waits()

    def _retry_due(self) -> None:
        """Resumes whose submit failed and whose pause is over join their owner's queue."""
        now = self.clock.monotonic()
        for ws, at in list(self._retry_at.items()):
            if at <= now:
                del self._retry_at[ws]
                owner = self._owner_of.pop(ws, UNKNOWN_OWNER)
                self._waiting.setdefault(owner, deque()).append((next(self._arrivals), ws))

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

    def _unqueue(self, ws: Path) -> None:
        """Take `ws` out of the queue (and out of a failed submit's pause), wherever it is."""
        queued, pausing = self._queued.pop(ws, None), self._retry_at.pop(ws, None)
        if queued is None and pausing is None:
            return
        self._requests.pop(ws, None)
        self._answered_at.pop(ws, None)
        for owner, queue in list(self._waiting.items()):
            at = next((i for i, (_, w) in enumerate(queue) if w == ws), None)
            if at is None:
                continue
            del queue[at]
            if (told := self._told.get(owner, 0)) > at:
                self._told[owner] = told - 1  # the logged ones are the first of the queue
            if not queue:
                del self._waiting[owner]
                self._told.pop(owner, None)

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

    # -- jobs -------------------------------------------------------------------------------
    def _spawn(
        self, ws: Path, run_id: str | None, launch: Launch, owner: int, request: str
    ) -> bool:
        if ws in self.children:
            return False  # already running (adopted): say nothing
        argv = build_argv(self._template, ws, run_id)
        attempt = next(self._attempts)
        # The one place a resume is submitted; the spec carries the HA fence (checked again by
        # an executor right before its engine's submit).
        spec = replace(
            spec_of(ws, run_id, argv, launch, self._timeout, attempt, request), fence=self.fence
        )
        try:
            handle = self.executor.submit(spec)
        except SubmitError as e:
            return self._spawn_failed(spec, str(e), (run_id, launch, owner, request), e.permanent)
        except Exception as e:  # a third-party executor's bug must not stop the daemon
            error = f"{type(e).__name__}: {e}"
            return self._spawn_failed(spec, error, (run_id, launch, owner, request), True)
        self._in_flight[ws] = InFlight(
            handle, self.clock.time(), again=(run_id, launch, owner, request)
        )
        self._owner_of[ws] = owner
        who = launch.identity
        # Counted until the job runs (a worker's submit may still come back Refused).
        failures = self._failures.get(ws, 0)
        log.info(
            "resume_spawned",
            workspace=str(ws),
            run_id=run_id,
            **shown(handle),
            uid=who.runs_as.uid,
            user=who.runs_as.name,
            executor=handle.executor,
            **({"failed_before": failures} if failures else {}),
        )
        return True

    def _spawn_failed(
        self,
        spec: JobSpec,
        error: str,
        again: tuple[str | None, Launch, int, str],
        permanent: bool = False,
    ) -> bool:
        """Said once per run of failures; tried again after a `Pacing` delay unless the refusal
        is permanent (then the next look at the workspace decides, as for any new resume)."""
        if self.metrics is not None:
            self.metrics.executor_errors.labels(self._kind, "submit").inc()
        ws = spec.key.workspace
        n = self._failures[ws] = self._failures.get(ws, 0) + 1
        delay = SUBMIT_RETRY.delay(n)
        fields = {
            "workspace": str(ws),
            "run_id": spec.key.run_id or None,
            "program": spec.argv[0],
            "error": error,
        }
        if permanent:
            self._failures.pop(ws, None)
            log.error("resume_spawn_failed", **fields, detail="not tried again")
            return False
        if n == 1:
            log.error(
                "resume_spawn_failed", **fields, detail="tried again until the engine takes it"
            )
        else:
            log.debug("resume_spawn_failed_again", **fields, failures=n)
        run_id, launch, owner, request = again
        self._queued[ws] = (ws, run_id, launch)
        self._requests[ws] = request
        self._owner_of[ws] = owner
        self._retry_at[ws] = self.clock.monotonic() + delay
        return False

    def fds(self) -> list[int]:
        return list(self._guard("fds", self.executor.fds) or [])

    def reap(self) -> list[Finished]:
        """Poll the executor (every loop turn): a Started sets the timeout, an Exit is a
        finished resume."""
        if self._executor is None:
            return []
        if not self.jobs_known and (
            self._adopt_pending or self.clock.monotonic() >= self._adopt_again
        ):
            self._adopt(late=True)
        done: list[Finished] = []
        events = self._guard("poll", self._executor.poll, self.clock.monotonic()) or []
        for event in events:
            resume = self._in_flight.get(event.handle.key.workspace)
            if resume is None or resume.handle != event.handle:
                continue  # not ours (any more)
            if isinstance(event, Started):
                self._started(resume, event.at)
            elif isinstance(event, Exit):
                done.append(self._ended(resume, event))
            elif isinstance(event, Refused):
                self._refused(resume, event)
        return done

    def _refused(self, resume: InFlight, event: Refused) -> None:
        """The engine did not take a job submitted from the executor's worker: submit again."""
        del self._in_flight[resume.workspace]
        if resume.again is None:  # never for an adopted job; nothing to submit again
            self._owner_of.pop(resume.workspace, None)
            return
        run_id, launch, _, _ = resume.again
        argv = build_argv(self._template, resume.workspace, run_id)
        key = resume.handle.key
        spec = spec_of(key.workspace, run_id, argv, launch, self._timeout, key.attempt, key.request)
        self._spawn_failed(spec, event.reason, resume.again)

    def _guard(self, call: str, fn: Any, *args: Any) -> Any:
        """One seam call that must not end the daemon: an exception is logged (once per
        distinct failure of that call) and gives None."""
        try:
            result = fn(*args)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            if self._said.get(call) != error:
                assert self._executor is not None
                log.error(
                    "executor_call_failed", executor=self._executor.name, call=call, error=error
                )
            self._said[call] = error
            return None
        self._said.pop(call, None)
        return result

    def _started(self, resume: InFlight, at: float) -> None:
        self._failures.pop(resume.workspace, None)
        resume.started = started_at(self.clock.monotonic(), self.clock.time(), at)
        resume.deadline = resume.started + self._timeout
        if resume.adopted:
            resume.spawned_at = at

    def _ended(self, resume: InFlight, event: Exit) -> Finished:
        del self._in_flight[resume.workspace]
        self._failures.pop(resume.workspace, None)
        self._owner_of.pop(resume.workspace, None)
        resume.timed_out = resume.timed_out or event.timed_out
        began = resume.started
        ms = int((self.clock.monotonic() - began) * 1000) if began is not None else 0
        fin = Finished(resume, event.rc, max(0, ms), event.detail)
        if self.metrics is not None:
            self.metrics.resume_ended(resume.handle.executor, fin.failed, resume.timed_out)
        log.info(
            "resume_exited",
            workspace=str(resume.workspace),
            run_id=resume.run_id,
            **shown(resume.handle),
            exit_code=fin.rc,
            outcome=fin.meaning,
            timed_out=resume.timed_out,
            duration_ms=fin.duration_ms,
            **({"detail": event.detail} if event.detail else {}),
        )
        return fin

    def enforce_timeouts(self, now: float) -> None:
        """TERM at the resume's deadline, KILL after `KILL_GRACE_SECONDS` without its Exit
        (`now` is monotonic)."""
        if self._executor is None:
            return
        for resume in list(self._in_flight.values()):
            if resume.term_sent is None and now >= resume.deadline:
                resume.timed_out = True
                resume.term_sent = now
                log.warning(
                    "resume_timeout",
                    workspace=str(resume.workspace),
                    run_id=resume.run_id,
                    **shown(resume.handle),
                    timeout_s=self._timeout,
                )
                self._guard("cancel", self._executor.cancel, resume.handle, False)
            elif (
                resume.term_sent is not None
                and not resume.kill_sent
                and now >= resume.term_sent + KILL_GRACE_SECONDS
            ):
                resume.kill_sent = True
                log.warning(
                    "resume_killed",
                    workspace=str(resume.workspace),
                    run_id=resume.run_id,
                    **shown(resume.handle),
                    grace_s=KILL_GRACE_SECONDS,
                )
                self._guard("cancel", self._executor.cancel, resume.handle, True)

    def next_poll(self, now: float) -> float | None:
        """When `reap` must look again although no fd is readable: every `poll_every` while a
        job is in flight (engines without fds), or when the executor says something is due."""
        ex = self._executor
        if ex is None:
            return None
        times = []
        if ex.poll_every is not None and self._in_flight:
            times.append(now + ex.poll_every)
        if not self.jobs_known and not self._adopt_pending:  # adopt() to be tried again
            times.append(max(now, self._adopt_again))
        if self._retry_at:  # a refused submit to try again
            times.append(min(self._retry_at.values()))
        if (when := self._guard("due", ex.due, now)) is not None:
            times.append(float(when))
        return min(times, default=None)

    def next_deadline(self) -> float | None:
        """The next resume timeout, or the next KILL after a TERM's grace (monotonic)."""
        times = [
            r.deadline if r.term_sent is None else r.term_sent + KILL_GRACE_SECONDS
            for r in self._in_flight.values()
            if not r.kill_sent
        ]
        return min((t for t in times if t != math.inf), default=None)

    def detach_all(self) -> list[dict[str, Any]]:
        """On shutdown after the grace budget: leave the jobs running (a local process's own
        session keeps it alive) and let go of the executor; the next daemon adopts them."""
        if self._executor is None:
            return []
        left = [{"workspace": str(ws), **shown(r.handle)} for ws, r in self._in_flight.items()]
        self._in_flight.clear()
        self._owner_of.clear()
        self._guard("close", self._executor.close)
        return left
