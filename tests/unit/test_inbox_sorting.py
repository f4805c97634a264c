"""The inbox's list by age, deadline and kind: `sort=`, `older_than=`, `due_within=` from
tables, and cursors that stay correct under each sort while the index changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltad.inbox import paging
from deltad.inbox.feed import Index, Listed, View

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (None, None),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
        ("0.5h", 1800.0),
        (" 5m ", 300.0),
        ("366d", 366 * 86400.0),
    ],
)
def test_a_duration(text: str | None, seconds: float | None) -> None:
    assert paging.duration("older_than", text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "0", "0s", "-5m", "5 m", "1y", "m", "1h1", "367d", "1e3", "１h", "10mm", "NaN", "90"],
)
def test_a_bad_duration_is_one_line(text: str) -> None:
    with pytest.raises(paging.BadPage, match=r"^due_within: "):
        paging.duration("due_within", text)


def test_a_number_without_a_unit_is_not_read_as_seconds() -> None:
    with pytest.raises(paging.BadPage) as refused:
        paging.duration("due_within", "10")
    assert str(refused.value) == (
        "due_within: a duration like 90s, 10m, 1h30m or 2d, not '10' "
        "(a number needs its unit: 10s, 10m, 10h or 10d)"
    )


@pytest.mark.parametrize(
    ("given", "sort"),
    [(None, "newest"), ("newest", "newest"), ("oldest", "oldest"), ("deadline", "deadline")],
)
def test_a_sort(given: str | None, sort: str) -> None:
    assert paging.sort_of(given) == sort


def test_a_bad_sort() -> None:
    with pytest.raises(paging.BadPage, match="sort: newest"):
        paging.sort_of("age")


# (workspace, asked at, deadline or None, kind)
QUESTIONS = [
    ("/ws/a", NOW - 7200, NOW + 300, "text"),  # 2 h old, due in 5 min
    ("/ws/b", NOW - 600, NOW + 3600, "approval"),  # 10 min old, due in 1 h
    ("/ws/c", NOW - 86400, None, "text"),  # a day old, no deadline
    ("/ws/d", NOW - 60, NOW - 30, "choice"),  # due 30 s ago, not yet acted on
    ("/ws/e", NOW - 5400, None, "approval"),  # 1.5 h old, no deadline
    ("/ws/f", NOW - 30, NOW + 590, "text"),  # due in 9 min 50 s
]


def index_of(rows: list[tuple[str, float, float | None, str]]) -> Index:
    index = Index()
    for ws, created, deadline, kind in rows:
        name = ws.rsplit("/", 1)[1]
        index.put(
            View(Path(ws), "waiting", f"r-{name}", "WAITING", f"q-{name}", kind, created, deadline)
        )
    return index


def pages(index: Index, limit: int = 2, **params: Any) -> list[str]:
    """Every page's workspaces in order, following `next`."""
    wanted = paging.Filters(
        ("/**",),
        input_type=params.get("input_type"),
        asked_before=NOW - old if (old := paging.duration("o", params.get("older_than"))) else None,
        due_by=NOW + due if (due := paging.duration("d", params.get("due_within"))) else None,
    )
    sort = paging.sort_of(params.get("sort"))
    out: list[str] = []
    cursor = None
    for _ in range(20):
        after = paging.decode(paging.SORTS[sort], cursor)
        docs, cursor = paging.question_page(
            index, wanted, sort, after, lambda e: str(e.workspace).rsplit("/", 1)[1], limit
        )
        out += docs
        if cursor is None:
            return out
    raise AssertionError("no end")


LISTS = [
    ({}, ["f", "d", "b", "e", "a", "c"]),
    ({"sort": "newest"}, ["f", "d", "b", "e", "a", "c"]),
    ({"sort": "oldest"}, ["c", "a", "e", "b", "d", "f"]),
    ({"sort": "deadline"}, ["d", "a", "f", "b", "c", "e"]),  # none last, by workspace
    ({"older_than": "1h"}, ["e", "a", "c"]),
    ({"older_than": "1h", "sort": "oldest"}, ["c", "a", "e"]),
    ({"due_within": "10m"}, ["f", "d", "a"]),
    ({"due_within": "10m", "sort": "deadline"}, ["d", "a", "f"]),
    ({"due_within": "5m", "sort": "deadline"}, ["d", "a"]),
    ({"input_type": "approval", "sort": "oldest"}, ["e", "b"]),
    ({"input_type": "approval", "sort": "deadline"}, ["b", "e"]),
    ({"older_than": "1d", "due_within": "1h"}, []),
]


@pytest.mark.parametrize(("params", "order"), LISTS)
@pytest.mark.parametrize("limit", [1, 2, 100])
def test_each_sort_and_filter_pages_through(
    params: dict[str, str], order: list[str], limit: int
) -> None:
    assert pages(index_of(QUESTIONS), limit, **params) == order


@pytest.mark.parametrize("sort", ["newest", "oldest", "deadline"])
def test_a_cursor_stays_correct_under_its_sort_while_questions_come_and_go(sort: str) -> None:
    index = index_of(QUESTIONS)
    wanted = paging.Filters(("/**",))
    s = paging.sort_of(sort)

    def page(cursor: str | None) -> tuple[list[str], str | None]:
        after = paging.decode(paging.SORTS[s], cursor)
        return paging.question_page(index, wanted, s, after, lambda e: str(e.workspace)[-1], 2)

    first, cursor = page(None)
    full = pages(index_of(QUESTIONS), 100, sort=sort)
    assert first == full[:2]
    # One shown is answered, one not yet shown is answered: the rest comes once, in order.
    gone = full[3]
    index.remove(Path(f"/ws/{first[0]}"))
    index.remove(Path(f"/ws/{gone}"))
    rest: list[str] = []
    while cursor is not None:
        got, cursor = page(cursor)
        rest += got
    assert rest == [w for w in full[2:] if w != gone]


def test_a_cursor_of_one_sort_is_refused_by_another() -> None:
    cursor = paging.encode("requests:deadline", (NOW, "/ws/a", "q"))
    with pytest.raises(paging.BadPage, match=r"not a cursor of /v1/requests \(a cursor continues"):
        paging.decode("requests", cursor)
    with pytest.raises(paging.BadPage, match=r"requests\?sort=oldest"):
        paging.decode("requests:oldest", cursor)
    old = paging.encode("requests", (NOW, "/ws/a", "q"))  # the default's cursor is unchanged
    assert paging.decode("requests", old) == (NOW, "/ws/a", "q")


def test_a_deadline_page_reads_a_bounded_number() -> None:
    index = index_of([(f"/ws/{i:04d}", NOW - i, NOW + 1000 - i, "text") for i in range(1000)])
    found = paging.soonest(index.questions(), paging.Filters(("/**",)).keep, None, 10)
    assert len(found) == 21
    assert [str(e.workspace) for e in found[:2]] == ["/ws/0999", "/ws/0998"]
    assert all(isinstance(e, Listed) for e in found)
