"""`RemoteExecutor`: the runtime of an executor whose engine is remote (Slurm, Kubernetes, ...).

The daemon's loop must never wait on an engine, so one worker thread owned by the executor does
all of the engine's I/O: submits, status queries, cancels. The seam's methods (called from the
loop) only put work on the worker's queue or take its results, and return at once; a self-pipe
in `fds()` wakes the loop's select when the worker has news. The shape follows snakemake's
`RemoteExecutor` (a wait thread, an active-jobs list, a throttle) and Airflow's Kubernetes job
watcher (a worker feeding a queue the scheduler drains without blocking).

An engine is then a subclass with three hooks, all called from the worker only:

- `engine_list()`: this daemon's jobs the engine knows of, as `Seen` rows (one query: a
  daemon-wide key, never one name per job), already checked to be this daemon's own;
- `engine_submit(spec)`: submit one job, return the engine's id (`SubmitError` when refused);
- `engine_cancel(job, force)`: TERM or KILL one job.

and optionally `engine_missing(jobs)` (jobs the list no longer shows: the accounting database)
and `engine_ended(job)` (clean up after an end).

An engine that can park a job (`parks = True`: Slurm's `--hold`) makes every submit two steps:
the job is submitted parked, then let go (`engine_release`) only after the HA fence is asked once
more. A daemon frozen while its submit was in flight (the engine's command goes on without it)
thus leaves at most a parked job that never runs: the new active, which did not see it when it
took over and submitted the resume itself, finds a parked job nobody tracks and cancels it. A
daemon killed between the two steps leaves a parked job its successor adopts and lets go.

The base keeps the tracked-jobs table, turns what the engine says into `Started`/`Exit`/
`Refused` (a submit waits in the worker while the engine cannot be asked at all, and is
`Refused` only when the engine answered no), queries at an interval that doubles while nothing
changes (from `interval` up to `max_interval`, back to `interval` at any change or new work),
and logs one line per distinct failure (and one when the engine answers again).

Handles of a remote executor carry the key's name as their `ref` (known before the engine has
given an id; the engine's id is in the executor's own log lines and in `Handle.shown` of
adopted jobs).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from deltad import keys
from deltad.protocol.printable import show_path

from .seam import (
    AdoptPending,
    BaseJobExecutor,
    Event,
    Exit,
    Handle,
    JobSpec,
    JobState,
    Refused,
    RequestKey,
    Started,
    SubmitError,
)

log = structlog.get_logger("deltad.executors.remote")

SECRET_FILE = keys.EXECUTORS.name
TAG_HEX = 32  # hex digits of a tag: 128 bits
# While the engine cannot be asked, pending submits are tried again at most this often (and at
# once when a hung query returns: a hung engine's return is seen as soon as it answers).
SUBMIT_RETRY_CAP = 2.0
FENCED = "fenced: this daemon's HA lease was not confirmed before its job was let go"


class EngineAway(Exception):
    """From `engine_submit`: the engine could not be asked at all (no connection, no answer
    in time), which is no refusal: the submit waits in the worker and is tried again when the
    engine answers (a `poke`) or after `SUBMIT_RETRY_CAP`. Only for a submit that is safe to
    repeat (the engine refuses a second job of the same key)."""


@dataclass(frozen=True)
class Seen:
    """One job as the engine reports it (plain values: the decision below is pure)."""

    key: RequestKey
    ref: str  # the engine's id for it (a Slurm job id, a Job's uid)
    state: JobState
    start: float | None = None  # wall clock, once it runs (or ran)
    rc: int | None = None  # once ended: a code, -signal, or None when not known
    timed_out: bool = False
    detail: str = ""
    parked: bool = False  # submitted parked (`parks`): it runs once `engine_release` lets it go


@dataclass
class RemoteJob:
    """A job this executor tracks: its handle, the engine's id once known, what was said."""

    handle: Handle
    spec: JobSpec | None = None  # None for an adopted job
    ref: str | None = None  # the engine's id, once submitted (or found)
    started: bool = False
    extra: dict[str, object] = field(default_factory=dict)  # an engine's own notes


