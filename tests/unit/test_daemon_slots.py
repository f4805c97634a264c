"""Fair resume slots: the pure picker from tables, and the resumer's queue around it (with a
stand-in executor that only records what it was asked to start)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import structlog

from deltad.core.config import DaemonConfig
from deltad.core.resumer import Resumer
from deltad.core.slots import Slots, held_by_owner_cap, pick_next
from deltad.core.tenancy import Identity, Launch, owner_of
from deltad.executors.seam import Event, Exit, Handle, JobSpec, RequestKey

MALLORY, ALICE, BOB = 1001, 1002, 1003


@pytest.mark.parametrize(
    ("waiting", "running", "slots", "picked"),
    [
        ({}, {}, Slots(4, 4), None),  # nothing waits
        ({MALLORY: 0}, {}, Slots(4, 4), MALLORY),
        ({MALLORY: 0}, {MALLORY: 3}, Slots(4, 4), MALLORY),  # one owner: every slot is theirs
        ({MALLORY: 0}, {MALLORY: 4}, Slots(4, 4), None),  # global cap
        ({MALLORY: 0, ALICE: 1}, {MALLORY: 2, ALICE: 2}, Slots(4, 4), None),  # global cap
        ({MALLORY: 0}, {MALLORY: 2}, Slots(4, 2), None),  # per-owner cap, slots free
        ({MALLORY: 0, ALICE: 9}, {MALLORY: 2}, Slots(4, 2), ALICE),  # capped owner skipped
        # Mallory's backlog arrived first; Alice's first resume still goes before it.
        ({MALLORY: 0, ALICE: 7}, {MALLORY: 1}, Slots(2, 2), ALICE),
        ({MALLORY: 0, ALICE: 7}, {MALLORY: 3, ALICE: 1}, Slots(8, 8), ALICE),  # fewest running
        ({MALLORY: 0, ALICE: 1}, {}, Slots(4, 4), MALLORY),  # a tie: the longest waiting
        ({MALLORY: 3, ALICE: 1}, {}, Slots(4, 4), ALICE),
        ({MALLORY: 0, ALICE: 1}, {MALLORY: 1, ALICE: 1}, Slots(4, 4), MALLORY),
        ({ALICE: 5}, {-1: 3}, Slots(4, 4), ALICE),  # an adopted resume of nobody's counts
        ({ALICE: 5}, {-1: 4}, Slots(4, 4), None),
    ],
)
def test_pick_next(
    waiting: dict[int, int], running: dict[int, int], slots: Slots, picked: int | None
) -> None:
    assert pick_next(waiting, running, slots) == picked


def _start_order(arrivals: list[int], slots: Slots) -> list[int]:
    """The owners in the order their resumes start when all arrive at once and none ends."""
    queues: dict[int, list[int]] = {}
    for n, owner in enumerate(arrivals):
        queues.setdefault(owner, []).append(n)
    running: Counter[int] = Counter()
    order = []
    while (
        owner := pick_next({o: q[0] for o, q in queues.items() if q}, running, slots)
    ) is not None:
        queues[owner].pop(0)
        running[owner] += 1
        order.append(owner)
    return order


@pytest.mark.parametrize(
    ("arrivals", "slots", "order"),
    [
        # Owners take turns, whoever queued first.
        ([MALLORY] * 4 + [ALICE], Slots(4, 4), [MALLORY, ALICE, MALLORY, MALLORY]),
        (
            [MALLORY] * 3 + [ALICE] * 2 + [BOB],
            Slots(6, 6),
            [MALLORY, ALICE, BOB, MALLORY, ALICE, MALLORY],
        ),
        ([MALLORY] * 4 + [ALICE], Slots(4, 1), [MALLORY, ALICE]),  # per-owner cap
        ([MALLORY] * 5, Slots.of(3, None), [MALLORY] * 3),  # one owner: FIFO up to the cap
    ],
)
def test_owners_take_turns(arrivals: list[int], slots: Slots, order: list[int]) -> None:
    assert _start_order(arrivals, slots) == order


@pytest.mark.parametrize(
    ("total", "per_owner", "slots"),
    [(4, None, Slots(4, 4)), (4, 2, Slots(4, 2)), (4, 4, Slots(4, 4)), (4, 9, Slots(4, 4))],
)
def test_slots_of_the_config(total: int, per_owner: int | None, slots: Slots) -> None:
    assert Slots.of(total, per_owner) == slots


@pytest.mark.parametrize(
    ("waiting", "running", "slots", "held"),
    [
        ({MALLORY: 0}, {MALLORY: 1}, Slots(2, 1), [MALLORY]),
        ({MALLORY: 0}, {MALLORY: 1, ALICE: 1}, Slots(2, 1), []),  # no slot free at all
        ({MALLORY: 0}, {MALLORY: 4}, Slots(4, 4), []),  # one owner: never held by its cap
        ({MALLORY: 0, ALICE: 1}, {MALLORY: 2}, Slots(4, 2), [MALLORY]),
    ],
)
def test_held_by_owner_cap(
    waiting: dict[int, int], running: dict[int, int], slots: Slots, held: list[int]
) -> None:
    assert held_by_owner_cap(waiting, running, slots) == held


# -- the resumer's queue ------------------------------------------------------------------------
class Recorder:
    """A job executor that starts nothing: it records each job and holds it until `finish`."""

    name = "recorder"
    poll_every: float | None = None

    def __init__(self) -> None:
        self.started: list[Path] = []
        self.running: dict[Path, Handle] = {}
        self.ended: list[Event] = []
        self.left: list[Handle] = []

    def submit(self, spec: JobSpec) -> Handle:
        self.started.append(spec.key.workspace)
        handle = Handle(spec.key, self.name, str(len(self.started)))
        self.running[spec.key.workspace] = handle
        return handle

    def finish(self, ws: Path) -> None:
        self.ended.append(Exit(self.running.pop(ws), 0))

    def poll(self, now: float) -> list[Event]:
        ended, self.ended = self.ended, []
        return ended

    def cancel(self, handle: Handle, force: bool) -> None:
        pass

    def adopt(self) -> list[Handle]:
        return self.left

    def fds(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


def _resumer(
    tmp_path: Path, left: tuple[Path, ...] = (), **settings: object
) -> tuple[Resumer, Recorder]:
    config = DaemonConfig.model_validate({"state_dir": str(tmp_path), **settings})
    resumer = Resumer(config)
    recorder = Recorder()
    recorder.left = [Handle(RequestKey(ws, "", "resume"), "recorder", "left") for ws in left]
    resumer._executor = recorder
    resumer._adopt()
    return resumer, recorder


LAUNCH = Launch(Identity(owner_of(os.getuid())), {})


def test_the_resumer_serves_owners_in_turn_and_logs_a_wait_once(tmp_path: Path) -> None:
    resumer, ex = _resumer(tmp_path, max_parallel_resumes=2, max_parallel_resumes_per_owner=1)
    theirs = [tmp_path / f"m{i}" for i in range(3)]
    for ws in theirs:
        assert resumer.submit(ws, None, LAUNCH, MALLORY)
    assert not resumer.submit(theirs[0], None, LAUNCH, MALLORY)  # a workspace once
    with structlog.testing.capture_logs() as logged:
        resumer.start_ready()
        resumer.start_ready()  # the same waits: not logged again
        assert ex.started == theirs[:1]
        assert not resumer.can_start()  # a slot is free, but not for mallory
        mine = tmp_path / "alice"
        resumer.submit(mine, None, LAUNCH, ALICE)
        assert resumer.can_start()
        resumer.start_ready()
    assert ex.started == [theirs[0], mine]
    waits = [e for e in logged if e["event"] == "resume_waits_for_owner_slot"]
    assert [(e["workspace"], e["uid"]) for e in waits] == [(str(ws), MALLORY) for ws in theirs[1:]]
    ex.finish(theirs[0])
    resumer.reap()
    resumer.start_ready()
    assert ex.started == [theirs[0], mine, theirs[1]]
    assert [q[0] for q in resumer.pending] == [theirs[2]]


def test_the_resumer_with_one_owner_and_every_slot_is_first_come_first_served(
    tmp_path: Path,
) -> None:
    resumer, ex = _resumer(tmp_path, max_parallel_resumes=3, max_parallel_resumes_per_owner=3)
    spaces = [tmp_path / f"ws{i}" for i in range(5)]
    for ws in spaces:
        resumer.submit(ws, None, LAUNCH, MALLORY)
    with structlog.testing.capture_logs() as logged:
        resumer.start_ready()
        ex.finish(spaces[1])
        resumer.reap()
        resumer.start_ready()
    assert ex.started == spaces[:4]
    assert not [e for e in logged if e["event"] == "resume_waits_for_owner_slot"]


def test_an_adopted_resume_counts_for_its_workspaces_owner(tmp_path: Path) -> None:
    """A resume an earlier daemon left running has no recorded owner: the workspace's is used."""
    left = tmp_path / "left-running"
    left.mkdir()
    resumer, ex = _resumer(
        tmp_path, (left,), max_parallel_resumes=2, max_parallel_resumes_per_owner=1
    )
    assert resumer.children[left].adopted
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    resumer.submit(mine, None, LAUNCH, os.getuid())  # the adopted one's owner: at its share
    resumer.submit(theirs, None, LAUNCH, ALICE)
    resumer.start_ready()
    assert ex.started == [theirs]
    assert [q[0] for q in resumer.pending] == [mine]


@pytest.mark.parametrize(("total", "share"), [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (256, 128)])
def test_an_unset_share_is_half_the_slots_rounded_up(
    tmp_path: Path, total: int, share: int
) -> None:
    config = DaemonConfig.model_validate(
        {"state_dir": str(tmp_path), "max_parallel_resumes": total}
    )
    assert config.max_parallel_resumes_per_owner == share


def test_on_a_fresh_install_one_owner_cannot_hold_every_slot(tmp_path: Path) -> None:
    resumer, ex = _resumer(tmp_path)  # the defaults: 4 slots, 2 an owner
    mallory = [tmp_path / f"m{i}" for i in range(4)]
    for ws in mallory:
        resumer.submit(ws, None, LAUNCH, MALLORY)
    with structlog.testing.capture_logs() as logged:
        resumer.start_ready()
    assert ex.started == mallory[:2]  # two slots stay free for anyone else
    waits = [e for e in logged if e["event"] == "resume_waits_for_owner_slot"]
    assert [e["workspace"] for e in waits] == [str(ws) for ws in mallory[2:]]
    assert resumer.slots() == 2
