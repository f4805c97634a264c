"""One workspace's directory tricks never cost another workspace its watch.

inotify hands out one watch descriptor per inode: `mallory/.delta/interaction` as a symlink to
`victim/.delta/interaction` used to take the victim's watch (its answers then reached nobody
until a full reconcile). Real `deltad`, real filesystem events; the periodic full reconcile is
an hour away, so only the victim's own watch can find its answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import DELTAD, Daemon, answer, paused_workspace, running

from ..users import Accounts, accounts, chown_tree, executable_by_all, shared_tmp

NO_RESCAN = 3600  # the periodic full reconcile never runs during a test


def _mailbox(ws: Path) -> Path:
    return ws / ".delta" / "interaction"


def _point_mailbox_at(ws: Path, victim: Path) -> None:
    """Replace `ws`'s mailbox by a symlink to `victim`'s."""
    shutil.rmtree(_mailbox(ws))
    os.symlink(_mailbox(victim), _mailbox(ws))


def _victim_served_mallory_refused(d: Daemon, victim: Path, mallory: Path) -> None:
    answer(victim, "the victim's answer")
    assert d.wait_resumed(victim)[0]["answer"] == "the victim's answer"
    assert d.resumed(mallory) == []
    [refused] = d.wait_event("watch_refused", workspace=str(mallory))
    assert "symlink" in refused["reason"]
    d.wait_event("workspace_problem", workspace=str(mallory))
    # More events in the shared mailbox: the refusal is still logged once, not per event.
    answer(victim, "again")
    assert len(d.events("watch_refused", workspace=str(mallory))) == 1
    assert len(d.events("workspace_problem", workspace=str(mallory))) == 1


def test_a_symlinked_mailbox_made_before_start_does_not_take_the_victims_watch(
    tmp_path: Path,
) -> None:
    # Two roots: the victim's is walked first, so the link is watched after the victim's dir
    # (the order that used to hand the victim's events to mallory).
    first, second = tmp_path / "a", tmp_path / "b"
    victim, mallory = first / "victim", second / "mallory"
    paused_workspace(victim)
    paused_workspace(mallory)
    _point_mailbox_at(mallory, victim)
    with running(tmp_path, [first, second], rescan_interval_seconds=NO_RESCAN) as d:
        _victim_served_mallory_refused(d, victim, mallory)


def test_a_symlinked_mailbox_moved_in_after_ready_does_not_take_the_victims_watch(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    victim = root / "victim"
    paused_workspace(victim)
    staged = tmp_path / "staging" / "mallory"
    paused_workspace(staged)
    _point_mailbox_at(staged, victim)
    with running(tmp_path, [root], rescan_interval_seconds=NO_RESCAN) as d:
        mallory = root / "mallory"
        os.rename(staged, mallory)  # a whole prepared workspace appears at once
        d.wait_event("workspace_discovered", workspace=str(mallory))
        _victim_served_mallory_refused(d, victim, mallory)


@pytest.fixture
def world() -> Iterator[tuple[Accounts, Path]]:
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        yield acc, base


def test_another_user_cannot_silence_a_victims_mailbox(world: tuple[Accounts, Path]) -> None:
    """Two real users under one root daemon: mallory, by herself and after READY, moves in a
    workspace whose mailbox is a symlink to the victim's."""
    acc, base = world
    victim_user, mallory_user = acc.user(), acc.user()
    root = base / "root"
    homes = {u: root / u.name for u in (victim_user, mallory_user)}
    for user, home in homes.items():
        home.mkdir(parents=True)
        chown_tree(home, user)
    victim = homes[victim_user] / "ws"
    paused_workspace(victim)
    chown_tree(victim, victim_user)
    staged = base / "staging" / "ws"  # mallory's, outside the root
    paused_workspace(staged)
    shutil.rmtree(_mailbox(staged))
    chown_tree(staged.parent, mallory_user)
    mallory = homes[mallory_user] / "ws"
    daemon_home = base / "daemon"
    daemon_home.mkdir()
    d = Daemon(daemon_home, [root], rescan_interval_seconds=NO_RESCAN)
    d.record.touch()
    os.chmod(d.record, 0o666)  # the stand-in client appends as the victim
    d.start()
    try:
        link = f"ln -s '{_mailbox(victim)}' '{_mailbox(staged)}' && mv '{staged}' '{mallory}'"
        subprocess.run(mallory_user.argv("sh", "-c", link), check=True, timeout=60)
        d.wait_event("workspace_discovered", workspace=str(mallory))
        _victim_served_mallory_refused(d, victim, mallory)
    finally:
        d.stop()
        d.kill_children()


def test_a_tenants_directory_flood_is_capped_and_its_workspace_still_served(
    world: tuple[Accounts, Path],
) -> None:
    """Every directory a tenant makes under a root cost root one inotify watch. With
    `max_watches_per_owner`, its directories take at most that many (said once, and in
    `deltad status`); the rest is polled, so its workspace is still served."""
    acc, base = world
    tenant = acc.user()
    root = base / "root"
    home = root / tenant.name
    home.mkdir(parents=True)
    for i in range(30):
        (home / f"d{i:02d}").mkdir()
    ws = home / "ws"  # walked after the flood: beyond the cap
    paused_workspace(ws)
    chown_tree(home, tenant)
    daemon_home = base / "daemon"
    daemon_home.mkdir()
    cap = 10
    d = Daemon(
        daemon_home,
        [{"path": str(root), "backend": "inotify"}],
        rescan_interval_seconds=NO_RESCAN,
        max_watches_per_owner=cap,
        poll_interval_seconds=0.3,
    )
    d.record.touch()
    os.chmod(d.record, 0o666)  # the stand-in client appends as the tenant
    d.start()
    try:
        [said] = d.wait_event("watch_owner_cap")
        assert said["uid"] == tenant.uid and said["max_watches_per_owner"] == cap
        more = " ".join(f"'{home}/e{i:02d}'" for i in range(20))  # after READY, by the tenant
        subprocess.run(tenant.argv("sh", "-c", f"mkdir {more}"), check=True, timeout=60)
        answer(ws, "the tenant's answer")
        assert d.wait_resumed(ws)[0]["answer"] == "the tenant's answer"  # polled, still served
        done = subprocess.run(
            [DELTAD, "status", "--state-dir", str(d.state_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        doc = json.loads(done.stdout)
        capped = doc["watch_capped_owners"][str(tenant.uid)]
        assert capped["watches"] == cap and capped["polled"] >= 21  # 20 + 1 dirs, and ws
        assert doc["watches"]["inotify"] <= 1 + cap  # the root's own, and the tenant's share
        assert len(d.events("watch_owner_cap")) == 1
    finally:
        d.stop()
        d.kill_children()
