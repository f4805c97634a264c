"""The fanotify backend (`backend: fanotify`): one filesystem mark, no inotify watch at all.

The detection scenarios of `test_daemon_detect.py` and the symlinked-mailbox scenarios of
`test_tenant_watches.py` run again here with every plain root set to `backend: fanotify`
(`harness.ROOT_BACKEND`); below them, what only this backend has. Tests run as root, which
fanotify filesystem marks need."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_daemon_detect import (  # noqa: F401 - collected again, under fanotify
    test_a_dozen_answered_at_once_each_resumed_exactly_once,
    test_answer_written_while_daemon_was_down,
    test_atomic_rename,
    test_moved_in_from_outside_and_hard_linked,
    test_queue_overflow_triggers_a_full_reconcile,
    test_root_itself_can_be_a_workspace_and_depth_is_respected,
    test_slow_writer_in_two_parts_is_delivered_whole,
    test_structured_answer_file_response_json,
    test_working_files_cost_no_watches,
    test_workspace_created_after_start,
)
from tests.e2e.test_tenant_watches import (  # noqa: F401 - collected again, under fanotify
    test_a_symlinked_mailbox_made_before_start_does_not_take_the_victims_watch,
    test_a_symlinked_mailbox_moved_in_after_ready_does_not_take_the_victims_watch,
)
from tests.support import daemon as harness
from tests.support.daemon import Daemon, answer, paused_workspace, running, wait_for

NO_RESCAN = 3600  # only events can find an answer: the periodic full reconcile never runs


@pytest.fixture(autouse=True)
def _fanotify_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "ROOT_BACKEND", "fanotify")


def _status(d: Daemon) -> dict[str, Any]:
    return wait_for(lambda: json.loads((d.state_dir / "status.json").read_text()), "status.json")


def inotify_watches(pid: int) -> int:
    """The kernel's count of the process's inotify watches: one `inotify wd:` line each."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue  # closed meanwhile
        count += sum(line.startswith("inotify wd:") for line in text.splitlines())
    return count


def test_no_inotify_watch_for_any_workspace(tmp_path: Path) -> None:
    root = tmp_path / "root"
    workspaces = [root / f"team{t}" / f"ws{i}" for t in range(3) for i in range(10)]
    for ws in workspaces:
        paused_workspace(ws)
    with running(tmp_path, [root], rescan_interval_seconds=NO_RESCAN) as d:
        assert d.proc is not None
        assert _status(d)["roots"][0]["backend"] == "fanotify"
        assert inotify_watches(d.proc.pid) == 0
        answer(workspaces[-1], "through the mark")
        assert d.wait_resumed(workspaces[-1])[0]["answer"] == "through the mark"


def test_a_workspace_made_later_in_a_new_directory_is_picked_up(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with running(tmp_path, [root], rescan_interval_seconds=NO_RESCAN) as d:
        team = root / "team"
        team.mkdir()  # a new directory above workspaces: its handle joins the table
        ws = team / "ws1"
        ws.mkdir()
        (ws / ".delta").mkdir()  # `.delta/` later: the workspace appears
        d.wait_event("workspace_discovered", workspace=str(ws))
        paused_workspace(ws)
        answer(ws, "found late")
        assert d.wait_resumed(ws)[0]["answer"] == "found late"


def test_a_recreated_mailbox_is_watched_again(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [root], rescan_interval_seconds=NO_RESCAN) as d:
        mailbox = ws / ".delta" / "interaction"
        saved = tmp_path / "saved"
        shutil.copytree(mailbox, saved)
        shutil.rmtree(mailbox)  # a new inode, a new handle: learnt from `.delta/`'s CREATE
        shutil.copytree(saved, tmp_path / "staged")
        os.rename(tmp_path / "staged", mailbox)
        answer(ws, "in the new mailbox")
        assert d.wait_resumed(ws)[0]["answer"] == "in the new mailbox"


def test_busy_files_elsewhere_on_the_filesystem_are_dropped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with running(tmp_path, [root], rescan_interval_seconds=NO_RESCAN) as d:
        for i in range(2000):  # the mark sees these; the handle table does not know them
            (elsewhere / f"f{i}").write_text("x")
        answer(ws, "amid the noise")
        assert d.wait_resumed(ws)[0]["answer"] == "amid the noise"


def _check(cfg: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, harness.DELTAD, "check", "--config", str(cfg)], capture_output=True, text=True
    )


