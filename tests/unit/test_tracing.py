"""deltad/tracing.py and the core's stages (deltad/core/traced.py), through the SDK's in-memory
exporter: the span tree of one question, its carried context, links, and the off path that
imports nothing of OpenTelemetry."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar, cast

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deltad import tracing
from deltad.core.facts import Action, State, Verdict
from deltad.core.traced import Traces
from deltad.inbox.feed import FeedEvent
from deltad.outbound import hub as hub_module
from deltad.outbound.base import Channel, Closed, Question
from deltad.outbound.handoff import Handoff
from deltad.outbound.hub import Hub
from deltad.outbound.outbox import Delivery, target_key
from deltad.protocol import InteractionRequest
from deltad.testing.stub import paused_workspace

CARRIED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exported() -> Iterator[tuple[InMemorySpanExporter, tracing.Exporting]]:
    exporter = InMemorySpanExporter()
    yield exporter, tracing.Exporting(SimpleSpanProcessor(exporter), "deltad-test")


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def _waiting(rid: str, carried: str | None = None) -> Verdict:
    return Verdict(
        Action.RESUME,
        State.WAITING,
        "run-1",
        request_id=rid,
        input_type="yes_no",
        created=1000.0,
        traceparent=carried,
        channel="http",
    )


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        "",
        CARRIED.upper(),  # lower-case hex only
        "01" + CARRIED[2:],  # another version
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # an all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        CARRIED + "-more",
        CARRIED.replace("-", "_"),
    ],
)
def test_anything_but_a_traceparent_is_no_context(value: object) -> None:
    assert tracing.parse(value) is None and tracing.checked(value) is None


def test_a_question_s_ids_are_derived_or_carried() -> None:
    own = tracing.Question("/ws", "r1")
    assert own.trace_id == tracing.Question("/ws", "r1").trace_id  # a restart finds the same
    assert own.trace_id != tracing.Question("/ws", "r2").trace_id  # one trace per question
    assert own.ask_span_id != tracing.Question("/other", "r1").ask_span_id
    joined = tracing.Question("/ws", "r1", CARRIED)
    assert joined.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert joined.ask_span_id == own.ask_span_id
    assert joined.context(0xAB) == "00-0af7651916cd43dd8448eb211c80319c-00000000000000ab-01"


def test_the_stages_of_one_question_are_one_tree(
    exported: tuple[InMemorySpanExporter, tracing.Exporting],
) -> None:
    exporter, tracer = exported
    traces = Traces(tracer)
    ws = Path("/srv/ws")
    traces.saw(ws, _waiting("r1", CARRIED))
    created = {"workspace": str(ws), "run_id": "run-1", "request_id": "r1", "input_type": "yes_no"}
    traces.event(FeedEvent(7, "request.created", "", created))
    traces.event(FeedEvent(8, "request.reminder", "", created))
    caller = "00-11111111111111111111111111111111-2222222222222222-01"
    tracer.caller(str(ws), "r1", caller)
    tracer.caller(str(ws), "r1", "not a traceparent")  # ignored
    parent = traces.resuming(ws, _waiting("r1", CARRIED), "answer", 1500.0, fresh=True)
    traces.resumed(ws, "run-1", 0, "completed")
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["ask_human", "announce", "remind", "answer", "resume"]
    got = _by_name(spans)
    ask = got["ask_human"]
    assert ask.parent is not None and ask.parent.span_id == 0xB7AD6B7169203331  # the carried
    assert ask.start_time == 1000 * 10**9  # request.json's timestamp
    assert {s.context.trace_id for s in spans} == {0x0AF7651916CD43DD8448EB211C80319C}
    for name in ("announce", "remind", "answer", "resume"):
        p = got[name].parent
        assert p is not None and p.span_id == ask.context.span_id, name
    answer = got["answer"]
    assert answer.start_time == 1500 * 10**9  # the answer file's write
    assert answer.attributes is not None and answer.attributes["deltad.channel"] == "http"
    assert [lk.context.span_id for lk in answer.links] == [0x2222222222222222]
    resume = got["resume"]
    assert parent == f"00-{resume.context.trace_id:032x}-{resume.context.span_id:016x}-01"
    assert resume.attributes is not None
    assert (resume.attributes["deltad.exit"], resume.attributes["deltad.exit_code"]) == (
        "completed",
        0,
    )
    assert resume.resource.attributes["service.name"] == "deltad-test"


def test_a_question_nobody_announced_still_has_its_root_once(
    exported: tuple[InMemorySpanExporter, tracing.Exporting],
) -> None:
    exporter, tracer = exported
    traces = Traces(tracer)
    ws = Path("/srv/ws")
    assert traces.resuming(ws, _waiting("r1"), "answer", 5.0, fresh=True) is not None
    assert traces.resuming(ws, _waiting("r1"), "answer", 5.0, fresh=False) is not None  # a retry
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["ask_human", "answer"]  # the resumes' spans come at their ends
    ask = exporter.get_finished_spans()[0]
    assert ask.parent is None  # derived: the question's own trace
    # A resume of an interrupted run closes no question: no context, no span.
    interrupted = Verdict(Action.RESUME, State.INTERRUPTED, "run-1")
    assert traces.resuming(Path("/srv/other"), interrupted, "interrupted", None, fresh=True) is None


def test_a_carried_context_not_sampled_records_nothing(
    exported: tuple[InMemorySpanExporter, tracing.Exporting],
) -> None:
    exporter, tracer = exported
    traces = Traces(tracer)
    unsampled = CARRIED[:-2] + "00"
    assert (
        traces.resuming(Path("/ws"), _waiting("r1", unsampled), "answer", 1.0, fresh=True) is None
    )
    assert exporter.get_finished_spans() == ()


def test_attributes_are_printable_and_bounded(
    exported: tuple[InMemorySpanExporter, tracing.Exporting],
) -> None:
    exporter, tracer = exported
    ws = "/srv/\x1b[31mred\n" + "x" * 1000
    tracer.record(tracing.Question(ws, "r1"), tracing.Stage("announce", 1.0, 1.0, {}))
    [span] = exporter.get_finished_spans()
    assert span.attributes is not None
    shown = str(span.attributes["deltad.workspace"])
    assert shown.isprintable() and len(shown) == tracing.MAX_ATTRIBUTE
    assert shown.startswith("/srv/\\x1b[31mred\\n")
    named = "/srv/" + b"caf\xe9\xff".decode("utf-8", "surrogateescape") + "\u2028"
    tracer.record(tracing.Question(named, "r2"), tracing.Stage("announce", 1.0, 1.0, {}))
    attributes = exporter.get_finished_spans()[1].attributes
    assert attributes is not None and attributes["deltad.workspace"] == "/srv/caf\\xe9\\xff\\u2028"


class _Handoff:
    """The inbox process's outboxes as the core hands to them (outbound/handoff.py)."""

    def __init__(self) -> None:
        self.channel_of = {target_key("recording"): "recording"}
        self.handed: list[object] = []

    def put(self, d: object, key: str) -> None:
        self.handed.append(d)


