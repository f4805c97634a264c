"""The answering path in-process: one check, one atomic write, a compare-and-set."""

from __future__ import annotations

import os
import stat
from datetime import timedelta
from pathlib import Path

import pytest

from deltad import inbox
from deltad.inbox.trust import Owner, agent_problem, problem
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


def test_submit_refuses_an_answer_file_the_resume_would_not_read(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)  # a text question
    big = "x" * (inbox.answering.MAX_ANSWER_BYTES + 1)
    with pytest.raises(inbox.TooLarge, match="limit"):
        inbox.submit(ws, None, big)  # `delta respond TEXT`
    long_comment = inbox.AnswerIn(answer="ok", comment="c" * inbox.answering.MAX_ANSWER_BYTES)
    with pytest.raises(inbox.TooLarge):
        inbox.submit(ws, None, long_comment, channel="http")
    assert Mailbox(Workspace.at(ws)).answer_file() is None
    inbox.submit(ws, None, inbox.AnswerIn(answer="ok", comment="fine"), channel="http")


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


# -- reading an agent as the workspace's owner would -----------------------------------------------
def _st(kind: int, perm: int, uid: int, gid: int = 0) -> os.stat_result:
    return os.stat_result((kind | perm, 0, 0, 1, uid, gid, 0, 0, 0, 0))


DIR, FILE, LINK = stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK
BOB = Owner(1000, frozenset({1000}))


@pytest.mark.parametrize(
    ("st", "last", "directory", "why"),
    [
        (_st(DIR, 0o755, 0), False, True, None),  # /, /srv
        (_st(DIR, 0o1777, 0), False, True, None),  # /tmp: sticky keeps others' hands off
        (_st(DIR, 0o1777, 0), True, True, "writable by others"),  # the agent dir as /tmp
        (_st(DIR, 0o777, 0), False, True, "writable by others"),
        (_st(DIR, 0o775, 1000, 1000), True, True, "writable by others"),
        (_st(DIR, 0o700, 1000), True, True, None),
        (_st(DIR, 0o700, 0), True, True, "not readable"),  # root-only
        (_st(DIR, 0o711, 0), False, True, None),  # searchable parent
        (_st(DIR, 0o755, 2000), True, True, "owned by uid 2000"),  # someone else's
        (_st(LINK, 0o777, 1000), True, True, "symlink"),
        (_st(FILE, 0o600, 0), True, False, "not readable"),
        (_st(FILE, 0o640, 0, 1000), True, False, None),  # through the owner's group
        (_st(FILE, 0o644, 1000), True, False, None),
        (_st(FILE, 0o666, 1000), True, False, "writable by others"),
        (_st(DIR, 0o755, 1000), True, False, "not a regular file"),
    ],
)
def test_an_agent_path_is_read_only_as_its_owner_could(
    st: os.stat_result, last: bool, directory: bool, why: str | None
) -> None:
    got = problem(st, BOB, last=last, directory=directory)
    assert (got is None) if why is None else (got is not None and why in got)


def test_an_agent_through_a_symlink_or_in_a_shared_dir_is_not_read(tmp_path: Path) -> None:
    home = tmp_path / "agents" / "a"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("name: a\n")
    (home / "system_prompt.md").write_text("hi\n")
    uid = os.getuid()
    assert agent_problem(str(home), uid) is None
    (tmp_path / "link").symlink_to(home)
    assert "symlink" in str(agent_problem(str(tmp_path / "link"), uid))
    home.chmod(0o777)
    assert "writable by others" in str(agent_problem(str(home), uid))
