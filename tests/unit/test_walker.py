"""The Walker (deltad/core/walking.py) on its own: made from an index, a feed, a clock, the
backends and four callbacks, without the service, it walks, glances, reads after, and drops
what is gone. Its narrow interface is the point (docs/design.md, "The daemon's loop")."""

from __future__ import annotations

import shutil
from collections.abc import Generator
from pathlib import Path

import pytest

from deltad.clock import ManualClock
from deltad.core.registry import Registry
from deltad.core.sweep import Sweep, after
from deltad.core.walking import Walker
from deltad.inbox.feed import Feed
from deltad.testing.stub import paused_workspace
from deltad.watch import PollingBackend
from deltad.watch.discovery import Layout
from deltad.watch.hints import HintQueue


def test_a_walker_needs_only_what_it_is_handed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    spaces = [root / f"ws{i}" for i in range(3)]
    for ws in spaces:
        paused_workspace(ws)  # a question, no answer: a glance is enough at first
    poller = PollingBackend(HintQueue(), 60.0)
    poller.add_root(root, 2)
    feed = Feed(100)
    registry = Registry(feed)
    looked: list[tuple[Path, bool]] = []
    dropped: list[Path] = []
    ended: list[Sweep] = []
    between: list[int] = []
    walker = Walker(
        registry,
        feed,
        ManualClock(),
        backends=lambda: [poller],
        look=lambda ws, quiet: looked.append((ws, quiet)),
        drop=lambda ws: (dropped.append(ws), registry.drop(ws)),
        between=lambda: between.append(1),
        ended=ended.append,
    )
    walker.full_reconcile("startup", quiet=True, at_once=True)
    assert walker.sweep is None and len(ended) == 1 and ended[0].reason == "startup"
    assert set(registry.workspaces) == set(spaces)
    assert looked == [] and len(walker.unread) == 3  # glanced at, read after READY
    while walker.unread:
        walker.read_step()
    assert sorted(looked) == [(ws, True) for ws in spaces]  # read quietly: not new questions
    shutil.rmtree(spaces[0])
    walker.full_reconcile("overflow", force=True)  # reads everything, a slice per turn
    while walker.sweep is not None:
        walker.sweep_step()
    assert dropped == [spaces[0]] and len(ended) == 2
    poller.close()


# -- an overflow storm: the walk goes on and ends one complete walk after the last overflow --
class ListedBackend:
    """A backend whose walk yields the same workspaces in the same order, one per step."""

    name = "listed"

    def __init__(self, spaces: list[Path]) -> None:
        self.spaces = spaces
        self.walks: list[bool] = []  # each walk begun, by whether it re-adds the watches

    def sync_steps(self, force: bool = False) -> Generator[Path | None, None, Layout]:
        self.walks.append(force)
        yield from self.spaces
        return Layout(workspaces=set(self.spaces))


@pytest.mark.parametrize(
    ("running", "reason", "force", "does"),
    [
        (False, "startup", False, "start"),
        (False, "overflow", True, "start"),
        (False, "periodic", False, "start"),
        (True, "periodic", False, "keep"),  # left to the one in progress
        (True, "overflow", True, "again"),  # goes on, walks once more after: never restarted
        (True, "reload", False, "start"),  # its walks belong to the new backends
        (True, "reload", True, "start"),
    ],
)
def test_what_a_full_reconcile_does_to_the_one_in_progress(
    running: bool, reason: str, force: bool, does: str
) -> None:
    assert after(running, reason, force) == does


def test_overflows_during_a_sweep_let_it_finish_each_workspace_read_after_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A storm: the queue overflows every 3 turns, and a walk takes 5. Restarted at each
    overflow, the walk never got past its first 30 workspaces while the storm lasted; going on
    and walking once more after, every workspace is reached again and again, and once the
    overflows stop the sweep ends, each workspace read after the last one."""
    monkeypatch.setattr("deltad.core.walking.SWEEP_BUDGET", 10)
    spaces = [Path(f"/nonexistent/ws{i:02d}") for i in range(50)]
    backend = ListedBackend(spaces)
    feed = Feed(100)
    registry = Registry(feed)
    looked: dict[Path, list[int]] = {ws: [] for ws in spaces}
    ended: list[Sweep] = []
    turn = 0
    walker = Walker(
        registry,
        feed,
        ManualClock(),
        backends=lambda: [backend],  # type: ignore[list-item]
        look=lambda ws, quiet: looked[ws].append(turn),
        drop=registry.drop,
        between=lambda: None,
        ended=ended.append,
    )
    walker.full_reconcile("overflow", force=True)
    last_overflow = 0
    for turn in range(1, 61):  # the storm
        if turn % 3 == 0:
            walker.full_reconcile("overflow", force=True)
            last_overflow = turn
        walker.sweep_step()
        assert walker.sweep is not None  # an overflow came during every walk: not done yet
    assert all(len(turns) >= 10 for turns in looked.values()), looked  # every one, each lap
    while walker.sweep is not None:
        turn += 1
        walker.sweep_step()
        assert turn <= last_overflow + 2 * 5, "ends within two walks of the last overflow"
    assert [s.reason for s in ended] == ["overflow"] and ended[0].laps == len(backend.walks)
    assert all(turns[-1] > last_overflow for turns in looked.values())
    assert all(backend.walks)  # every lap after an overflow re-adds the watches
