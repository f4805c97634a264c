"""One workspace's directory tricks never cost another workspace its watch.

inotify hands out one watch descriptor per inode: `mallory/.delta/interaction` as a symlink to
`victim/.delta/interaction` used to take the victim's watch (its answers then reached nobody
until a full reconcile). Real `deltad`, real filesystem events; the periodic full reconcile is
an hour away, so only the victim's own watch can find its answer.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from deltad.testing.daemon import Daemon, answer, paused_workspace, running

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