class _Recording:
    """A channel that hands one message off per question, or (`quiet`) none."""

    name: ClassVar[str] = "recording"

    def __init__(self, hand: Callable[[Delivery], None], quiet: bool = False) -> None:
        self.hand, self.quiet = hand, quiet
        self.sent: list[Question] = []

    def send(self, question: Question) -> None:
        self.sent.append(question)
        if not self.quiet:
            self.hand(cast(Delivery, question.request.request_id))

    def withdraw(self, closed: Closed) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_each_channel_s_hand_off_is_a_deliver_span(
    tmp_path: Path, exported: tuple[InMemorySpanExporter, tracing.Exporting]
) -> None:
    exporter, tracer = exported
    ws = tmp_path / "ws"
    paused_workspace(ws, "Ship it?", traceparent=CARRIED)
    req = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    outbox = _Handoff()
    hand = hub_module._hand(cast(Handoff, outbox), "recording")
    channels = [_Recording(hand), _Recording(hand, quiet=True), _Recording(hand)]
    hub = Hub(cast(list[Channel], channels), [])
    data = {"workspace": str(ws), "run_id": req["run_id"], "request_id": req["request_id"]}
    tracing.current = tracer
    try:
        hub.take(FeedEvent(1, "request.created", "", data))
    finally:
        tracing.current = tracing.OFF
    assert all(len(c.sent) == 1 for c in channels) and len(outbox.handed) == 2
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["deliver", "deliver"]  # the quiet one handed nothing
    q = tracing.Question(str(ws), req["request_id"], CARRIED)
    for s in spans:
        assert s.parent is not None and s.parent.span_id == q.ask_span_id
        assert s.context.trace_id == q.trace_id
        assert s.attributes is not None and s.attributes["deltad.channel"] == "recording"
        assert s.attributes["deltad.messages"] == 1


