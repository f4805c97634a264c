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

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
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


def test_an_idle_connection_flood_without_a_token_is_capped_per_source(tmp_path: Path) -> None:
    # A long header deadline: the idle connections stay while the cap is checked.
    with serving(tmp_path, max_connections_per_source=20, header_timeout_seconds=600) as d:
        server = address(d)
        ws = warmed(d, tmp_path / "root")
        held = [connect(server) for _ in range(20)]  # idle: not a byte sent
        try:
            # Each one is admitted: a request on the last answers (the first 20 are in).
            beyond = [connect(server) for _ in range(30)]
            assert all(refused(s) for s in beyond)
            for s in beyond:
                s.close()
            assert healthz(server, "127.0.0.2").startswith(b"HTTP/1.1 200 ")
            resumed_meanwhile(d, ws, 1)
            # One log line for the burst, not one per connection.
            lines = d.events("http_connections_refused")
            assert 1 <= len(lines) <= 2, lines
            assert lines[0]["refused"]["max_connections_per_source"] >= 1
            held[-1].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert closed_by_server(held[-1]).startswith(b"HTTP/1.1 200 ")
        finally:
            for s in held:
                s.close()
        # Closed ones free their places.
        wait_for(
            lambda: healthz(server, "127.0.0.1").startswith(b"HTTP/1.1 200 "),
            "a new connection from the flooding address admitted again",
        )


def test_idle_half_sent_and_slow_connections_are_cut_off(tmp_path: Path) -> None:
    with serving(
        tmp_path,
        header_timeout_seconds=1,
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
    limits = {"fd_reserve": 256, "max_connections": 1000, "header_timeout_seconds": 600}
    with serving(tmp_path, wrapper=prlimit, **limits) as d:
        server = address(d)
        [clamp] = d.wait_event("http_connections_clamped")  # the inbox process says it
        allowed = int(clamp["allowed"])
        assert 1 <= allowed < 44 and clamp["nofile"] == 300, clamp
        ws = warmed(d, tmp_path / "root")
        # From many sources, so only the process's cap binds.
        held: list[socket.socket] = []
        try:
            for i in range(allowed + 20):
                held.append(connect(server, f"127.0.1.{i % 250 + 1}"))
            beyond = held[allowed:]
            assert all(refused(s) for s in beyond)
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
