"""List, then watch: how `executor: kubernetes` learns what its Jobs do (as kopf, client-go's
reflector and Airflow's KubernetesJobWatcher do), in a thread of the executor's own.

`JobWatch` lists this daemon's Jobs (by its label selector) once, remembers the list's
`metadata.resourceVersion`, and then watches from there (`watch=1&resourceVersion=RV&
allowWatchBookmarks=true&timeoutSeconds=...`): each ADDED/MODIFIED/DELETED event updates its
table of Jobs and advances the version, as does each BOOKMARK. A stream the server ends (its
timeoutSeconds) is watched again at once from the last version; a stream that breaks (a reset,
a proxy's idle cut, the server away) is watched again from the last version after a `Pacing`
delay that grows while it keeps failing; 410 Gone (the version was compacted away: an ERROR
event with code 410, or an HTTP 410) means the table may have missed changes, so it lists
again and watches from the new list's version. A full list every `relist_every` seconds is the
only polling left, a safety net against a watch that silently lost an event.

The worker of `RemoteExecutor` reads the table (`jobs()`, no API call) whenever `on_news` woke
it, so the daemon's loop and the worker never wait on a stream. What the watch does is said in
the JSON log (`kubernetes_jobs_listed` with its reason, `kubernetes_watch_restarted` with its
reason: ended by the server, broken, gone) and counted (`counts()`, in /metrics as
`deltad_executor_engine_events_total`).
Decisions are pure (`next_step`); the thread is the shell around them.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import structlog

from deltad.pacing import Pacing

log = structlog.get_logger("deltad.executors.kubernetes")

# Reconnects after a failure: from 0.2 s, doubling, at most 2 s (±25 %): a server back from
# an outage is watched again within ~2.5 s, and a fleet of daemons does not come back at once.
RETRY = Pacing(0.2, 2.0, jitter=0.25)
GONE = 410


class Step(Enum):
    LIST = "list"
    WATCH = "watch"


class Outcome(Enum):
    """How one list or one watch request ended."""

    LISTED = "listed"  # a list answered
    LIST_FAILED = "list_failed"  # a list did not (the server away, refused, timed out)
    ENDED = "ended"  # the server closed the stream (its timeoutSeconds): nothing wrong
    GONE = "gone"  # 410: the version is too old to watch from
    BROKEN = "broken"  # the stream broke or could not be opened


def next_step(outcome: Outcome, failures: int, relist_due: bool) -> tuple[Step, int]:
    """What the watcher does next, and after how many failures in a row (its `Pacing` step:
    0 is at once). A list is due after 410 and while no list has answered; the safety net's
    list (`relist_due`) comes when a stream ends or breaks, never in the middle of one."""
    if outcome is Outcome.LIST_FAILED:
        return Step.LIST, failures
    if outcome is Outcome.GONE or (relist_due and outcome is not Outcome.LISTED):
        return Step.LIST, 0
    if outcome is Outcome.BROKEN:
        return Step.WATCH, failures
    return Step.WATCH, 0


@dataclass(frozen=True)
class Change:
    """One watch event, as plain values: its type, the Job's name, the version it carries."""

    kind: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    name: str
    version: str


def change_of(event: Mapping[str, Any]) -> Change:
    raw = event.get("raw_object")
    meta = (raw.get("metadata") or {}) if isinstance(raw, Mapping) else {}
    version = str(meta.get("resourceVersion") or "")
    return Change(str(event.get("type")), str(meta.get("name") or ""), version)


class Unavailable(Exception):
    """The table cannot be trusted now: no list has answered yet, or the server is away."""


