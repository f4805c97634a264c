"""Bad input never stops the daemon: one clear log line per bad workspace, the rest unaffected."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support import daemon as harness
from tests.support.daemon import answer, paused_workspace, running, wait_for


def _interaction(ws: Path) -> Path:
    return ws / ".delta" / "interaction"


def _metadata(ws: Path) -> Path:
    latest = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
    return ws / ".delta" / "runs" / latest / "execution" / "metadata.json"


def _bad_metadata(ws: Path) -> None:
    _metadata(ws).write_text("{not json")  # metadata is not watched: the answer brings us
    answer(ws, "an answer to a run with broken metadata")


def _bad_request(ws: Path) -> None:
    (_interaction(ws) / "request.json").write_text('{"prompt": 42}')
    answer(ws, "an answer to a broken question")


def _bad_latest(ws: Path) -> None:
    (ws / ".delta" / "runs" / "LATEST").write_text("../../etc")


def _symlink(ws: Path) -> None:
    target = ws / "elsewhere.txt"
    target.write_text("via a link")
    os.symlink(target, _interaction(ws) / "response.txt")


def _fifo(ws: Path) -> None:
    os.mkfifo(_interaction(ws) / "response.txt")


def _huge(ws: Path) -> None:
    answer(ws, "x" * (2 * 1024 * 1024))


def _not_utf8(ws: Path) -> None:
    tmp = _interaction(ws) / ".tmp"
    tmp.write_bytes(b"\xff\xfe not utf-8 \xc3\x28")
    os.replace(tmp, _interaction(ws) / "response.txt")


BAD = {
    "metadata": (_bad_metadata, "metadata.json"),
    "request": (_bad_request, "request.json"),
    "latest": (_bad_latest, "LATEST"),
    "symlink": (_symlink, "symlink"),
    "fifo": (_fifo, "not a regular file"),
    "huge": (_huge, "limit"),
    "utf8": (_not_utf8, "UTF-8"),
}


@pytest.mark.parametrize("before_start", [True, False], ids=["at_start", "while_running"])
def test_each_bad_workspace_gets_one_log_line_and_the_rest_work(
    tmp_path: Path, before_start: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A LATEST broken while running is seen at once only where `.delta/runs/` is watched: with
    # the fanotify mark (with inotify, at the next full reconcile; docs/daemon.md's table).
    monkeypatch.setattr(harness, "ROOT_BACKEND", "fanotify")
    root = tmp_path / "root"
    good = root / "good"
    paused_workspace(good)
    spaces = {name: root / f"bad_{name}" for name in BAD}
    for ws in spaces.values():
        paused_workspace(ws)
    if before_start:
        for name, ws in spaces.items():
            BAD[name][0](ws)
    with running(tmp_path, [root]) as d:
        if not before_start:
            for name, ws in spaces.items():
                BAD[name][0](ws)
        for name, ws in spaces.items():
            [problem] = d.wait_event("workspace_problem", workspace=str(ws))
            assert BAD[name][1] in problem["problem"], (name, problem)
        answer(good, "fine")
        assert d.wait_resumed(good)[0]["answer"] == "fine"
        d.reload()  # a full reconcile does not repeat the same complaint
        for ws in spaces.values():
            assert len(d.events("workspace_problem", workspace=str(ws))) == 1
        # Broken state files are never resumed; unusable answer files are, once, so that the
        # client sets them aside with the reason (then the problem clears by itself).
        for name in ("metadata", "request", "latest"):
            assert d.events("resume_spawned", workspace=str(spaces[name])) == []
        for name in ("fifo", "huge", "utf8"):
            d.wait_event("workspace_problem_cleared", workspace=str(spaces[name]))
            assert len(d.events("resume_spawned", workspace=str(spaces[name]))) == 1
            assert list(_interaction(spaces[name]).glob("response.rejected-*"))
        # A good answer after the bad one was set aside resumes it.
        d.wait_event("workspace_problem_cleared", workspace=str(spaces["symlink"]))
        answer(spaces["symlink"], "fixed")
        assert d.wait_resumed(spaces["symlink"])[0]["answer"] == "fixed"


def test_workspaces_deleted_and_recreated_while_running(tmp_path: Path) -> None:
    root = tmp_path / "root"
    spaces = [root / f"ws{i}" for i in range(5)]
    for ws in spaces:
        paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        shutil.rmtree(spaces[0])  # the whole workspace
        shutil.rmtree(spaces[1] / ".delta")  # only its state: no longer a workspace
        d.wait_event("workspace_removed", workspace=str(spaces[0]))
        d.wait_event("workspace_removed", workspace=str(spaces[1]))
        paused_workspace(spaces[1])  # and a workspace again
        d.wait_event("workspace_discovered", workspace=str(spaces[1]))
        for ws in spaces[1:]:
            answer(ws, ws.name)
        for ws in spaces[1:]:
            assert d.wait_resumed(ws)[0]["answer"] == ws.name


def test_deleting_workspaces_during_a_full_reconcile(tmp_path: Path) -> None:
    root = tmp_path / "root"
    spaces = [root / f"ws{i:03d}" for i in range(200)]
    for ws in spaces:
        paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        d.signal(__import__("signal").SIGHUP)
        for ws in spaces[:150]:  # races the reload's walk and reconcile
            shutil.rmtree(ws, ignore_errors=True)
        d.wait_event("reconcile_full", reason="reload")
        answer(spaces[-1], "survivor")
        assert d.wait_resumed(spaces[-1])[0]["answer"] == "survivor"
        status = d.state_dir / "status.json"
        wait_for(
            lambda: json.loads(status.read_text())["counts"]["workspaces"] == 50,
            "the 150 deleted workspaces to be dropped",
        )


def test_watch_limit_falls_back_to_polling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "ROOT_BACKEND", "inotify")  # fanotify has no watch to count
    root = tmp_path / "root"
    spaces = [root / f"ws{i}" for i in range(6)]
    for ws in spaces:
        paused_workspace(ws)
    # 1 root + 1 per workspace (its mailbox): the cap is spent after three workspaces.
    with running(tmp_path, [root], max_inotify_watches=4, poll_interval_seconds=0.2) as d:
        [limit] = d.events("watch_limit_reached")
        assert "max_user_watches" in limit["hint"] and limit["fallback"] == "polling"
        for ws in spaces:
            answer(ws, ws.name)
        for ws in spaces:
            assert d.wait_resumed(ws)[0]["answer"] == ws.name
        assert len(d.events("watch_limit_reached")) == 1


# Root reads everything, so as root the daemon runs without the capabilities that bypass file
# permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): then a mode-000 file really is EACCES.
UNPRIVILEGED = (
    ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    if os.geteuid() == 0 and shutil.which("setpriv")
    else []
)


@pytest.mark.skipif(
    os.geteuid() == 0 and not UNPRIVILEGED, reason="root without setpriv: no EACCES to provoke"
)
def test_permission_denied(tmp_path: Path) -> None:
    root = tmp_path / "root"
    locked, good = root / "locked", root / "good"
    paused_workspace(locked)
    paused_workspace(good)
    os.chmod(_interaction(locked) / "request.json", 0)
    try:
        with running(tmp_path, [root], wrapper=UNPRIVILEGED) as d:
            answer(locked, "denied")
            [p] = d.wait_event("workspace_problem", workspace=str(locked))
            assert "ermission" in p["problem"]
            answer(good, "ok")
            assert d.wait_resumed(good)[0]["answer"] == "ok"
    finally:
        os.chmod(_interaction(locked) / "request.json", 0o644)
