"""The executors' decisions in-process: how a command is planned, which executor `auto` means,
exit meanings, the orphans file and adopting what an earlier daemon left running. Through a
real fork server: tests/e2e/test_executor_server.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from deltad.daemon.executors import Orphan, exit_meaning, orphans, resolve
from deltad.daemon.executors.fork import plan
from deltad.daemon.executors.fresh import FreshExecutor
from deltad.protocol.process import proc_start_ticks as start_ticks
from deltad.testing.daemon import reap_one

HERE = Path(sys.executable).parent


def test_plans() -> None:
    delta = str(HERE / "delta")
    assert plan([delta, "run", "--work-dir", "/w"]) == {
        "kind": "delta",
        "argv": [delta, "run", "--work-dir", "/w"],
    }
    assert plan([sys.executable, "-m", "mod", "a"]) == {
        "kind": "module",
        "module": "mod",
        "argv": ["a"],
    }
    for other in (["systemd-run", "--wait", delta], ["/usr/bin/env", "-m", "x"]):
        assert plan(other)["kind"] == "exec"


@pytest.mark.linux_only  # leases, /proc or the fork server (deltad/platform.py)
def test_auto_forks_what_can_run_warm_and_runs_wrappers_as_commands() -> None:
    delta = [str(HERE / "delta"), "run", "--work-dir", "/w"]
    assert resolve("auto", delta) == "fork"
    assert resolve("auto", ["systemd-run", "--wait", *delta]) == "command"
    assert resolve("fresh", delta) == "fresh"
    assert resolve("fork", ["/bin/true"]) == "fork"  # exec'd from the fork: works, not warm


def test_an_unknown_exit_code_is_not_a_failure() -> None:
    assert exit_meaning(None) == "unknown"
    assert exit_meaning(-9) == "killed_by_SIGKILL"
    assert exit_meaning(-53) == "killed"  # a real-time signal has no name (a Slurm status had it)


@pytest.mark.linux_only  # leases, /proc or the fork server (deltad/platform.py)
def test_orphans_round_trip_and_adoption(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ticks = start_ticks(proc.pid)
        assert ticks is not None
        ws = tmp_path / "ws"
        left = [
            Orphan(ws, "r1", proc.pid, ticks, 1.0, time.time() + 60),
            Orphan(tmp_path / "recycled", None, proc.pid, ticks + 1, 1.0, 0.0),
            Orphan(tmp_path / "impossible", None, 2**22, 0, 1.0, 0.0),
        ]
        ex = FreshExecutor(4)
        [child] = ex.adopt(left)
        assert (child.workspace, child.pid, child.adopted) == (ws, proc.pid, True)
        orphans.save(tmp_path, ex.children.values())
        assert [(o.workspace, o.pid, o.start_ticks) for o in orphans.load(tmp_path)] == [
            (ws, proc.pid, ticks)
        ]
        assert ex.reap() == []
        proc.kill()
        proc.wait()
        fin = reap_one(ex)
        assert (fin.rc, fin.failed, fin.meaning) == (None, False, "unknown")
    finally:
        proc.kill()
        proc.wait()


def test_an_unreadable_orphans_file_is_nothing(tmp_path: Path) -> None:
    (tmp_path / orphans.NAME).write_text("[{]")
    assert orphans.load(tmp_path) == []
    (tmp_path / orphans.NAME).write_text('[{"pid": "x"}]')
    assert orphans.load(tmp_path) == []


def test_an_unknown_executor_is_a_one_line_config_error(tmp_path: Path) -> None:
    from deltad.daemon.config import ConfigError, load_config

    path = tmp_path / "deltad.yaml"
    path.write_text(f"roots: [{tmp_path}]\nexecutor: threads\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "executor:" in str(e.value) and "\n" not in str(e.value)
