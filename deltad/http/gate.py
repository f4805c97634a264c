"""What a peer may hold of the HTTP process, enforced where a connection is accepted: at most
`max_connections` open at once (fewer if the descriptor limit leaves less after `fd_reserve`
for the process's own work), at most `max_connections_per_source` from one address, and a
deadline on each request's headers (a slowloris holds nothing for long). A connection over a
cap is answered a fixed 503 and closed before anything of it is parsed.

The decisions (`refusal`, `connection_cap`) are pure; `Gate` counts; `gated` is the shell, a
subclass of uvicorn's h11 protocol. The body's deadline is in limits.py (`BodyLimit`), the
idle keep-alive one is uvicorn's `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from deltad.http import problems

log = structlog.get_logger("deltad.http")
Why = Literal["max_connections", "max_connections_per_source"]
LOG_EVERY = 10.0  # seconds: refusals are logged at most this often, as counts
_BUSY_BODY = problems.encoded(503, "busy", "too many connections; try again later")
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_BUSY_BODY), _BUSY_BODY)
)


@dataclass(frozen=True)
class Caps:
    total: int
    per_source: int


def refusal(open_total: int, open_from_source: int, caps: Caps) -> Why | None:
    """Why one more connection from a source is refused, or None (it is let in)."""
    if open_total >= caps.total:
        return "max_connections"
    if open_from_source >= caps.per_source:
        return "max_connections_per_source"
    return None


def connection_cap(configured: int, nofile: int, in_use: int, reserve: int) -> int:
    """Connections the process may hold: what is configured, or fewer if the descriptor limit
    (`nofile`) less those in use now and `reserve` leaves less (at least 1)."""
    return max(1, min(configured, nofile - in_use - reserve))


def descriptors() -> tuple[int, int]:
    """(the soft RLIMIT_NOFILE, descriptors open now)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 0
    return soft, in_use


class Gate:
    """The open connections, per source; thread-safe (counted on the server's loop, read by
    tests and status)."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self._total = 0
        self.refused: Counter[str] = Counter()  # by reason, since start
        self._unlogged: Counter[str] = Counter()
        self._logged_at = 0.0

    def admit(self, source: str) -> Why | None:
        with self._lock:
            why = refusal(self._total, self._open[source], self.caps)
            if why is None:
                self._open[source] += 1
                self._total += 1
                return None
            self.refused[why] += 1
            self._unlogged[why] += 1
            now = time.monotonic()
            if now - self._logged_at < LOG_EVERY:
                return why
            counts, self._unlogged, self._logged_at = dict(self._unlogged), Counter(), now
        # One line per LOG_EVERY at most, whatever the flood: the log must not fill a disk.
        log.warning("http_connections_refused", refused=counts, open=self._total, **self.limits)
        return why

    def release(self, source: str) -> None:
        with self._lock:
            self._open[source] -= 1
            self._total -= 1
            if self._open[source] <= 0:
                del self._open[source]

    def timed_out(self, what: str) -> None:
        with self._lock:
            self.refused[what] += 1

    @property
    def limits(self) -> dict[str, int]:
        return {
            "max_connections": self.caps.total,
            "max_connections_per_source": self.caps.per_source,
        }

    def open_count(self, source: str | None = None) -> int:
        with self._lock:
            return self._total if source is None else self._open[source]


def gated(gate: Gate, header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, counted by `gate`, with a deadline on each request's headers."""

    class Gated(H11Protocol):
        _source: str | None = None
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peer: Any = transport.get_extra_info("peername")
            source = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            if gate.admit(source) is not None:
                transport.write(BUSY)
                transport.close()  # never parsed, never counted by uvicorn
                return
            self._source = source
            super().connection_made(transport)
            self._watch_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._source is None:
                return  # refused at the gate: nothing of it was set up
            gate.release(self._source)
            self._source = None
            self._stop_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_headers()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch_headers()

        def _watch_headers(self) -> None:
            """A deadline runs while a request's headers are awaited after its first byte (or
            the connection's start); the idle keep-alive timer covers the wait before it."""
            if self.transport is None or self.transport.is_closing():
                return
            awaiting = self.conn.their_state is h11.IDLE and self.timeout_keep_alive_task is None
            if awaiting and self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_late)
            elif not awaiting:
                self._stop_header_timer()

        def _stop_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                gate.timed_out("header_timeout")
                self.transport.close()

    return Gated
