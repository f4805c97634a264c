"""What the HTTP layer itself tells an operator: one JSON access-log line per request, a
rate-limited line per failed authentication, and its own Prometheus registry (requests by
route, method and code; their durations).

This registry is the HTTP side's only: the core's metrics arrive as bytes through the
`health.Vitals` the server is handed (deltad/metrics.py says why), and `/metrics` serves the
two one after the other. Nothing here reads the daemon's loop.

Never logged: a token, a cookie, a body, a query string, or the raw path (a signed link's path
is its credential): the route's template names what was asked.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deltad.http import gate
from deltad.metrics import HttpMetrics

log = structlog.get_logger("deltad.http.access")
auth_log = structlog.get_logger("deltad.http.auth")

SCOPE_KEY = "deltad.access"  # a dict the routes fill in (the token's name), shared by reference
FAILED_AUTH_EVERY = 60.0  # seconds: one line per source at most this often
FAILED_AUTH_SOURCES = 10_000  # sources remembered (the oldest is forgotten beyond it)
OTHER_ROUTE = "other"  # no route matched (a 404): one label, whatever was asked


@dataclass
class Said:
    """What `RateLimit.allow` decided: log now?, and how many were held back before it."""

    log: bool
    suppressed: int = 0


class RateLimit:
    """At most one line per key per `every` seconds; the lines held back are counted and
    reported with the next one let through. Bounded: the least recently seen keys go first."""

    def __init__(self, every: float = FAILED_AUTH_EVERY, keys: int = FAILED_AUTH_SOURCES) -> None:
        self.every, self.keys = every, keys
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()  # key -> (said at, held)

    def allow(self, key: str, now: float) -> Said:
        with self._lock:
            said = self._seen.get(key)
            if said is not None and now - said[0] < self.every:
                self._seen[key] = (said[0], said[1] + 1)
                self._seen.move_to_end(key)
                return Said(False)
            self._seen[key] = (now, 0)
            self._seen.move_to_end(key)
            while len(self._seen) > self.keys:
                self._seen.popitem(last=False)
            return Said(True, said[1] if said is not None else 0)


def route_of(routes: list[BaseRoute], scope: Scope) -> str:
    """The template of the route `scope` is for (`/v1/requests/{request_id}`), never its path."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return str(getattr(route, "path", OTHER_ROUTE))
        if match == Match.PARTIAL and partial is None:  # the path fits, not the method
            partial = str(getattr(route, "path", OTHER_ROUTE))
    return partial or OTHER_ROUTE


def note_token(scope: Scope, name: str) -> None:
    """Called where a credential was accepted: the access line names its token, and its
    connection is known to the gate from now on (never closed to make room)."""
    gate.prove(scope)
    holder = scope.get(SCOPE_KEY)
    if isinstance(holder, dict):
        holder["token"] = name


class AccessLog:
    """Outermost ASGI middleware: times each request, counts it, logs it once it is answered
    (its last body byte sent, or the exception that ended it)."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Callable[[], list[BaseRoute]],
        metrics: HttpMetrics,
        failed_auth: RateLimit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app, self.routes, self.metrics = app, routes, metrics
        self.failed_auth, self.clock = failed_auth, clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        holder: dict[str, Any] = {}
        scope[SCOPE_KEY] = holder
        t0 = self.clock()
        code = 500
        done = False

        async def sending(message: Message) -> None:
            nonlocal code, done
            if message["type"] == "http.response.start":
                code = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                done = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.answered(scope, code, self.clock() - t0, holder.get("token"), done)

    def answered(
        self, scope: Scope, code: int, seconds: float, token: str | None, complete: bool
    ) -> None:
        route = route_of(self.routes(), scope)
        method = str(scope.get("method", ""))
        self.metrics.requests.labels(route, method, str(code)).inc()
        self.metrics.duration.labels(route).observe(seconds)
        client = scope.get("client")
        source = str(client[0]) if client else "unknown"
        log.info(
            "http_request",
            route=route,
            method=method,
            code=code,
            duration_ms=round(seconds * 1000, 1),
            token=token,
            client=source,
            **({} if complete else {"complete": False}),
        )
        if code == 401:
            said = self.failed_auth.allow(source, self.clock())
            if said.log:
                auth_log.warning(
                    "http_auth_failed",
                    client=source,
                    route=route,
                    suppressed=said.suppressed,
                    detail=f"at most one line per client every {self.failed_auth.every:g}s",
                )


class McpMetrics:
    """The MCP endpoint's own figures (deltad/http/mcp_adapter.py), in the HTTP layer's
    registry: tool calls by tool and outcome, and who is being told of changes. Its answers
    are counted where every answer is, `deltad_answers_total{channel="mcp"}` (the core's)."""

    TOOLS = frozenset({"list_questions", "get_question", "answer_question"})

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "deltad_mcp_tool_calls",
            "MCP tool calls, by tool and outcome (ok, refused, input_required, task).",
            ["tool", "outcome"],
            registry=registry,
        )
        self.listeners = Gauge(
            "deltad_mcp_listeners",
            "MCP subscriptions/listen streams open (told when the question list changes).",
            registry=registry,
        )

    def called(self, tool: str, outcome: str) -> None:
        self.calls.labels(tool if tool in self.TOOLS else "other", outcome).inc()
