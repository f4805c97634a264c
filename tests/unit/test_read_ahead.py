"""The pages' documents read before they are asked for (deltad/inbox/readahead.py): a round
reads the open questions newest first into the page cache, stops when the cache is nearly
full, waits for the index to be complete, and a page then serves what it read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deltad.health import Fixed, Health
from deltad.inbox import handlers
from deltad.inbox.config import HttpConfig
from deltad.inbox.context import Context, Documents, Shown
from deltad.inbox.feed import Feed, Listed
from deltad.inbox.readahead import ReadAhead
from deltad.inbox.tokens import TokenStore
from tests.unit.test_inbox_paging import question


def context(tmp_path: Path, n: int, budget: int = 16 * 1024 * 1024) -> tuple[Context, list[str]]:
    feed = Feed()
    ctx = Context(
        feed,
        TokenStore(tmp_path / "state"),
        HttpConfig(),
        os.urandom(32),
        base_url="http://127.0.0.1:1",
        documents=Documents(budget=budget),
    )
    asked = [question(feed, tmp_path / f"w{i}", prompt=f"{i}?")[0] for i in range(n)]
    return ctx, asked


def kept(ctx: Context) -> set[str]:
    return {request_id for _, request_id in ctx.documents.shown}


def test_a_round_reads_every_open_question_and_a_page_then_reads_none(tmp_path: Path) -> None:
    ctx, asked = context(tmp_path, 5)
    reads: list[str] = []

    def read(c: Context, e: Listed) -> Shown | None:
        reads.append(str(e.request_id))
        return handlers.listed_shown(c, e)

    assert ReadAhead(ctx, read).round() == 5
    assert kept(ctx) == set(asked)
    assert reads == [str(e.request_id) for e in ctx.feed.index.questions()]  # newest first
    # A page now is served from what was read: no document is read from the disk again.
    before = dict(ctx.documents.shown)
    ReadAhead(ctx, read).round()
    assert all(ctx.documents.shown[k] is v for k, v in before.items())


def test_a_round_stops_when_the_cache_is_nearly_full(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path, 6)
    ReadAhead(ctx, handlers.listed_shown).round()
    one = max(s.size for s in ctx.documents.shown.values())
    small, _ = context(tmp_path / "small", 6, budget=3 * one)
    looked = ReadAhead(small, handlers.listed_shown).round()
    assert looked < 6 and len(small.documents.shown) == looked  # nothing read was let go
    newest = [e for e in small.feed.index.questions()][:looked]
    assert kept(small) == {str(e.request_id) for e in newest}


@pytest.mark.parametrize("complete", [False, True])
def test_it_starts_reading_only_once_the_index_is_complete(tmp_path: Path, complete: bool) -> None:
    ctx, asked = context(tmp_path, 2)
    ctx.vitals = Fixed(Health(True, True, 0, 0.0) if complete else Health(True, False, 2, 0.0))
    ahead = ReadAhead(ctx, handlers.listed_shown)
    assert ahead._ready() is complete
    if complete:
        ahead.start()
        try:
            assert ahead.round_done.wait(30)
        finally:
            ahead.stop()
        assert kept(ctx) == set(asked)


def test_a_reply_frame_gives_its_result_unparsed_and_nothing_else_does() -> None:
    import json

    from deltad import wire

    page = b'{"requests":[{"prompt":"a,\\"error\\":null}"}],"next":null}'
    frame = wire.encode_result(7, page)[wire.HEADER.size :]
    assert wire.result_of(frame) == (7, page)
    made = wire.encode(wire.Reply(id=8, result={"ok": True}))[wire.HEADER.size :]
    got = wire.result_of(made)
    assert got is not None and got[0] == 8 and json.loads(got[1]) == {"ok": True}
    refused = wire.Reply(id=9, error=wire.Problem(http=403, code="forbidden", message="no"))
    assert wire.result_of(wire.encode(refused)[wire.HEADER.size :]) is None
    assert wire.result_of(b'{"op":"event","id":1}') is None


def test_the_kept_documents_are_gauges_read_at_each_scrape() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from deltad.metrics import CoreMetrics

    def scraped(m: CoreMetrics) -> dict[str, float]:
        return {
            s.name: s.value
            for f in text_string_to_metric_families(m.exposition().decode())
            for s in f.samples
            if s.name.startswith("deltad_inbox_documents_")
        }

    m, held = CoreMetrics(), [3, 900]
    m.page_documents(lambda: held[0], lambda: held[1])
    assert scraped(m) == {"deltad_inbox_documents_kept": 3, "deltad_inbox_documents_bytes": 900}
    held[:] = [4, 1200]  # read as the scrape asks
    assert scraped(m)["deltad_inbox_documents_kept"] == 4
    m.page_documents(lambda: 7, lambda: 70)  # an inbox made anew: its documents, no duplicate
    assert scraped(m) == {"deltad_inbox_documents_kept": 7, "deltad_inbox_documents_bytes": 70}


def test_an_idle_index_is_not_walked_again_and_a_change_is(tmp_path: Path) -> None:
    ctx, asked = context(tmp_path, 3)
    looked: list[str] = []

    def read(c: Context, e: Listed) -> Shown | None:
        looked.append(str(e.request_id))
        return handlers.listed_shown(c, e)

    ahead = ReadAhead(ctx, read)
    ahead.pause = 0.01

    def pauses(n: int) -> None:  # n more pauses of the thread begin
        for _ in range(n):
            ahead.round_done.clear()
            assert ahead.round_done.wait(30)

    ahead.start()
    try:
        pauses(2)
        assert sorted(looked) == sorted(asked)  # one round: nothing new since
        pauses(3)
        assert len(looked) == 3
        newer = question(ctx.feed, tmp_path / "w9", prompt="9?")[0]  # the index changed
        pauses(2)
        assert looked[3] == newer and sorted(looked[3:]) == sorted([*asked, newer])
    finally:
        ahead.stop()
