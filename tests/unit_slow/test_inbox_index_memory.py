"""The inbox's index at fleet size: what it keeps per open question, counted by tracemalloc
in-process (deterministic: no timing). The target is the daemon's RSS growth for the index at
10,000 questions ≤ 2 KB each (docs/inbox.md; bench/inbox_bench.py measures that). The Python
objects are most of it: about 220 bytes on CPython 3.11 (the index's own view of each, its
entries in the tables and lists); 490 while listed entries copied the view's fields and kept
their keys, 583 while what each workspace filed had a table of its own, 1,015 while holders were
sets."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from deltad.inbox.feed import Feed, View

QUESTIONS = 4000
BUDGET = 260  # bytes per open question, allocations only


def views(n: int) -> list[View]:
    return [
        View(
            Path(f"/srv/delta-workspaces/team{i // 1000:02}/ws{i:05}"),
            "waiting",
            run_id=f"20261124_042553_{i:06x}",
            status="WAITING_FOR_INPUT",
            request_id=f"req_{i:032x}",
            input_type="text",
            created=1.7e9 + i,
        )
        for i in range(n)
    ]


def test_the_index_keeps_under_260_bytes_per_open_question() -> None:
    waiting = views(QUESTIONS)
    for v in waiting:
        str(v.workspace)  # the registry has made each path's string already
    feed = Feed()
    feed.priming = True  # the startup reconcile: filled quietly
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for v in waiting:
            feed.changed(v.workspace, None, v)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(list(feed.index.questions())) == QUESTIONS
    assert kept / QUESTIONS <= BUDGET, f"{kept / QUESTIONS:.0f} bytes per open question"


def test_holders_of_a_request_id_come_and_go() -> None:
    """Two workspaces showing one request id (a copy): both found, then each on its own."""
    a, b = views(2)
    b = View(b.workspace, "waiting", "r2", "WAITING_FOR_INPUT", a.request_id, "text", 2.0)
    feed = Feed()
    feed.changed(a.workspace, None, a)
    feed.changed(b.workspace, None, b)
    feed.changed(b.workspace, None, b)  # seen again: still one holder each
    assert feed.index.find(str(a.request_id)) == sorted([a.workspace, b.workspace])
    feed.changed(a.workspace, a, None)
    assert feed.index.find(str(a.request_id)) == [b.workspace]
    assert feed.index.run_holders(str(a.run_id)) == []
    assert feed.index.run_holders("r2") == [b.workspace]
    feed.changed(b.workspace, b, None)
    assert feed.index.find(str(a.request_id)) == []
    assert feed.index.closed(str(a.request_id)) == {a.workspace: False, b.workspace: False}
