"""Fair resume slots: one owner's slow resumes never hold every slot, and one owner's backlog
never delays another owner's first resume.

A root daemon, real throw-away users, and the stand-in client in `hold` mode: each resume takes
its workspace's lock and waits until the test releases it (`FILE.go.<workspace>`), so "still
running" is a fact, not a timing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.testing.stub import paused_workspace
from tests.support.daemon import DELTAD, Daemon, records, wait_for

from ..users import Accounts, User, accounts, chown_tree, executable_by_all, shared_tmp


@pytest.fixture
def world() -> Iterator[tuple[Accounts, Path]]:
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        yield acc, base


def _workspaces(root: Path, owner: User, n: int) -> list[Path]:
    spaces = []
    for i in range(n):
        ws = root / f"{owner.name}-{i}"
        paused_workspace(ws, prompt=f"{owner.name}'s question {i}")
        chown_tree(ws, owner)
        spaces.append(ws)
    return spaces


def _answer_as(ws: Path, owner: User) -> None:
    """An answer of the owner's, renamed in whole (as `delta respond` writes it)."""
    tmp = ws / ".delta" / "interaction" / ".response.tmp"
    tmp.write_text("yes")
    os.chown(tmp, owner.uid, owner.gid)
    os.replace(tmp, tmp.with_name("response.txt"))


def _daemon(base: Path, root: Path, **settings: object) -> Daemon:
    home = base / "daemon"
    home.mkdir()
    home.chmod(0o1777)  # the stand-in resumes, run as the owners, record here
    d = Daemon(home, [root], mode="hold", **settings)
    d.record.touch()
    d.record.chmod(0o666)  # every owner's resume appends to it
    return d.start()


def _release(d: Daemon, ws: Path) -> None:
    d.record.with_name(f"{d.record.name}.go.{ws.name}").touch()


def _spawned(d: Daemon) -> list[str]:
    return [e["workspace"] for e in d.events("resume_spawned")]


def test_one_owners_slow_resumes_leave_a_slot_for_another_owner(
    world: tuple[Accounts, Path],
) -> None:
    acc, base = world
    mallory, alice = acc.user(), acc.user()
    root = base / "root"
    root.mkdir()
    theirs = _workspaces(root, mallory, 3)
    [mine] = _workspaces(root, alice, 1)
    d = _daemon(base, root, max_parallel_resumes=2, max_parallel_resumes_per_owner=1)
    try:
        for ws in theirs:
            _answer_as(ws, mallory)
        d.wait_event("resume_spawned", uid=mallory.uid)
        waits = d.wait_event("resume_waits_for_owner_slot", count=2, uid=mallory.uid)
        assert len({w["workspace"] for w in waits}) == 2  # once per resume
        _answer_as(mine, alice)
        d.wait_event("resume_spawned", workspace=str(mine), uid=alice.uid)
        # Mallory's first resume is still held: alice did not wait for it.
        assert len(d.events("resume_spawned", uid=mallory.uid)) == 1
        assert not d.events("resume_exited") and not records(d.record)
        (d.record.parent / (d.record.name + ".go")).touch()
        for ws in [*theirs, mine]:
            d.wait_resumed(ws)
        assert sorted(_spawned(d)) == sorted(str(ws) for ws in [*theirs, mine])
        assert len(d.events("resume_waits_for_owner_slot")) == 2
    finally:
        d.stop()
        d.kill_children()


def test_one_owners_backlog_does_not_delay_another_owners_first_resume(
    world: tuple[Accounts, Path],
) -> None:
    """A per-owner share of every slot (set: the default is half): mallory fills both slots
    and queues two more; alice's answer comes after, and still takes the first slot that
    frees."""
    acc, base = world
    mallory, alice = acc.user(), acc.user()
    root = base / "root"
    root.mkdir()
    theirs = _workspaces(root, mallory, 4)
    [mine] = _workspaces(root, alice, 1)
    d = _daemon(base, root, max_parallel_resumes=2, max_parallel_resumes_per_owner=2)
    try:
        for ws in theirs:
            _answer_as(ws, mallory)
        d.wait_event("resume_queued", count=4)
        first = d.wait_event("resume_spawned", count=2)
        _answer_as(mine, alice)
        d.wait_event("resume_queued", workspace=str(mine))
        assert _spawned(d) == [e["workspace"] for e in first]  # nothing else started yet
        _release(d, Path(first[0]["workspace"]))
        d.wait_event("resume_exited", workspace=first[0]["workspace"])
        d.wait_event("resume_spawned", count=3)
        assert _spawned(d)[2] == str(mine)
        assert not d.events("resume_waits_for_owner_slot")  # a share of every slot never binds
        (d.record.parent / (d.record.name + ".go")).touch()
        wait_for(lambda: len(records(d.record)) == 5, "every resume to finish")
        assert sorted(r["workspace"] for r in records(d.record)) == sorted(
            str(ws) for ws in [*theirs, mine]
        )
    finally:
        d.stop()
        d.kill_children()


def _check(tmp_path: Path, settings: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "deltad.yaml"
    cfg.write_text(f"roots: [{tmp_path}]\nmax_parallel_resumes: 4\n{settings}")
    argv = [DELTAD, "check", "--config", str(cfg)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_check_shows_each_owners_share_and_notes_one_above_the_total(tmp_path: Path) -> None:
    out = _check(tmp_path, "")
    assert out.returncode == 0, out.stderr
    assert "  max_parallel_resumes_per_owner: 2\n" in out.stdout  # unset: half, rounded up
    assert "note: max_parallel_resumes_per_owner" not in out.stdout
    out = _check(tmp_path, "max_parallel_resumes_per_owner: 4\n")
    assert (
        "  max_parallel_resumes_per_owner: 4\n" in out.stdout
        and "note: max_parallel_resumes_per_owner" not in out.stdout
    )
    out = _check(tmp_path, "max_parallel_resumes_per_owner: 8\n")
    assert out.returncode == 0, out.stderr
    assert (
        "note: max_parallel_resumes_per_owner (8) is above max_parallel_resumes (4)" in out.stdout
    )


@pytest.mark.parametrize("value", ["0", "-1", "true", "'2'", "1.5", "two"])
def test_a_bad_share_is_one_line_naming_the_key(tmp_path: Path, value: str) -> None:
    out = _check(tmp_path, f"max_parallel_resumes_per_owner: {value}\n")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("deltad: error: ") and "max_parallel_resumes_per_owner" in line