class JobWatch:
    """This daemon's Jobs as the API server last said, kept by a list and a watch (see the
    module). `list_jobs` is the client's `BatchV1Api.list_namespaced_job`; `on_news` is
    called (from this thread) after each change of the table and when the server answers
    again after a failure."""

    def __init__(
        self,
        list_jobs: Callable[..., Any],
        namespace: str,
        selector: str,
        on_news: Callable[[], None],
        *,
        request_timeout: float,
        watch_timeout: int,
        relist_every: float,
        pacing: Pacing = RETRY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list_jobs = list_jobs
        self._namespace, self._selector = namespace, selector
        self._on_news = on_news
        self._request_timeout = request_timeout
        self._watch_timeout, self._relist_every = watch_timeout, relist_every
        self._pacing, self._clock = pacing, clock
        self._lock = threading.Condition()
        self._jobs: dict[str, Any] = {}  # name -> V1Job
        self._made: dict[str, float] = {}  # name -> when its create answered (clock)
        self._synced = False
        self._error = ""  # why the server cannot be asked now ("" while it can)
        self.version = ""  # the last resourceVersion seen (a list's, an event's, a bookmark's)
        self._counts = dict.fromkeys(("lists", "relists", "watches", "watch_restarts"), 0)
        self._counts.update(events=0, failures=0)
        self._stopped = threading.Event()
        self._stream: Any = None  # the open watch (to stop it from close())
        self._thread = threading.Thread(target=self._run, name="kubernetes-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Let go: the thread ends at its next step (an open stream is cut now)."""
        self._stopped.set()
        with self._lock:
            self._lock.notify_all()
        stream = self._stream
        if stream is not None:
            stream.stop()

    # -- what the worker reads ---------------------------------------------------------------
    def jobs(self) -> list[Any]:
        """The Jobs as last seen; `Unavailable` (its words) while the table cannot be trusted.
        Before the first list has answered, waits for it (as long as one API call may take)."""
        with self._lock:
            self._lock.wait_for(
                lambda: self._synced or self._error or self._stopped.is_set(),
                self._request_timeout,
            )
            if self._error:
                raise Unavailable(self._error)
            if not self._synced:
                raise Unavailable("no list of this daemon's jobs yet")
            return list(self._jobs.values())

    def made(self, job: Any) -> None:
        """A Job the worker just created (or found): in the table at once, before its ADDED
        event, so that no turn between the two takes it for gone. A list asked before it was
        made does not remove it; its own events replace it."""
        name = job.metadata.name
        with self._lock:
            self._jobs.setdefault(name, job)
            self._made[name] = self._clock()

    def updated(self, job: Any) -> None:
        """A Job the worker just changed (let go): its new version in the table at once."""
        with self._lock:
            if job.metadata.name in self._jobs:
                self._jobs[job.metadata.name] = job

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        step, failures, reason = Step.LIST, 0, "start"
        relist_at = self._clock() + self._relist_every
        while not self._stopped.is_set():
            if failures and self._stopped.wait(self._pacing.delay(failures)):
                return
            if step is Step.LIST:
                outcome = self._list(reason)
                if outcome is Outcome.LISTED:
                    relist_at = self._clock() + self._relist_every
            else:
                outcome = self._watch(max(0.0, relist_at - self._clock()))
            failed = outcome in (Outcome.LIST_FAILED, Outcome.BROKEN) and bool(self._error)
            failures = failures + 1 if failed else (1 if outcome is Outcome.BROKEN else 0)
            if self._stopped.is_set():
                return
            relist_due = self._clock() >= relist_at
            step, failures = next_step(outcome, failures, relist_due)
            if outcome is not Outcome.LIST_FAILED:  # (a list tried again keeps its reason)
                reason = "gone" if outcome is Outcome.GONE else "safety_net"
            if outcome in (Outcome.ENDED, Outcome.BROKEN, Outcome.GONE):
                # A watch ended and another follows, however it ended: a broken one too (the
                # server away cuts the stream by a reset or by a clean end, as it happens).
                with self._lock:
                    self._counts["watch_restarts"] += 1
            if outcome in (Outcome.ENDED, Outcome.BROKEN, Outcome.GONE) and not failed:
                log.info(
                    "kubernetes_watch_restarted",
                    reason=outcome.value,
                    then=step.value,
                    resource_version=self.version,
                )

    def _list(self, reason: str) -> Outcome:
        asked = self._clock()
        try:
            found = self._list_jobs(
                self._namespace,
                label_selector=self._selector,
                _request_timeout=self._request_timeout,
            )
        except Exception as e:
            self._fail(e)
            return Outcome.LIST_FAILED
        items = list(found.items or [])
        version = str(found.metadata.resource_version or "")
        with self._lock:
            fresh = {job.metadata.name: job for job in items}
            for name, at in self._made.items():  # made after the list was asked: kept
                if at >= asked and name not in fresh and name in self._jobs:
                    fresh[name] = self._jobs[name]
            self._made = {n: at for n, at in self._made.items() if at >= asked}
            self._jobs, self.version = fresh, version
            was, self._synced, self._error = self._error, True, ""
            self._lock.notify_all()
            self._counts["lists"] += 1
            if reason != "start":
                self._counts["relists"] += 1
        if was:
            log.info("kubernetes_watch_back", was=was)
        log.info("kubernetes_jobs_listed", reason=reason, jobs=len(items), resource_version=version)
        self._on_news()
        return Outcome.LISTED

    def _watch(self, until_relist: float) -> Outcome:
        from kubernetes import watch

        stream = watch.Watch(return_type="V1Job")  # type: ignore[no-untyped-call]
        self._stream = stream
        opened = threading.Event()

        def open_stream(*args: Any, **kwargs: Any) -> Any:
            response = self._list_jobs(*args, **kwargs)
            if 200 <= int(getattr(response, "status", 200)) < 300:
                opened.set()
                self._answered()
            return response

        seconds = max(1, min(self._watch_timeout, int(until_relist) + 1))
        with self._lock:
            self._counts["watches"] += 1
        try:
            for event in stream.stream(  # type: ignore[no-untyped-call]
                open_stream,
                self._namespace,
                label_selector=self._selector,
                resource_version=self.version,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                # A quiet stream is no failure: only silence past the server's own end is.
                _request_timeout=(self._request_timeout, seconds + self._request_timeout),
            ):
                if self._stopped.is_set():
                    break
                self._apply(event)
        except Exception as e:
            if getattr(e, "status", None) == GONE:
                return Outcome.GONE
            if not opened.is_set():
                self._fail(e)
            return Outcome.BROKEN
        finally:
            self._stream = None
        return Outcome.ENDED

    def _apply(self, event: Mapping[str, Any]) -> None:
        change = change_of(event)
        with self._lock:
            if change.version:
                self.version = change.version
            self._counts["events"] += 1
            if change.kind in ("ADDED", "MODIFIED"):
                self._jobs[change.name] = event["object"]
            elif change.kind == "DELETED":
                self._jobs.pop(change.name, None)
                self._made.pop(change.name, None)
            else:
                return  # a BOOKMARK: only the version moves
        self._on_news()

    def _answered(self) -> None:
        with self._lock:
            was, self._error = self._error, ""
        if was:
            log.info("kubernetes_watch_back", was=was)
            self._on_news()  # submits waiting for the server go now

    def _fail(self, e: BaseException) -> None:
        """The server could not be asked: the table is not trusted until it answers again.
        Said once per distinct failure (the worker's `executor_engine_failed` warns)."""
        words = (_error_words(e) if isinstance(e, Exception) else str(e)) or type(e).__name__
        with self._lock:
            was, self._error = self._error, words
            self._counts["failures"] += 1
            self._lock.notify_all()
        if was != words:
            log.info("kubernetes_watch_failed", error=words, resource_version=self.version)


# -- the server's errors in words (kubernetes.py says them too) ---------------------------------


def _error_words(e: Exception) -> str:
    return _api_words(e) if hasattr(e, "status") and hasattr(e, "body") else _one_line(e)


def _api_words(e: Any) -> str:
    """An ApiException's status and the server's message, on one line."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(e.body or "{}").get("message", "")
    return _one_line(f"{e.status} {e.reason}" + (f": {message}" if message else ""))


def _one_line(e: object) -> str:
    return " ".join(str(e).split())[:300]
