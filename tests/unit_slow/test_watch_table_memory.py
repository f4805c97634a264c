"""What the watch table (deltad/watch/tree.py) keeps per idle workspace, counted by
tracemalloc in-process (deterministic: no timing): a real walk of real directories over a fake
kernel that keeps nothing, so only the table's own cost counts. The workspaces' own `Path`s
are made by the walk (`discovery.py`) and kept by the registry as well: not counted here.
Issue 20's goal for the table and its pathlib objects is 150 bytes per workspace; before the
table was keyed by the workspace it was 205 bytes in tree.py and 200 in the mailbox's Path."""

from __future__ import annotations

import gc
import inspect
import pathlib
import tracemalloc
from pathlib import Path

import pytest

from deltad.watch.fanotify import FanotifyBackend
from tests.support.kernel import FakeKernelTree

WORKSPACES = 2000
BUDGET = 120  # bytes per workspace: 100 now (two dict entries, the descriptor), 480 before
FREE_BUDGET = 450  # with three watches per workspace (fanotify): 420 now, 1,540 before


class FreeKernel(FakeKernelTree):
    """As fanotify: a watch costs nothing, so `.delta/` and `runs/` are kept as well."""

    FREE_WATCHES = FanotifyBackend.FREE_WATCHES


def _table_bytes(tree: FakeKernelTree, root: Path) -> int:
    """What a sync leaves allocated, less what the walk made for the workspaces themselves."""
    tree.add_root(root, 1)
    gc.collect()
    tracemalloc.start(30)
    try:
        before = tracemalloc.take_snapshot()
        layout = tree.sync()
        del layout  # the daemon's sweep lets it go once done
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(d.size_diff for d in after.filter_traces(_theirs()).compare_to(before, "filename"))


def _theirs() -> list[tracemalloc.Filter]:
    """The workspaces' own costs: their `Path`s (made by the walk) and the hash a `Path`
    caches when first put in a dict or set (the registry's dict would cache it too)."""
    lines, first = inspect.getsourcelines(pathlib.PurePath.__hash__)
    # Any frame: from 3.12 the hash is of the path's string, made (parsed, joined) when first
    # hashed, below `__hash__` in pathlib's own lines.
    hashing = [
        tracemalloc.Filter(False, inspect.getfile(pathlib.PurePath), lineno=n, all_frames=True)
        for n in range(first, first + len(lines))
    ]
    return [tracemalloc.Filter(False, "*/deltad/watch/discovery.py", all_frames=True), *hashing]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("memory") / "root"
    for i in range(WORKSPACES):
        (root / f"ws{i:05}" / ".delta" / "interaction").mkdir(parents=True)
        (root / f"ws{i:05}" / ".delta" / "runs").mkdir()
    return root


def test_a_watched_workspace_costs_under_the_budget(root: Path) -> None:
    tree = FakeKernelTree()
    kept = _table_bytes(tree, root)
    assert tree.watch_count() == WORKSPACES + 1  # one per workspace, and the root
    assert kept / WORKSPACES <= BUDGET, f"{kept / WORKSPACES:.0f} bytes per workspace"


def test_with_free_watches_a_workspace_costs_under_its_budget(root: Path) -> None:
    """Three watches per workspace (fanotify): its `.delta/` and `runs/` holders as well."""
    tree = FreeKernel()
    kept = _table_bytes(tree, root)
    assert tree.watch_count() == 3 * WORKSPACES + 1
    assert kept / WORKSPACES <= FREE_BUDGET, f"{kept / WORKSPACES:.0f} bytes per workspace"
