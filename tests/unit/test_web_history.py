"""The page's history, decided from journal events alone: answers with who and when (never a
sensitive value), run ends with their status."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from deltad.inbox.history import FINAL_MESSAGE_MAX, bounded, complete, duration_seconds, entries
from deltad.protocol import JournalEvent
from deltad.protocol.viewing import event_of

T1, T2, T3 = "2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z", "2026-01-01T00:00:03Z"


def line(type_: str, at: str, payload: dict[str, Any]) -> JournalEvent:
    """An event as the views' reader makes it from a journal line (typed when it fits)."""
    doc = {"seq": 1, "timestamp": at, "type": type_, "payload": payload}
    e = event_of(json.dumps(doc).encode())
    assert e is not None
    return e


def asked(rid: str, **request: Any) -> JournalEvent:
    doc = {"request_id": rid, "prompt": f"{rid}?", "input_type": "text", "sensitive": False,
           "run_id": "r", "action_id": "a"}  # fmt: skip
    return line("HUMAN_INTERACTION", "2026-01-01T00:00:00Z",
                {"phase": "asked", "request": {**doc, **request}})  # fmt: skip


def answered(rid: str, value: Any = "Ada", **reply: Any) -> JournalEvent:
    doc = {"outcome": "answered", "value": value, "answered_by": "alice", "at": T2}
    return line("HUMAN_INTERACTION", T1,
                {"phase": "answered", "request_id": rid, "action_id": "a",
                 "reply": {**doc, **reply}})  # fmt: skip


END = line("RUN_END", T3, {"status": "COMPLETED", "reason": "done"})


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
        ([line("THOUGHT", T1, {"content": "hm"})], []),
        # what the reader could not type is skipped: an unknown type, a payload that misfits
        (
            [asked("q"), line("NEWER_EVENT", T1, {}), answered("q")],
            [("answered", "alice", "Ada", "q?")],
        ),
        ([asked("q"), line("HUMAN_INTERACTION", T1, {"phase": "answered"})], []),
    ],
)
def test_history_entries_from_a_journal(
    events: list[JournalEvent], expected: list[tuple[Any, ...]]
) -> None:
    got = entries("/srv/ws/a", "20260101_000000_abcdef", events)
    assert [
        (e["kind"], e.get("answered_by"), e.get("answer"), e.get("prompt")) for e in got
    ] == expected
    for e in got:
        assert e["workspace"] == "/srv/ws/a" and e["at"] in (T2, T3)


def ended(status: str, reason: str | None, at: str = "2026-01-01T00:01:05Z") -> JournalEvent:
    payload = {"status": status} if reason is None else {"status": status, "reason": reason}
    return line("RUN_END", at, payload)


START = datetime(2026, 1, 1, tzinfo=UTC)
LONG = "x" * (FINAL_MESSAGE_MAX + 1)


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
        (
            ended("COMPLETED", LONG),
            ("COMPLETED", None, "x" * (FINAL_MESSAGE_MAX - 1) + "…", True, 65.0),
        ),
        (ended("FAILED", None), ("FAILED", None, None, False, 65.0)),
        # a clock stepped back between the start and the end: never negative
        (ended("COMPLETED", "ok", "2025-12-31T23:59:00Z"), ("COMPLETED", None, "ok", False, 0.0)),
    ],
)
def test_a_run_end_carries_its_status_final_message_and_duration(
    event: JournalEvent, expected: tuple[Any, ...]
) -> None:
    [e] = entries("/w", "r", [event], started=START)
    got = ("status", "reason", "final_message", "final_message_truncated", "duration_seconds")
    assert tuple(e[k] for k in got) == expected
    assert e["kind"] == "run_ended"


def test_a_run_end_without_a_known_start_has_no_duration() -> None:
    [e] = entries("/w", "r", [END])
    assert (e["status"], e["final_message"], e["at"]) == ("COMPLETED", "done", T3)
    assert e["duration_seconds"] is None


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
    ("started", "ended_at", "expected"),
    [
        (START, datetime(2026, 1, 1, 0, 0, 1, 500000, tzinfo=UTC), 1.5),
        (START, datetime(2026, 1, 1, 1, tzinfo=UTC), 3600.0),
        (START, datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC), 0.0),
        (None, datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC), None),
    ],
)
def test_a_duration_runs_from_the_start_to_that_end(
    started: datetime | None, ended_at: datetime, expected: float | None
) -> None:
    assert duration_seconds(started, ended_at) == expected


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


def test_an_edited_approval_says_what_changed_and_a_rejection_why() -> None:
    call = {"action_id": "c1", "tool_name": "deploy", "arguments": {"channel": "beta"}}
    reply = {"outcome": "answered", "value": None, "answered_by": "alice", "at": T2,
             "decisions": [{"action_id": "c1", "decision": "edit",
                            "arguments": {"channel": "stable"}}]}  # fmt: skip
    events = [
        asked("q", input_type="approval", calls=[call], action_id="c1"),
        line("HUMAN_INTERACTION", T1,
             {"phase": "answered", "request_id": "q", "action_id": "c1", "reply": reply}),
    ]  # fmt: skip
    [got] = entries("/srv/ws/a", "20260101_000000_abcdef", events)
    assert got["decisions"] == [
        {
            "action_id": "c1",
            "decision": "edit",
            "tool_name": "deploy",
            "asked_arguments": {"channel": "beta"},
            "arguments": {"channel": "stable"},
        }
    ]
    reply["decisions"] = [{"action_id": "c1", "decision": "reject", "reason": "not today"}]
    payload = {"phase": "answered", "request_id": "q", "action_id": "c1", "reply": reply}
    events[1] = line("HUMAN_INTERACTION", T1, payload)
    [got] = entries("/srv/ws/a", "20260101_000000_abcdef", events)
    assert got["decisions"] == [
        {"action_id": "c1", "decision": "reject", "tool_name": "deploy", "reason": "not today"}
    ]