def events_of(job: RemoteJob, seen: Seen | None) -> list[Event]:
    """What one query says about one submitted job: Started once it runs, Exit once it ended
    (a job the engine no longer knows of ended, its code unknown)."""
    if seen is None:
        return [Exit(job.handle, None, detail="unknown to the engine")]
    out: list[Event] = []
    ran = seen.state in (JobState.RUNNING, JobState.ENDED)
    if not job.started and seen.start is not None and ran:
        out.append(Started(job.handle, seen.start))
    if seen.state in (JobState.ENDED, JobState.UNKNOWN):
        out.append(Exit(job.handle, seen.rc, seen.timed_out, seen.detail))
    return out


def next_interval(current: float, changed: bool, base: float, cap: float) -> float:
    """The pause before the next query: back to `base` at a change, else doubled up to `cap`."""
    return base if changed else min(cap, current * 2.0)


# -- a key no tenant can forge ------------------------------------------------------------------


# A fleet of daemons (HA) shares one key, or each would take the others' jobs for foreign ones
# and submit them again after a takeover: under `ha:` the key lives beside the lease, in the
# directory the fleet shares and only root may write (lease.py's trust). Set by the daemon at
# start (`use_fleet_key_dir`); one daemon per process.
_fleet_key_dir: Path | None = None


def use_fleet_key_dir(directory: Path | None) -> None:
    global _fleet_key_dir
    _fleet_key_dir = directory


def daemon_secret(state_dir: Path) -> bytes:
    """This daemon's (its fleet's) signing key: `executor.key` in the HA lease's directory
    under `ha:`, else in `state_dir` (deltad/keys.py: raw bytes, 0600, made on first use, this
    user's own or refused). A tenant cannot read it, so a job bearing a valid tag was
    submitted by this fleet. ValueError (one line) when the file cannot be made or used."""
    directory = _fleet_key_dir or state_dir
    try:
        return keys.load(directory, keys.EXECUTORS)
    except (OSError, keys.KeyUnusable) as e:
        why = e.strerror if isinstance(e, OSError) else str(e)
        raise ValueError(f"executor key {show_path(directory / SECRET_FILE)}: {why}") from None


def tag(secret: bytes, *parts: str) -> str:
    """An HMAC-SHA256 of `parts` (hex, 32 digits): what marks a job as this daemon's."""
    return keys.sign(secret, None, *parts).hex()[:TAG_HEX]


