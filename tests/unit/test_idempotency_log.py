"""Idempotency-Key records in the state dir (deltad/inbox/idempotency.py): a new `Idempotency`
on the same state dir is a restarted daemon."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from deltad.inbox import idempotency
from deltad.inbox.context import Idempotency
from deltad.inbox.ops import ApiError

DOC = {"status": "accepted", "request_id": "q1", "workspace": "/ws/a", "run_id": "r1"}


def test_a_key_answers_the_same_after_a_restart(tmp_path: Path) -> None:
    Idempotency(tmp_path).remember("ann", "k1", "q1", "digest-1", DOC)
    again = Idempotency(tmp_path)
    assert again.seen("ann", "k1", "q1", None, "digest-1") == DOC
    assert again.seen("ann", "k1", "q1", Path("/ws/b"), "digest-1") is None  # another question
    assert again.seen("bob", "k1", "q1", None, "digest-1") is None  # keyed per token
    with pytest.raises(ApiError) as e:
        again.seen("ann", "k1", "q1", None, "digest-2")
    assert e.value.code == "idempotency_mismatch"
    path = tmp_path / idempotency.FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "digest-1" not in path.read_text()  # sealed with the file's salt


def test_records_live_their_lifetime_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_000_000.0]
    monkeypatch.setattr(idempotency.time, "time", lambda: now[0])
    monkeypatch.setattr("deltad.inbox.context.time.time", lambda: now[0])
    Idempotency(tmp_path).remember("ann", "k1", "q1", "d", DOC)
    now[0] += idempotency.TTL_SECONDS - 1
    assert Idempotency(tmp_path).seen("ann", "k1", "q1", None, "d") == DOC
    now[0] += 2
    assert Idempotency(tmp_path).seen("ann", "k1", "q1", None, "d") is None


def test_the_file_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idempotency, "MAX_KEYS", 5)
    monkeypatch.setattr(idempotency.KeyLog.__init__, "__defaults__", (idempotency.TTL_SECONDS, 5))
    keys = Idempotency(tmp_path)
    for i in range(300):
        keys.remember("ann", f"k{i}", "q1", "d", DOC)
    lines = (tmp_path / idempotency.FILE).read_text().splitlines()
    assert len(lines) <= 2 * 5 + 100 + 1
    again = Idempotency(tmp_path)
    assert again.seen("ann", "k299", "q1", None, "d") == DOC
    assert again.seen("ann", "k0", "q1", None, "d") is None  # the oldest went first


def test_a_torn_line_is_skipped(tmp_path: Path) -> None:
    Idempotency(tmp_path).remember("ann", "k1", "q1", "d", DOC)
    with open(tmp_path / idempotency.FILE, "a") as f:
        f.write('{"k": ["ann", "k2"')  # a power cut mid-line
    assert Idempotency(tmp_path).seen("ann", "k1", "q1", None, "d") == DOC
