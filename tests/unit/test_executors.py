"""The executors' decisions in-process: how a command is planned, which executor `auto` means,
exit meanings. The local job executors (resumes.json, adoption, cancel): test_local_jobs.py;
through a real fork server: tests/e2e/test_executor_server.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from deltad.daemon.executors import exit_meaning, resolve
from deltad.daemon.executors.fork import plan

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


def test_an_unknown_executor_is_a_one_line_config_error(tmp_path: Path) -> None:
    from deltad.daemon.config import ConfigError, load_config

    path = tmp_path / "deltad.yaml"
    path.write_text(f"roots: [{tmp_path}]\nexecutor: threads\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "executor:" in str(e.value) and "\n" not in str(e.value)
