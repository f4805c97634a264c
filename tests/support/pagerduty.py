"""A stand-in for PagerDuty's Events API v2 on 127.0.0.1 (`POST /v2/enqueue`), answering as
PagerDuty documents it (developer.pagerduty.com, Events API v2: "Send an Alert Event" and
"Response Codes & Retry Logic"): 202 `{"status": "success", "message": "Event processed",
"dedup_key"}` for a valid event; 400 `{"status": "invalid event", "message": "Event object is
invalid", "errors": [...]}` otherwise (a `routing_key` not of 32 characters, an unknown
`event_action`, a `dedup_key` over 255 characters, a trigger without `payload.summary` (at most
1,024 characters), `payload.source` or a known `payload.severity`, an acknowledge or resolve
without `dedup_key`); 429 for the first `throttle` calls (retry later). It keeps the alerts as
PagerDuty would: one per dedup key, triggered then resolved."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SEVERITIES = ("critical", "error", "warning", "info")
ACTIONS = ("trigger", "acknowledge", "resolve")


def problems(event: Any) -> list[str]:
    """Why PagerDuty would refuse `event` (empty: it accepts it)."""
    if not isinstance(event, dict):
        return ["Event object is not a JSON object"]
    out = []
    key = event.get("routing_key")
    if not isinstance(key, str) or len(key) != 32:
        out.append("'routing_key' must be 32 characters")
    action = event.get("event_action")
    if action not in ACTIONS:
        out.append("'event_action' is invalid")
    dedup = event.get("dedup_key")
    if dedup is not None and (not isinstance(dedup, str) or len(dedup) > 255):
        out.append("'dedup_key' must be a string of at most 255 characters")
    if action in ("acknowledge", "resolve") and not dedup:
        out.append("'dedup_key' is required for acknowledge and resolve")
    if action == "trigger":
        payload = event.get("payload")
        if not isinstance(payload, dict):
            return [*out, "'payload' is missing"]
        summary = payload.get("summary")
        if not isinstance(summary, str) or not summary or len(summary) > 1024:
            out.append("'payload.summary' is missing or over 1024 characters")
        if not isinstance(payload.get("source"), str) or not payload["source"]:
            out.append("'payload.source' is missing")
        if payload.get("severity") not in SEVERITIES:
            out.append("'payload.severity' is invalid")
    return out


@dataclass
class Alert:
    dedup_key: str
    summary: str
    status: str = "triggered"  # then "resolved"
    events: list[dict[str, Any]] = field(default_factory=list)


class EventsApi:
    def __init__(self, throttle: int = 0) -> None:
        self.throttle = throttle
        self.calls: list[tuple[int, dict[str, Any] | None]] = []  # (status answered, event)
        self.alerts: dict[str, Alert] = {}
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._reply(405, {"status": "method not allowed"})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v2/enqueue":
                    self._reply(404, {"status": "not found"})
                    return
                status, doc = outer._take(raw)
                self._reply(status, doc)

            def _reply(self, status: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v2/enqueue"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()

    def _take(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        try:
            event = json.loads(raw)
        except ValueError:
            event = None
        with self._lock:
            if self.throttle > 0:
                self.throttle -= 1
                self.calls.append((429, event))
                return 429, {"status": "throttle event", "message": "Requests for this service "
                             "are arriving too quickly.  Please retry later."}  # fmt: skip
            if wrong := problems(event):
                self.calls.append((400, event))
                return 400, {
                    "status": "invalid event",
                    "message": "Event object is invalid",
                    "errors": wrong,
                }
            assert isinstance(event, dict)
            self.calls.append((202, event))
            key = str(event.get("dedup_key") or f"generated-{len(self.calls)}")
            alert = self.alerts.get(key)
            if event["event_action"] == "trigger" and (alert is None or alert.status == "resolved"):
                alert = self.alerts[key] = Alert(key, event["payload"]["summary"])
            if alert is not None:
                alert.events.append(event)
                if event["event_action"] == "resolve":
                    alert.status = "resolved"
            return 202, {"status": "success", "message": "Event processed", "dedup_key": key}

    def accepted(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for status, e in self.calls if status == 202 and e is not None]

    def __enter__(self) -> EventsApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
