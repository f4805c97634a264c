"""The Walker (deltad/core/walking.py) on its own: made from an index, a feed, a clock, the
backends and four callbacks, without the service, it walks, glances, reads after, and drops
what is gone. Its narrow interface is the point (docs/design.md, "The daemon's loop")."""

from __future__ import annotations

import shutil
from pathlib import Path

from deltad.clock import ManualClock
from deltad.core.registry import Registry
from deltad.core.sweep import Sweep
from deltad.core.walking import Walker
from deltad.inbox.feed import Feed
from deltad.testing.stub import paused_workspace
from deltad.watch import PollingBackend
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
