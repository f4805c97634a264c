"""The watchdog backend (`backend: watchdog`), run here on Linux so that its code path really
runs: a real `deltad serve`, real filesystem events through watchdog's observer.

The ways an answer arrives are the scenarios of `test_daemon_detect.py`, run again here with
every plain root set to `backend: watchdog` (`harness.ROOT_BACKEND`); below them, what only the
watchdog backend has: a thread per schedule, and unscheduling."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_daemon_detect import (  # noqa: F401 - collected again, under watchdog
    test_a_dozen_answered_at_once_each_resumed_exactly_once,
    test_answer_written_while_daemon_was_down,
    test_atomic_rename,
    test_moved_in_from_outside_and_hard_linked,
    test_queue_overflow_triggers_a_full_reconcile,  # only watchdog's log line can report it
    test_slow_writer_in_two_parts_is_delivered_whole,
    test_structured_answer_file_response_json,
    test_working_files_cost_no_watches,
    test_workspace_created_after_start,
)
from tests.e2e.test_tenant_watches import (  # noqa: F401 - collected again, under watchdog
    test_a_symlinked_mailbox_made_before_start_does_not_take_the_victims_watch,
    test_a_symlinked_mailbox_moved_in_after_ready_does_not_take_the_victims_watch,
)
from tests.support import daemon as harness
from tests.support.daemon import Daemon, answer, paused_workspace, running, wait_for


@pytest.fixture(autouse=True)
def _watchdog_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "ROOT_BACKEND", "watchdog")


def _status(d: Daemon) -> dict[str, Any]:
    return wait_for(lambda: json.loads((d.state_dir / "status.json").read_text()), "status.json")


def _watches(d: Daemon) -> dict[str, int]:
    return _status(d)["watches"]


def _threads(d: Daemon) -> int:
    assert d.proc is not None
    return len(os.listdir(f"/proc/{d.proc.pid}/task"))


def test_the_root_uses_watchdog(tmp_path: Path) -> None:
    root = tmp_path / "root"
    paused_workspace(root / "ws1")
    with running(tmp_path, [root]) as d:
        [ready] = d.events("daemon_ready")
        assert ready["watches"] == {"watchdog": 2, "polling": 0}  # root + the workspace's mailbox
        assert _status(d)["roots"][0]["backend"] == "watchdog"


def test_working_files_start_no_threads(tmp_path: Path) -> None:
    ws = tmp_path / "root" / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [ws.parent]) as d:
        threads = _threads(d)
        for i in range(100):  # directories and files an agent makes: no schedule, no thread
            os.makedirs(ws / "src" / f"pkg{i}")
            (ws / "src" / f"pkg{i}" / "mod.py").touch()
        answer(ws, "after the files")
        d.wait_resumed(ws)
        d.reload()
        assert _threads(d) == threads


def test_debug_level_logs_no_line_per_filesystem_event(tmp_path: Path) -> None:
    # watchdog logs every inotify event at DEBUG; at the daemon's debug level that would be
    # one line (and its rendering cost) per file anyone creates in a watched directory.
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [root], log_level="debug") as d:
        for i in range(50):
            (root / f"scratch-{i}").touch()
        answer(ws, "after the scratch files")
        d.wait_resumed(ws)
        assert d.events("resume_queued", workspace=str(ws))
        assert not [line for line in d.log_path.read_text().splitlines() if "scratch-" in line]


def test_removed_workspace_is_dropped_and_unscheduled(tmp_path: Path) -> None:
    root = tmp_path / "root"
    gone, kept = root / "gone", root / "kept"
    paused_workspace(gone)
    paused_workspace(kept)
    with running(tmp_path, [root]) as d:
        assert _watches(d)["watchdog"] == 3
        threads = _threads(d)
        shutil.rmtree(gone)
        d.wait_event("workspace_removed", workspace=str(gone))
        wait_for(lambda: _watches(d)["watchdog"] == 2, "the workspace's schedule dropped")
        wait_for(lambda: _threads(d) == threads - 1, "its emitter thread ended")
        answer(kept, "still watched")
        assert d.wait_resumed(kept)[0]["answer"] == "still watched"
        paused_workspace(gone)  # made anew at the same path: watched again
        d.wait_event("workspace_discovered", workspace=str(gone), count=2)
        answer(gone, "back again")
        assert d.wait_resumed(gone)[0]["answer"] == "back again"
