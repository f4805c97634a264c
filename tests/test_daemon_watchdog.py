"""The watchdog backend (`backend: watchdog`), run here on Linux so that its code path really
runs: a real `deltad serve`, real filesystem events through watchdog's observer."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from deltad.daemon.harness import Daemon, answer, paused_workspace, running, wait_for


def _root(path: Path) -> dict[str, Any]:
    return {"path": str(path), "backend": "watchdog"}


def _response(ws: Path) -> Path:
    return ws / ".delta" / "interaction" / "response.txt"


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
    with running(tmp_path, [_root(root)]) as d:
        [ready] = d.events("daemon_ready")
        assert ready["watches"] == {"watchdog": 4, "polling": 0}  # root + 3 in the workspace
        assert _status(d)["roots"][0]["backend"] == "watchdog"


def test_slow_writer_in_two_parts_is_delivered_whole(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [_root(root)]) as d:
        with open(_response(ws), "w") as f:
            f.write("first half, ")
            f.flush()
            # The CREATE is seen; nothing may be resumed while the writer still has it open.
            time.sleep(1.0)
            assert d.resumed(ws) == []
            assert d.events("resume_spawned") == []
            f.write("second half")
        [rec] = d.wait_resumed(ws)
        assert rec["answer"] == "first half, second half"


def test_atomic_rename_and_moved_in_from_outside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    renamed, moved = root / "renamed", root / "moved"
    run_id = paused_workspace(renamed)
    paused_workspace(moved)
    outside = tmp_path / "outside"
    outside.mkdir()
    with running(tmp_path, [_root(root)]) as d:
        answer(renamed, "renamed in")  # FileMovedEvent inside interaction/
        (outside / "a.txt").write_text("moved answer")
        os.rename(outside / "a.txt", _response(moved))  # unpaired: a FileCreatedEvent
        [rec] = d.wait_resumed(renamed)
        assert (rec["answer"], rec["run_id"]) == ("renamed in", run_id)
        assert d.wait_resumed(moved)[0]["answer"] == "moved answer"


def test_workspace_created_after_start(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with running(tmp_path, [_root(root)]) as d:
        shallow = root / "new"
        deep = root / "group" / "deeper"  # inside a directory that did not exist at start
        paused_workspace(shallow)
        paused_workspace(deep)
        d.wait_event("workspace_discovered", workspace=str(shallow))
        d.wait_event("workspace_discovered", workspace=str(deep))
        answer(shallow, "a")
        answer(deep, "b")
        assert d.wait_resumed(shallow)[0]["answer"] == "a"
        assert d.wait_resumed(deep)[0]["answer"] == "b"


def test_a_dozen_answered_at_once_each_resumed_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    spaces = [root / f"ws{i:02d}" for i in range(12)]
    for ws in spaces:
        paused_workspace(ws)
    with running(tmp_path, [_root(root)], max_parallel_resumes=3) as d:
        for ws in spaces:
            answer(ws, f"answer {ws.name}")
        d.wait_event("resume_exited", count=12)
        d.reload()  # look at everything again: nothing is left to resume
        for ws in spaces:
            [rec] = d.resumed(ws)
            assert rec["answer"] == f"answer {ws.name}"
        assert len(d.events("resume_spawned")) == 12


def test_working_files_add_no_schedules(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [_root(root)]) as d:
        before, threads = _watches(d), _threads(d)
        for i in range(50):
            sub = ws / f"dir{i}" / "nested"
            sub.mkdir(parents=True)
            (sub / "file.txt").write_text("x")
        answer(ws, "after the files")
        d.wait_resumed(ws)
        d.reload()  # a full re-sync: still no schedule inside the workspace
        assert _watches(d) == before
        assert _threads(d) == threads  # watchdog runs a thread per schedule: none were added


def test_removed_workspace_is_dropped_and_unscheduled(tmp_path: Path) -> None:
    root = tmp_path / "root"
    gone, kept = root / "gone", root / "kept"
    paused_workspace(gone)
    paused_workspace(kept)
    with running(tmp_path, [_root(root)]) as d:
        assert _watches(d)["watchdog"] == 7
        threads = _threads(d)
        shutil.rmtree(gone)
        d.wait_event("workspace_removed", workspace=str(gone))
        wait_for(lambda: _watches(d)["watchdog"] == 4, "the 3 schedules of the workspace dropped")
        wait_for(lambda: _threads(d) == threads - 3, "their emitter threads ended")
        answer(kept, "still watched")
        assert d.wait_resumed(kept)[0]["answer"] == "still watched"
        paused_workspace(gone)  # made anew at the same path: watched again
        d.wait_event("workspace_discovered", workspace=str(gone), count=2)
        answer(gone, "back again")
        assert d.wait_resumed(gone)[0]["answer"] == "back again"


def test_queue_overflow_warning_triggers_a_full_reconcile(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    with running(tmp_path, [_root(root)]) as d:
        d.signal(signal.SIGSTOP)  # the kernel queues events nobody reads...
        try:
            for i in range(limit + 100):
                (root / f"f{i}").touch()
            answer(ws, "lost in the flood")  # ...until it overflows and drops this one
        finally:
            d.signal(signal.SIGCONT)
        d.wait_event("inotify_overflow", backend="watchdog")
        d.wait_event("reconcile_full", reason="overflow")
        assert d.wait_resumed(ws)[0]["answer"] == "lost in the flood"
