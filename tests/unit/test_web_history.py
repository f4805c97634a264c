"""The page's history, decided from journal events alone: answers with who and when (never a
sensitive value), run ends with their status."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from deltad.api.history import FINAL_MESSAGE_MAX, bounded, complete, duration_seconds, entries


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


def ended(status: str, reason: str, at: str = "2026-01-01T00:01:05Z") -> dict[str, Any]:
    return {"type": "RUN_END", "timestamp": at, "payload": {"status": status, "reason": reason}}


START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        # (status, reason, final_message, final_message_truncated, duration_seconds)
        (ended("COMPLETED", "Hello Ada!"), ("COMPLETED", None, "Hello Ada!", False, 65.0)),
        (
            ended("FAILED", "max_iterations (3) reached"),
            ("FAILED", "max_iterations (3) reached", "max_iterations (3) reached", False, 65.0),
        ),
        (
            ended("CANCELED", "canceled by bob"),
            ("CANCELED", "canceled by bob", "canceled by bob", False, 65.0),
        ),
        (ended("COMPLETED", "<b>hi</b>"), ("COMPLETED", None, "<b>hi</b>", False, 65.0)),
        (ended("COMPLETED", "done", at="T3"), ("COMPLETED", None, "done", False, None)),
        (
            ended("COMPLETED", "x" * (FINAL_MESSAGE_MAX + 1)),
            ("COMPLETED", None, "x" * (FINAL_MESSAGE_MAX - 1) + "…", True, 65.0),
        ),
        (
            {"type": "RUN_END", "timestamp": "T3", "payload": {"status": "FAILED"}},
            ("FAILED", None, None, False, None),
        ),
    ],
)
def test_a_run_end_carries_its_status_final_message_and_duration(
    event: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    [e] = entries("/w", "r", [event], started=START)
    got = ("status", "reason", "final_message", "final_message_truncated", "duration_seconds")
    assert tuple(e[k] for k in got) == expected
    assert e["kind"] == "run_ended" and e["at"] == event["timestamp"]


def test_a_run_end_without_a_known_start_has_no_duration() -> None:
    [e] = entries("/w", "r", [ended("COMPLETED", "done")])
    assert e["duration_seconds"] is None and e["final_message"] == "done"


@pytest.mark.parametrize(
    ("text", "cap", "expected"),
    [
        (None, 3, (None, False)),
        ("", 3, ("", False)),
        ("abc", 3, ("abc", False)),
        ("abcd", 3, ("ab…", True)),
    ],
)
def test_a_final_message_is_bounded(text: str | None, cap: int, expected: tuple[Any, ...]) -> None:
    assert bounded(text, cap) == expected


@pytest.mark.parametrize(
    ("started", "at", "expected"),
    [
        (START, "2026-01-01T00:00:01.500000Z", 1.5),
        (START, "2026-01-01T01:00:00+00:00", 3600.0),
        (START, "2025-12-31T23:59:59Z", 0.0),  # a clock stepped back: never negative
        (START, "2026-01-01T00:00:01", None),  # no zone: not comparable
        (START, "soon", None),
        (START, None, None),
        (None, "2026-01-01T00:00:01Z", None),
    ],
)
def test_a_duration_runs_from_the_start_to_that_end(
    started: datetime | None, at: object, expected: float | None
) -> None:
    assert duration_seconds(started, at) == expected


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
