"""The executors' decisions in-process: how a command is planned, which executor `auto` means,
exit meanings. The local job executors (resumes.json, adoption, cancel): test_local_jobs.py;
through a real fork server: tests/e2e/test_executor_server.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from deltad.executors import exit_meaning, fork, resolve
from deltad.executors.fork import plan

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
    from deltad.core.config import ConfigError, load_config

    path = tmp_path / "deltad.yaml"
    path.write_text(f"roots: [{tmp_path}]\nexecutor: threads\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "executor:" in str(e.value) and "\n" not in str(e.value)


def test_the_package_signature_ignores_pycache_but_not_a_source_change(tmp_path: Path) -> None:
    """A fresh tree's first runs write __pycache__/ into package dirs: not an upgrade (it made
    the first resumes after a checkout restart the warm server, a 1.5 s tail in the bench)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    paths = [pkg, pkg / "sub"]
    before = fork.signature_of(paths)
    for d in paths:
        (d / "__pycache__").mkdir()
        (d / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert fork.signature_of(paths) == before
    (pkg / "sub" / "b.py").write_text("y = 3\n")  # an upgrade replaces a source file
    assert fork.signature_of(paths) != before
    changed = fork.signature_of(paths)
    (pkg / "new.py").write_text("")  # or adds one
    assert fork.signature_of(paths) != changed


def test_the_package_walk_digests_one_path_per_step_to_the_same_signature(
    tmp_path: Path,
) -> None:
    """The loop's look at the package is spread over its turns, a directory each, and ends
    with exactly the signature the server was started with."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "_version.py").write_text("__version__ = '1'\n")
    paths = [pkg, pkg / "sub", tmp_path / "_version.py"]
    walk = fork.SignatureWalk(paths)
    steps = []
    while (signature := walk.step()) is None:
        steps.append(None)
    assert len(steps) == len(paths)
    assert signature == fork.signature_of(paths)
    assert fork.SignatureWalk([]).step() == fork.signature_of([])
