"""The core's Prometheus metrics (the loop's side), in a `CollectorRegistry` of its own.

Two kinds, chosen by cost on the loop:
- counters and histograms for events the loop already handles one at a time (an answer taken
  up, a resume started or ended, an executor error, a full reconcile, a webhook delivery):
  one `inc()`/`observe()` each, a lock and an add;
- everything that is a count the core already keeps (workspaces by state, questions waiting by
  kind, the oldest question, resumes running and queued, watches, the backends' health, the
  outbox's depth, readiness, the lease) is read at scrape time by `Scraped`, a custom collector,
  from a `Source`: nothing is maintained per event for them.

The seam (see deltad/health.py): the HTTP layer never sees this module's objects. It is handed
a `health.Vitals`, whose `core_metrics()` returns this registry's exposition as bytes and whose
`health()` returns a plain `Health`. `CoreVitals` (deltad/core/service.py) is that object in
the core's process; an HTTP layer in another process asks the core for the same two answers
over its socket. The HTTP layer
keeps its own registry for what only it sees (requests by route and code: deltad/http/access.py)
and `/metrics` is the two expositions one after the other (no name is in both).

Labels never carry a workspace path or a request id: state, input type, channel, executor,
result, backend, the configured roots (a handful), a full reconcile's reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from deltad import __version__
from deltad.health import HEARTBEAT_SECONDS, Health

# What an answer file's `channel` may say, as a label; anything else is "other". A plain
# response.txt (written by a person's editor or `echo`) is "file".
CHANNELS = frozenset({"cli", "http", "link", "pipeline", "mcp", "slack", "email", "file", "teams"})
RESULTS = ("succeeded", "failed", "timed_out")

# answer file closed → resume started: the promise is tens of milliseconds, a stuck queue is
# minutes.
# From 1 ms: the warm path resumes an answer in a few (a 10 ms first bucket could not show it).
RESUME_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0,
)  # fmt: skip
# A person's time to answer: seconds to a week.
ANSWER_BUCKETS = (
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0,
    259200.0, 604800.0,
)  # fmt: skip
RECONCILE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
# One turn of the loop (its work between two selects): a quiet turn is well under a
# millisecond; 50 ms is the bound an engine's outage must not push the p99 past (docs/daemon.md),
# so it is a bucket's edge and the share of turns within it is read exactly, not interpolated.
TURN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def channel_of(file_name: str, text: str | None) -> str:
    """The label for an answer: response.json's `channel` when it names a known one."""
    if file_name != "response.json" or not text:
        return "file"
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # (a 100,000-deep response.json: the resume refuses it)
        return "other"
    channel = doc.get("channel") if isinstance(doc, dict) else None
    if channel is None:
        return "file"
    return channel if isinstance(channel, str) and channel in CHANNELS else "other"