def tag_ok(secret: bytes, given: str, *parts: str) -> bool:
    raw = keys.unhex(given)
    return raw is not None and keys.verify(secret, raw, None, *parts, size=TAG_HEX // 2)


# -- the runtime ----------------------------------------------------------------------------------


class RemoteExecutor(BaseJobExecutor):
    """A `JobExecutor` whose engine is reached from one worker thread (see the module)."""

    poll_every: float | None = None  # fds() tells everything
    parks = False  # engine_submit leaves the job parked; engine_release lets it run

    def __init__(
        self,
        interval: float,
        max_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval, self.max_interval = interval, max(interval, max_interval)
        self._clock = clock
        self._lock = threading.Condition()
        self._jobs: dict[str, RemoteJob] = {}  # by key name; the loop's and the worker's
        self._submits: deque[str] = deque()  # key names to submit
        self._cancels: dict[str, bool] = {}  # key name -> force
        self._events: list[Event] = []
        self._listed: list[Seen] | None = None  # the first answer, for adopt()
        self._list_error = ""
        self._adopted = False
        self._closed = False
        self._said: dict[str, str] = {}  # an operation -> its failure last logged
        self._r, self._w = os.pipe()  # (not pipe2: off Linux too); close-on-exec already
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._pause = interval
        self._next_query = 0.0
        self._submit_at = 0.0  # while the engine is away: when to try the pending submits
        self._orphans: set[str] = set()  # parked jobs nobody tracks, already cancelled (refs)
        self.queries = 0  # how many times the engine answered a query (a bench reads it)
        self.turns = 0  # how many turns the worker took (tests wait for a few)
        self._thread = threading.Thread(target=self._work, name=f"{self.name}-engine", daemon=True)
        self._thread.start()

    # -- the hooks (the worker thread only) ------------------------------------------------------
    def engine_list(self) -> list[Seen]:
        raise NotImplementedError

    def engine_submit(self, spec: JobSpec) -> str:
        raise NotImplementedError

    def engine_cancel(self, job: RemoteJob, force: bool) -> None:
        raise NotImplementedError

    def engine_missing(self, jobs: list[RemoteJob]) -> dict[str, Seen]:
        """What the engine's records say of jobs its list no longer shows (by key name);
        the default: nothing (their ends are unknown)."""
        return {}

    def engine_ended(self, job: RemoteJob) -> None:
        """After a job's Exit was reported: clean up on the engine (a Job's deletion)."""

    def engine_release(self, job: RemoteJob, fence: Callable[[], bool] | None) -> None:
        """Let a parked job run (only with `parks`). `fence`, when given, is asked once more
        as late as the engine's call allows (in the command's own process); a False answer
        raises SubmitError and the job stays parked."""
        raise NotImplementedError

    def engine_words(self, e: BaseException) -> str:
        """A failure of a hook on one line, for the log and a `Refused`."""
        return _words(e)

    def poke(self) -> None:
        """The engine has news (an engine that pushes changes, as a Kubernetes watch does):
        the worker's next turn is now, and the interval starts again from `interval`. Any
        thread may call it."""
        with self._lock:
            if self._closed:
                return
            self._pause, self._next_query = self.interval, self._clock()
            self._lock.notify()

    # -- the seam (the loop) ----------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> Handle:
        name = spec.key.name
        with self._lock:
            if self._closed:
                raise SubmitError(f"{self.name}: closed")
            if (known := self._jobs.get(name)) is not None:
                return known.handle
            handle = Handle(spec.key, self.name, name)
            self._jobs[name] = RemoteJob(handle, spec)
            self._submits.append(name)
            self._lock.notify()
        return handle

    def poll(self, now: float) -> list[Event]:
        with self._lock:
            if self._closed:
                return []
            with contextlib.suppress(BlockingIOError):
                while os.read(self._r, 4096):
                    pass
        with self._lock:
            events, self._events = self._events, []
        return events

    def cancel(self, handle: Handle, force: bool) -> None:
        with self._lock:
            job = self._jobs.get(handle.key.name)
            if job is None or job.handle != handle:
                return
            self._cancels[handle.key.name] = force or self._cancels.get(handle.key.name, False)
            self._lock.notify()

    def adopt(self) -> list[Handle]:
        """This daemon's jobs from the worker's first query: `AdoptPending` until it answered,
        `SubmitError` while the engine cannot be asked. Ended ones report their Exit next."""
        with self._lock:
            if self._listed is None:
                if self._list_error:
                    raise SubmitError(self._list_error)
                raise AdoptPending(f"{self.name}: the first query is on its way")
            handles = []
            for seen in self._listed:
                job = self._jobs.get(seen.key.name)
                if job is None:
                    handle = Handle(seen.key, self.name, seen.key.name, (("job", seen.ref),))
                    job = self._jobs[seen.key.name] = RemoteJob(handle, None, seen.ref)
                    self._events.extend(self._apply(job, seen))
                handles.append(job.handle)
            self._adopted = True
            self._pause, self._next_query = self.interval, self._clock()  # look soon
            self._lock.notify()
            if self._events:
                self._wake()
            return handles

    def fds(self) -> list[int]:
        return [] if self._closed else [self._r]

    def close(self) -> None:
        """Let go: the worker stops after its current call (jobs keep running)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._jobs.clear()
            self._lock.notify()
            os.close(self._w)
            os.close(self._r)

    # -- the worker ------------------------------------------------------------------------------
    def _wake(self) -> None:
        """Called with the lock held (the pipe is closed under it)."""
        if not self._closed:
            with contextlib.suppress(BlockingIOError):
                os.write(self._w, b"x")

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._has_work():
                    self._lock.wait(self._sleep())
                if self._closed:
                    return
                submits = [self._jobs[n] for n in self._submits if n in self._jobs]
                self._submits.clear()
                cancels = [(self._jobs[n], f) for n, f in self._cancels.items() if n in self._jobs]
                self._cancels.clear()
            try:
                self._turn(submits, cancels)
                self.turns += 1
            except Exception as e:  # a hook's bug: said, and the worker goes on
                self._failed("worker", f"{type(e).__name__}: {e}")
                with self._lock:
                    self._next_query = self._clock() + self._pause

    def _sleep(self) -> float | None:
        """How long the worker may wait for new work: until the next query or retry is due;
        for ever (until notified) with nothing tracked and nothing to submit."""
        times = []
        if self._jobs or self._listed is None:
            times.append(self._next_query)
        if self._submits:
            times.append(self._submit_at)
        return max(0.0, min(times) - self._clock()) if times else None

    def _has_work(self) -> bool:
        if self._cancels or (self._submits and self._clock() >= self._submit_at):
            return True
        wanted = self._jobs or self._listed is None
        return bool(wanted) and self._clock() >= self._next_query

    def _turn(self, submits: list[RemoteJob], cancels: list[tuple[RemoteJob, bool]]) -> None:
        changed = bool(submits or cancels)
        for job, force in cancels:
            if job.ref is None:  # never submitted: nothing on the engine to stop
                continue
            try:
                self.engine_cancel(job, force)
                self._recovered("cancel")
            except Exception as e:  # asked again at the next turn
                self._failed("cancel", self.engine_words(e))
                with self._lock:
                    self._cancels.setdefault(job.handle.key.name, force)
        try:
            rows = self.engine_list()
            self.queries += 1
        except Exception as e:  # the engine away: submits wait here, tried again at its return
            error = self.engine_words(e)
            self._failed("query", error)
            with self._lock:
                self._list_error = self._said_as(f"cannot list this daemon's jobs: {error}")
                waiting = [j.handle.key.name for j in submits if j.handle.key.name in self._jobs]
                self._submits.extendleft(reversed(waiting))
                self._pause = next_interval(self._pause, False, self.interval, self.max_interval)
                now = self._clock()
                self._next_query = now + self._pause
                self._submit_at = now + min(self._pause, SUBMIT_RETRY_CAP)
            return
        # The engine answers again after an outage: look at the usual pace at once, not after
        # the long pause the failures grew (ends that happened meanwhile are seen now).
        changed = self._recovered("query") or changed
        self._submit_at = 0.0
        by_key = {r.key.name: r for r in rows}
        for job in submits:  # idempotent: a job of this key already there is the one
            if (seen := by_key.get(job.handle.key.name)) is not None:
                job.ref = seen.ref
                if seen.parked:
                    self._let_go(job)
                continue
            assert job.spec is not None
            try:
                job.ref = self.engine_submit(job.spec)
                self._recovered("submit")
                if self.parks:
                    self._let_go(job)
            except EngineAway as e:
                self._failed("submit", self.engine_words(e))
                with self._lock:
                    if self._jobs.get(job.handle.key.name) is job:
                        self._submits.append(job.handle.key.name)
                    self._submit_at = self._clock() + min(self._pause, SUBMIT_RETRY_CAP)
            except Exception as e:
                error = self.engine_words(e)
                self._failed("submit", error)
                with self._lock:
                    self._refuse([job], error)
        self._parked(rows, submits)
        missing = [
            j for j in self._tracked() if j.ref is not None and j.handle.key.name not in by_key
        ]
        missing = [j for j in missing if j not in submits]
        if missing:
            try:
                by_key.update(self.engine_missing(missing))
            except Exception as e:
                self._failed("records", self.engine_words(e))
        ended: list[RemoteJob] = []
        with self._lock:
            if self._listed is None:
                self._listed, self._list_error = rows, ""
                changed = True
            for job in list(self._jobs.values()):
                if job.ref is None or job in submits:
                    continue  # not on the engine yet, or just submitted: at the next query
                events = self._apply(job, by_key.get(job.handle.key.name))
                if events:
                    changed = True
                    self._events.extend(events)
                if any(isinstance(e, Exit) for e in events):
                    ended.append(job)
            if changed:
                self._wake()
            self._pause = next_interval(self._pause, changed, self.interval, self.max_interval)
            self._next_query = self._clock() + self._pause
        for job in ended:
            try:
                self.engine_ended(job)
            except Exception as e:
                self._failed("cleanup", self.engine_words(e))

    def _tracked(self) -> list[RemoteJob]:
        with self._lock:
            return list(self._jobs.values())

    def _fence_of(self, job: RemoteJob | None) -> Callable[[], bool] | None:
        spec_fence = job.spec.fence if job is not None and job.spec is not None else None
        return spec_fence or self.fence

    def _let_go(self, job: RemoteJob) -> None:
        """Release one parked job of this daemon's: only while the fence says this daemon may
        act. Fenced: the job stays parked and the resume is refused (the active's look cancels
        it). Any other failure: tried again at the next query, which still shows it parked."""
        fence = self._fence_of(job)
        try:
            if fence is not None and not fence():
                raise SubmitError(FENCED)
            self.engine_release(job, fence)
            self._recovered("release")
        except SubmitError as e:
            if fence is not None and not fence():
                with self._lock:
                    self._refuse([job], f"{FENCED} (job {job.ref} left parked)")
                return
            self._failed("release", self.engine_words(e))
        except Exception as e:
            self._failed("release", self.engine_words(e))

    def _parked(self, rows: list[Seen], submits: list[RemoteJob]) -> None:
        """What the list shows parked: a tracked job's (its release failed, or it was adopted
        from a daemon killed between submit and release) is let go; one nobody tracks once
        adoption is done (a frozen former active's late submit, an engine call that timed out
        but landed) is cancelled: it never ran, and the resume it was meant for runs as
        another job or is decided again."""
        with self._lock:
            tracked = {n: j for n, j in self._jobs.items() if j.ref is not None}
            adopted = self._adopted
        for seen in rows:
            if not seen.parked:
                continue
            job = tracked.get(seen.key.name)
            if job is not None:
                if job not in submits and job.ref == seen.ref:
                    self._let_go(job)
                continue
            if not adopted or seen.ref in self._orphans:
                continue
            if self.fence is not None and not self.fence():
                continue  # only the active cancels
            handle = Handle(seen.key, self.name, seen.key.name, (("job", seen.ref),))
            try:
                self.engine_cancel(RemoteJob(handle, None, seen.ref), False)
            except Exception as e:
                self._failed("cancel", self.engine_words(e))
                continue
            self._orphans.add(seen.ref)
            log.warning(
                "executor_orphan_cancelled",
                executor=self.name,
                job=seen.ref,
                workspace=str(seen.key.workspace),
                detail="a parked job no resume of this daemon tracks; it never ran",
            )

    def _apply(self, job: RemoteJob, seen: Seen | None) -> list[Event]:
        """With the lock held: what `seen` says of `job`, and the table updated."""
        events = events_of(job, seen)
        for event in events:
            if isinstance(event, Started):
                job.started = True
            elif isinstance(event, Exit):
                self._jobs.pop(job.handle.key.name, None)
        return events

    def _refuse(self, jobs: Iterable[RemoteJob], error: str) -> None:
        """With the lock held: submits the engine did not take go back to the resumer."""
        for job in jobs:
            if self._jobs.get(job.handle.key.name) is job:
                del self._jobs[job.handle.key.name]
                self._events.append(Refused(job.handle, self._said_as(error)))
        self._wake()

    def _said_as(self, error: str) -> str:
        """An error as the daemon logs it: naming the engine once."""
        return error if error.startswith(self.name) else f"{self.name}: {error}"

    def _failed(self, op: str, error: str) -> None:
        if self._closed:  # let go of: what fails now is no news
            return
        if self._said.get(op) != error:  # once per distinct failure, not every query
            log.warning("executor_engine_failed", executor=self.name, op=op, error=error)
        self._said[op] = error

    def _recovered(self, op: str) -> bool:
        """`op` worked: True (and said once) when it had failed before."""
        if self._said.pop(op, None) is None:
            return False
        log.info("executor_engine_back", executor=self.name, op=op)
        return True

    # For tests and benches: the worker's state without reaching into it.
    def tracked(self) -> Mapping[str, RemoteJob]:
        with self._lock:
            return dict(self._jobs)

    @property
    def pause(self) -> float:
        """The current pause between two queries (`interval` … `max_interval`)."""
        return self._pause


def _words(e: BaseException) -> str:
    """An engine's failure on one line: its own words for a `SubmitError` (an engine's error
    class derives from it), the exception's type besides for anything else (a bug, an OSError)."""
    text = " ".join(str(e).split())[:300]
    if isinstance(e, SubmitError):
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
