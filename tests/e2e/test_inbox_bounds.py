"""Bounded work per request against a real `deltad serve --listen`: an adversarial workspace glob
neither freezes the server nor the daemon's loop, an unauthenticated 99 MB body is refused
after its headers and never read, and revoking a token ends its open event stream and its web
sessions at once."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.daemon import DELTAD, Daemon, answer, paused_workspace, wait_for
from tests.support.inbox import EventReader, client, http_url, make_token

# Minutes of backtracking under the regex translation, with one workspace in scope.
ADVERSARIAL = "**" * 14 + "\x01"
MIB = 1024 * 1024


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Daemon, str, Path]]:
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        yield d, http_url(d), root
    finally:
        d.stop()
        d.kill_children()


class Storm:
    """Threads sending requests that make the server match adversarial globs (a `?workspace=`
    filter, or the token's own scope) until stopped, counting the answers."""

    def __init__(self, url: str, calls: list[tuple[str, str, dict[str, str]]]) -> None:
        self.answered = [0] * len(calls)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(url, i, *call), daemon=True)
            for i, call in enumerate(calls)
        ]
        for t in self._threads:
            t.start()

    def _run(self, url: str, i: int, token: str, route: str, params: dict[str, str]) -> None:
        with client(url, token) as http:
            while not self._stop.is_set():
                try:
                    r = http.get(route, params=params, timeout=20)
                except httpx.HTTPError as e:
                    self.failures.append(f"{route}: {type(e).__name__}")
                    return
                if r.status_code != 200:
                    self.failures.append(f"{route}: {r.status_code} {r.text}")
                    return
                self.answered[i] += 1

    def running(self) -> bool:
        return not self.failures and all(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def test_an_adversarial_glob_storm_stalls_neither_the_server_nor_the_loop(
    served: tuple[Daemon, str, Path],
) -> None:
    d, url, root = served
    ws = root / "ws1"
    paused_workspace(ws)
    token = make_token(d.state_dir, "alice")
    odd_scope = make_token(d.state_dir, "mallory", "/" + ADVERSARIAL)
    with client(url, token) as http:
        wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question listed")
    storm = Storm(
        url,
        [
            (token, "/v1/requests", {"workspace": ADVERSARIAL}),
            (token, "/v1/runs", {"workspace": ADVERSARIAL}),
            (odd_scope, "/v1/requests", {}),  # token scopes go through the same matcher
        ],
    )
    try:
        # Each storm request returns: the old matcher spent minutes on the first one.
        wait_for(lambda: min(storm.answered) >= 3 or storm.failures, "storm requests answered")
        assert storm.running(), storm.failures
        with client(url) as anon:
            assert anon.get("/healthz", timeout=20).json() == {"status": "ok"}
        answer(ws)
        d.wait_resumed(ws)  # the daemon's loop went on
        assert storm.running(), storm.failures  # ... while the storm was still on
        with client(url, token) as http:
            r = http.get("/v1/events", params={"workspace": "/" + "a" * 2000})
            assert r.status_code == 422 and r.json()["code"] == "bad_glob"
    finally:
        storm.stop()
    assert not storm.failures


def _vm_hwm_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM): what a buffered body would have raised."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


def _raw_post(url: str, path: str, headers: dict[str, str], body: Iterator[bytes]) -> int:
    """POST over a plain socket, sending the body while a thread reads the answer (the server
    may answer, and close, before the body is sent). The answer's status code."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), 30)
    head = f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    got = bytearray()

    def read() -> None:
        with contextlib.suppress(OSError):
            while b"\r\n" not in got:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                got.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        sock.sendall(head.encode())
        for chunk in body:
            if got or not reader.is_alive():
                break  # answered: the rest is not wanted
            sock.sendall(chunk)
    except OSError:
        pass  # the server closed the connection on an unread body
    reader.join(30)
    sock.close()
    assert got.startswith(b"HTTP/1.1 "), bytes(got[:200])
    return int(got.split(b" ", 2)[1])


def _json_body(size: int) -> Iterator[bytes]:
    yield b'{"answer": "'
    for _ in range(size // MIB):
        yield b"x" * MIB
    yield b'"}'


def test_a_99mb_body_from_a_stranger_is_refused_unread(served: tuple[Daemon, str, Path]) -> None:
    d, url, _ = served
    assert d.proc is not None
    size = 99 * MIB
    before = _vm_hwm_kib(d.proc.pid)

    def grown_mib() -> float:
        assert d.proc is not None
        return (_vm_hwm_kib(d.proc.pid) - before) / 1024

    length = {"Content-Type": "application/json", "Content-Length": str(size + 14)}
    assert _raw_post(url, "/v1/requests/q1/answer", length, _json_body(size)) == 401
    assert grown_mib() < 50, f"the daemon's peak RSS grew by {grown_mib():.0f} MiB"
    chunked = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}

    def chunks() -> Iterator[bytes]:
        for part in _json_body(size):
            yield f"{len(part):x}\r\n".encode() + part + b"\r\n"
        yield b"0\r\n\r\n"

    # The login takes its token from the body: cut off at its cap, whatever the length.
    assert _raw_post(url, "/v1/session", chunked, chunks()) == 413
    token = make_token(d.state_dir, "alice")
    length["Authorization"] = f"Bearer {token}"
    assert _raw_post(url, "/v1/requests/q1/answer", length, _json_body(size)) == 413
    with client(url) as anon:  # the server goes on
        assert anon.get("/healthz").status_code == 200
    assert grown_mib() < 50, f"the daemon's peak RSS grew by {grown_mib():.0f} MiB"


def test_revoking_a_token_ends_its_event_stream_and_sessions(
    served: tuple[Daemon, str, Path],
) -> None:
    d, url, root = served
    alice, bob = make_token(d.state_dir, "alice"), make_token(d.state_dir, "bob")
    hers, his = EventReader(url, alice), EventReader(url, bob)
    with httpx.Client(base_url=url, timeout=30) as browser:
        login = browser.post("/v1/session", json={"token": alice})
        assert login.status_code == 200
        assert browser.get("/v1/session").json()["name"] == "alice"
        paused_workspace(root / "ws1")
        for stream in (hers, his):
            stream.wait(lambda e: e["type"] == "request.created", "request.created for ws1")
        subprocess.run(
            [DELTAD, "token", "revoke", "alice", "--state-dir", str(d.state_dir)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(hers.ended, "the revoked token's stream to end")
        r = browser.get("/v1/session")
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    seen = len(hers.events)
    paused_workspace(root / "ws2")
    his.wait(lambda e: e.get("workspace") == str(root / "ws2"), "bob's stream goes on")
    assert len(hers.events) == seen
    assert not [e for e in hers.events if e.get("workspace") == str(root / "ws2")]
    hers.close()
    his.close()
