"""Which backend `backend: auto` takes (deltad/watch/choice.py): the decision from a
table, the watch count over real trees, and the config resolving its roots with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deltad.core.config import DaemonConfig
from deltad.watch.choice import (
    PlannedRoot,
    RootFacts,
    choose_backend,
    estimate_watches,
    plan,
    scaled,
)

CAN = None  # fanotify_problem: a filesystem mark works
NO_ROOT = "fanotify filesystem marks need root (CAP_SYS_ADMIN)"


@pytest.mark.parametrize(
    ("facts", "backend", "says"),
    [
        (RootFacts(True, 100_001, 192_000, CAN), "inotify", "fit the 192000 left"),
        (RootFacts(True, 800, 1000, CAN), "inotify", "fit"),  # 800 + 200 spare = 1000
        (RootFacts(True, 801, 1000, CAN), "fanotify", "one fanotify filesystem mark"),
        (RootFacts(True, 1_000_001, 192_000, CAN), "fanotify", "do not fit"),
        (RootFacts(True, 1_000_001, 192_000, NO_ROOT), "inotify", "the rest is polled"),
        (RootFacts(True, 10, -5, CAN), "fanotify", "do not fit the -5 left"),  # others took all
        (RootFacts(True, 0, 0, CAN), "inotify", "fit"),  # nothing yet: a missing root
        (RootFacts(True, 10**6, None, CAN), "inotify", "limit is unknown"),
        (RootFacts(False, 10, 1000, CAN), "watchdog", "not Linux"),
    ],
)
def test_choose_backend(facts: RootFacts, backend: str, says: str) -> None:
    name, why = choose_backend(facts)
    assert name == backend and says in why and "\n" not in why


@pytest.mark.parametrize(
    ("count", "looked", "total"),
    [
        (0, [], 0),
        (3, [1, 1, 1], 3),  # all looked into: the exact sum
        (100_000, [1] * 32, 100_000),
        (100, [5] * 32, 500),
        (10, [2, 1, 1], 14),  # 10 * 4 / 3, rounded up
    ],
)
def test_scaled(count: int, looked: list[int], total: int) -> None:
    assert scaled(count, looked) == total


def _ws(path: Path) -> None:
    (path / ".delta" / "interaction").mkdir(parents=True)


def test_the_count_is_the_watch_tree_s(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _ws(root / "a")
    (root / "a" / "src" / "deep").mkdir(parents=True)  # inside a workspace: never watched
    _ws(root / "g" / "b")
    _ws(root / "g" / "c")
    (root / "g" / "empty").mkdir()  # watched: a workspace may appear in it
    (root / "g" / "empty" / "too-deep").mkdir()  # below the depth
    os.symlink(root / "g", root / "link")  # never followed
    assert estimate_watches(root, 2) == 6  # root, a, g, b, c, empty
    assert estimate_watches(root, 1) == 3  # root, a, g
    assert estimate_watches(tmp_path / "missing", 2) == 0
    _ws(tmp_path / "itself")
    assert estimate_watches(tmp_path / "itself", 2) == 1


def test_a_wide_level_is_sampled_and_scaled(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for owner in range(3):
        for i in range(200):  # 200 > SAMPLE: a sample of them is looked into
            _ws(root / f"u{owner}" / f"w{i}")
    assert estimate_watches(root, 2) == 1 + 3 * 201
    flat = tmp_path / "flat"
    for i in range(500):
        _ws(flat / f"w{i}")
    assert estimate_watches(flat, 2) == 501


def _probe_ok(path: Path) -> str | None:
    return None


def _probe_no(path: Path) -> str | None:
    return NO_ROOT


def test_roots_share_the_budget_in_order(tmp_path: Path) -> None:
    roots = []
    for name in ("one", "two", "three"):
        for i in range(30):
            _ws(tmp_path / name / f"w{i}")
        roots.append(PlannedRoot(tmp_path / name, "auto"))
    # 31 watches each, 38 with the spare quarter; a cap of 80 takes two, not three
    chosen = plan(roots, 2, 80, True, _probe_ok)
    assert [c[0] for c in chosen] == ["inotify", "inotify", "fanotify"]
    assert [c[2] for c in chosen] == [31, 31, 31]
    assert "the 18 left" in chosen[2][1]
    chosen = plan(roots, 2, 80, True, _probe_no)
    assert [c[0] for c in chosen] == ["inotify"] * 3 and "polled" in chosen[2][1]


def test_a_configured_inotify_root_takes_its_watches_first(tmp_path: Path) -> None:
    for name in ("auto", "ino"):
        for i in range(30):
            _ws(tmp_path / name / f"w{i}")
    roots = [PlannedRoot(tmp_path / "auto", "auto"), PlannedRoot(tmp_path / "ino", "inotify")]
    chosen = plan(roots, 2, 60, True, _probe_ok)
    assert chosen[0][0] == "fanotify" and "the 29 left" in chosen[0][1]
    assert chosen[1] == ("inotify", "configured", 31)


def test_no_auto_root_counts_nothing(tmp_path: Path) -> None:
    roots = [PlannedRoot(tmp_path / "x", "polling"), PlannedRoot(tmp_path / "y", "inotify")]
    assert plan(roots, 2, None, True, _probe_ok) == [
        ("polling", "configured", 0),
        ("inotify", "configured", 0),
    ]


@pytest.mark.linux_only
@pytest.mark.skipif(os.geteuid() != 0, reason="a fanotify filesystem mark needs root")
def test_the_config_resolves_auto_with_the_budget(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for i in range(20):
        _ws(root / f"w{i}")
    roomy = DaemonConfig.model_validate({"roots": [str(root)]})
    assert roomy.roots[0].backend == "inotify" and "~21 inotify watches fit" in roomy.roots[0].why
    tight = DaemonConfig.model_validate({"roots": [str(root)], "max_inotify_watches": 20})
    assert tight.roots[0].backend == "fanotify" and "the 20 left" in tight.roots[0].why
    asked = DaemonConfig.model_validate(
        {"roots": [{"path": str(root), "backend": "inotify"}], "max_inotify_watches": 20}
    )
    assert asked.roots[0].backend == "inotify" and asked.roots[0].why == "configured"


def test_off_linux_auto_is_watchdog_without_a_count(tmp_path: Path) -> None:
    def no_probe(path: Path) -> str | None:
        raise AssertionError("no fanotify off Linux")

    _ws(tmp_path / "root" / "w")
    chosen = plan([PlannedRoot(tmp_path / "root", "auto")], 2, None, False, no_probe)
    assert chosen == [("watchdog", "not Linux: watchdog's native observer", 0)]
