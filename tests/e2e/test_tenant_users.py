"""deltad on a server with many users: a resume runs as the workspace's owner, never as the
daemon; unsafe workspaces are refused; the service-user deployment of docs/daemon.md works.

Real users (created and removed here; root needed), the real `delta` client, the fake model.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status, wait_for

from ..conftest import llm_env
from ..users import Accounts, User, accounts, chown_tree, executable_by_all, shared_tmp

DELTA = str(Path(sys.executable).parent / "delta")
REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]

# The attack of the issue: an agent the workspace owner wrote, whose tool reads what only root
# may read and dumps its environment.
PROBE = """name: probe
llm: {model: fake}
tools:
  - name: probe
    shell: 'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"; head -c 20 /etc/shadow 2>&1; env'
"""


@pytest.fixture
def world() -> Iterator[tuple[Accounts, Path]]:
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        yield acc, base


def _agent(base: Path, owner: User | None = None) -> Path:
    home = base / f"agent-{owner.name if owner else 'root'}"
    home.mkdir()
    (home / "config.yaml").write_text(PROBE)
    (home / "system_prompt.md").write_text("Probe.\n")
    if owner:
        chown_tree(home, owner)
    return home


def _as(
    user: User, fake: FakeLLM, *args: str, umask: str = "022"
) -> subprocess.CompletedProcess[str]:
    env = [f"{k}={v}" for k, v in llm_env(fake).items() if k.startswith(("OPENAI_", "DELTA_"))]
    argv = user.argv("env", *env, DELTA, *args, umask=umask)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")


def _daemon(
    base: Path, fake: FakeLLM, root: Path, wrapper: list[str] | None = None, **kw: object
) -> Daemon:
    home = base / "daemon"
    home.mkdir(exist_ok=True)
    d = Daemon(home, [root], resume_command=REAL_CLIENT, wrapper=wrapper, **kw)
    return d.start(env={**llm_env(fake), "DAEMON_PRIVATE": "not-for-resumes"})


def test_root_daemon_resumes_as_the_owner_with_a_clean_environment(
    world: tuple[Accounts, Path], fake: FakeLLM
) -> None:
    acc, base = world
    mallory = acc.user()
    root = base / "root"
    root.mkdir()
    ws = root / "mallory-ws"
    ws.mkdir()
    chown_tree(ws, mallory)
    agent = _agent(base, mallory)
    fake.call("ask_human", {"prompt": "go?"}, id="q").call("probe", {}, id="p").reply("done")
    r = _as(mallory, fake, "run", "--agent", str(agent), "--task", "t", "-w", str(ws))
    assert r.returncode == 101, r.stderr
    assert _as(mallory, fake, "respond", "-w", str(ws), "yes").returncode == 0
    d = _daemon(base, fake, root)
    try:
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the resume as mallory")
        [spawned] = d.events("resume_spawned", workspace=str(ws))
        assert spawned["uid"] == mallory.uid and spawned["user"] == mallory.name
    finally:
        d.stop()
        d.kill_children()
    out = fake.tool_results()["p"]
    assert f"uid={mallory.uid} gid={mallory.gid}" in out
    assert "root:" not in out  # /etc/shadow stayed unreadable
    assert "test-key" not in out and "OPENAI_" not in out and "DAEMON_PRIVATE" not in out
    # Nothing in the run is left owned by root for the owner to trip over.
    for p in [ws / ".delta", *(ws / ".delta").rglob("*")]:
        assert os.lstat(p).st_uid == mallory.uid, p


@pytest.mark.parametrize("flaw", ["other_writable", "group_writable", "symlinked_interaction"])
def test_unsafe_workspaces_are_refused_with_one_line(
    world: tuple[Accounts, Path], fake: FakeLLM, flaw: str
) -> None:
    acc, base = world
    alice = acc.user()
    root = base / "root"
    root.mkdir()
    ws = root / "ws"
    ws.mkdir()
    chown_tree(ws, alice)
    agent = _agent(base)
    fake.call("ask_human", {"prompt": "go?"}, id="q").call("probe", {}, id="p").reply("done")
    assert (
        _as(alice, fake, "run", "--agent", str(agent), "--task", "t", "-w", str(ws)).returncode
        == 101
    )
    box = ws / ".delta" / "interaction"
    (box / "response.txt").write_text("yes")
    chown_tree(box, alice)
    if flaw == "other_writable":
        os.chmod(ws / ".delta", 0o777)
    elif flaw == "group_writable":
        os.chmod(box, 0o770)
    else:
        real = ws / "elsewhere"
        box.rename(real)
        box.symlink_to(real)
        os.lchown(box, alice.uid, alice.gid)
    d = _daemon(base, fake, root)
    try:
        [problem] = d.wait_event("workspace_problem", workspace=str(ws))
        words = {
            "other_writable": "everyone",
            "group_writable": "group-writable",
            "symlinked_interaction": "symlink",
        }[flaw]
        assert words in problem["problem"]
        d.reload()  # once, not at every rescan
        assert len(d.events("workspace_problem", workspace=str(ws))) == 1
        assert d.events("resume_spawned") == []
    finally:
        d.stop()
        d.kill_children()


@dataclass(frozen=True)
class SharedWorkspace:
    group: str
    gid: int
    svc: User  # the daemon's service user
    alice: User  # the workspace's owner
    root: Path
    ws: Path


def _shared_workspace(acc: Accounts, base: Path) -> SharedWorkspace:
    """docs/daemon.md, deployment (b): a service user and an owner in one group; the owner's
    workspace and its .delta/ setgid 2770 in that group."""
    group = acc.group()
    svc = acc.user(group)
    alice = acc.user(group)
    gid = int(
        subprocess.run(["getent", "group", group], capture_output=True, text=True).stdout.split(
            ":"
        )[2]
    )
    root = base / "root"
    root.mkdir()
    ws = root / "alice-ws"
    ws.mkdir()
    os.chown(ws, alice.uid, gid)
    os.chmod(ws, 0o2770)
    subprocess.run(
        ["install", "-d", "-m", "2770", "-o", alice.name, "-g", group, str(ws / ".delta")],
        check=True,
    )
    return SharedWorkspace(group, gid, svc, alice, root, ws)


def _as_service(svc: User) -> list[str]:
    return ["setpriv", f"--reuid={svc.uid}", f"--regid={svc.gid}", "--init-groups"]


def test_service_user_deployment_resumes_end_to_end(
    world: tuple[Accounts, Path], fake: FakeLLM
) -> None:
    """docs/daemon.md, deployment (b): deltad runs as a service user sharing a group with the
    workspace owner; the owner's .delta/ is setgid 2770 in that group; umask 002."""
    acc, base = world
    t = _shared_workspace(acc, base)
    group, gid, svc, alice, root, ws = t.group, t.gid, t.svc, t.alice, t.root, t.ws
    agent = _agent(base)
    fake.call("ask_human", {"prompt": "Name?"}, id="q").call("probe", {}, id="p").reply("hi")
    r = _as(alice, fake, "run", "--agent", str(agent), "--task", "t", "-w", str(ws), umask="002")
    assert r.returncode == 101, r.stderr
    assert _as(alice, fake, "respond", "-w", str(ws), "Ada", umask="002").returncode == 0
    home = base / "daemon"
    home.mkdir()
    os.chown(home, svc.uid, svc.gid)
    as_svc = _as_service(svc)
    # Without trusting alice, a non-root daemon refuses her workspace.
    d = _daemon(base, fake, root, wrapper=as_svc)
    try:
        [problem] = d.wait_event("workspace_problem", workspace=str(ws))
        assert alice.name in problem["problem"] and "trusted_owners" in problem["problem"]
        assert metadata_status(ws) == "WAITING_FOR_INPUT"
    finally:
        d.stop()
    shutil.rmtree(home / "state", ignore_errors=True)
    d = _daemon(base, fake, root, wrapper=as_svc, trusted_owners=[alice.name], shared_group=group)
    try:
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the service user's resume")
    finally:
        d.stop()
        d.kill_children()
    assert f"uid={svc.uid}" in fake.tool_results()["p"]
    for p in (ws / ".delta").rglob("*"):
        mode = os.lstat(p).st_mode & 0o7777
        assert mode == (0o2770 if p.is_dir() else 0o660), (p, oct(mode))
        assert os.lstat(p).st_gid == gid, p


