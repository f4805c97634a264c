"""Two daemons on one fleet: active/standby through a lease (docs/daemon.md, "Two daemons, one
fleet"). Real `deltad serve` processes sharing one root, one state dir and one lease; real
stub resumes whose record lines are counted across both."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from deltad.protocol import Workspace, load_metadata, save_metadata
from deltad.protocol.models import OwnerProcess
from deltad.protocol.states import RunStatus
from tests.support.daemon import (
    DELTAD,
    Daemon,
    answer,
    metadata_status,
    paused_workspace,
    records,
    stub_command,
    wait_for,
)


@contextlib.contextmanager
def pair(
    tmp: Path, root: Path, mode: str = "consume", **settings: Any
) -> Iterator[tuple[Daemon, Daemon]]:
    """An active daemon (started first) and a standby, sharing root, state dir, lease and the
    stub's record file; each logs to its own file."""
    shared = tmp / "shared"
    ha = {"lease": str(shared / "deltad.lease"), "poll_seconds": 0.1, **settings.pop("ha", {})}
    common = {"state_dir": str(shared / "state"), "ha": ha, **settings}
    a_dir, b_dir = tmp / "a", tmp / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    record = tmp / "resumes.jsonl"
    a = Daemon(a_dir, [root], **common)
    b = Daemon(b_dir, [root], **common)
    for d in (a, b):
        d.record = record
        d.write_config(resume_command=stub_command(record, mode))
    a.start()
    b.start(wait=False)
    try:
        b.wait_event("standby")
        yield a, b
    finally:
        for d in (b, a):  # a standby stopped last would take over for nothing
            with contextlib.suppress(Exception):
                d.stop()
            d.kill_children()


