"""Nothing a peer sends without a token exhausts the daemon, against a real `deltad serve
--listen`: idle connections beyond the per-source cap are answered 503 and closed at once,
half-sent headers and slow bodies are cut off at their deadlines, the descriptor limit keeps a
reserve for the daemon's own work, and through each an answer written to a workspace is resumed
(its latency printed, not asserted) and `/healthz` answers another source. And what a token
holder sends: logins and logouts past what is kept by id, the `?workspace=` probe, a broken
tokens.json (10,000 logouts are in tests/unit/test_inbox_exhaust.py: in-process, fast).

Sources are told apart by address: every 127.0.0.0/8 address is this machine's, so a client
bound to 127.0.0.2 is "another source" to a server on 127.0.0.1."""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import resource
import selectors
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from deltad.http.sessions import CLOSED_PER_TOKEN
from tests.support.daemon import DELTAD, Daemon, answer, paused_workspace, wait_for
from tests.support.inbox import http_url, make_token

BUSY = b"HTTP/1.1 503 "


@contextlib.contextmanager
def serving(tmp_path: Path, wrapper: list[str] | None = None, **http: object) -> Iterator[Daemon]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    d = Daemon(tmp_path, [root], wrapper=wrapper, http={"listen": "127.0.0.1:0", **http})
    d.start()
    try:
        yield d
    finally:
        d.stop()
        d.kill_children()


def address(d: Daemon) -> tuple[str, int]:
    parts = urlsplit(http_url(d))
    return parts.hostname or "127.0.0.1", parts.port or 80


