"""OpenTelemetry traces of a question's life (docs/daemon.md, "Traces"): off unless `traces:` is
configured.

One trace per question, the human wait inside it. No span is held open across the wait: every
span is recorded whole, as a stage ends, with its own start and end times (a wait can last
days, and a daemon restarts meanwhile). So the ids are not kept anywhere: they are derived.

- The question's trace: the trace of the `traceparent` its `request.json` carries (`delta`
  writes the `TRACEPARENT` it was started with: a resume by a tracing daemon, or an operator's
  own tool), else one derived from the workspace and the request id.
- Its root, `ask_human`: a span id derived from the workspace and the request id, so every
  stage recorded later (by this daemon or one restarted) is its child.
- Each stage (`announce`, `deliver`, `answer`, `expire`, `remind`, `escalate`, `resume`): a
  child of `ask_human`. The `resume` span's context is handed to the resumed `delta run` as
  `TRACEPARENT` (the environment carrier): a question that run asks joins the same trace.

This module holds the only imports of the OpenTelemetry SDK, made when tracing is configured
(`start`): with tracing off every call is the no-op `Tracer`'s and nothing of the SDK is loaded.
The spans go to a `BatchSpanProcessor` (its own thread, a bounded queue that drops when full),
so a caller, the daemon's loop among them, never waits on the collector.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deltad.protocol.printable import show

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor

ENV = "TRACEPARENT"  # the environment carrier (W3C Trace Context, as OTel's env carriers spec)
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
MAX_ATTRIBUTE = 256  # characters of one attribute value: names are untrusted bytes
MAX_CALLERS = 1024  # answers' callers remembered until the loop records the answer


@dataclass(frozen=True)
class Parent:
    """A W3C `traceparent`, checked: version 00, ids not all zero."""

    trace_id: int
    span_id: int
    sampled: bool

    @property
    def header(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"


def parse(value: object) -> Parent | None:
    """`value` as a traceparent, or None for anything else (it comes from files and frames that
    others write: never an error, never more than the header's 55 characters looked at)."""
    if not isinstance(value, str) or len(value) != 55:
        return None
    m = _TRACEPARENT.fullmatch(value)
    if m is None:
        return None
    trace_id, span_id = int(m.group(1), 16), int(m.group(2), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return Parent(trace_id, span_id, bool(int(m.group(3), 16) & 1))


def checked(value: object) -> str | None:
    """`value` if it is a traceparent (what `request.json` and the wire may carry), else None."""
    return value if isinstance(value, str) and parse(value) is not None else None


def _derived(*parts: str, size: int) -> int:
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:size], "big") or 1


@dataclass(frozen=True)
class Question:
    """One question's place in its trace, derived from where it is and what it carried."""

    workspace: str
    request_id: str
    traceparent: str | None = None  # request.json's, checked

    @property
    def parent(self) -> Parent | None:
        return parse(self.traceparent)

    @property
    def trace_id(self) -> int:
        p = self.parent
        return p.trace_id if p is not None else _derived(self.workspace, self.request_id, size=16)

    @property
    def ask_span_id(self) -> int:
        return _derived(self.workspace, self.request_id, "ask_human", size=8)

    @property
    def sampled(self) -> bool:
        p = self.parent
        return p.sampled if p is not None else True

    def context(self, span_id: int) -> str:
        """The traceparent of this question's span `span_id` (a carrier's value)."""
        return Parent(self.trace_id, span_id, self.sampled).header


def printable(value: object) -> str:
    """An attribute value: shown as logs show names (deltad/protocol/printable.py: a byte that
    is not UTF-8 as `\\xNN`, a control escaped), and bounded."""
    text = show(str(value))
    return text if len(text) <= MAX_ATTRIBUTE else text[: MAX_ATTRIBUTE - 1] + "…"


def new_span_id() -> int:
    import secrets

    return secrets.randbits(64) or 1


@dataclass(frozen=True)
class Stage:
    """A span recorded whole: a stage of a question's life."""

    name: str
    start: float  # wall clock, seconds
    end: float
    attributes: Mapping[str, str | int | bool]
    span_id: int = 0  # 0: a new one
    parent_id: int | None = None  # None: the question's ask_human span
    links: Sequence[Parent] = ()


