"""Signals, systemd notifications, single instance, logs, and the `check`/`status` commands."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.daemon import (
    DELTAD,
    Daemon,
    answer,
    paused_workspace,
    running,
    wait_for,
)

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z$")


def test_json_log_lines_carry_the_fields(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    run_id = paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        answer(ws, "secret-ish answer text")
        d.wait_event("resume_exited", workspace=str(ws))
    for line in d.lines():
        assert ISO_UTC.match(line["timestamp"]), line
        assert line["level"] in {"debug", "info", "warning", "error"}
        assert line["logger"].startswith("deltad")
        assert re.fullmatch(r"[a-z][a-z0-9_]*", line["event"]), line["event"]
    [spawned] = d.events("resume_spawned")
    assert spawned["workspace"] == str(ws) and spawned["run_id"] == run_id and spawned["pid"] > 0
    [exited] = d.events("resume_exited")
    assert exited["exit_code"] == 0 and exited["duration_ms"] >= 0 and exited["pid"] > 0
    ready = d.events("daemon_ready")[0]
    assert ready["duration_ms"] >= 0
    # The answer itself is never logged.
    assert "secret-ish" not in d.log_path.read_text()


def test_sigterm_lets_the_in_flight_resume_finish_and_exits_0(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    d = Daemon(tmp_path, [root], mode="slow").start()
    try:
        answer(ws, "x")
        d.wait_event("resume_spawned")
        assert d.stop() == 0
    finally:
        d.kill_children()
    names = [e["event"] for e in d.lines()]
    assert (
        names.index("daemon_stopping")
        < names.index("resume_exited")
        < names.index("daemon_stopped")
    )
    [exited] = d.events("resume_exited")
    assert exited["exit_code"] == 0


def test_sighup_reloads_the_config(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    a, b = first / "a", second / "b"
    paused_workspace(a)
    paused_workspace(b)
    with running(tmp_path, [first]) as d:
        answer(b, "only watched after the reload")
        d.write_config(roots=[str(first), str(second)])
        d.reload()
        d.wait_event("config_reloaded")
        assert d.wait_resumed(b)[0]["answer"] == "only watched after the reload"
        # A broken config on reload is refused; the daemon keeps running on the old one.
        d.config_path.write_text("roots: [unclosed\n")
        d.signal(signal.SIGHUP)
        d.wait_event("config_reload_failed")
        answer(a, "still working")
        assert d.wait_resumed(a)[0]["answer"] == "still working"


def test_second_daemon_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with running(tmp_path, [root]) as d:
        second = subprocess.run(
            [DELTAD, "serve", "--config", str(d.config_path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode != 0
        assert "already running" in second.stderr
        assert str(d.state_dir) in second.stderr


@pytest.fixture
def notify_socket(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    sock.settimeout(30)
    yield sock, path
    sock.close()


def _messages_until(sock: socket.socket, wanted: str, seen: list[str]) -> list[str]:
    while not any(wanted in m for m in seen):
        seen.append(sock.recv(65536).decode())
    return seen


def test_systemd_notifications(tmp_path: Path, notify_socket) -> None:
    sock, path = notify_socket
    root = tmp_path / "root"
    paused_workspace(root / "ws1")
    d = Daemon(tmp_path, [root])
    d.start(env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"}, wait=False)
    try:
        seen: list[str] = []
        _messages_until(sock, "READY=1", seen)
        ready = next(m for m in seen if "READY=1" in m)
        assert "STATUS=watching 1 workspaces" in ready
        _messages_until(sock, "WATCHDOG=1", seen)
        d.signal(signal.SIGHUP)
        _messages_until(sock, "RELOADING=1", seen)
        reloading = next(m for m in seen if "RELOADING=1" in m)
        assert re.search(r"MONOTONIC_USEC=\d+", reloading)
        _messages_until(sock, "READY=1", after_reload := [])
        d.signal(signal.SIGTERM)
        _messages_until(sock, "STOPPING=1", after_reload)
        assert d.proc is not None and d.proc.wait(30) == 0
    finally:
        d.stop()


def test_status_command(tmp_path: Path) -> None:
    root = tmp_path / "root"
    waiting, answered = root / "waiting", root / "answered"
    paused_workspace(waiting)
    paused_workspace(answered)
    state = tmp_path / "state"
    with running(tmp_path, [root], mode="hang") as d:
        answer(answered, "go")
        d.wait_resumed(answered)

        def snapshot() -> dict | None:
            out = subprocess.run(
                [DELTAD, "status", "--state-dir", str(state), "--json"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            snap = json.loads(out.stdout)
            return snap if snap["counts"]["resuming"] == 1 else None

        snap = wait_for(snapshot, "status showing one resuming run")
        assert snap["counts"]["workspaces"] == 2
        assert snap["waiting"] == [str(waiting)]
        assert snap["resuming"][0]["workspace"] == str(answered)
        text = subprocess.run(
            [DELTAD, "status", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        assert "resuming" in text and str(waiting) in text
    out = subprocess.run(
        [DELTAD, "status", "--state-dir", str(state)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 3
    assert "not running" in out.stderr


def test_check_command(tmp_path: Path) -> None:
    root = tmp_path / "root"
    paused_workspace(root / "a")
    paused_workspace(root / "g" / "b")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"roots:\n  - {root}\n  - path: {tmp_path / 'nfs'}\n    polling: true\n")
    out = subprocess.run([DELTAD, "check", "--config", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "2 workspaces" in out.stdout
    assert f"workspace {root / 'g' / 'b'}" in out.stdout
    assert "(polling)" in out.stdout
    cfg.write_text(f"roots: [{root}]\nmax_parallel_resumes: 0\n")
    out = subprocess.run([DELTAD, "check", "--config", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "max_parallel_resumes" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    cfg.write_text(f"roots: [{root}]\nmax_paralel_resumes: 3\n")
    out = subprocess.run([DELTAD, "check", "--config", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 2 and "max_paralel_resumes" in out.stderr


REPO = Path(__file__).resolve().parents[2]


def test_the_example_config_is_valid(tmp_path: Path) -> None:
    # Every key as documented; only the example roots are swapped for directories that exist
    # here (check says OK only when serve would have something to watch).
    text = (REPO / "config" / "deltad.yaml").read_text()
    for example in ("/srv/delta-workspaces", "/mnt/nfs/delta-workspaces"):
        (tmp_path / example.strip("/").replace("/", "_")).mkdir()
        text = text.replace(example, str(tmp_path / example.strip("/").replace("/", "_")))
    cfg = tmp_path / "deltad.yaml"
    cfg.write_text(text)
    out = subprocess.run(
        [DELTAD, "check", "--config", str(cfg)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert "configuration OK" in out.stdout


def test_the_systemd_unit_keeps_runs_alive_and_is_sandboxed() -> None:
    unit = (REPO / "systemd" / "deltad.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0] != "#"
    )
    assert settings["Type"] == "notify"
    assert settings["KillMode"] == "process"
    assert settings["Restart"] == "on-failure"
    assert settings["ProtectSystem"] == "strict" and settings["ReadWritePaths"]
    assert settings["NoNewPrivileges"] == "yes" and settings["PrivateTmp"] == "yes"
    assert settings["WatchdogSec"] and "deltad serve" in settings["ExecStart"]
    # Root that can only switch to owners and manage their runs (docs/daemon.md).
    caps = set(settings["CapabilityBoundingSet"].split())
    assert caps == {
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_KILL",
        "CAP_LEASE",
    }
    assert settings["User"] == "root"


def test_a_notify_socket_nobody_reads_never_blocks_the_daemon(
    tmp_path: Path, notify_socket
) -> None:
    _, path = notify_socket  # bound, never read: its queue (net.unix.max_dgram_qlen) fills up
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    d = Daemon(tmp_path, [root])
    # A watchdog ping every 5 ms: the queue is full long before the resume below has exited.
    d.start(env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "10000"})
    try:
        answer(ws, "still responsive")
        assert d.wait_resumed(ws)[0]["answer"] == "still responsive"
        d.wait_event("resume_exited")
        assert d.stop() == 0  # STOPPING=1 into a full queue must not hang the shutdown
    finally:
        d.stop()
