"""The daemon inside the shipped unit's sandbox (tests/systemd_sandbox.py: its syscall filter,
capability bounding set, NoNewPrivileges and umask, without systemd): it still resumes a run as
its owner through the warm fork server, on inotify; fanotify works only with the fanotify
drop-in, and without it `backend: fanotify` is a one-line error.

Needs root, systemd-analyze, setpriv and Debian's python3 with python3-seccomp: required with
CI=true (`.ci/run` installs them), skipped elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.testing import FakeLLM
from tests.support.daemon import DELTAD, Daemon, metadata_status, wait_for

from ..conftest import llm_env
from ..users import Accounts, accounts, chown_tree, executable_by_all, shared_tmp
from .test_tenant_users import REAL_CLIENT, _agent, _as

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "deltad.service"
FANOTIFY = REPO / "systemd" / "deltad.service.d" / "fanotify.conf.example"
SANDBOX = REPO / "tests" / "systemd_sandbox.py"
SYSTEM_PYTHON = "/usr/bin/python3"


def _sandbox(*drop_ins: Path) -> list[str]:
    missing = [c for c in ("systemd-analyze", "setpriv") if shutil.which(c) is None]
    has_seccomp = (
        os.path.exists(SYSTEM_PYTHON)
        and subprocess.run([SYSTEM_PYTHON, "-c", "import seccomp"], check=False).returncode == 0
    )
    if missing or not has_seccomp or os.geteuid() != 0:
        why = f"needs root, {', '.join(missing) or 'systemd-analyze, setpriv'} and python3-seccomp"
        if os.environ.get("CI"):
            pytest.fail(f"the unit's sandbox must be tried in CI: {why}")
        pytest.skip(why)
    return [SYSTEM_PYTHON, str(SANDBOX), str(UNIT), *map(str, drop_ins), "--"]


@pytest.fixture
def world() -> Iterator[tuple[Accounts, Path]]:
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        yield acc, base


def test_the_daemon_resumes_as_the_owner_inside_the_units_sandbox(
    world: tuple[Accounts, Path], fake: FakeLLM
) -> None:
    wrapper = _sandbox()
    acc, base = world
    owner = acc.user()
    root = base / "root"
    ws = root / "ws"
    ws.mkdir(parents=True)
    chown_tree(ws, owner)
    agent = _agent(base, owner)
    fake.call("ask_human", {"prompt": "go?"}, id="q").call("probe", {}, id="p").reply("done")
    assert (
        _as(owner, fake, "run", "--agent", str(agent), "--task", "t", "-w", str(ws)).returncode
        == 101
    )
    assert _as(owner, fake, "respond", "-w", str(ws), "yes").returncode == 0
    home = base / "daemon"
    home.mkdir()
    d = Daemon(home, [root], resume_command=REAL_CLIENT, executor="fork", wrapper=wrapper)
    d.start(env=llm_env(fake))
    try:
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the resume inside the sandbox")
        [spawned] = d.events("resume_spawned", workspace=str(ws))
        assert spawned["executor"] == "fork" and spawned["uid"] == owner.uid
        assert d.events("fork_server_unhealthy") == []
        [chosen] = d.events("backend_chosen")
        assert chosen["backend"] == "inotify"
    finally:
        d.stop()
        d.kill_children()
    assert f"uid={owner.uid} gid={owner.gid}" in fake.tool_results()["p"]


def test_fanotify_needs_the_drop_in(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    config = tmp_path / "deltad.yaml"
    config.write_text(
        f"roots: [{{path: {root}, backend: fanotify}}]\nstate_dir: {tmp_path / 'state'}\n"
    )
    out = subprocess.run(
        [*_sandbox(), DELTAD, "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert "fanotify" in line and "Operation not permitted" in line
    out = subprocess.run(
        [*_sandbox(FANOTIFY), DELTAD, "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "fanotify" in out.stdout