class Tracer:
    """Tracing off: every call does nothing. `Exporting` records the spans."""

    on = False

    def record(self, q: Question, stage: Stage) -> int:
        return 0

    def caller(self, workspace: str, request_id: str, traceparent: str | None) -> None:
        """The traceparent an answer's caller sent (the HTTP request's, over the wire), linked
        from the `answer` span the loop records."""

    def callers_of(self, workspace: str, request_id: str) -> list[Parent]:
        return []

    def shutdown(self) -> None:
        pass


class Exporting(Tracer):
    """Spans handed to `processor` (the SDK's BatchSpanProcessor in the daemon, a simple one
    over an in-memory exporter in tests)."""

    on = True

    def __init__(self, processor: SpanProcessor, service_name: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.processor = processor
        self.resource = Resource.create({"service.name": service_name})
        self.scope = InstrumentationScope("deltad")
        self._lock = threading.Lock()
        self._callers: OrderedDict[tuple[str, str], list[Parent]] = OrderedDict()

    def record(self, q: Question, stage: Stage) -> int:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

        if not q.sampled:
            return 0
        flags = TraceFlags(TraceFlags.SAMPLED)
        span_id = stage.span_id or new_span_id()
        if stage.name == "ask_human":
            p = q.parent
            parent = None if p is None else SpanContext(p.trace_id, p.span_id, True, flags)
        else:
            pid = stage.parent_id if stage.parent_id is not None else q.ask_span_id
            parent = SpanContext(q.trace_id, pid, False, flags)
        attributes: dict[str, str | int | bool] = {
            "deltad.workspace": printable(q.workspace),
            "deltad.request_id": printable(q.request_id),
        }
        attributes |= {
            k: printable(v) if isinstance(v, str) else v for k, v in stage.attributes.items()
        }
        links = [
            Link(SpanContext(lk.trace_id, lk.span_id, True, TraceFlags(int(lk.sampled))))
            for lk in stage.links
        ]
        span = ReadableSpan(
            name=stage.name,
            context=SpanContext(q.trace_id, span_id, False, flags),
            parent=parent,
            resource=self.resource,
            attributes=attributes,
            links=links,
            kind=SpanKind.INTERNAL,
            instrumentation_scope=self.scope,
            start_time=int(stage.start * 1e9),
            end_time=int(max(stage.end, stage.start) * 1e9),
        )
        self.processor.on_end(span)  # the batch processor's queue: never waits, drops when full
        return span_id

    def caller(self, workspace: str, request_id: str, traceparent: str | None) -> None:
        if (p := parse(traceparent)) is None:
            return
        with self._lock:
            self._callers.setdefault((workspace, request_id), []).append(p)
            self._callers.move_to_end((workspace, request_id))
            while len(self._callers) > MAX_CALLERS:
                self._callers.popitem(last=False)

    def callers_of(self, workspace: str, request_id: str) -> list[Parent]:
        with self._lock:
            return self._callers.pop((workspace, request_id), [])[:8]

    def shutdown(self) -> None:
        self.processor.shutdown()  # exports what is queued, within the exporter's timeout


OFF = Tracer()
current: Tracer = OFF  # the daemon's: set at start (`start`), read where a stage happens
# The traceparent of the request being served (an HTTP request's header in the inbox process;
# the call frame's in the core, around its handler): an answer written links to it.
calling: ContextVar[str | None] = ContextVar("deltad_traceparent", default=None)


def headers_of(path: Path | None) -> dict[str, str]:
    """The exporter's HTTP headers from `path`: `Name: value` lines (an API key: a secret, so
    a file, never the config). ValueError (one line) for a line that is not one."""
    if path is None:
        return {}
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name.strip()):
            raise ValueError(f"line {n} is not `Name: value`")
        out[name.strip().lower()] = value.strip()
    return out


def start(
    endpoint: str,
    service_name: str,
    headers: Mapping[str, str],
    timeout_seconds: float,
    max_queue: int,
) -> Tracer:
    """The daemon's tracer, exporting over OTLP/HTTP (protobuf) to `endpoint` (the whole URL,
    `/v1/traces` included). The standard OTEL_EXPORTER_OTLP_* variables are not read: every
    setting is given here, so an environment cannot turn tracing on or send it elsewhere."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(headers), timeout=timeout_seconds)
    processor = BatchSpanProcessor(
        exporter,
        max_queue_size=max_queue,
        max_export_batch_size=min(512, max_queue),
        schedule_delay_millis=1000,
        export_timeout_millis=int(timeout_seconds * 1000),
    )
    return Exporting(processor, service_name)


def now() -> float:
    return time.time()
