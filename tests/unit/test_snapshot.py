"""The journal's snapshot (deltad/protocol/snapshot.py): a resume reads only what is new, and a
snapshot that does not match the journal's bytes exactly is never believed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from deltad.engine.budget import Cut
from deltad.protocol import CorruptFile, EventType, Journal
from deltad.protocol.history import History
from deltad.protocol.snapshot import NAME, Snapshot, load, path_of


def _turn(j: Journal, i: int) -> None:
    cid = f"call_{i:04d}"
    call = {"id": cid, "type": "function", "function": {"name": "noop", "arguments": "{}"}}
    j.append(EventType.THOUGHT, {"content": f"step {i}", "tool_calls": [call]})
    j.append(EventType.ACTION_REQUEST, {"action_id": cid, "tool_name": "noop", "tool_args": {}})
    j.append(
        EventType.ACTION_RESULT,
        {"action_id": cid, "status": "SUCCESS", "observation_content": f"result {i}"},
    )


def _long_run(path: Path, turns: int = 30) -> Journal:
    """A run with pipeline steps, a question answered, a context cut and turns after it."""
    j = Journal(path)
    j.append(EventType.RUN_START, {"task": "t"})
    j.append(EventType.NODE_START, {"node": "plan", "kind": "codergen", "prompt": "Plan it"})
    _turn(j, 0)
    j.append(EventType.NODE_OUTCOME, {"node": "plan", "status": "success"})
    j.append(EventType.EDGE_TAKEN, {"source": "plan", "target": "build", "step": "weight"})
    j.append(EventType.NODE_START, {"node": "build", "kind": "codergen", "prompt": "Build it"})
    request = {
        "request_id": "req_1",
        "run_id": "r",
        "action_id": "call_0001",
        "input_type": "text",
        "prompt": "which?",
        "timestamp": "2026-11-23T10:00:00Z",
    }
    j.append(EventType.HUMAN_INTERACTION, {"phase": "asked", "request": request})
    j.append(
        EventType.HUMAN_INTERACTION,
        {
            "phase": "answered",
            "request_id": "req_1",
            "action_id": "call_0001",
            "reply": {"value": "this one"},
        },
    )
    for i in range(1, turns):
        _turn(j, i)
    through = j.events[-12].seq
    j.append(EventType.SYSTEM_MESSAGE, Cut(through, 20, {"noop": 20}, "left out").payload(99, 9))
    _turn(j, turns)
    return j


def _whole(path: Path) -> Journal:
    """The same journal read without its snapshot."""
    saved = path_of(path).read_bytes() if path_of(path).exists() else None
    path_of(path).unlink(missing_ok=True)
    try:
        j = Journal(path)
        assert j.restored_bytes == 0
        return j
    finally:
        if saved is not None:
            path_of(path).write_bytes(saved)


def _same(a: Journal, b: Journal) -> None:
    assert a.events == b.events
    assert a._offsets == b._offsets
    assert a.history.state() == b.history.state()
    assert a.next_seq == b.next_seq


def test_a_resume_reads_only_what_follows_the_snapshot_and_knows_the_same(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = _long_run(path)
    j.snapshot()
    size = path.stat().st_size
    again = Journal(path)
    assert again.restored_bytes == size  # nothing read twice
    _same(again, _whole(path))
    kinds = [e.type for e in again.events]
    assert kinds.count(EventType.NODE_START) == 2 and EventType.EDGE_TAKEN in kinds  # kept
    assert again.history.reply("req_1") is not None and "call_0000" in again.history.results

    # Events written after the snapshot (a crash before the next one) are read and checked.
    _turn(again, 99)
    again.append(EventType.RUN_END, {"status": "COMPLETED"})
    third = Journal(path)
    assert third.restored_bytes == size
    _same(third, _whole(path))
    assert third.history.ended() is not None and "call_0099" in third.history.call_ids

    # Its own snapshot moves forward; one with nothing new is not rewritten.
    third.snapshot()
    assert Journal(path).restored_bytes == path.stat().st_size
    before = path_of(path).stat().st_mtime_ns
    Journal(path).snapshot()
    assert path_of(path).stat().st_mtime_ns == before


def test_a_journal_that_is_not_the_snapshot_s_is_read_whole(tmp_path: Path) -> None:
    """Same length, one call id changed before the cut: the snapshot's digest no longer
    matches, so what the read model knows comes from the journal, not the stale snapshot."""
    path = tmp_path / "journal.jsonl"
    _long_run(path).snapshot()
    data = path.read_bytes()
    assert data.count(b"call_0003") == 3
    path.write_bytes(data.replace(b"call_0003", b"call_9993"))
    again = Journal(path)
    assert again.restored_bytes == 0
    assert "call_9993" in again.history.call_ids and "call_0003" not in again.history.call_ids


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: b"",
        lambda raw: b"{not json",
        lambda raw: raw[: len(raw) // 2],
        lambda raw: json.dumps({**json.loads(raw), "version": 99}).encode(),
        lambda raw: json.dumps({**json.loads(raw), "journal_bytes": 10**9}).encode(),
        lambda raw: json.dumps({**json.loads(raw), "tail_offset": 7}).encode(),  # mid-line
        lambda raw: json.dumps({**json.loads(raw), "kept_offsets": [3]}).encode(),
        lambda raw: json.dumps({**json.loads(raw), "kept_offsets": "x"}).encode(),
        lambda raw: json.dumps({**json.loads(raw), "history": {"started": True}}).encode(),
        lambda raw: json.dumps(
            {**json.loads(raw), "history": {**json.loads(raw)["history"], "results": [1, 2]}}
        ).encode(),
        lambda raw: json.dumps([1] * 3).encode(),
    ],
)
def test_a_damaged_snapshot_is_a_full_read_never_an_error(tmp_path: Path, damage: Any) -> None:
    path = tmp_path / "journal.jsonl"
    _long_run(path).snapshot()
    path_of(path).write_bytes(damage(path_of(path).read_bytes()))
    again = Journal(path)
    assert again.restored_bytes == 0
    _same(again, _whole(path))
    again.snapshot()  # and the next one is good again
    assert Journal(path).restored_bytes == path.stat().st_size


def test_a_snapshot_that_is_a_symlink_is_not_followed_and_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = _long_run(path)
    j.snapshot()
    real = tmp_path / "elsewhere.json"
    os.rename(path_of(path), real)
    os.symlink(real, path_of(path))
    again = Journal(path)
    assert again.restored_bytes == 0  # not read through the link
    _turn(again, 50)
    again.snapshot()
    assert not path_of(path).is_symlink() and real.read_bytes() != path_of(path).read_bytes()


def test_a_torn_tail_after_a_snapshot_is_set_aside_and_the_snapshot_still_serves(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.jsonl"
    _long_run(path).snapshot()
    size = path.stat().st_size
    with path.open("ab") as f:
        f.write(b'{"seq": 999, "timest')  # a crash mid-append
    again = Journal(path)
    assert again.restored_bytes == size
    assert [p.name for p in tmp_path.iterdir() if ".torn-" in p.name]
    assert again.events[-1].type == EventType.SYSTEM_MESSAGE  # the note that says so
    _same(Journal(path), _whole(path))


def test_the_read_model_round_trips_through_its_state(tmp_path: Path) -> None:
    j = _long_run(tmp_path / "journal.jsonl")
    state = j.history.state()
    assert History.restored(json.loads(json.dumps(state))).state() == state
    with pytest.raises((KeyError, TypeError, ValueError)):
        History.restored({**state, "asked_requests": [{"prompt": 3}]})


def test_the_snapshot_is_compact_and_lives_beside_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    _long_run(path).snapshot()
    ck = load(path)
    assert isinstance(ck, Snapshot) and path_of(path) == tmp_path / NAME
    assert ck.journal_bytes == path.stat().st_size and b"\n" not in path_of(path).read_bytes()[:-1]
    assert 0 < ck.tail_offset < ck.journal_bytes and len(ck.kept_offsets) == 4


def test_a_snapshot_written_before_unknown_types_were_refused_does_not_hide_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal.jsonl"
    _long_run(path).snapshot()
    lines = path.read_bytes().splitlines(keepends=True)
    unknown = b'{"seq":2,"timestamp":"2026-01-01T00:00:00Z","type":"HUMAN_NOTE","payload":{}}\n'
    path.write_bytes(b"".join([lines[0], unknown, *lines[1:]]))
    path_of(path).unlink()
    # What a version that skipped unknown types left: a snapshot whose prefix covers the line.
    with monkeypatch.context() as m:
        m.setattr("deltad.protocol.journal._known", lambda *_: None)
        Journal(path).snapshot()
    old = json.loads(path_of(path).read_bytes())
    path_of(path).write_text(json.dumps(old | {"version": 1}))

    with pytest.raises(CorruptFile, match=r"journal\.jsonl:2: unknown event type 'HUMAN_NOTE'"):
        Journal(path)
