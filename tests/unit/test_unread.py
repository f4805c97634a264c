"""The list of workspaces read after READY (deltad/core/unread.py): read oldest first, a
workspace looked at meanwhile skipped, and nothing kept once it is empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltad.clock import ManualClock
from deltad.core.unread import Unread


def spaces(*names: str) -> list[Path]:
    return [Path("/srv/ws") / n for n in names]


@pytest.mark.parametrize(
    ("added", "discarded", "budget", "read"),
    [
        ("abc", "", 10, "abc"),
        ("abc", "", 2, "ab"),
        ("abc", "a", 2, "bc"),  # a discarded one is skipped, not counted
        ("abc", "abc", 10, ""),
        ("abca", "", 10, "abc"),  # added twice: once
    ],
)
def test_reads_oldest_first_skipping_what_was_looked_at(
    added: str, discarded: str, budget: int, read: str
) -> None:
    unread, got = Unread(), []
    for ws in spaces(*added):
        unread.add(ws)
    for ws in spaces(*discarded):
        unread.discard(ws)
    unread.step(got.append, ManualClock(), budget, slice_s=1.0)
    assert got == spaces(*read)
    assert len(unread) == len(set(added)) - len(set(discarded)) - len(read)


def test_discarded_then_added_again_is_read_once() -> None:
    unread, got = Unread(), []
    a, b = spaces("a", "b")
    unread.add(a)
    unread.add(b)
    unread.discard(a)
    unread.add(a)
    unread.step(got.append, ManualClock(), 10, slice_s=1.0)
    assert sorted(got) == [a, b] and len(unread) == 0
    assert unread.emptied() == 3  # added since it was last empty
    assert unread.emptied() == 0