def test_a_request_without_a_context_is_written_as_before() -> None:
    req = InteractionRequest(prompt="Go?", run_id="r", action_id="a")
    assert "traceparent" not in req.model_dump(mode="json")
    assert "traceparent" not in json.loads(req.model_dump_json())
    carried = InteractionRequest(prompt="Go?", run_id="r", action_id="a", traceparent=CARRIED)
    again = InteractionRequest.model_validate_json(carried.model_dump_json())
    assert again.traceparent == CARRIED


def test_the_call_frame_carries_a_traceparent_only_when_there_is_one() -> None:
    from deltad import wire
    from deltad.privsep import monitor

    bare = wire.Call(op="vitals", id=1)
    assert b"traceparent" not in wire.encode(bare)  # a frame without it is as it was
    carried = wire.Call(op="vitals", id=2, traceparent=CARRIED)
    taken = monitor.decode(wire.encode(carried)[4:])
    assert isinstance(taken, monitor.Request) and taken.traceparent == CARRIED
    body = wire.encode(bare)[4:]
    odd = body[:-1] + b',"traceparent":"00-x"}'
    taken = monitor.decode(odd)
    assert isinstance(taken, monitor.Request) and taken.traceparent is None  # not a context
    too_long = body[:-1] + b',"traceparent":"' + b"0" * 56 + b'"}'
    refused = monitor.decode(too_long)
    assert isinstance(refused, str) and "traceparent" in refused  # a frame that does not fit


class _Stuck(InMemorySpanExporter):
    """A collector that does not answer until told to."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait()
        return super().export(spans)


@pytest.mark.timeout(60)  # a recording that waited on the collector would hang here
def test_a_stuck_collector_drops_spans_and_never_holds_the_recorder() -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    stuck = _Stuck()
    processor = BatchSpanProcessor(stuck, max_queue_size=4, max_export_batch_size=1)
    tracer = tracing.Exporting(processor, "deltad-test")
    q = tracing.Question("/ws", "r1")
    for n in range(200):
        tracer.record(q, tracing.Stage("announce", float(n), float(n), {}))
    stuck.release.set()
    tracer.shutdown()
    assert 0 < len(stuck.get_finished_spans()) <= 4 + 1  # the queue's, and the one in flight


OFF_PATH = """
import sys, types
from deltad import tracing
from deltad.core import cli, service
from deltad.core.traced import Traces
from deltad.outbound import hub
from deltad.engine import asking
from deltad.client import cli as client
svc = types.SimpleNamespace(config=types.SimpleNamespace(traces=None), traces=None)
service.Service.start_tracing(svc)  # type: ignore[arg-type]
assert svc.traces is None and tracing.current is tracing.OFF
tracing.current.record(tracing.Question("/ws", "r"), tracing.Stage("announce", 1.0, 1.0, {}))
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


@pytest.mark.spawns
def test_with_tracing_off_nothing_of_opentelemetry_is_imported() -> None:
    out = subprocess.run(
        [sys.executable, "-c", OFF_PATH], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
