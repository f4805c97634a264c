"""The answering path in-process: one check, one atomic write, a compare-and-set."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from deltad import inbox
from deltad.protocol import EventType, InputType, InteractionRequest, Journal, Mailbox, Workspace
from deltad.protocol.accelerators import build_options
from deltad.protocol.models import utcnow
from deltad.testing.stub import paused_workspace


def _choice(ws: Path) -> InteractionRequest:
    paused_workspace(ws)
    w = Workspace.at(ws)
    req = InteractionRequest(
        prompt="Channel?",
        input_type=InputType.CHOICE,
        options=build_options(["[S] stable", "[B] beta"]),
        run_id=w.latest_run_id() or "",
        action_id="q",
    )
    Mailbox(w).post(req)
    return req


def test_pending_shows_the_question_with_its_run(tmp_path: Path) -> None:
    req = _choice(tmp_path / "ws")
    p = inbox.pending(tmp_path / "ws")
    assert p is not None and p.request.request_id == req.request_id
    assert p.task == "benchmark task" and not p.answer_waiting


def test_submit_checks_then_writes_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    req = _choice(ws)
    with pytest.raises(inbox.Misfit, match="not one of the options"):
        inbox.submit(ws, req.request_id, inbox.AnswerIn(answer="nightly"), channel="http")
    assert Mailbox(Workspace.at(ws)).answer_file() is None  # nothing written
    done = inbox.submit(
        ws, req.request_id, inbox.AnswerIn(answer="b"), answered_by="ann", channel="http"
    )
    assert done.path.name == "response.json"
    with pytest.raises(inbox.AnswerWaiting):  # the second of two racing answers
        inbox.submit(ws, req.request_id, inbox.AnswerIn(answer="s"), channel="http")
    inbox.submit(ws, req.request_id, inbox.AnswerIn(answer="s"), channel="http", force=True)


def test_submit_is_a_compare_and_set_on_the_request(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _choice(ws)
    with pytest.raises(inbox.NotPending):
        inbox.submit(ws, "not-this-one", inbox.AnswerIn(answer="b"))


def test_an_expired_question_cannot_be_answered(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    req = _choice(ws)
    req.expires_at = utcnow() - timedelta(seconds=1)
    Mailbox(Workspace.at(ws)).post(req)
    with pytest.raises(inbox.Expired):
        inbox.submit(ws, req.request_id, inbox.AnswerIn(answer="b"))


def test_a_question_the_journal_answered_is_closed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    req = _choice(ws)
    journal = Journal(Workspace.at(ws).run(req.run_id).journal)
    journal.append(
        EventType.HUMAN_INTERACTION, {"phase": "asked", "request": req.model_dump(mode="json")}
    )
    journal.append(
        EventType.HUMAN_INTERACTION,
        {
            "phase": "answered",
            "request_id": req.request_id,
            "action_id": "q",
            "reply": {"value": "beta"},
        },
    )
    with pytest.raises(inbox.AlreadyAnswered):
        inbox.submit(ws, req.request_id, inbox.AnswerIn(answer="b"))


def test_a_bad_document_is_a_misfit_not_a_traceback() -> None:
    with pytest.raises(inbox.Misfit):
        inbox.AnswerIn.parse({"decisions": [{"action_id": "x", "decision": "maybe"}]})
