"""Journal events are read as typed payloads (protocol/events.py): the model the reader made
when it checked the line is the one consumers get, so they read fields, not dict keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from deltad.protocol import EventType, JournalEvent, read_journal
from deltad.protocol.events import ActionResult, Thought, typed


def _journal(tmp_path: Path) -> Path:
    lines = [
        {"seq": 1, "timestamp": "2030-01-01T00:00:00Z", "type": "THOUGHT",
         "payload": {"content": "hi", "tool_calls": [
             {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}},
        {"seq": 2, "timestamp": "2030-01-01T00:00:01Z", "type": "ACTION_RESULT",
         "payload": {"action_id": "c1", "status": "SUCCESS", "observation_content": "a b"}},
    ]  # fmt: skip
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_the_reader_s_checked_model_is_what_consumers_get(tmp_path: Path) -> None:
    thought, result = read_journal(_journal(tmp_path)).events
    made = typed(thought, Thought)
    assert made is thought.typed_payload  # not parsed a second time
    assert made.content == "hi" and [c.function.name for c in made.tool_calls] == ["ls"]
    res = typed(result, ActionResult)
    assert (res.action_id, res.observation_content) == ("c1", "a b")


def test_an_event_made_in_memory_is_typed_once_and_kept() -> None:
    e = JournalEvent(seq=1, timestamp="2030-01-01T00:00:00Z", type=EventType.THOUGHT, payload={})
    assert typed(e, Thought) is typed(e, Thought)
    assert e == JournalEvent.model_validate(e.model_dump())  # the kept model is not compared


def test_a_payload_that_does_not_fit_is_an_error_not_a_key_error() -> None:
    e = JournalEvent(seq=1, timestamp="2030-01-01T00:00:00Z", type="ACTION_RESULT", payload={})
    with pytest.raises(ValidationError):
        typed(e, ActionResult)