def connect(server: tuple[str, int], source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(server, timeout=60, source_address=(source, 0))
    return sock


def refused(sock: socket.socket) -> bool:
    """Whether the server answered this connection 503 and closed it (waits for the answer)."""
    got = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(4096):
            got += chunk
    return got.startswith(BUSY)


def closed_by_server(sock: socket.socket) -> bytes:
    """What the server sent before it closed the connection (waits for the close)."""
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            got += chunk
    return got


def healthz(server: tuple[str, int], source: str) -> bytes:
    with connect(server, source) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return closed_by_server(s)


def resumed_meanwhile(d: Daemon, ws: Path, count: int, when: str = "during the attack") -> float:
    """Answer `ws` and wait for its resume; the seconds it took (printed, never asserted)."""
    t0 = time.monotonic()
    answer(ws, f"answer {count}")
    d.wait_resumed(ws, count)
    took = time.monotonic() - t0
    print(f"resume latency {when}: {took:.3f} s")
    return took


def warmed(d: Daemon, root: Path) -> Path:
    """One resume before the attack (the first after a start is the slow one: the baseline on
    this machine, printed), and a workspace waiting for the one during it."""
    calm, ws = root / "ws0", root / "ws1"
    paused_workspace(calm)
    paused_workspace(ws)
    resumed_meanwhile(d, calm, 1, "before it (the baseline on this machine)")
    return ws


def one_answer(sock: socket.socket, request: bytes) -> bytes:
    """Send `request` on a kept-alive connection and read its whole answer (headers and a
    Content-Length body), leaving the connection open."""
    sock.sendall(request)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        assert chunk, f"closed after {got[:200]!r}"
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return got


def known(sock: socket.socket, token: str) -> None:
    """One request with `token` on `sock`, its answer read, the connection kept open."""
    auth = b"Authorization: Bearer " + token.encode()
    got = one_answer(sock, b"GET /v1/session HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200 "), got[:200]


def test_an_idle_flood_from_one_address_churns_among_itself(tmp_path: Path) -> None:
    # Long header deadlines: the idle connections stay while the caps are checked.
    limits = {
        "header_timeout_seconds": 600,
        "stranger_header_timeout_seconds": 600,
        "idle_timeout_seconds": 600,
    }
    with serving(tmp_path, max_connections_per_source=20, **limits) as d:
        server = address(d)
        ws = warmed(d, tmp_path / "root")
        alice = make_token(d.state_dir, "alice", str(tmp_path / "root" / "**"))
        mine = connect(server)  # alice's, from the flooding address, known to the gate
        known(mine, alice)
        held = [connect(server) for _ in range(19)]  # idle: not a byte sent
        try:
            # Beyond the address's cap each newcomer closes the address's oldest stranger
            # (a 503, as a refused one gets); alice's known connection is never among them.
            beyond = [connect(server) for _ in range(30)]
            assert all(refused(s) for s in held + beyond[:11])
            known(mine, alice)
            for s in beyond[11:]:
                got = one_answer(s, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert got.startswith(b"HTTP/1.1 200 ")
            assert healthz(server, "127.0.0.2").startswith(b"HTTP/1.1 200 ")
            resumed_meanwhile(d, ws, 1)
            # Each newcomer made room, and the line that says so counts them.
            # When the address holds only known connections, a newcomer is refused.
            for s in beyond[11:]:
                known(s, alice)
            over = connect(server)
            assert refused(over)
            over.close()
            lines = d.events("http_connections_refused")
            assert 1 <= len(lines) <= 2, lines
            assert lines[0]["refused"]["max_connections_per_source"] >= 1
        finally:
            for s in [mine, *held, *beyond]:
                s.close()
        # Closed ones free their places.
        wait_for(
            lambda: healthz(server, "127.0.0.1").startswith(b"HTTP/1.1 200 "),
            "a new connection from the flooding address admitted again",
        )


class Flood:
    """Idle connections held from each of `sources`, `per_source` each, every one reopened as
    soon as the server closes it (the attack that held the gate at 503 for everyone), on one
    thread until `stop()`."""

    def __init__(self, server: tuple[str, int], sources: list[str], per_source: int) -> None:
        self.server, self.sources, self.per_source = server, sources, per_source
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _open(self, sel: selectors.BaseSelector, source: str) -> None:
        with contextlib.suppress(OSError):
            sock = socket.socket()
            sock.setblocking(False)
            sock.bind((source, 0))
            sock.connect_ex(self.server)
            sel.register(sock, selectors.EVENT_READ, source)
            self.opened += 1

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            for source in self.sources:
                for _ in range(self.per_source):
                    self._open(sel, source)
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    sel.unregister(sock)
                    sock.close()  # answered 503 and closed: open another at once
                    self._open(sel, key.data)
            for key in list(sel.get_map().values()):
                sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]


class Streams:
    """`count` event streams on one token, held open; each one refused (429) or ended is
    opened again at once, on one thread until `stop()`."""

    def __init__(self, url: str, token: str, count: int) -> None:
        self.url, self.token, self.count = url, token, count
        self.statuses: collections.Counter[int] = collections.Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(8)]

    def __enter__(self) -> Streams:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _run(self) -> None:
        held: list[tuple[httpx.Client, httpx.Response]] = []
        per_thread = self.count // len(self._threads)
        while not self._stop.is_set():
            if len(held) >= per_thread:
                self._stop.wait(0.2)
                continue
            c = httpx.Client(
                base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {self.token}"}
            )
            try:
                r = c.send(c.build_request("GET", "/v1/events"), stream=True)
            except httpx.HTTPError:
                c.close()
                continue
            self.statuses[r.status_code] += 1
            if r.status_code == 200:
                held.append((c, r))
            else:
                r.close()
                c.close()
        for c, r in held:
            r.close()
            c.close()


def attack(server: tuple[str, int], url: str, reader: str, seen: Any, stop: Any) -> None:
    """The flood and the streams, in a process of their own (their threads would starve the
    test's own client of the GIL); `seen`: connections opened, streams refused, streams held."""
    sources = [f"127.0.0.{i}" for i in range(2, 7)]
    with Flood(server, sources, 128) as flood, Streams(url, reader, 512) as streams:
        while not stop.wait(0.1):
            seen[:] = [flood.opened, streams.statuses[429], streams.statuses[200]]