class CoreMetrics:
    """The loop's counters and histograms, and the registry `Scraped` joins them in."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.answers = Counter(
            "deltad_answers",
            "Answers the daemon took up for a resume, by the channel that wrote the file.",
            ["channel"],
            registry=r,
        )
        self.resumes = Counter(
            "deltad_resumes",
            "Resumes that ended, by executor and result (succeeded, failed, timed_out).",
            ["executor", "result"],
            registry=r,
        )
        self.audit_failures = Counter(
            "deltad_audit_failures",
            "Receipts the audit log would not take; each holds its resume until one is written.",
            registry=r,
        )
        self.resumes_started = Counter(
            "deltad_resumes_started", "Resumes started, by executor.", ["executor"], registry=r
        )
        self.answer_to_resume = Histogram(
            "deltad_answer_to_resume_seconds",
            "From the answer file's last write to its resume's start.",
            buckets=RESUME_BUCKETS,
            registry=r,
        )
        self.asked_to_answered = Histogram(
            "deltad_question_asked_to_answered_seconds",
            "From a question's asking to its answer's last write, by the question's kind.",
            ["kind"],
            buckets=ANSWER_BUCKETS,
            registry=r,
        )
        self.executor_errors = Counter(
            "deltad_executor_errors",
            "An executor refused or failed an operation (submit, adopt).",
            ["executor", "operation"],
            registry=r,
        )
        self.reconcile = Histogram(
            "deltad_reconcile_full_duration_seconds",
            "How long a full reconcile (a walk of every root) took, by why it ran.",
            ["reason"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.overflows = Counter(
            "deltad_watch_overflows",
            "Times the kernel's event queue overflowed (events lost), as the loop took them up: "
            "each glances at every workspace again, those waiting for an answer first, and walks "
            "every root once more.",
            registry=r,
        )
        self.loop_turn = Histogram(
            "deltad_loop_turn_seconds",
            "How long each turn of the daemon's loop took: its work between two waits (the "
            "wait itself excluded). The loop never waits on an engine, a network or a person.",
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self.loop_turn_cpu = Histogram(
            "deltad_loop_turn_cpu_seconds",
            "The CPU time of each turn of the loop (its thread's own): beside "
            "deltad_loop_turn_seconds, what of a slow turn was the daemon's work and what was "
            "waiting for a CPU or a disk.",
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self.deliveries = Counter(
            "deltad_deliveries",
            "Delivery attempts from the inbox process's outboxes, by target (webhook0, email, "
            "slack, command0, ...), kind (webhook, email, slack, command) and result (sent, "
            "retry, dead).",
            ["target", "kind", "result"],
            registry=r,
        )
        self.votes = Counter(
            "deltad_approval_votes",
            "Four eyes: votes cast on questions needing several approvals, by outcome "
            "(pending, answered, refused).",
            ["outcome"],
            registry=r,
        )
        self.channel_replies = Counter(
            "deltad_channel_replies",
            "Replies the core decided on, by channel and result: email's are relayed by the "
            "inbox process (answered, voted: a four-eyes vote that leaves the question "
            "waiting, taken: already answered by the same message before a crash, refused, "
            "failed: set aside by a bug).",
            ["channel", "result"],
            registry=r,
        )
        self.follow_ups = Counter(
            "deltad_question_follow_ups",
            "Open questions reminded (action=remind), escalated (escalate) or past their SLA "
            "(overdue).",
            ["action"],
            registry=r,
        )
        Gauge("deltad_build_info", "deltad's version.", ["version"], registry=r).labels(
            __version__
        ).set(1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def page_documents(self, kept: Callable[[], int], held: Callable[[], int]) -> None:
        """The list pages' kept documents (deltad/inbox/context.py `Documents`), read as a
        scrape asks: how many, and the bytes they cost. Called again (an inbox made anew), it
        reads the new ones."""
        first = not hasattr(self, "_documents")
        self._documents = (kept, held)
        if not first:
            return
        Gauge(
            "deltad_inbox_documents_kept",
            "Question documents kept for list pages (read by a page, or ahead of one).",
            registry=self.registry,
        ).set_function(lambda: float(self._documents[0]()))
        Gauge(
            "deltad_inbox_documents_bytes",
            "What the kept documents cost (compressed JSON and their records).",
            registry=self.registry,
        ).set_function(lambda: float(self._documents[1]()))

    def vote(self, outcome: str) -> None:
        """A four-eyes vote (deltad/inbox/quorum.py tells it from the core's call threads)."""
        self.votes.labels(outcome).inc()

    def resume_ended(self, executor: str, failed: bool, timed_out: bool) -> None:
        result = "timed_out" if timed_out else "failed" if failed else "succeeded"
        self.resumes.labels(executor, result).inc()

    def answered(self, kind: str | None, asked_at: float | None, answered_at: float) -> None:
        """A question's answer taken up (once per answer, as `deltad_answers_total` counts)."""
        if asked_at is not None:
            seconds = max(0.0, answered_at - asked_at)
            self.asked_to_answered.labels(kind or "unknown").observe(seconds)

    def resume_started(self, executor: str, answered_at: float | None, now: float) -> None:
        self.resumes_started.labels(executor).inc()
        if answered_at is not None:
            self.answer_to_resume.observe(max(0.0, now - answered_at))


class Source(Protocol):
    """Plain reads of counts the core keeps, for the collector (from the scraping thread)."""

    def health(self) -> Health: ...
    def workspaces_by_state(self) -> dict[str, int]: ...
    def questions(self) -> tuple[dict[str, int], float | None]: ...
    def resumes(self) -> tuple[int, int]: ...
    def roots(self) -> list[tuple[str, str]]: ...
    def backends(self) -> list[tuple[str, int, bool]]: ...
    def outbox_depth(self) -> int | None: ...
    def channel_outbox_depth(self) -> list[tuple[str, int]]: ...


class Scraped:
    """The gauges computed when Prometheus asks (a custom collector)."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []  # registered without a first collect

    def collect(self) -> Iterator[Metric]:
        return iter(list(gauges(self.source, time.monotonic(), time.time())))


class EngineEvents:
    """`deltad_executor_engine_events_total{executor, event}`: what the executor counts on its
    engine's side (`BaseJobExecutor.counts()`: a Kubernetes watch's lists, re-lists, restarts,
    events, failures), read when Prometheus asks."""

    def __init__(self, read: Callable[[], tuple[str, Mapping[str, int]]]) -> None:
        self.read = read

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        executor, counts = self.read()
        family = CounterMetricFamily(
            "deltad_executor_engine_events",
            "What the executor did on its engine's side, by event (a watch's relists...).",
            labels=["executor", "event"],
        )
        for event, n in sorted(counts.items()):
            family.add_metric([executor, event], n)
        yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _by(name: str, doc: str, label: str, values: Iterable[tuple[str, float]]) -> Metric:
    g = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in values:
        g.add_metric([key], value)
    return g


def gauges(s: Source, mono: float, wall: float) -> Iterator[Metric]:
    h = s.health()
    yield _gauge(
        "deltad_ready", "1 once /readyz would say 200 (lease aside).", h.ready and h.index_complete
    )
    yield _gauge(
        "deltad_index_complete", "1 once every workspace found is in the index.", h.index_complete
    )
    if h.last_turn is not None:
        yield _gauge(
            "deltad_loop_last_turn_age_seconds",
            "Seconds since the loop last turned (it wakes every "
            f"{HEARTBEAT_SECONDS:g} s at least).",
            max(0.0, mono - h.last_turn),
        )
    if h.lease_held is not None:
        yield _gauge(
            "deltad_ha_lease_held", "1 while this daemon holds the HA lease.", h.lease_held
        )
    yield _by(
        "deltad_workspaces",
        "Workspaces by the daemon's belief about them.",
        "state",
        sorted(s.workspaces_by_state().items()),
    )
    kinds, oldest = s.questions()
    yield _by(
        "deltad_requests_pending",
        "Questions waiting for an answer, by input type.",
        "input_type",
        sorted(kinds.items()),
    )
    yield _gauge(
        "deltad_request_oldest_pending_age_seconds",
        "Age of the oldest question still waiting (0 when none).",
        0.0 if oldest is None else max(0.0, wall - oldest),
    )
    running, queued = s.resumes()
    yield _gauge("deltad_resumes_running", "Resumes in flight.", running)
    yield _gauge("deltad_resumes_queued", "Resumes waiting for a slot.", queued)
    root = GaugeMetricFamily(
        "deltad_root_backend_info", "The watch backend of each root.", labels=["root", "backend"]
    )
    for path, backend in s.roots():
        root.add_metric([path, backend], 1)
    yield root
    backends = s.backends()
    yield _by(
        "deltad_watches",
        "Kernel watches or marks (polled directories for the poller), by backend.",
        "backend",
        [(name, n) for name, n, _ in backends],
    )
    yield _by(
        "deltad_watch_backend_healthy",
        "1 while a watch backend works (0: events are lost until a restart).",
        "backend",
        [(name, ok) for name, _, ok in backends],
    )
    if (depth := s.outbox_depth()) is not None:
        yield _gauge(
            "deltad_webhook_outbox_depth", "Webhook deliveries waiting in the outbox.", depth
        )
    if channels := s.channel_outbox_depth():
        yield _by(
            "deltad_channel_outbox_depth",
            "Messages of a channel (or notify command) waiting in the inbox process's outbox, "
            "as it last said.",
            "channel",
            channels,
        )


# Request durations, seconds: the HTTP layer's histogram.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)


# -- the HTTP layer's registry (the inbox process; deltad/http/access.py counts into it) ------
class HttpMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "deltad_http_requests",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "code"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "deltad_http_request_duration_seconds",
            "Time to answer an HTTP request (an event stream: how long it stayed open).",
            ["route"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
