"""How an answer reaches the daemon: every way of writing response.txt, resumed once, whole."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.support.daemon import answer, paused_workspace, running, wait_for


def _response(ws: Path) -> Path:
    return ws / ".delta" / "interaction" / "response.txt"


def test_slow_writer_in_two_parts_is_delivered_whole(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        with open(_response(ws), "w") as f:
            f.write("first half, ")
            f.flush()
            # The daemon has seen the CREATE; nothing may be resumed while the file is open,
            # no matter how long the writer pauses (longer than settle_seconds here).
            time.sleep(1.0)
            assert d.resumed(ws) == []
            assert d.events("resume_spawned") == []
            f.write("second half")
        [rec] = d.wait_resumed(ws)
        assert rec["answer"] == "first half, second half"


def test_atomic_rename(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    run_id = paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        answer(ws, "renamed in")
        [rec] = d.wait_resumed(ws)
        assert rec["answer"] == "renamed in"
        assert rec["run_id"] == run_id
        d.wait_event("resume_exited", workspace=str(ws))


def test_moved_in_from_outside_and_hard_linked(tmp_path: Path) -> None:
    root = tmp_path / "root"
    moved, linked = root / "moved", root / "linked"
    paused_workspace(moved)
    paused_workspace(linked)
    outside = tmp_path / "outside"
    outside.mkdir()
    with running(tmp_path, [root]) as d:
        (outside / "a.txt").write_text("moved answer")
        os.rename(outside / "a.txt", _response(moved))
        (outside / "b.txt").write_text("linked answer")
        os.link(outside / "b.txt", _response(linked))  # IN_CREATE only; no close event follows
        assert d.wait_resumed(moved)[0]["answer"] == "moved answer"
        assert d.wait_resumed(linked)[0]["answer"] == "linked answer"


def test_workspace_created_after_start(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with running(tmp_path, [root]) as d:
        shallow = root / "new"
        deep = root / "group" / "deeper"  # depth 2, inside a dir that did not exist at start
        paused_workspace(shallow)
        paused_workspace(deep)
        d.wait_event("workspace_discovered", workspace=str(shallow))
        d.wait_event("workspace_discovered", workspace=str(deep))
        answer(shallow, "a")
        answer(deep, "b")
        assert d.wait_resumed(shallow)[0]["answer"] == "a"
        assert d.wait_resumed(deep)[0]["answer"] == "b"


def test_root_itself_can_be_a_workspace_and_depth_is_respected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    paused_workspace(root)
    too_deep = tmp_path / "other" / "a" / "b" / "c"
    paused_workspace(too_deep)
    with running(tmp_path, [root, tmp_path / "other"]) as d:
        answer(root, "root answer")
        answer(too_deep, "never seen")
        assert d.wait_resumed(root)[0]["answer"] == "root answer"
        d.reload()  # a full reconcile: still not discovered
        assert d.resumed(too_deep) == []


def test_answer_written_while_daemon_was_down(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    answer(ws, "written before start")
    with running(tmp_path, [root]) as d:
        assert d.wait_resumed(ws)[0]["answer"] == "written before start"


def test_a_dozen_answered_at_once_each_resumed_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    spaces = [root / f"ws{i:02d}" for i in range(12)]
    for ws in spaces:
        paused_workspace(ws)
    with running(tmp_path, [root], max_parallel_resumes=3) as d:
        for ws in spaces:
            answer(ws, f"answer {ws.name}")
        d.wait_event("resume_exited", count=12)
        d.reload()  # look at everything again: nothing is left to resume
        for ws in spaces:
            [rec] = d.resumed(ws)
            assert rec["answer"] == f"answer {ws.name}"
        assert len(d.events("resume_spawned")) == 12
        in_flight = peak = 0
        for e in d.lines():  # the log is in order: the pool never ran more than 3 at once
            in_flight += {"resume_spawned": 1, "resume_exited": -1}.get(e["event"], 0)
            peak = max(peak, in_flight)
        assert peak <= 3


def test_polling_root(tmp_path: Path) -> None:
    root = tmp_path / "nfs"
    ws = root / "ws1"
    paused_workspace(ws)
    polled = {"path": str(root), "polling": True}
    with running(tmp_path, [polled], poll_interval_seconds=0.2) as d:
        later = root / "later"
        paused_workspace(later)
        answer(ws, "polled")
        assert d.wait_resumed(ws)[0]["answer"] == "polled"
        d.wait_event("workspace_discovered", workspace=str(later))
        answer(later, "found by walking")
        assert d.wait_resumed(later)[0]["answer"] == "found by walking"
        assert d.events("watch_limit_reached") == []


def test_working_files_cost_no_watches(tmp_path: Path) -> None:
    import json

    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        status = d.state_dir / "status.json"
        before = wait_for(lambda: json.loads(status.read_text())["watches"], "status")
        for i in range(50):
            sub = ws / f"dir{i}" / "nested"
            sub.mkdir(parents=True)
            (sub / "file.txt").write_text("x")
        answer(ws, "after the files")
        d.wait_resumed(ws)
        d.reload()
        after = wait_for(lambda: json.loads(status.read_text())["watches"], "status")
        assert after == before


def test_queue_overflow_triggers_a_full_reconcile(tmp_path: Path) -> None:
    import signal

    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    with running(tmp_path, [root]) as d:
        assert d.proc is not None
        d.signal(signal.SIGSTOP)  # the kernel queues events nobody reads...
        try:
            for i in range(limit + limit // 4):  # file events in a watched dir, filtered
                (root / f"f{i}").touch()
            answer(ws, "lost in the flood")  # ...until it overflows and drops this one
        finally:
            d.signal(signal.SIGCONT)
        d.wait_event("inotify_overflow")
        d.wait_event("reconcile_full", reason="overflow")
        assert d.wait_resumed(ws)[0]["answer"] == "lost in the flood"


def test_structured_answer_file_response_json(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        tmp = ws / ".delta" / "interaction" / ".response.json.tmp"
        tmp.write_text('{"answer": "structured"}')
        os.replace(tmp, ws / ".delta" / "interaction" / "response.json")
        [rec] = d.wait_resumed(ws)
        assert "structured" in rec["answer"]
