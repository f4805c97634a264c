"""One decision for a question's deadline: the journal's `asked` record (protocol/deadline.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from deltad.protocol import EventType, InteractionRequest, Journal
from deltad.protocol.deadline import judge_expiry
from deltad.protocol.journal import asked_request

NOW = datetime(2026, 6, 1, tzinfo=UTC)
LATER = datetime(2026, 6, 2, tzinfo=UTC)
EARLIER = datetime(2026, 5, 1, tzinfo=UTC)
YEAR_ONE = datetime(1, 1, 1, tzinfo=UTC)
ASKED = InteractionRequest(
    request_id="R", prompt="q", run_id="run", action_id="a", expires_at=LATER
)


def _posted(**changes: object) -> InteractionRequest:
    return ASKED.model_copy(update=changes)


@pytest.mark.parametrize(
    ("posted", "asked", "expired", "at", "problem"),
    [
        (_posted(), ASKED, False, LATER, None),  # agree, not yet
        (_posted(expires_at=EARLIER), _posted(expires_at=EARLIER), True, EARLIER, None),
        (_posted(expires_at=YEAR_ONE), ASKED, False, LATER, "expires_at 0001-01-01T00:00:00Z"),
        (_posted(expires_at=None), ASKED, False, LATER, "expires_at None"),
        (_posted(expires_at=LATER), _posted(expires_at=EARLIER), True, EARLIER, "expires_at"),
        (_posted(action_id="b"), ASKED, False, LATER, "action_id 'b'"),
        (_posted(expires_at=YEAR_ONE), None, False, None, "never asked"),
    ],
)
def test_the_journal_decides_when_a_question_expires(
    posted: InteractionRequest,
    asked: InteractionRequest | None,
    expired: bool,
    at: datetime | None,
    problem: str | None,
) -> None:
    judged = judge_expiry(posted, asked, NOW)
    assert (judged.expired, judged.at) == (expired, at)
    if problem is None:
        assert judged.problem is None
    else:
        assert judged.problem is not None and problem in judged.problem
        assert "\n" not in judged.problem


def test_the_asked_record_is_found_from_the_end(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.append(EventType.RUN_START, {"run_id": "run", "task": "t", "agent_ref": "a"})
    j.append(
        EventType.HUMAN_INTERACTION, {"phase": "asked", "request": ASKED.model_dump(mode="json")}
    )
    other = _posted(request_id="S", expires_at=None)
    j.append(
        EventType.HUMAN_INTERACTION, {"phase": "asked", "request": other.model_dump(mode="json")}
    )
    assert asked_request(path, "R", block=64) == ASKED  # across blocks
    assert asked_request(path, "S") == other
    assert asked_request(path, "nope") is None
    assert asked_request(tmp_path / "missing.jsonl", "R") is None
