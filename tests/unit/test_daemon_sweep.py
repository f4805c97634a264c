"""The full reconcile in bounded steps (deltad/core/sweep.py) under a ManualClock, and the
watch index that makes a removed directory cost what was below it (backends/tree.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from deltad.clock import ManualClock
from deltad.core import lifecycle
from deltad.core.config import DaemonConfig, load_config
from deltad.core.resumer import Resumer
from deltad.core.service import Service
from deltad.core.tenancy import Launch
from deltad.core.walking import recheck_reads
from deltad.testing.stub import paused_workspace
from deltad.watch import events as F
from deltad.watch.hints import Why
from tests.support.kernel import FakeKernelTree

BUDGET = 10  # steps per turn in these tests (the daemon's is larger)


def _answer(ws: Path, text: str = "yes") -> None:
    p = ws / ".delta" / "interaction" / "response.txt"
    tmp = p.with_name(".tmp")
    tmp.write_text(text)
    os.replace(tmp, p)


# -- the watch index ------------------------------------------------------------------------
class CountingTree(FakeKernelTree):
    """Watches kept in a dict; counts what is removed."""

    def wd_of(self, path: Path) -> int:
        return self.paths()[path]


def _farm(root: Path, groups: int, per_group: int) -> list[Path]:
    spaces = [root / f"g{g}" / f"ws{i}" for g in range(groups) for i in range(per_group)]
    for ws in spaces:
        (ws / ".delta" / "interaction").mkdir(parents=True)
        (ws / ".delta" / "runs").mkdir()
    return spaces


def test_a_removed_directory_drops_exactly_the_watches_below_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    spaces = _farm(root, groups=3, per_group=4)
    tree = CountingTree()
    tree.add_root(root, 2)
    layout = tree.sync()
    assert layout.workspaces == set(spaces)
    assert tree.watch_count() == 1 + 3 + 12  # root, its groups, one per workspace
    shutil.rmtree(root / "g1")
    before = len(tree.removed)  # each workspace's `.delta/` watch, dropped for its mailbox's
    tree._event(tree.wd_of(root), F.DELETE | F.ISDIR, "g1")
    assert len(tree.removed) - before == 1 + 4  # the group's watch and its workspaces', no more
    assert tree.watch_count() == 1 + 2 + 8
    assert not tree._subtree(root / "g1")[1:]  # nothing left indexed below it
    kept = [ws for ws in spaces if ws.parent.name != "g1"]
    assert sorted(tree.workspaces()) == sorted(kept)
    gone = [h.workspace for h in iter(tree._queue.pop, None)]
    assert sorted(gone) == sorted(ws for ws in spaces if ws.parent.name == "g1")


def test_the_index_walks_only_the_removed_subtree(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _farm(root, groups=4, per_group=5)
    tree = CountingTree()
    tree.add_root(root, 2)
    tree.sync()
    below = tree._subtree(root / "g2")
    assert sorted(below) == sorted([root / "g2", *(root / "g2" / f"ws{i}" for i in range(5))])
    assert len(tree._subtree(root)) == 1 + 4 + 20


def test_a_directory_that_becomes_a_workspace_is_reindexed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    tree = CountingTree()
    tree.add_root(root, 2)
    tree.sync()
    (root / "d" / ".delta" / "interaction").mkdir(parents=True)
    tree._event(tree.wd_of(root / "d"), F.CREATE | F.ISDIR, ".delta")
    assert root / "d" in tree.workspaces()
    assert tree._subtree(root) == [root, root / "d"]
    tree._event(tree.wd_of(root), F.DELETE | F.ISDIR, "d")
    assert tree.watch_count() == 1 and tree._subtree(root) == [root]
    assert not tree.workspaces()


# -- the stepped full reconcile -----------------------------------------------------------
class RecordingResumer(Resumer):
    """The resume queue as the loop sees it, with an executor that starts nothing: what the
    loop asked to resume is recorded (the executor seam is reached only through effects)."""

    def __init__(self, config: DaemonConfig) -> None:
        super().__init__(config)
        self.resumed: list[Path] = []

    def submit(
        self,
        ws: Path,
        run_id: str | None,
        launch: Launch,
        owner: int,
        request: str = "resume",
        answered_at: float | None = None,
    ) -> bool:
        self.resumed.append(ws)
        return True


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Service:
    monkeypatch.delenv("DELTAD_CONFIG", raising=False)
    monkeypatch.setattr("deltad.core.walking.SWEEP_BUDGET", BUDGET)
    config = load_config(None, (str(tmp_path / "root"),))
    config.state_dir = tmp_path / "state"
    config.state_dir.mkdir()
    config.executor = "fresh"  # not a fork server (a Python start): no resume is started here
    clock = ManualClock(wall=__import__("time").time())
    return Service(config, None, (), clock=clock, resumer=RecordingResumer(config))


def resumed(svc: Service) -> list[Path]:
    assert isinstance(svc.resumer, RecordingResumer)
    return svc.resumer.resumed


def _built(svc: Service, root: Path, n: int) -> list[Path]:
    spaces = [root / f"ws{i:04d}" for i in range(n)]
    for ws in spaces:
        paused_workspace(ws)
    svc.life.build_backends()
    return spaces


@pytest.mark.linux_only  # leases, /proc or the fork server (deltad/platform.py)
def test_each_turn_does_a_bounded_slice_and_serves_answers_in_between(
    service: Service, tmp_path: Path
) -> None:
    spaces = _built(service, tmp_path / "root", 2 * BUDGET + 50)
    service.full_reconcile("periodic")
    turns = 0
    answered_mid_sweep: Path | None = None
    while service.sweep is not None:
        before = len(service.registry)
        service.turn()
        turns += 1
        assert len(service.registry) - before <= BUDGET
        if answered_mid_sweep is None and service.sweep is not None:
            # one the walk has not reached yet: its event is served now, not after the walk
            answered_mid_sweep = next(ws for ws in reversed(spaces) if ws not in service.registry)
            _answer(answered_mid_sweep)
            service.queue.put(answered_mid_sweep, Why.ANSWER_CLOSED)
            service.turn()
            turns += 1
            assert resumed(service) == [answered_mid_sweep]
            assert service.sweep is not None  # still sweeping
    assert turns >= 3
    assert set(service.registry.workspaces) == set(spaces)
    assert service.registry.counts()["waiting"] == len(spaces) - 1
    service.life.close_backends()


@pytest.mark.linux_only  # leases, /proc or the fork server (deltad/platform.py)
def test_what_changes_during_a_sweep_is_kept_true_at_its_end(
    service: Service, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    spaces = _built(service, root, BUDGET + 20)
    service.full_reconcile("startup", at_once=True)
    assert len(service.registry) == len(spaces)
    service.full_reconcile("periodic")
    service.turn()  # part of the walk is done
    assert service.sweep is not None
    removed, added = spaces[0], root / "new-one"
    shutil.rmtree(removed)
    paused_workspace(added)
    while service.sweep is not None:
        for b in service.backends:
            service.life.process(b)
        service.turn()
    assert removed not in service.registry
    assert added in service.registry
    assert len(service.registry) == len(spaces)
    [tree] = [b for b in service.backends if b.name == "inotify"]
    assert tree.watch_count() == 1 + len(spaces)
    service.life.close_backends()


def test_neither_a_periodic_reconcile_nor_an_overflow_restarts_one_in_progress(
    service: Service, tmp_path: Path
) -> None:
    _built(service, tmp_path / "root", BUDGET * 2)
    service.full_reconcile("periodic")
    service.turn()
    first = service.sweep
    assert first is not None and not first.again
    service.full_reconcile("periodic")
    assert service.sweep is first and not first.again
    service.full_reconcile("overflow", force=True)  # goes on, and walks once more after
    assert service.sweep is first and first.walks and first.again
    assert first.reason == "overflow"
    service.full_reconcile("reload")  # a reload's walks are the new backends': anew
    assert service.sweep is not first and first.walks == []
    service.life.close_backends()


# -- when the next periodic full reconcile is due --------------------------------------------
@pytest.mark.parametrize(
    ("took", "due_in"),
    [
        (0.5, 300.0),  # 10,000 workspaces: every interval, as configured
        (30.0, 300.0),  # at a tenth of the interval, still every interval
        (234.0, 2340.0),  # 1,000,000: not 80 % of a core on a safety net
    ],
)
def test_a_long_walk_pushes_the_next_periodic_one(took: float, due_in: float) -> None:
    assert lifecycle.rescan_after(1000.0, 300.0, took) == 1000.0 + due_in


def test_a_long_startup_walk_pushes_the_first_periodic_one(tmp_path: Path) -> None:
    config = DaemonConfig.model_validate(
        {"roots": [{"path": str(tmp_path), "backend": "polling"}], "rescan_interval_seconds": 300}
    )
    ticks = lifecycle.Ticks()
    ticks.walked(ended=500.0, took=290.0, config=config)  # the startup walk, before the loop
    ticks.start(500.0, config)
    assert not ticks.rescan_due(500.0 + 2899.0, config)
    assert ticks.rescan_due(500.0 + 2900.0, config)
    quick = lifecycle.Ticks()
    quick.walked(ended=500.0, took=2.0, config=config)
    quick.start(500.0, config)
    assert not quick.rescan_due(799.0, config) and quick.rescan_due(800.0, config)


# -- after an overflow: who waits for an answer is glanced at first ---------------------------
@pytest.mark.parametrize(
    ("names", "known", "reads"),
    [
        ({"request.json"}, True, False),  # the question read or glanced at, still unanswered
        ({"request.json", "response.txt"}, True, True),  # an answer, its event lost
        ({"request.json", "response.json"}, True, True),
        ({"response.txt"}, False, True),  # an answer to a question that went meanwhile
        ({"request.json"}, False, True),  # a question posted while events were lost
        ({"request.json", "live"}, False, True),
        (set(), True, False),  # no question: nothing to answer, the walk reads it
        ({"live"}, False, False),  # a run in progress
        (None, True, False),  # no mailbox
    ],
)
def test_what_an_overflow_reads_at_once(names: set[str] | None, known: bool, reads: bool) -> None:
    assert recheck_reads(None if names is None else frozenset(names), known) is reads


@pytest.mark.linux_only  # leases, /proc or the fork server (deltad/platform.py)
def test_an_answer_lost_in_an_overflow_is_found_at_once_however_often_it_overflows(
    service: Service, tmp_path: Path
) -> None:
    """The walk reaches the answered workspace last; the queue overflows at every turn. The
    answer is still taken at the first turn after the overflow (the old restart never
    reached it while the overflows went on)."""
    root = tmp_path / "root"
    spaces = _built(service, root, 3 * BUDGET)
    service.full_reconcile("startup", quiet=True, at_once=True)
    while service.unread:
        service.turn()  # every question read: settled, waiting
    last = root / [e.name for e in os.scandir(root)][-1]  # the walk's order
    _answer(last)  # ...and its event lost in an overflow
    with capture_logs() as logs:
        service.queue.request_rescan()
        service.turn()
        assert resumed(service) == [last]
        assert service.sweep is not None  # the walk has not reached it
        for _ in range(3):
            service.queue.request_rescan()
            service.turn()
        while service.sweep is not None:
            service.turn()
    assert set(resumed(service)) == {last}  # (this resumer starts nothing: asked again)
    rechecked = [e for e in logs if e["event"] == "overflow_rechecked"]
    assert rechecked and rechecked[0]["workspaces"] == len(spaces)
    ends = [e for e in logs if e["event"] == "reconcile_full"]
    assert [e["reason"] for e in ends] == ["overflow"]  # one sweep, never restarted
    assert any(e["event"] == "reconcile_full_lap" for e in logs)
    service.life.close_backends()
