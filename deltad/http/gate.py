"""What a peer may hold of the HTTP process, enforced where a connection is accepted: at most
`max_connections` open at once (fewer if the descriptor limit leaves less after `fd_reserve`
for the process's own work), at most `max_connections_per_source` from one address and
`max_connections_per_network` from one network (an IPv4 /24, an IPv6 /64: one host holds many
addresses, loopback's 127.0.0.0/8 among them), and deadlines on each request's headers (a
slowloris holds nothing for long).

A full gate never keeps out someone whose credential checks out. Until a request on it shows a
token or a session that checks out (`access.note_token`), a connection is a *stranger*; once
one does it is *known*. When a newcomer would go over a cap, a stranger in that cap's scope
(its address, its network, or, for the process's cap, the network holding the most strangers)
is answered the fixed 503 and closed to make room: the one longest open among those awaiting a
request (a flood's connections never send a byte; a person's sends its request at once), else
the one longest open; only when the scope holds no stranger is the newcomer refused that way,
before anything of it is parsed. A known
connection is never closed to make room, nor is one while it asks a health route (`/livez`,
`/readyz`, `/healthz`): so a flood of connections that never show a credential, from any
number of addresses, churns among itself while token holders and probes are served. A stranger
also gets the shorter header deadline (`stranger_header_timeout_seconds`).

The decisions (`admission`, `network_of`, `connection_cap`) are pure; `Gate` counts; `gated`
is the shell, a subclass of uvicorn's h11 protocol. The body's deadline is in limits.py
(`BodyLimit`), the idle keep-alive one is uvicorn's `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import os
import resource
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import h11
import structlog
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from deltad.http import problems

log = structlog.get_logger("deltad.http")
Why = Literal["max_connections", "max_connections_per_source", "max_connections_per_network"]
Scope_ = Literal["source", "network", "any"]
LOG_EVERY = 10.0  # seconds: refusals are logged at most this often, as counts
HEALTH_PATHS = frozenset({"/livez", "/readyz", "/healthz"})
CONNECTION = "deltad.connection"  # the ASGI scope key of the request's `Connection`
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
    per_network: int


@dataclass(frozen=True)
class Load:
    """What is open now, as one newcomer from a source sees it: in all, from its address and
    from its network, and how many of each are strangers (closable to make room)."""

    total: int
    source: int
    network: int
    strangers: int = 0
    strangers_from_source: int = 0
    strangers_from_network: int = 0


def admission(load: Load, caps: Caps) -> tuple[Why | None, Scope_ | None]:
    """(the cap a newcomer would go over, where a stranger is closed to make room for it):
    (None, None) lets it in; (why, None) refuses it. The narrowest cap first: closing one of
    its own address's or network's strangers makes room under the wider caps too."""
    checks: tuple[tuple[Why, int, int, int, Scope_], ...] = (
        ("max_connections_per_source", load.source, caps.per_source,
         load.strangers_from_source, "source"),
        ("max_connections_per_network", load.network, caps.per_network,
         load.strangers_from_network, "network"),
        ("max_connections", load.total, caps.total, load.strangers, "any"),
    )  # fmt: skip
    for why, count, cap, strangers, scope in checks:
        if count >= cap:
            return why, (scope if strangers else None)
    return None, None


def network_of(source: str) -> str:
    """The network a source address is counted in: its IPv4 /24 or IPv6 /64 (an IPv4-mapped
    IPv6 address as its IPv4 one); anything else (a Unix socket's '?') is its own."""
    try:
        ip = ipaddress.ip_address(source.split("%", 1)[0])
    except ValueError:
        return source
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


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


_ids = itertools.count()
Kind = Literal["idle", "busy", "known", "probing"]


class Connection:
    """One admitted connection as the gate counts it. `close` is called (on the server's loop)
    when it is closed to make room; `prove` when a credential checked out on it (any thread).
    A stranger is `idle` while it awaits a request (from its start, and after each answer) and
    `busy` from a request's first byte until its answer."""

    def __init__(self, gate: Gate, source: str, close: Callable[[], None]) -> None:
        self.gate, self.source, self.network = gate, source, network_of(source)
        self.id = next(_ids)
        self.close = close
        self.counted = True  # until it is closed (or closed to make room)
        self.kind: Kind = "idle"

    def prove(self) -> None:
        self.gate.prove(self)


class _Pool:
    """Strangers of one kind, oldest first (dicts keep their order), in all and by source and
    by network."""

    def __init__(self) -> None:
        self.all: dict[int, Connection] = {}
        self.by_source: dict[str, dict[int, Connection]] = {}
        self.by_network: dict[str, dict[int, Connection]] = {}

    def add(self, conn: Connection) -> None:
        self.all[conn.id] = conn
        self.by_source.setdefault(conn.source, {})[conn.id] = conn
        self.by_network.setdefault(conn.network, {})[conn.id] = conn

    def drop(self, conn: Connection) -> None:
        if self.all.pop(conn.id, None) is None:
            return
        for pools, key in ((self.by_source, conn.source), (self.by_network, conn.network)):
            pool = pools[key]
            del pool[conn.id]
            if not pool:
                del pools[key]

    def within(self, scope: Scope_, key: str) -> dict[int, Connection]:
        if scope == "source":
            return self.by_source.get(key, {})
        if scope == "network":
            return self.by_network.get(key, {})
        return self.all


class Gate:
    """The open connections, per source and network, strangers in the order they came;
    thread-safe (admitted on the server's loop, proven from the app's threads, read by tests)."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self._open_network: Counter[str] = Counter()
        self._total = 0
        # Strangers that may be closed to make room: the idle ones first (a flood's connections
        # never send a byte; a person's sends its request at once and is busy from then on).
        self._idle, self._busy = _Pool(), _Pool()
        self.refused: Counter[str] = Counter()  # by reason, since start
        self._unlogged: Counter[str] = Counter()
        self._logged_at = 0.0

    def _strangers(self, scope: Scope_, key: str) -> int:
        return len(self._idle.within(scope, key)) + len(self._busy.within(scope, key))

    def admit(self, source: str, close: Callable[[], None]) -> Connection | Why:
        """The newcomer's Connection (a stranger closed first if it had to make room), or why
        it is refused."""
        victim: Connection | None = None
        with self._lock:
            network = network_of(source)
            load = Load(
                self._total,
                self._open[source],
                self._open_network[network],
                self._strangers("any", ""),
                self._strangers("source", source),
                self._strangers("network", network),
            )
            why, scope = admission(load, self.caps)
            if why is not None and scope is None:
                return self._refused(why)
            if why is not None and scope is not None:
                victim = self._oldest_stranger(scope, source, network)
                self._forget(victim)
                self.refused["closed_for_room"] += 1
            conn = Connection(self, source, close)
            self._open[source] += 1
            self._open_network[network] += 1
            self._total += 1
            self._idle.add(conn)
        if victim is not None:
            victim.close()
        return conn

    def _refused(self, why: Why) -> Why:
        self.refused[why] += 1
        self._unlogged[why] += 1
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY:
            return why
        counts, self._unlogged, self._logged_at = dict(self._unlogged), Counter(), now
        # One line per LOG_EVERY at most, whatever the flood: the log must not fill a disk.
        log.warning("http_connections_refused", refused=counts, open=self._total, **self.limits)
        return why

    def _oldest_stranger(self, scope: Scope_, source: str, network: str) -> Connection:
        key = source if scope == "source" else network
        if scope == "any":  # the process is full: the network holding the most strangers
            networks = self._idle.by_network.keys() | self._busy.by_network.keys()
            scope, key = "network", max(networks, key=lambda n: self._strangers("network", n))
        pool = self._idle.within(scope, key) or self._busy.within(scope, key)
        return next(iter(pool.values()))

    def _set_kind(self, conn: Connection, kind: Kind) -> None:
        pools = {"idle": self._idle, "busy": self._busy}
        if not conn.counted or conn.kind == kind:
            return
        if conn.kind in pools:
            pools[conn.kind].drop(conn)
        conn.kind = kind
        if kind in pools:
            pools[kind].add(conn)

    def _forget(self, conn: Connection) -> None:
        """Count a connection out (closed, or about to be closed to make room); once only."""
        if not conn.counted:
            return
        self._set_kind(conn, "known")  # out of the pools
        conn.counted = False
        for counts, key in ((self._open, conn.source), (self._open_network, conn.network)):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
        self._total -= 1

    def release(self, conn: Connection) -> None:
        with self._lock:
            self._forget(conn)

    def prove(self, conn: Connection) -> None:
        with self._lock:
            self._set_kind(conn, "known")

    def talking(self, conn: Connection, busy: bool) -> None:
        """A stranger's request began (its first byte came) or was answered."""
        with self._lock:
            if conn.kind in ("idle", "busy"):
                self._set_kind(conn, "busy" if busy else "idle")

    def probe(self, conn: Connection, started: bool) -> None:
        """A health request began (True) or ended on `conn`: never closed to make room then."""
        with self._lock:
            if conn.kind != "known":
                self._set_kind(conn, "probing" if started else "busy")

    def timed_out(self, what: str) -> None:
        with self._lock:
            self.refused[what] += 1

    @property
    def limits(self) -> dict[str, int]:
        return {
            "max_connections": self.caps.total,
            "max_connections_per_source": self.caps.per_source,
            "max_connections_per_network": self.caps.per_network,
        }

    def open_count(self, source: str | None = None) -> int:
        with self._lock:
            return self._total if source is None else self._open[source]

    def stranger_count(self) -> int:
        with self._lock:
            return self._strangers("any", "")


def prove(scope: Scope) -> None:
    """A credential checked out on this request: its connection is known from now on."""
    conn = scope.get(CONNECTION)
    if isinstance(conn, Connection):
        conn.prove()


def _with_connection(app: ASGIApp, conn: Connection) -> ASGIApp:
    """The app as one connection's requests reach it: each scope carries the connection, and a
    health request holds it un-closable while it is answered."""

    async def per_connection(scope: Scope, receive: Receive, send: Send) -> None:
        scope[CONNECTION] = conn
        if scope.get("path") not in HEALTH_PATHS:
            await app(scope, receive, send)
            return
        conn.gate.probe(conn, True)
        try:
            await app(scope, receive, send)
        finally:
            conn.gate.probe(conn, False)

    return per_connection


def _has_bytes(transport: asyncio.BaseTransport) -> bool:
    """Whether bytes from the peer already wait on the connection's socket (not consumed)."""
    wrapped = transport.get_extra_info("socket")  # asyncio's wrapper: it has no recv
    if wrapped is None:
        return False
    try:
        sock = socket.socket(fileno=wrapped.fileno())
    except (OSError, ValueError):
        return False
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # nothing yet (EAGAIN), or gone
        return False
    finally:
        sock.detach()  # the descriptor stays the transport's


def gated(gate: Gate, header_timeout: float, stranger_header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, counted by `gate`, with a deadline on each request's headers
    (the shorter `stranger_header_timeout` until a credential checked out on it)."""

    class Gated(H11Protocol):
        _conn: Connection | None = None
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peer: Any = transport.get_extra_info("peername")
            source = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            admitted = gate.admit(source, self._make_room)
            if isinstance(admitted, str):
                transport.write(BUSY)
                transport.close()  # never parsed, never counted by uvicorn
                return
            self._conn = admitted
            if _has_bytes(transport):
                # Its request came with it (under a flood a connection waits in the listen
                # queue, and its first read would come after a batch of accepts that each may
                # close an idle stranger): busy from the start, as a person's is.
                gate.talking(admitted, True)
            super().connection_made(transport)
            self.app = _with_connection(self.app, admitted)
            self._watch_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._conn is None:
                return  # refused at the gate: nothing of it was set up
            gate.release(self._conn)
            self._conn = None
            self._stop_header_timer()
            super().connection_lost(exc)

        def _make_room(self) -> None:
            """Closed for a newcomer: told so as a refused one is, unless an answer has begun."""
            if self.transport is not None and not self.transport.is_closing():
                if self.conn.our_state in (h11.IDLE, h11.DONE):
                    self.transport.write(BUSY)
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._conn is not None and data:
                gate.talking(self._conn, True)
            super().data_received(data)
            self._watch_headers()

        def on_response_complete(self) -> None:
            if self._conn is not None:
                gate.talking(self._conn, False)
            super().on_response_complete()
            self._watch_headers()

        def _watch_headers(self) -> None:
            """A deadline runs while a request's headers are awaited after its first byte (or
            the connection's start); the idle keep-alive timer covers the wait before it."""
            if self.transport is None or self.transport.is_closing():
                return
            awaiting = self.conn.their_state is h11.IDLE and self.timeout_keep_alive_task is None
            if awaiting and self._header_timer is None:
                known = self._conn is not None and self._conn.kind == "known"
                deadline = header_timeout if known else stranger_header_timeout
                self._header_timer = self.loop.call_later(deadline, self._headers_late)
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