def status(state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DELTAD, "status", "--state-dir", str(state_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def status_doc(state_dir: Path) -> dict[str, Any]:
    done = status(state_dir)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def in_flight(tmp: Path) -> list[int]:
    """The pids the active has recorded in the shared state dir (what a takeover adopts)."""
    try:
        rows = json.loads((tmp / "shared" / "state" / "resumes.json").read_text())
    except (OSError, ValueError):
        return []
    return [int(r["pid"]) for r in rows]


def resumes_of(d: Daemon) -> list[str]:
    return [e["workspace"] for e in d.events("resume_spawned")]


def test_each_answer_is_resumed_once_and_only_by_the_active(tmp_path: Path) -> None:
    root = tmp_path / "root"
    spaces = [root / f"ws{i}" for i in range(6)]
    for ws in spaces:
        paused_workspace(ws)
    with pair(tmp_path, root) as (a, b):
        for ws in spaces:
            answer(ws, f"answer for {ws.name}")
        wait_for(lambda: len(records(a.record)) >= len(spaces), "every answer resumed")
        for ws in spaces:
            wait_for(lambda ws=ws: metadata_status(ws) == "COMPLETED", f"{ws} completed")
        doc = status_doc(tmp_path / "shared" / "state")
        assert doc["role"] == "active" and doc["pid"] == a.proc.pid  # type: ignore[union-attr]
        assert [s["pid"] for s in doc["standbys"]] == [b.proc.pid]  # type: ignore[union-attr]
        assert sorted(resumes_of(a)) == sorted(map(str, spaces))
        assert resumes_of(b) == []  # the standby watched nothing and resumed nothing
        assert not b.events("daemon_ready") and not b.events("reconcile_full")
    assert sorted(r["workspace"] for r in records(a.record)) == sorted(map(str, spaces))


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_the_standby_takes_over_and_resumes_what_comes_after(
    tmp_path: Path, how: signal.Signals
) -> None:
    root = tmp_path / "root"
    before, during, after = root / "before", root / "during", root / "after"
    for ws in (before, during, after):
        paused_workspace(ws)
    state = tmp_path / "shared" / "state"
    with pair(tmp_path, root) as (a, b):
        answer(before)
        wait_for(lambda: metadata_status(before) == "COMPLETED", "the active's resume")
        a.signal(how)
        assert a.proc is not None
        a.proc.wait(60)
        answer(during)  # in the gap: found by the takeover's reconcile
        [taken] = b.wait_event("lease_taken")
        assert taken["waited_ms"] >= 0
        b.wait_event("daemon_ready")
        answer(after)  # after the takeover: an event
        for ws in (during, after):
            wait_for(lambda ws=ws: metadata_status(ws) == "COMPLETED", f"{ws} resumed")
        doc = status_doc(state)
        assert doc["role"] == "active" and doc["pid"] == b.proc.pid  # type: ignore[union-attr]
        assert doc["lease"]["pid"] == b.proc.pid  # type: ignore[union-attr]
        assert "standbys" not in doc
    workspaces = [r["workspace"] for r in records(a.record)]
    assert sorted(workspaces) == sorted(map(str, (before, during, after)))  # once each
    assert resumes_of(a) == [str(before)]


def test_a_standby_alone_says_so(tmp_path: Path) -> None:
    """A standby's own state dir holds no status.json (the active uses another): `deltad
    status` still says what it is, and the lease's holder file names the active."""
    root = tmp_path / "root"
    paused_workspace(root / "ws")
    lease = tmp_path / "deltad.lease"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Daemon(tmp_path / "a", [root], ha={"lease": str(lease)})
    b = Daemon(tmp_path / "b", [root], ha={"lease": str(lease)})
    a.start()
    b.start(wait=False)
    try:
        b.wait_event("standby")
        done = status(b.state_dir)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["role"] == "standby"
        assert doc["standbys"][0]["active"]["pid"] == a.proc.pid  # type: ignore[union-attr]
        holder = json.loads((tmp_path / "deltad.lease.holder").read_text())
        assert holder["pid"] == a.proc.pid  # type: ignore[union-attr]
        plain = subprocess.run(
            [DELTAD, "status", "--state-dir", str(b.state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert plain.returncode == 0 and "standby: deltad pid" in plain.stdout
    finally:
        for d in (b, a):  # the standby first: stopped after a, it could take over meanwhile
            with contextlib.suppress(Exception):
                d.stop()
            d.kill_children()
    assert b.events("standby_stopped")  # SIGTERM while standing by: a clean exit


def _running_as(ws: Path, owner: OwnerProcess) -> None:
    w = Workspace.at(ws)
    path = w.run(w.latest_run_id() or "").metadata
    meta = load_metadata(path)
    meta.status, meta.owner = RunStatus.RUNNING, owner
    save_metadata(path, meta)


def test_a_run_on_another_host_is_not_marked_interrupted(tmp_path: Path) -> None:
    """Its pid is not on this host (here: no such process at all), which says nothing about a
    process on node-17; a run of this host with the same dead pid is marked, as the control."""
    root = tmp_path / "root"
    there, here = root / "there", root / "here"
    paused_workspace(there)
    paused_workspace(here)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid nobody has now
    _running_as(there, OwnerProcess(pid=gone.pid, hostname="node-17.cluster.invalid"))
    _running_as(here, OwnerProcess(pid=gone.pid, hostname=socket.gethostname()))
    d = Daemon(tmp_path, [root], liveness_sweep_seconds=0.2)
    d.start()
    try:
        wait_for(lambda: metadata_status(here) == "INTERRUPTED", "the local dead owner marked")
        d.reload()  # one more full look at both, after the control was marked
        assert metadata_status(there) == "RUNNING"
    finally:
        d.stop()
        d.kill_children()


def test_an_active_that_lost_its_lease_stops(tmp_path: Path) -> None:
    """NFS: a host cut off for longer than the server's lease loses its lock without being
    told, and the daemon that took over says so in the holder file. The old active must stop
    (exit 1, for systemd to restart it as a standby) rather than go on resuming."""
    root = tmp_path / "root"
    paused_workspace(root / "ws")
    lease = tmp_path / "deltad.lease"
    d = Daemon(tmp_path, [root], ha={"lease": str(lease)})
    d.start()
    try:
        holder = {"host": "node-2.invalid", "pid": 4242, "since": "2026-01-01T00:00:00Z"}
        (tmp_path / "deltad.lease.holder").write_text(json.dumps(holder))
        assert d.proc is not None
        assert d.proc.wait(60) == 1
        [lost] = d.events("lease_lost")
        assert "node-2.invalid" in lost["held_by"]
    finally:
        with contextlib.suppress(Exception):
            d.stop()
        d.kill_children()


def test_the_new_active_adopts_a_resume_the_killed_one_left_running(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    paused_workspace(ws)
    with pair(tmp_path, root, mode="hold") as (a, b):
        answer(ws)
        [spawned] = a.wait_event("resume_spawned", workspace=str(ws))
        wait_for(lambda: spawned["pid"] in in_flight(tmp_path), "the resume recorded in flight")
        a.signal(signal.SIGKILL)
        assert a.proc is not None
        a.proc.wait(60)
        b.wait_event("daemon_ready")
        [adopted] = b.wait_event("resume_adopted", workspace=str(ws))
        assert adopted["pid"] == spawned["pid"]
        go = a.record.with_name(a.record.name + ".go")
        go.write_text("")  # the held resume may now ingest the answer and complete
        b.wait_event("resume_exited", workspace=str(ws))
        assert metadata_status(ws) == "COMPLETED"
        assert b.events("resume_spawned") == []  # watched to its end, never started again
    assert [r["workspace"] for r in records(a.record)] == [str(ws)]


def test_a_standby_tells_systemd_it_is_standing_by(tmp_path: Path) -> None:
    """READY=1 at once (a Type=notify unit must not time out while it waits) with a STATUS=
    saying standby and who holds the lease."""
    root = tmp_path / "root"
    paused_workspace(root / "ws")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock_path = tmp_path / "notify.sock"
    sock.bind(str(sock_path))
    sock.settimeout(60)
    try:
        with pair(tmp_path, root) as (a, _):
            (tmp_path / "c").mkdir()
            b = Daemon(tmp_path / "c", [root], **_common_of(a))  # a second standby
            b.start(env={"NOTIFY_SOCKET": str(sock_path)}, wait=False)
            try:
                seen = _until(sock, "READY=1", [])
                assert any("STATUS=standby: waiting for the lease" in m for m in seen), seen
                assert any(f"pid {a.proc.pid}" in m for m in seen)  # type: ignore[union-attr]
            finally:
                b.stop()
    finally:
        sock.close()


def _common_of(d: Daemon) -> dict[str, Any]:
    return {k: d.settings[k] for k in ("state_dir", "ha", "resume_command")}


def _until(sock: socket.socket, wanted: str, seen: list[str]) -> list[str]:
    while not any(wanted in m for m in seen):
        seen.append(sock.recv(65536).decode())
    return seen


LEASE = 3.0  # seconds: ha.lease_seconds in the frozen-active tests (default 10)
FROZEN_FOR = 30.0  # seconds the active stays stopped


def test_a_frozen_active_is_fenced_and_resumes_nothing_when_it_wakes(tmp_path: Path) -> None:
    """SIGSTOP the active: it keeps its flock (and here the shared state dir's lock), but its
    record stops changing; the standby takes the lease over within the lease and resumes the
    answers written meanwhile. SIGCONT: the old active finds the next epoch in the record,
    acts on nothing and stops (exit 1); each answer was resumed once."""
    root = tmp_path / "root"
    before = root / "before"
    during = [root / f"during{i}" for i in range(3)]
    for ws in (before, *during):
        paused_workspace(ws)
    with pair(tmp_path, root, ha={"lease_seconds": LEASE}) as (a, b):
        assert a.proc is not None and b.proc is not None
        answer(before)
        wait_for(lambda: metadata_status(before) == "COMPLETED", "the active's resume")
        a.signal(signal.SIGSTOP)
        frozen, frozen_at = time.monotonic(), datetime.now(UTC)
        try:
            for ws in during:
                answer(ws, f"answer for {ws.name}")
            [taken] = b.wait_event("lease_taken")
            assert taken["how"] == "expired" and taken["epoch"] == 2, taken
            # by the standby's own log line: the bound, not how fast this test reads logs
            took = (datetime.fromisoformat(taken["timestamp"]) - frozen_at).total_seconds()
            assert took <= LEASE + 2, f"the lease was taken {took:.1f}s after the freeze"
            for ws in during:  # while the old active is still stopped
                wait_for(lambda ws=ws: metadata_status(ws) == "COMPLETED", f"{ws} resumed")
            assert b.events("state_dir_lock_held")  # the frozen one holds it: fenced instead
            wait_for(lambda: time.monotonic() - frozen >= FROZEN_FOR, "the freeze", 60)
        finally:
            a.signal(signal.SIGCONT)
        assert a.proc.wait(60) == 1
        [lost] = a.events("lease_lost")
        assert lost["epoch"] == 2 and str(b.proc.pid) in lost["held_by"]
        state, pid = tmp_path / "shared" / "state", b.proc.pid
        # The new active takes the state dir's lock at its first tick after the old one's
        # exit (held by the frozen one until then): nobody holds it for that instant.
        wait_for(
            lambda: status(state).returncode == 0 and status_doc(state)["pid"] == pid,
            "the new active holding the state dir and saying so",
        )
        doc = status_doc(state)
        assert doc["role"] == "active" and doc["pid"] == b.proc.pid
        assert doc["lease"]["epoch"] == 2
    assert resumes_of(a) == [str(before)]  # nothing after the wake
    assert sorted(resumes_of(b)) == sorted(map(str, during))
    workspaces = [r["workspace"] for r in records(a.record)]
    assert sorted(workspaces) == sorted(map(str, (before, *during)))  # once each


def _refused(tmp: Path, root: Path, lease: Path, command: str) -> str:
    """`deltad check` or `deltad serve` on a config whose lease is `lease`: exit 2 and one
    line on stderr, which is returned."""
    d = Daemon(tmp, [root], ha={"lease": str(lease)})
    done = subprocess.run(
        [DELTAD, command, "--config", str(d.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    # one line, naming the config and the key (deltad: error: CONFIG: ha.lease: ...)
    assert len(lines) == 1 and lines[0].startswith("deltad: error: "), lines
    assert ": ha.lease: " in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_lease_where_tenants_can_write_is_refused(tmp_path: Path, command: str) -> None:
    """A tenant who could create, lock or remove the lease could keep every daemon on standby
    or make two actives: the lease's directory and files are root's, writable by nobody else
    (OpenSSH's StrictModes)."""
    root = tmp_path / "root"
    paused_workspace(root / "ws")
    shared = tmp_path / "shared"
    shared.mkdir()
    lease = shared / "deltad.lease"
    shared.chmod(0o1777)  # like /tmp: anyone may create the lease first
    line = _refused(tmp_path, root, lease, command)
    assert f"directory {shared} is writable by its group or others (mode 1777)" in line
    shared.chmod(0o755)
    lease.write_text("")
    os.chown(lease, 65534, 65534)  # a tenant's own lease file
    assert "is owned by uid 65534, not by root" in _refused(tmp_path, root, lease, command)
    assert not (tmp_path / "state" / "status.json").exists()


@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_directory_planted_as_the_lease_record_is_said_as_it_is(
    tmp_path: Path, command: str
) -> None:
    root = tmp_path / "root"
    paused_workspace(root / "ws")
    lease = tmp_path / "shared" / "deltad.lease"
    (tmp_path / "shared" / "deltad.lease.holder").mkdir(parents=True)
    line = _refused(tmp_path, root, lease, command)
    assert line.endswith(f": ha.lease: {lease}.holder is a directory"), line
