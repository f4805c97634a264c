"""What the daemon keeps per idle workspace, counted by tracemalloc in-process (deterministic:
no timing): the watch table (a real walk of real directories, over a fake kernel that keeps
nothing), the registry and the inbox index, for paused workspaces each waiting on a question.
The issue's target is ≤ 1 KB per idle workspace beyond the kernel's; docs/daemon.md has where
it stands. The budget is what these structures cost now, with a margin: a regression fails."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path

import pytest

from deltad.daemon import tenancy
from deltad.daemon.reconcile import Action, State, Verdict
from deltad.daemon.registry import Registry
from deltad.daemon.tenancy import Policy
from deltad.inbox.feed import Feed
from deltad.protocol import RunStatus, Workspace, load_metadata
from deltad.protocol.errors import CorruptFile
from deltad.testing.kernel import FakeKernelTree
from deltad.testing.stub import paused_workspace

WORKSPACES = 2000
# bytes per idle workspace, allocations only: 2,281 before the first watch table cut, 1,785
# after, 1,128 once the registry and the index shared one view per workspace, 764 with the
# watch table keyed by the workspace too (781 in a worker that ran other tests first: the
# interpreter's own tables resize in steps)
BUDGET = 880


def paused(root: Path, n: int) -> list[Verdict]:
    """`n` workspaces on disk, and what a read of each finds (strings made before counting:
    they come from the state files, not from these structures)."""
    verdicts = []
    for i in range(n):
        (root / f"ws{i:05}" / ".delta" / "interaction").mkdir(parents=True)
        verdicts.append(
            Verdict(
                Action.NONE,
                State.WAITING,
                run_id=f"20261124_060000_{i:06x}",
                status=RunStatus.WAITING_FOR_INPUT,
                request_id=f"req_{i:032x}",
                input_type="text",
                created=1.7e9 + i,
            )
        )
    return verdicts


def test_an_idle_workspace_costs_under_the_budget(tmp_path: Path) -> None:
    root = tmp_path / "root"
    verdicts = paused(root, WORKSPACES)
    tree, feed = FakeKernelTree(), Feed()
    feed.priming = True  # the startup reconcile: filled quietly
    registry = Registry(feed)  # as the service has them: one table
    tree.add_root(root, 1)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        layout = tree.sync()
        for ws in sorted(layout.workspaces):
            registry.add(ws, quiet=True)
            registry.observe(ws, verdicts[int(ws.name[2:])], quiet=True)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(registry) == WORKSPACES == len(list(feed.index.questions()))
    assert tree.watch_count() == WORKSPACES + 1  # one per workspace, and the root
    assert kept / WORKSPACES <= BUDGET, f"{kept / WORKSPACES:.0f} bytes per idle workspace"


def test_reading_a_paused_workspace_interns_no_run_id(tmp_path: Path) -> None:
    """pathlib interns every part it parses: a run id per read grew the interpreter's table of
    interned strings for good. The owner check, the run's paths and the safe walk down to its
    metadata join it unparsed."""
    ws = tmp_path / "ws"
    chars = list(paused_workspace(ws))  # the string pathlib interned while making it is let go
    run_id = "".join(chars)  # one of its own, as read from LATEST
    tenancy.check(ws, run_id, Policy())
    meta = load_metadata(tenancy.run_paths(Workspace(ws), run_id).metadata)
    assert sys.intern("".join(chars)) is not run_id, "the run id was interned"
    assert meta.run_id == run_id
    with pytest.raises(CorruptFile, match="is not a run id"):
        tenancy.run_paths(Workspace(ws), "../elsewhere")
