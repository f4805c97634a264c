"""Audit entries besides decisions and votes (deltad/inbox/auditnotes.py): refused answers,
recorded once by the answering path for every channel and bounded; hand-overs; reminders and
escalations sent; auditing switched off and on."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deltad.inbox import AnswerIn, audit, auditnotes, quorum
from deltad.inbox.ops import ApiError
from deltad.protocol.models import GatedCall
from deltad.testing.stub import paused_workspace


@pytest.fixture(autouse=True)
def _fresh_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auditnotes, "bound", auditnotes._Bound())


def _approval(ws: Path, required: int = 2) -> str:
    call = GatedCall(
        action_id="act_1", tool_name="deploy", arguments={"env": "prod"}, resolved_command="x"
    )
    paused_workspace(
        ws, "Approve?", input_type="approval", calls=[call], approvals_required=required
    )
    return str(json.loads((ws / ".delta/interaction/request.json").read_text())["request_id"])


def _body(decision: str = "approve", **extra: object) -> AnswerIn:
    return AnswerIn.parse({"decisions": [{"action_id": "act_1", "decision": decision, **extra}]})


def _entries(log: Path) -> list[dict[str, Any]]:
    assert audit.verify(audit.read_lines(log)).entries >= 0  # the chain holds
    return [json.loads(x) for x in audit.read_lines(log)]


def test_a_refused_vote_is_one_entry_with_its_code_channel_and_origin(tmp_path: Path) -> None:
    ws, log = tmp_path / "ws", tmp_path / "audit.jsonl"
    rid = _approval(ws)
    mail = {"from": "a@x", "message": "1.m1", "message_id": "<m1@x>"}
    quorum.cast(ws, rid, _body(), by="alice", channel="http", audit=log, origin={"token": "al"})
    for _ in range(3):  # a flood: the same person, the same refusal, one entry
        with pytest.raises(quorum.AlreadyVoted):
            quorum.cast(ws, rid, _body(), by="alice", channel="email", shown_as="a@x",
                        audit=log, origin=mail)  # fmt: skip
    entries = _entries(log)
    assert [e["kind"] for e in entries] == ["vote", "refused"]
    refused = entries[1]
    assert refused["code"] == "already_voted"
    assert (refused["channel"], refused["answered_by"], refused["voter"]) == (
        "email",
        "a@x",
        "alice",
    )
    assert refused["origin"] == mail
    assert refused["request_id"] == rid and refused["run_id"] and refused["workspace"]
    assert "already voted" in refused["reason"] and refused["at"]


def test_each_kind_of_refusal_of_the_answering_path_is_recorded(tmp_path: Path) -> None:
    """A misfit (a digest that is not the shown call's), a signed link under four eyes, and a
    question that is not (or no longer) the pending one: each its own code."""
    ws, log = tmp_path / "ws", tmp_path / "audit.jsonl"
    rid = _approval(ws)
    with pytest.raises(quorum.Misfit):
        quorum.cast(
            ws, rid, _body(digest="sha256:" + "0" * 64), by="bob", channel="http", audit=log
        )
    with pytest.raises(quorum.NoVoter):
        quorum.cast(ws, rid, _body(), by=None, shown_as="signed link", channel="link", audit=log)
    with pytest.raises(quorum.SubmitError):
        quorum.cast(ws, "q-stale", _body(), by="bob", channel="slack", audit=log)
    got = [(e["code"], e["channel"], e.get("answered_by")) for e in _entries(log)]
    assert got == [
        ("misfit", "http", "bob"),
        ("not_a_respondent", "link", "signed link"),
        ("unknown_request", "slack", "bob"),
    ]
    assert _entries(log)[2]["request_id"] == "q-stale" and "run_id" not in _entries(log)[2]


def test_a_secrets_refusal_keeps_no_reason(tmp_path: Path) -> None:
    ws, log = tmp_path / "ws", tmp_path / "audit.jsonl"
    paused_workspace(ws, "Password?", input_type="password")
    rid = str(json.loads((ws / ".delta/interaction/request.json").read_text())["request_id"])
    with pytest.raises(quorum.SubmitError):
        quorum.cast(ws, rid, AnswerIn.parse({"answer": ""}), by="bob", channel="http", audit=log)
    (entry,) = _entries(log)
    assert entry["kind"] == "refused" and "reason" not in entry
    assert "answer" not in json.dumps(entry["code"])


def test_no_log_no_entry(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    rid = _approval(ws)
    quorum.cast(ws, rid, _body(), by="alice", channel="http")
    with pytest.raises(quorum.AlreadyVoted):
        quorum.cast(ws, rid, _body(), by="alice", channel="http", audit=None)
    assert not (tmp_path / "audit.jsonl").exists()


def test_refusals_past_the_rate_cap_are_counted_in_the_next_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(auditnotes, "bound", auditnotes._Bound(clock=lambda: now[0]))
    monkeypatch.setattr(auditnotes, "REFUSED_PER_MINUTE", 2)
    ws, log = tmp_path / "ws", tmp_path / "audit.jsonl"
    _approval(ws)
    for n in range(5):  # five people refused: two recorded, three counted
        auditnotes.refused(log, ws, "q1", "not_a_respondent", "no", channel="http", by=f"p{n}")
    assert [e["answered_by"] for e in _entries(log)] == ["p0", "p1"]
    now[0] += 60
    auditnotes.refused(log, ws, "q1", "not_a_respondent", "no", channel="http", by="p9")
    last = _entries(log)[-1]
    assert (last["answered_by"], last["suppressed"]) == ("p9", 3)


def test_the_keys_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auditnotes, "SEEN_MAX", 3)
    b = auditnotes._Bound()
    for n in range(5):
        assert b.admit(("w", "q", f"p{n}", "c")) == 0
    assert b.admit(("w", "q", "p4", "c")) is None  # remembered
    assert b.admit(("w", "q", "p0", "c")) == 0  # forgotten: one more


def test_the_apis_own_refusals_are_recorded_once_too(tmp_path: Path) -> None:
    """`not_a_respondent` and MCP's `secret` are decided by the API before the answering path:
    its handler records them through the same bounded writer."""
    from deltad.inbox import handlers

    ws, log = tmp_path / "ws", tmp_path / "audit.jsonl"
    rid = _approval(ws)
    ctx: Any = SimpleNamespace(audit=log)
    e = ApiError(403, "not_a_respondent", "only alice may answer this question, not bob")
    for _ in range(2):
        handlers._refused(ctx, ws, rid, e, "http", "bob-laptop", "bob")
    (entry,) = _entries(log)
    assert (entry["code"], entry["answered_by"], entry["voter"], entry["origin"]) == (
        "not_a_respondent",
        "bob-laptop",
        "bob",
        {"token": "bob-laptop"},
    )


def test_a_hand_over_is_one_entry_with_from_and_to(tmp_path: Path) -> None:
    from deltad.inbox import delegation
    from deltad.inbox.respondents import Answerer
    from deltad.protocol import Workspace

    ws, log = tmp_path / "ws", tmp_path / "audit.jsonl"
    paused_workspace(ws, "Deploy?", input_type="yes_no", respondents=["alice"])
    rid = str(json.loads((ws / ".delta/interaction/request.json").read_text())["request_id"])
    w = Workspace.at(ws)
    known = {"alice", "bob", "carol"}
    delegation.delegate(w, rid, "bob", who=Answerer("alice"), known=known, note="on leave",
                        audit=log, origin={"token": "alice"})  # fmt: skip
    with pytest.raises(delegation.UnknownDelegate):  # refused: nothing written, no entry
        delegation.delegate(w, rid, "mallory", who=Answerer("bob"), known=known, audit=log)
    delegation.delegate(w, rid, "carol", who=Answerer("bob"), known=known, audit=log)
    entries = _entries(log)
    assert [(e["kind"], e["from"], e["to"], e["channel"]) for e in entries] == [
        ("handover", "alice", "bob", "http"),
        ("handover", "bob", "carol", "http"),
    ]
    assert entries[0]["note"] == "on leave" and entries[0]["origin"] == {"token": "alice"}
    assert entries[0]["request_id"] == rid and entries[0]["run_id"] and "note" not in entries[1]


def test_auditing_switched_off_and_on_is_said_once_each_in_the_chain(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    assert auditnotes.switched(log, enabled=False) is None  # no log: no gap to show
    assert not log.exists()
    auditnotes.append(log, {"kind": "decision", "at": "t", "channel": "http"})
    assert auditnotes.switched(log, enabled=True) is None  # on, as it was
    assert auditnotes.switched(log, enabled=False) is not None
    assert auditnotes.switched(log, enabled=False) is None  # a restart while off: nothing more
    assert auditnotes.switched(log, enabled=True) is not None
    assert auditnotes.switched(log, enabled=True) is None
    entries = _entries(log)
    assert [e["kind"] for e in entries] == ["decision", "audit_disabled", "audit_enabled"]
    assert entries[1]["what"] == {"audit.enabled": False} and entries[1]["channel"] == "daemon"
    assert audit.verify(audit.read_lines(log)).entries == 3


def test_the_switch_reads_the_last_entry_across_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    auditnotes.append(log, {"kind": "decision", "at": "t", "channel": "http"})
    auditnotes.switched(log, enabled=False)
    log.rename(tmp_path / "audit.jsonl.000000000002")  # moved aside, the next not begun
    assert auditnotes.switched(log, enabled=False) is None
    assert audit.last_entry(log) is not None
    assert auditnotes.switched(log, enabled=True) is not None  # goes on from the file aside
    assert json.loads(log.read_text())["seq"] == 3


def test_a_torn_log_is_not_written_to_by_the_switch(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_bytes(b'{"torn')
    assert auditnotes.switched(log, enabled=False) is None
    assert log.read_bytes() == b'{"torn'
