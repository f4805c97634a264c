"""The page's history, decided from journal events alone: answers with who and when (never a
sensitive value), run ends with their status."""

from __future__ import annotations

from typing import Any

import pytest

from deltad.api.history import complete, entries


def asked(rid: str, **request: Any) -> dict[str, Any]:
    doc = {"request_id": rid, "prompt": f"{rid}?", "input_type": "text", "sensitive": False}
    return {
        "type": "HUMAN_INTERACTION",
        "timestamp": "2026-01-01T00:00:00Z",
        "payload": {"phase": "asked", "request": {**doc, **request}},
    }


def answered(rid: str, value: Any = "Ada", **reply: Any) -> dict[str, Any]:
    doc = {"outcome": "answered", "value": value, "answered_by": "alice", "at": "T2"}
    return {
        "type": "HUMAN_INTERACTION",
        "timestamp": "T1",
        "payload": {"phase": "answered", "request_id": rid, "reply": {**doc, **reply}},
    }


END = {"type": "RUN_END", "timestamp": "T3", "payload": {"status": "COMPLETED", "reason": "done"}}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], []),
        ([asked("q")], []),  # still waiting: not history yet
        ([asked("q"), answered("q")], [("answered", "alice", "Ada", "q?")]),
        (
            [asked("q", sensitive=True), answered("q", "s3cret")],
            [("answered", "alice", None, "q?")],
        ),
        (
            [asked("q", input_type="password"), answered("q", "pw")],
            [("answered", "alice", None, "q?")],
        ),
        ([answered("q", "from an older journal tail")], [("answered", "alice", None, None)]),
        (
            [asked("q"), answered("q"), END],
            [("answered", "alice", "Ada", "q?"), ("run_ended", None, None, None)],
        ),
        ([{"type": "THOUGHT", "payload": {"content": "hm"}}], []),
    ],
)
def test_history_entries_from_a_journal(
    events: list[dict[str, Any]], expected: list[tuple[Any, ...]]
) -> None:
    got = entries("/srv/ws/a", "20260101_000000_abcdef", events)
    assert [
        (e["kind"], e.get("answered_by"), e.get("answer"), e.get("prompt")) for e in got
    ] == expected
    for e in got:
        assert e["workspace"] == "/srv/ws/a" and e["at"] in ("T2", "T3")


def test_a_run_end_carries_its_status_and_reason() -> None:
    [e] = entries("/w", "r", [END])
    assert (e["status"], e["reason"], e["at"]) == ("COMPLETED", "done", "T3")


def _at(*times: str) -> list[dict[str, Any]]:
    return [{"at": t} for t in times]


@pytest.mark.parametrize(
    ("found", "next_mtime", "limit", "expected"),
    [
        (_at(), 0.0, 1, False),  # nothing found yet
        (_at("2026-01-01T00:00:10Z"), 5.0, 2, False),  # fewer than the limit
        (_at("1970-01-01T00:00:10Z"), 5.0, 1, True),  # the next journal is older than all
        (_at("1970-01-01T00:00:10Z"), 10.0, 1, True),  # as old as the last kept
        (_at("1970-01-01T00:00:10Z"), 11.0, 1, False),  # it may hold a newer entry
        (_at("1970-01-01T00:00:20Z", "1970-01-01T00:00:03Z"), 5.0, 2, False),
        (_at("1970-01-01T00:00:20Z", "1970-01-01T00:00:03Z"), 5.0, 1, True),
    ],
)
def test_journals_are_read_until_the_newest_entries_are_known(
    found: list[dict[str, Any]], next_mtime: float, limit: int, expected: bool
) -> None:
    assert complete(found, next_mtime, limit) is expected
