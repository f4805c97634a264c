"""The views' journal reader (protocol/viewing.py): bounded, tolerant and typed. Every view —
the API's run view and history, a finished run's outcome — reads through it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deltad.protocol.events import Answered, RunEnd, Thought
from deltad.protocol.viewing import event_of, naming, payload_of, tail


def _line(seq: int, type_: str, payload: dict[str, Any]) -> bytes:
    doc = {"seq": seq, "timestamp": "2030-01-01T00:00:00Z", "type": type_, "payload": payload}
    return json.dumps(doc).encode()


THOUGHT = _line(1, "THOUGHT", {"content": "hi"})
END = _line(2, "RUN_END", {"status": "COMPLETED", "reason": "done"})


@pytest.mark.parametrize(
    ("line", "typed_as"),
    [
        (THOUGHT, Thought),
        (END, RunEnd),
        (_line(3, "NEWER_EVENT", {"x": 1}), None),  # unknown: kept, not typed
        (_line(3, "RUN_END", {"status": "NOT_A_STATUS"}), None),  # misfit: kept, not typed
    ],
)
def test_an_event_line_is_typed_when_it_fits(line: bytes, typed_as: type[Any] | None) -> None:
    e = event_of(line)
    assert e is not None
    if typed_as is None:
        assert e.typed_payload is None and payload_of(e, RunEnd) is None
    else:
        assert isinstance(payload_of(e, typed_as), typed_as)
        assert payload_of(e, Answered) is None


@pytest.mark.parametrize(
    "line", [b"", b'{"seq": 4, "timest', b"[1, 2]", b'{"type": "RUN_END"}', b"[" * 100_000]
)
def test_what_is_not_an_event_is_none(line: bytes) -> None:
    assert event_of(line) is None


def test_the_tail_is_bounded_and_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    body = [_line(i, "THOUGHT", {"content": f"t{i}"}) for i in range(1, 101)]
    path.write_bytes(b"\n".join(body) + b"\n" + b'{"seq": 101, "timest')
    got = tail(path, 1 << 20, 10)
    assert [e.seq for e in got] == list(range(92, 101))  # the last 10 lines, one of them torn
    small = tail(path, 200, 50)  # a budget of bytes: the part line it begins in is dropped
    assert small and all(payload_of(e, Thought) for e in small) and small[-1].seq == 100
    assert tail(tmp_path / "missing.jsonl", 1 << 20, 10) == []


def test_naming_reads_only_the_lines_of_the_types_it_names(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(THOUGHT + b"\n" + END + b"\n" + b'{"seq": 3, "type": "RUN_END", "pay')
    got = list(naming(path, (b'"RUN_END"',)))
    assert [(e.seq, payload_of(e, RunEnd) is not None) for e in got] == [(2, True)]
