"""A real `deltad serve`: a web session outlives a daemon restart (and its CSRF token with it),
a revoke ends it, a logout is still a logout after a restart; SIGTERM with an event stream open
ends the stream properly (its terminating chunk) and the daemon cleanly; a shared
world-writable root is warned about."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import httpx

from tests.support.daemon import DELTAD, Daemon, wait_for
from tests.support.inbox import http_url, make_token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_web_session_survives_a_restart_and_ends_with_a_revoke(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    listen = f"127.0.0.1:{free_port()}"  # the same address after the restart, as for a page
    d = Daemon(tmp_path, [root], http={"listen": listen}).start()
    try:
        url = http_url(d)
        carol = make_token(d.state_dir, "carol")
        with (
            httpx.Client(base_url=url, timeout=30) as page,
            httpx.Client(base_url=url, timeout=30) as other,
        ):
            csrf = page.post("/v1/session", json={"token": carol}).json()["csrf"]
            logged_out = other.post("/v1/session", json={"token": carol})
            gone = logged_out.cookies["deltad_session"]
            gone_csrf = logged_out.json()["csrf"]
            assert (
                other.delete("/v1/session", headers={"X-CSRF-Token": gone_csrf}).status_code == 200
            )
            assert d.stop() == 0

            d.start(wait=False)
            d.wait_event("daemon_ready", count=2)
            me = page.get("/v1/session")
            assert me.status_code == 200, me.text
            assert me.json()["name"] == "carol" and me.json()["csrf"] == csrf
            r = page.post(
                "/v1/requests/nope/answer", json={"answer": "x"}, headers={"X-CSRF-Token": csrf}
            )
            assert r.status_code == 404  # past identity and CSRF: the question is unknown
            r = page.post("/v1/requests/nope/answer", json={"answer": "x"})
            assert r.status_code == 403 and r.json()["code"] == "csrf"
            # The logged-out cookie stays logged out across the restart.
            stale = httpx.get(f"{url}/v1/session", cookies={"deltad_session": gone}, timeout=30)
            assert stale.status_code == 401

            subprocess.run(
                [DELTAD, "token", "revoke", "carol", "--state-dir", str(d.state_dir)],
                check=True,
                capture_output=True,
                timeout=60,
            )
            assert page.get("/v1/session").status_code == 401
            # A new token of the same name is not the revoked one: the old session stays ended.
            make_token(d.state_dir, "carol")
            assert page.get("/v1/session").status_code == 401
    finally:
        d.stop()
        d.kill_children()


def test_sigterm_with_an_event_stream_open_ends_it_and_the_daemon_cleanly(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        url = http_url(d)
        token = make_token(d.state_dir, "alice")
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(
                f"GET /v1/events HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {token}\r\n\r\n".encode()
            )
            got = b""
            while b"retry:" not in got:
                chunk = s.recv(4096)
                assert chunk, got
                got += chunk
            assert d.proc is not None
            d.proc.send_signal(signal.SIGTERM)
            while chunk := s.recv(4096):
                got += chunk
        assert got.endswith(b"0\r\n\r\n"), got[-200:]  # the chunked stream's terminating chunk
        assert b"the daemon is stopping" in got
        assert d.stop() == 0
    finally:
        d.kill_children()
    bad = [
        line
        for line in d.log_path.read_text(errors="replace").splitlines()
        if "Traceback" in line
        or not line.startswith("{")
        or json.loads(line).get("level") in ("error", "critical", "warning")
    ]
    assert not bad, bad


def test_a_world_writable_root_is_warned_about(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private = tmp_path / "private"
    private.mkdir()
    argv = [DELTAD, "check", "--root", str(shared), "--root", str(private)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stdout.splitlines() if "writable by every" in line]
    assert len(warned) == 1 and str(shared) in warned[0], out.stdout

    d = Daemon(tmp_path, [shared, private]).start()
    try:
        [e] = wait_for(lambda: d.events("shared_root"), "the shared-root warning")
        assert e["level"] == "warning" and str(shared) in e["problem"]
        assert str(private) not in e["problem"]
    finally:
        d.stop()
        d.kill_children()