def test_check_says_which_path_each_root_takes(tmp_path: Path) -> None:
    fan, ino = tmp_path / "fan", tmp_path / "ino"
    for root in (fan, ino):
        paused_workspace(root / "a")
        paused_workspace(root / "g" / "b")
    cfg = tmp_path / "c.yaml"
    # The configured inotify root takes the 4 watches allowed; `auto` has none left for its 4.
    cfg.write_text(
        f"roots:\n  - {fan}\n  - path: {ino}\n    backend: inotify\nmax_inotify_watches: 4\n"
    )
    out = _check(cfg)
    assert out.returncode == 0, out.stderr
    assert f"root {fan} (fanotify)" in out.stdout and "no inotify watch" in out.stdout
    assert "backend: auto: ~4 inotify watches do not fit the 0 left" in out.stdout
    assert f"root {ino} (inotify)" in out.stdout and "~4 watches" in out.stdout  # root, g, a, b
    assert "inotify watches needed: ~4 (in use by this user now: " in out.stdout
    assert "fs.inotify.max_user_watches = " in out.stdout


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv")
def test_auto_falls_back_to_inotify_and_fanotify_asked_for_says_why_not(tmp_path: Path) -> None:
    root = tmp_path / "root"
    paused_workspace(root / "a")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"roots: [{root}]\nmax_inotify_watches: 1\n")  # its 2 do not fit
    no_admin = ("setpriv", "--inh-caps=-sys_admin", "--bounding-set", "-sys_admin")
    out = _check(cfg)
    assert out.returncode == 0, out.stderr
    assert f"root {root} (fanotify)" in out.stdout
    out = _check(cfg, *no_admin)  # root without CAP_SYS_ADMIN: no filesystem mark
    assert out.returncode == 0, out.stderr
    assert f"root {root} (inotify)" in out.stdout
    assert "no fanotify (fanotify filesystem marks need CAP_SYS_ADMIN): the rest is polled" in (
        out.stdout
    )
    cfg.write_text(f"roots: [{root}]\n")
    out = _check(cfg)  # room for its watches: inotify, though the mark would work
    assert f"root {root} (inotify)" in out.stdout and "fit the" in out.stdout
    cfg.write_text(f"roots:\n  - path: {root}\n    backend: fanotify\n")
    out = _check(cfg, *no_admin)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert "backend: fanotify is impossible here" in line and "CAP_SYS_ADMIN" in line
    cfg.write_text("roots:\n  - path: /proc\n    backend: fanotify\n")
    out = _check(cfg)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert "does not report file handles" in line


@pytest.fixture
def tmpfs_below(tmp_path: Path) -> Iterator[Path]:
    """A second filesystem mounted below the root (skipped where mounting is not allowed)."""
    mnt = tmp_path / "root" / "other"
    mnt.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_workspace_on_another_filesystem_gets_its_own_mark(
    tmp_path: Path, tmpfs_below: Path
) -> None:
    root = tmp_path / "root"
    here, there = root / "ws1", tmpfs_below / "ws2"
    paused_workspace(here)
    paused_workspace(there)
    with running(tmp_path, [root], rescan_interval_seconds=NO_RESCAN) as d:
        d.wait_event("fanotify_marked", filesystems=2)
        for ws in (here, there):
            answer(ws, f"from {ws.name}")
            assert d.wait_resumed(ws)[0]["answer"] == f"from {ws.name}"


def test_auto_says_in_the_log_which_backend_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "ROOT_BACKEND", None)  # auto
    small, big = tmp_path / "small", tmp_path / "big"
    paused_workspace(small / "a")
    for name in ("a", "b", "c"):
        paused_workspace(big / name)
    # small's 2 watches fit the 3 allowed with a quarter to spare; big's 4 do not fit the 1 left
    with running(tmp_path, [small, big], max_inotify_watches=3) as d:
        [first] = d.wait_event("backend_chosen", root=str(small))
        [second] = d.wait_event("backend_chosen", root=str(big))
        assert first["backend"] == "inotify" and "fit the 3 left" in first["reason"]
        assert second["backend"] == "fanotify" and "the 1 left" in second["reason"]
        answer(big / "b", "through the mark")
        assert d.wait_resumed(big / "b")[0]["answer"] == "through the mark"
        answer(small / "a", "through a watch")
        assert d.wait_resumed(small / "a")[0]["answer"] == "through a watch"