REPORTER = """name: reporter
llm: {model: fake}
tools:
  - name: report
    shell: 'mkdir -p out && echo findings > out/report.txt && echo summary > summary.txt'
"""


def test_what_the_service_user_s_tools_create_the_owner_can_read(
    world: tuple[Accounts, Path], fake: FakeLLM
) -> None:
    """docs/daemon.md, "File modes": in a shared workspace the tools of a resume run by the
    service user create group-readable files (umask 0007), so the owner reads her agent's
    output."""
    acc, base = world
    t = _shared_workspace(acc, base)
    agent = base / "agent-reporter"
    agent.mkdir()
    (agent / "config.yaml").write_text(REPORTER)
    (agent / "system_prompt.md").write_text("Report.\n")
    fake.call("ask_human", {"prompt": "Go?"}, id="q").call("report", {}, id="r").reply("done")
    run = ["run", "--agent", str(agent), "--task", "t", "-w", str(t.ws)]
    assert _as(t.alice, fake, *run, umask="002").returncode == 101
    assert _as(t.alice, fake, "respond", "-w", str(t.ws), "yes", umask="002").returncode == 0
    home = base / "daemon"
    home.mkdir()
    os.chown(home, t.svc.uid, t.svc.gid)
    d = _daemon(
        base,
        fake,
        t.root,
        wrapper=_as_service(t.svc),
        trusted_owners=[t.alice.name],
        shared_group=t.group,
    )
    try:
        wait_for(lambda: metadata_status(t.ws) == "COMPLETED", "the service user's resume")
    finally:
        d.stop()
        d.kill_children()
    made = [t.ws / "summary.txt", t.ws / "out", t.ws / "out" / "report.txt"]
    assert [os.lstat(p).st_uid for p in made] == [t.svc.uid] * 3  # the tool ran as the service
    assert [os.lstat(p).st_mode & 0o7777 for p in made] == [0o660, 0o2770, 0o660]
    for p in (t.ws / "summary.txt", t.ws / "out" / "report.txt"):
        read = subprocess.run(t.alice.argv("cat", str(p)), capture_output=True, text=True)
        assert read.returncode == 0, (p, read.stderr)
