"""Run status truth and resume discipline: one resumer per run, dead owners, backoff, timeouts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import (
    answer,
    metadata_status,
    paused_workspace,
    running,
    wait_for,
)


def _hand_run(ws: Path, record: Path, mode: str) -> subprocess.Popen[bytes]:
    """A person's `delta run` in that workspace (the stand-in client, started by the test)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deltad.testing.stub",
            "stub",
            str(ws),
            "--record",
            str(record),
            "--mode",
            mode,
        ],
        start_new_session=True,
    )


def _holds_lock(ws: Path, pid: int) -> bool:
    try:
        return (ws / ".delta" / "lock").read_text().strip() == str(pid)
    except FileNotFoundError:
        return False


def test_daemon_and_hand_run_client_race_one_resumer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        hand = _hand_run(ws, d.record, "hold")
        try:
            wait_for(lambda: _holds_lock(ws, hand.pid), "the hand-run client to hold the lock")
            answer(ws, "raced")
            busy = d.wait_event("resume_exited", exit_code=75)
            assert busy[0]["outcome"] == "busy"
            d.wait_event("resume_busy")
            d.record.with_name(d.record.name + ".go").touch()
            assert hand.wait(30) == 0
        finally:
            hand.kill()
        d.reload()  # a full look: nothing left to resume
        [rec] = d.resumed(ws)
        assert rec["pid"] == hand.pid and rec["answer"] == "raced"
        assert metadata_status(ws) == "COMPLETED"
        assert len(d.events("resume_spawned")) == 1


def test_killed_resume_child_is_marked_interrupted_at_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    # A sweep far in the future: only the child's exit can explain a prompt INTERRUPTED.
    with running(tmp_path, [root], mode="hang", liveness_sweep_seconds=3600) as d:
        answer(ws, "go")
        [rec] = d.wait_resumed(ws)
        wait_for(lambda: metadata_status(ws) == "RUNNING", "the run to be RUNNING")
        os.kill(rec["pid"], signal.SIGKILL)
        [t] = d.wait_event("status_transition", to="INTERRUPTED")
        assert t["from"] == "RUNNING" and t["workspace"] == str(ws) and "observed" not in t
        assert metadata_status(ws) == "INTERRUPTED"
        assert d.events("resume_exited")[0]["outcome"] == "killed_by_SIGKILL"


def test_killed_hand_started_run_is_found_by_the_liveness_sweep(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    answer(ws, "by hand")
    hand = _hand_run(ws, tmp_path / "hand.jsonl", "hang")  # before the daemon: not its child
    try:
        wait_for(lambda: metadata_status(ws) == "RUNNING", "the hand-run client to be RUNNING")
        with running(tmp_path, [root], liveness_sweep_seconds=0.3) as d:
            assert d.events("status_transition") == []  # alive: left alone
            hand.kill()
            hand.wait()
            [t] = d.wait_event("status_transition", to="INTERRUPTED", workspace=str(ws))
            assert t["from"] == "RUNNING"
            assert metadata_status(ws) == "INTERRUPTED"
            assert d.events("resume_spawned") == []  # auto_resume_interrupted is off
    finally:
        hand.kill()
        hand.wait()


def test_auto_resume_interrupted_resumes_with_backoff(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [root], mode="hang", auto_resume_interrupted=True) as d:
        answer(ws, "go")
        [rec] = d.wait_resumed(ws)
        wait_for(lambda: metadata_status(ws) == "RUNNING", "the run to be RUNNING")
        os.kill(rec["pid"], signal.SIGKILL)
        d.wait_event("resume_queued", reason="interrupted")
        # The stand-in client cannot continue an interrupted run (exits 101): that is a
        # failed resume of the same run, so the daemon backs off instead of looping.
        d.wait_event("resume_backoff", count=2, exit_code=101)
        first, second = d.events("resume_backoff", exit_code=101)[:2]
        assert first["failures"] == 1 and second["failures"] == 2
        assert second["retry_in_s"] == 2 * first["retry_in_s"]


def test_failing_client_backs_off_exponentially_up_to_the_cap(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(
        tmp_path, [root], mode="fail", backoff_initial_seconds=0.1, backoff_max_seconds=0.4
    ) as d:
        answer(ws, "x")
        backoffs = d.wait_event("resume_backoff", count=4)
        assert [b["retry_in_s"] for b in backoffs[:4]] == [0.1, 0.2, 0.4, 0.4]
        assert all(b["exit_code"] == 2 for b in backoffs)
        # A new answer starts from scratch (no waiting for the backoff).
        spawned = len(d.events("resume_spawned"))
        answer(ws, "y")
        d.wait_event("resume_spawned", count=spawned + 1)


def test_resume_timeout_kills_the_child_and_the_run_is_interrupted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    # The timeout must outlast the stand-in's start on a loaded machine (it has to take the
    # answer and turn RUNNING before it is killed, or there is nothing to interrupt).
    with running(tmp_path, [root], mode="hang", resume_timeout_seconds=5) as d:
        answer(ws, "x")
        d.wait_resumed(ws)
        d.wait_event("resume_timeout")
        [exited] = d.wait_event("resume_exited")
        assert exited["timed_out"] is True and exited["outcome"] == "killed_by_SIGTERM"
        d.wait_event("status_transition", to="INTERRUPTED")
        assert metadata_status(ws) == "INTERRUPTED"
