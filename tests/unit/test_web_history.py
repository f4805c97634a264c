"""The page's history, decided from journal events alone: answers with who and when (never a
sensitive value), run ends with their status."""

from __future__ import annotations

from typing import Any

import pytest

from deltad.api.history import entries


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
