"""The executors through a real `deltad`: a resume forked by the warm server is the same process
a fresh one is (identity, environment, session, signals, fds, stdio); the server is restarted
on SIGHUP, a dead one falls back to fresh processes without losing a resume, and a restarted
daemon adopts the resumes its predecessor left running.

The rest of the daemon suite runs against each executor: `DELTAD_TEST_EXECUTOR=fresh|fork`
(`.ci/run` does both).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, answer, paused_workspace, running, wait_for

from ..users import Accounts, accounts, chown_tree, executable_by_all, shared_tmp

EXECUTORS = ("fresh", "fork")


def _facts(
    base: Path, ws: Path, executor: str, pause: Callable[[], object], **settings: Any
) -> dict[str, Any]:
    """Pause `ws`, resume it once under `executor`: what the resume process was."""
    home = base / executor
    home.mkdir(mode=0o777)
    os.chmod(home, 0o777)  # the probe appends its record here, maybe as another user
    pause()
    # One signing key for both daemons, as for an HA fleet: each resume is told the same key.
    settings.setdefault("decision_key_file", str(base / "decision-key"))
    with running(home, [ws.parent], mode="probe", executor=executor, **settings) as d:
        answer(ws, f"via {executor}")
        d.wait_event("resume_exited", workspace=str(ws))
        [rec] = [r for r in d.resumed(ws) if "facts" in r]
        assert [r["answer"] for r in d.resumed(ws) if "answer" in r] == [f"via {executor}"]
        [spawned] = d.events("resume_spawned", workspace=str(ws))
        assert spawned["executor"] == executor
        # the daemons' own directories differ (record file, resume log): name them alike
        facts: dict[str, Any] = json.loads(json.dumps(rec["facts"]).replace(str(home), "HOME"))
        return facts


def test_a_forked_resume_is_the_process_a_fresh_one_is(tmp_path: Path) -> None:
    ws = tmp_path / "root" / "ws"
    fresh, forked = (_facts(tmp_path, ws, e, lambda: paused_workspace(ws)) for e in EXECUTORS)
    assert forked == fresh
    assert fresh["umask"] == "0077" and fresh["session_leader"] and fresh["cwd"] == str(ws)
    assert fresh["stdio"][0] == "/dev/null" and "resume-logs" in fresh["stdio"][1]


@pytest.fixture
def world() -> Iterator[tuple[Accounts, Path]]:
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        yield acc, base


def test_a_forked_resume_runs_as_the_owner_exactly_as_a_fresh_one(
    world: tuple[Accounts, Path],
) -> None:
    acc, base = world
    owner = acc.user(acc.group())
    ws = base / "root" / "ws"

    def pause() -> None:
        paused_workspace(ws)
        os.chmod(base / "root", 0o755)
        chown_tree(ws, owner)

    fresh, forked = (_facts(base, ws, e, pause) for e in EXECUTORS)
    assert forked == fresh
    assert fresh["uid"] == [owner.uid] * 3 and fresh["gid"] == [owner.gid] * 3
    # Not the root server's look at the host, cached as it rehearsed a resume in itself.
    assert fresh["sandbox_euid"] == owner.uid and fresh["model_transport"] == "None"
    assert len(fresh["groups"]) == 2  # the primary group and the extra one
    assert fresh["env"]["USER"] == owner.name


def _server_pids(d: Daemon, count: int = 1) -> list[int]:
    return [e["pid"] for e in d.wait_event("fork_server_started", count=count)]


def test_sighup_starts_a_new_fork_server(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    paused_workspace(ws)
    with running(tmp_path, [root], executor="fork") as d:
        [first] = _server_pids(d)
        d.reload()
        assert _server_pids(d, 2)[1] != first
        answer(ws, "after the reload")
        assert d.wait_resumed(ws)[0]["answer"] == "after the reload"
        [spawned] = d.events("resume_spawned")
        assert spawned["executor"] == "fork"
        wait_for(lambda: not _alive(first), "the old server gone")


def test_a_killed_fork_server_loses_no_resume(tmp_path: Path) -> None:
    """Its child runs on (own session) and is watched to its exit; the next resumes start as
    fresh processes until a new server is up, then forked again. Each answer used once."""
    root = tmp_path / "root"
    held, later = root / "held", root / "later"
    paused_workspace(held)
    paused_workspace(later)
    with running(tmp_path, [root], executor="fork", mode="hold") as d:
        answer(held, "first")
        [spawned] = d.wait_event("resume_spawned", workspace=str(held))
        assert spawned["executor"] == "fork"
        [server] = _server_pids(d)[:1]
        os.kill(server, signal.SIGKILL)
        d.wait_event("fork_server_unhealthy")
        d.record.with_name(d.record.name + ".go").touch()  # let the held resume finish
        [exited] = d.wait_event("resume_exited", workspace=str(held))
        assert exited["outcome"] == "unknown"  # its parent, the server, is gone
        answer(later, "second")
        assert d.wait_resumed(later)[0]["answer"] == "second"
        assert [r["answer"] for r in d.resumed(held)] == ["first"]
        _server_pids(d, 2)  # and a new server


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_restarted_daemon_adopts_the_resume_left_running(tmp_path: Path, executor: str) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    paused_workspace(ws)
    first = Daemon(tmp_path, [root], mode="hold", executor=executor, shutdown_grace_seconds=0)
    first.start()
    try:
        answer(ws, "only once")
        [spawned] = first.wait_event("resume_spawned", workspace=str(ws))
        assert first.stop() == 0
        [detached] = first.events("resume_detached")[0]["jobs"]
        assert (detached["pid"], detached["job"]) == (spawned["pid"], spawned["job"])
        second = Daemon(tmp_path, [root], mode="hold", executor=executor).start()
        try:
            [adopted] = second.wait_event("resume_adopted", workspace=str(ws))
            assert (adopted["pid"], adopted["job"]) == (spawned["pid"], spawned["job"])
            second.record.with_name(second.record.name + ".go").touch()
            [exited] = second.wait_event("resume_exited", workspace=str(ws))
            assert exited["pid"] == spawned["pid"]
            assert [r["answer"] for r in second.resumed(ws)] == ["only once"]
            assert not second.events("resume_spawned")
        finally:
            second.stop()
            second.kill_children()
    finally:
        first.kill_children()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_daemon_killed_with_sigkill_leaves_its_resume_to_the_next_one(
    tmp_path: Path, executor: str
) -> None:
    """No shutdown runs on kill -9: the next daemon adopts what the executor recorded when it
    started the job (the same job: pid and start time), and the answer is used once."""
    root = tmp_path / "root"
    ws = root / "ws"
    paused_workspace(ws)
    first = Daemon(tmp_path, [root], mode="hold", executor=executor).start()
    try:
        answer(ws, "only once")
        [spawned] = first.wait_event("resume_spawned", workspace=str(ws))
        first.signal(signal.SIGKILL)
        assert first.stop() == -signal.SIGKILL
        second = Daemon(tmp_path, [root], mode="hold", executor=executor).start()
        try:
            [adopted] = second.wait_event("resume_adopted", workspace=str(ws))
            assert (adopted["pid"], adopted["job"]) == (spawned["pid"], spawned["job"])
            second.record.with_name(second.record.name + ".go").touch()
            [exited] = second.wait_event("resume_exited", workspace=str(ws))
            assert (exited["job"], exited["outcome"]) == (spawned["job"], "unknown")
            assert [r["answer"] for r in second.resumed(ws)] == ["only once"]
            assert not second.events("resume_spawned")
        finally:
            second.stop()
            second.kill_children()
    finally:
        first.kill_children()