@pytest.mark.timeout(600)
def test_a_flood_from_many_addresses_and_streams_on_one_token_keep_nobody_out(
    tmp_path: Path,
) -> None:
    """The attack that held the HTTP side at 503 for everyone: idle connections from five
    addresses, 128 each (640, over the process's 512), reopened as they are closed, and 512
    event streams asked on one reader token; meanwhile a second token's requests and /livez,
    each on a new connection from the same /24 as the flood, are all answered 200."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))  # ~1,200 sockets there
    with serving(tmp_path) as d:
        url, server = http_url(d), address(d)
        root = tmp_path / "root"
        ws = warmed(d, root)
        reader = make_token(d.state_dir, "mallory", str(root / "**"), role="reader")
        alice = make_token(d.state_dir, "alice", str(root / "**"))
        served: collections.Counter[int] = collections.Counter()
        mp = multiprocessing.get_context("fork")
        seen, stop = mp.Array("q", 3), mp.Event()
        attacker = mp.Process(target=attack, args=(server, url, reader, seen, stop))
        attacker.start()
        try:
            wait_for(lambda: seen[0] >= 640, "the flood's connections opened")
            wait_for(lambda: seen[1], "a stream refused past the token's cap")
            fresh = httpx.Limits(max_keepalive_connections=0)  # a new connection each time
            auth = {"Authorization": f"Bearer {alice}"}
            with httpx.Client(base_url=url, timeout=60, limits=fresh) as c:
                for _ in range(25):
                    served[c.get("/v1/requests", headers=auth).status_code] += 1
                    served[c.get("/livez").status_code] += 1
            resumed_meanwhile(d, ws, 1)
            assert seen[0] > 640 * 2  # the flood went on, reopening what was closed
        finally:
            stop.set()
            attacker.join(timeout=60)
            attacker.kill()
        assert served == {200: 50}, served
        assert 16 <= seen[2] < 100, list(seen)  # the token's cap (and a stream or so ended)
    assert "Traceback" not in d.log_path.read_text()


def test_a_token_holds_its_streams_up_to_a_cap_each_for_a_lifetime(tmp_path: Path) -> None:
    with serving(tmp_path, max_streams_per_token=2, stream_lifetime_seconds=2) as d:
        url = http_url(d)
        reader = make_token(d.state_dir, "mallory", str(tmp_path / "**"), role="reader")
        auth = {"Authorization": f"Bearer {reader}"}
        with contextlib.ExitStack() as stack:
            c = stack.enter_context(httpx.Client(base_url=url, timeout=30, headers=auth))

            def stream() -> httpx.Response:
                r = c.send(c.build_request("GET", "/v1/events"), stream=True)
                stack.callback(r.close)
                return r

            first, second = stream(), stream()
            assert first.status_code == second.status_code == 200
            third = stream()
            assert third.status_code == 429 and third.headers["connection"] == "close"
            assert third.headers["retry-after"] and third.read()
            assert third.json()["code"] == "too_many_streams"
            # A stream ends at its lifetime, saying why; its place is given back.
            said = b"".join(first.iter_raw())  # returns once the server ends it
            assert b"reached its lifetime" in said, said
            wait_for(lambda: stream().status_code == 200, "a stream once one ended")


def test_idle_half_sent_and_slow_connections_are_cut_off(tmp_path: Path) -> None:
    with serving(
        tmp_path,
        header_timeout_seconds=1,
        stranger_header_timeout_seconds=1,
        body_timeout_seconds=1,
        idle_timeout_seconds=1,
    ) as d:
        server = address(d)
        ws = warmed(d, tmp_path / "root")
        idle = connect(server)  # never a byte
        half = connect(server)
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never the blank line
        slow = connect(server)
        slow.sendall(
            b"POST /v1/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"  # 99 bytes owed, never sent
        )
        kept = connect(server)  # keep-alive after one answer, then idle
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            resumed_meanwhile(d, ws, 1)
            # Each is closed by the server (each recv waits for it: no timing here).
            assert closed_by_server(idle) == b""
            assert closed_by_server(half) == b""
            got = closed_by_server(slow)
            assert got.startswith(b"HTTP/1.1 408 ") and b'"slow_body"' in got, got[:300]
            assert closed_by_server(kept).startswith(b"HTTP/1.1 200 ")
        finally:
            for s in (idle, half, slow, kept):
                s.close()
        assert healthz(server, "127.0.0.2").startswith(b"HTTP/1.1 200 ")


def test_the_descriptor_limit_keeps_a_reserve_for_the_daemons_own_work(tmp_path: Path) -> None:
    # 300 descriptors, 256 of them kept back: only what is left after those in use at start
    # may be connections, whatever max_connections says.
    prlimit = ["prlimit", "--nofile=300:300", "--"]
    limits = {
        "fd_reserve": 256,
        "max_connections": 1000,
        "stranger_header_timeout_seconds": 600,
    }
    with serving(tmp_path, wrapper=prlimit, **limits) as d:
        server = address(d)
        [clamp] = d.wait_event("http_connections_clamped")  # the inbox process says it
        allowed = int(clamp["allowed"])
        assert 1 <= allowed < 44 and clamp["nofile"] == 300, clamp
        ws = warmed(d, tmp_path / "root")
        # From many sources, so only the process's cap binds: each beyond it closes the
        # oldest stranger, so the first 20 are answered 503 and never more are open.
        held: list[socket.socket] = []
        try:
            for i in range(allowed + 20):
                held.append(connect(server, f"127.0.1.{i % 250 + 1}"))
            assert all(refused(s) for s in held[:20])
            for s in held[20:]:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
            resumed_meanwhile(d, ws, 1)  # the resume had its descriptors
            assert not d.events("http_failed")
        finally:
            for s in held:
                s.close()
        wait_for(
            lambda: healthz(server, "127.0.0.2").startswith(b"HTTP/1.1 200 "),
            "a connection admitted once the flood is gone",
        )


@pytest.mark.parametrize("key", ["max_connections", "header_timeout_seconds", "fd_reserve"])
def test_a_bad_limit_is_one_line(tmp_path: Path, key: str) -> None:
    cfg = tmp_path / "deltad.yaml"
    cfg.write_text(f"roots: [{tmp_path}]\nhttp:\n  {key}: -1\n")
    out = subprocess.run(
        [DELTAD, "check", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert key in line


# -- what a token holder sends ----------------------------------------------------------------
def test_logouts_a_broken_tokens_json_and_the_probe_against_a_real_daemon(tmp_path: Path) -> None:
    with serving(tmp_path) as d:
        url = http_url(d)
        root = tmp_path / "root"
        paused_workspace(root / "bob" / "ws")
        ws = root / "alice" / "ws"
        paused_workspace(ws)
        alice = make_token(d.state_dir, "alice", str(root / "alice" / "**"))
        with httpx.Client(base_url=url, timeout=30) as page:
            # A stolen cookie, logged out; then logins and logouts past what is kept by id.
            login = page.post("/v1/session", json={"token": alice})
            stolen, csrf = login.cookies["deltad_session"], login.json()["csrf"]
            assert page.delete("/v1/session", headers={"X-CSRF-Token": csrf}).status_code == 200
            for _ in range(2 * CLOSED_PER_TOKEN + 10):
                r = page.post("/v1/session", json={"token": alice})
                h = {"X-CSRF-Token": r.json()["csrf"]}
                assert page.delete("/v1/session", headers=h).status_code == 200
            page.cookies.clear()
            page.cookies.set("deltad_session", stolen)
            back = page.get("/v1/session")
            page.cookies.clear()
            assert back.status_code == 401
            auth = {"Authorization": f"Bearer {alice}"}
            # The probe: a workspace outside the scope is no workspace.
            theirs = page.get(
                "/v1/runs/x", params={"workspace": str(root / "bob" / "ws")}, headers=auth
            )
            none = page.get("/v1/runs/x", params={"workspace": str(root / "nope")}, headers=auth)
            assert theirs.status_code == none.status_code == 404
            assert theirs.json()["code"] == none.json()["code"] == "unknown_workspace"
            # A broken tokens.json: one line, and the last good one serves.
            (d.state_dir / "inbox" / "tokens.json").write_bytes(b"{not json")
            for _ in range(5):
                assert page.get("/v1/requests", headers=auth).status_code == 200
            resumed_meanwhile(d, ws, 1)
            # once per reader of the file (the inbox, and the core that re-checks each call),
            # not once per request
            assert 1 <= len(d.events("tokens_refused")) <= 2
    assert "Traceback" not in d.log_path.read_text()
