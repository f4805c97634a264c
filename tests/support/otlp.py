"""A stand-in OpenTelemetry collector on 127.0.0.1: OTLP/HTTP with protobuf bodies, as a
collector's `otlphttp` receiver takes them (`POST /v1/traces`, Content-Type
`application/x-protobuf`, an `ExportTraceServiceRequest`). The body is decoded with the
protocol's own messages (opentelemetry-proto); anything else is answered 400 and kept as a
failure, so a test sees a malformed export."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    start: int  # ns
    end: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    service: str


@dataclass
class Collector:
    spans: list[Span] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self.lock = threading.Lock()

    def by_name(self, name: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def all(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def take(self, body: bytes, headers: dict[str, str]) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        got = []
        for rs in req.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            {a.key: _value(a.value) for a in s.attributes},
                            [(lk.trace_id.hex(), lk.span_id.hex()) for lk in s.links],
                            str(res.get("service.name", "")),
                        )
                    )
        with self.lock:
            self.spans.extend(got)
            self.headers.append(headers)


@contextmanager
def collector() -> Iterator[Collector]:
    got = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            ok = self.path == "/v1/traces" and (
                self.headers.get("Content-Type") == "application/x-protobuf"
            )
            try:
                if not ok:
                    raise ValueError(f"{self.path} {self.headers.get('Content-Type')}")
                got.take(body, {k.lower(): v for k, v in self.headers.items()})
            except Exception as e:
                with got.lock:
                    got.failures.append(str(e))
                self.send_response(400)
                self.end_headers()
                return
            out = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    got.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()
