"""Decisions only the daemon can sign (protocol/seal.py, inbox/sealing.py): the rule from a
table, the key file, and the answering path sealing (or refusing) what it writes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deltad.inbox import answering
from deltad.inbox.answer_body import AlreadyAnswered, AnswerIn, Unsigned
from deltad.inbox.sealing import KeyProblem, Sealer, load_or_create, problem_of
from deltad.protocol import InputType, InteractionRequest, Mailbox, Workspace, iso, utcnow
from deltad.protocol.models import GatedCall
from deltad.protocol.questions import interpret_json
from deltad.protocol.replies import Reply
from deltad.protocol.seal import BadKey, gated, parse_keys, problem, trusted_keys
from deltad.testing.stub import paused_workspace

KEY = Sealer.of(Ed25519PrivateKey.generate())
OTHER = Sealer.of(Ed25519PrivateKey.generate())

APPROVAL = InteractionRequest(
    prompt="Approve 1 tool call(s): deploy?",
    input_type=InputType.APPROVAL,
    run_id="r1",
    action_id="d1",
    calls=[GatedCall(action_id="d1", tool_name="deploy", arguments={"env": "prod"})],
    respondents=["alice"],
)
SECRET = InteractionRequest(
    prompt="token?", input_type=InputType.PASSWORD, run_id="r1", action_id="s1", respondents=["a"]
)
APPROVE = {
    "request_id": APPROVAL.request_id,
    "decisions": [{"action_id": "d1", "decision": "approve"}],
}
REJECT = {
    "request_id": APPROVAL.request_id,
    "decisions": [{"action_id": "d1", "decision": "reject"}],
}


def _reply(req: InteractionRequest, doc: dict[str, Any], by: Sealer | None = KEY) -> Reply:
    """`response.json` as the mailbox reads it, sealed by `by` (None: not sealed)."""
    if by is not None:
        doc = {**doc, "seal": by.seal(req, doc)}
    return interpret_json(req, json.dumps(doc))


def _swap(reply: Reply, statement: dict[str, Any]) -> Reply:
    assert reply.seal is not None
    return reply.model_copy(update={"seal": {**reply.seal, "statement": statement}})


@pytest.mark.parametrize(
    ("req", "respondents", "approvals", "owner_may", "expect"),
    [
        ("plain", [], 1, True, False),
        ("named", ["alice"], 1, True, True),
        ("four eyes", [], 2, True, True),
        ("not the owner", [], 1, False, True),
    ],
)
def test_which_questions_are_gated(
    req: str, respondents: list[str], approvals: int, owner_may: bool, expect: bool
) -> None:
    q = InteractionRequest(
        prompt=req,
        run_id="r",
        action_id="a",
        respondents=respondents,
        approvals_required=approvals,
        owner_may_approve=owner_may,
    )
    assert gated(q) is expect


def test_a_sealed_answer_counts() -> None:
    assert problem(APPROVAL, _reply(APPROVAL, APPROVE), [KEY.public]) is None
    # with the key among others (a rotation: the old key still trusted)
    assert problem(APPROVAL, _reply(APPROVAL, APPROVE), [OTHER.public, KEY.public]) is None


@pytest.mark.parametrize(
    ("case", "make", "keys", "says"),
    [
        ("unsigned", lambda: _reply(APPROVAL, APPROVE, by=None), [KEY], "not signed by deltad"),
        ("another key", lambda: _reply(APPROVAL, APPROVE, by=OTHER), [KEY], "does not verify"),
        ("no key known", lambda: _reply(APPROVAL, APPROVE), [], "public key is not known"),
        (
            "statement edited",  # the agent turns a signed rejection into an approval
            lambda: _swap(_reply(APPROVAL, REJECT), APPROVE),
            [KEY],
            "does not verify",
        ),
        (
            "reply is not the statement",  # a journal line saying approve, a real seal of reject
            lambda: _reply(APPROVAL, APPROVE).model_copy(
                update={"seal": _reply(APPROVAL, REJECT).seal}
            ),
            [KEY],
            "not the one deltad signed",
        ),
        (
            "another question's seal",
            lambda: _swap(_reply(APPROVAL, APPROVE), {**APPROVE, "request_id": "other"}),
            [KEY],
            "for another question",
        ),
        (
            "damaged seal",
            lambda: _reply(APPROVAL, APPROVE).model_copy(update={"seal": {"sig": 3}}),
            [KEY],
            "damaged",
        ),
        (
            "signature not base64",
            lambda: _reply(APPROVAL, APPROVE).model_copy(
                update={"seal": {**(_reply(APPROVAL, APPROVE).seal or {}), "sig": "!!"}}
            ),
            [KEY],
            "does not verify",
        ),
        (
            "a timeout that approves",
            lambda: Reply(outcome="timeout", decisions=_reply(APPROVAL, APPROVE).decisions),
            [KEY],
            "not the rule's",
        ),
        (
            "a skip that decides",
            lambda: Reply(outcome="skipped", decisions=_reply(APPROVAL, APPROVE).decisions),
            [KEY],
            "a skip that decides",
        ),
    ],
)
def test_what_does_not_count(case: str, make: Any, keys: list[Sealer], says: str) -> None:
    why = problem(APPROVAL, make(), [k.public for k in keys])
    assert why is not None and says in why, (case, why)


def test_a_timeout_by_the_rule_and_a_skip_count_unsigned() -> None:
    from deltad.protocol.kinds import on_timeout

    assert problem(APPROVAL, on_timeout(APPROVAL), [KEY.public]) is None
    assert problem(APPROVAL, Reply(outcome="skipped"), [KEY.public]) is None


def test_a_secrets_seal_keeps_no_secret_and_still_counts() -> None:
    reply = _reply(SECRET, {"request_id": SECRET.request_id, "answer": "hunter2"})
    assert reply.seal is not None and reply.seal["statement"]["answer"] is None
    assert "hunter2" not in json.dumps(reply.seal)
    assert problem(SECRET, reply, [KEY.public]) is None


def test_keys_from_the_environment() -> None:
    text = f"{KEY.public_text}, {OTHER.public_text}"
    assert trusted_keys({"DELTA_DECISION_KEYS": text}) == [KEY.public, OTHER.public]
    assert trusted_keys({"DELTA_DECISION_KEYS": ""}) == []
    for bad in ("rsa:AAAA", "ed25519:!!", "ed25519:AAAA"):
        with pytest.raises(BadKey):
            parse_keys(bad)


# -- the key file ------------------------------------------------------------------------------
def test_the_key_is_made_once_private_with_its_public_half(tmp_path: Path) -> None:
    path = tmp_path / "state" / "decision-key"
    made = load_or_create(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert (tmp_path / "state" / "decision-key.pub").read_text() == made.public_text + "\n"
    again = load_or_create(path)
    assert again.public == made.public and problem_of(path) is None


@pytest.mark.parametrize("flaw", ["readable by others", "a symlink", "not a key"])
def test_a_key_file_that_cannot_be_trusted_is_refused(tmp_path: Path, flaw: str) -> None:
    path = tmp_path / "decision-key"
    load_or_create(tmp_path / "real")
    if flaw == "readable by others":
        load_or_create(path)
        path.chmod(0o644)
    elif flaw == "a symlink":
        path.symlink_to(tmp_path / "real")
    else:
        path.write_text("hello")
        path.chmod(0o600)
    why = problem_of(path)
    assert why is not None and why.startswith(f"decision key {path}: ")
    with pytest.raises(KeyProblem):
        load_or_create(path)


# -- the answering path -------------------------------------------------------------------------
def _gated_workspace(tmp_path: Path) -> tuple[Workspace, str]:
    paused_workspace(tmp_path / "ws", prompt="Deploy?", input_type="yes_no", respondents=["a"])
    ws = Workspace.at(tmp_path / "ws")
    req = Mailbox(ws).read_request()
    assert req is not None
    return ws, req.request_id


def test_the_core_seals_what_it_writes(tmp_path: Path, decision_key: Sealer) -> None:
    ws, rid = _gated_workspace(tmp_path)
    answering.submit(ws, rid, AnswerIn(answer="yes"), answered_by="alice", channel="http")
    doc = json.loads(ws.response_json.read_text())
    req = Mailbox(ws).read_request()
    assert req is not None
    reply = interpret_json(req, json.dumps(doc))
    assert problem(req, reply, [decision_key.public]) is None
    assert problem(req, reply, [KEY.public]) is not None  # this key, no other


def test_where_nothing_can_sign_a_gated_answer_is_refused_before_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answering, "sealer", None)  # `delta respond`, as the owner
    ws, rid = _gated_workspace(tmp_path)
    with pytest.raises(Unsigned, match="answered through deltad's inbox"):
        answering.submit(ws, rid, AnswerIn(answer="yes"), answered_by="me", channel="cli")
    with pytest.raises(Unsigned):
        answering.submit(ws, rid, "yes")
    assert Mailbox(ws).answer_file() is None


def test_a_journal_line_the_daemon_did_not_seal_leaves_the_question_open(
    tmp_path: Path, decision_key: Sealer
) -> None:
    ws, rid = _gated_workspace(tmp_path)
    req = Mailbox(ws).read_request()
    assert req is not None
    journal = ws.run(req.run_id).journal

    def append(reply: Reply) -> None:
        payload = {"phase": "answered", "request_id": rid, "action_id": "act_1"}
        line = {"seq": 99, "timestamp": iso(utcnow()), "type": "HUMAN_INTERACTION"}
        line["payload"] = {**payload, "reply": reply.model_dump(mode="json")}
        with journal.open("a") as f:
            f.write(json.dumps(line) + "\n")

    append(Reply(value="yes", source="mailbox"))  # what an agent's tool could append
    assert answering.open_question(ws, rid).request_id == rid  # still open to people
    doc = {"request_id": rid, "answer": "yes", "answered_by": "alice", "channel": "http"}
    append(interpret_json(req, json.dumps({**doc, "seal": decision_key.seal(req, doc)})))
    with pytest.raises(AlreadyAnswered):
        answering.open_question(ws, rid)


def test_a_vote_written_into_the_votes_file_counts_for_nobody(tmp_path: Path) -> None:
    """Four eyes' record (approvals.json) is the core's and signed: a vote an agent's tool
    wrote into it beside the question is not counted, so one person's vote answers nothing."""
    from deltad.inbox import quorum
    from deltad.inbox.ballots import path_of

    paused_workspace(tmp_path / "ws", prompt="Ship?", input_type="yes_no", approvals_required=2)
    ws = Workspace.at(tmp_path / "ws")
    req = Mailbox(ws).read_request()
    assert req is not None
    forged = {
        "request_id": req.request_id,
        "required": 2,
        "votes": [
            {"by": "bob", "channel": "http", "at": iso(utcnow()), "verdict": "answer",
             "agree": '"yes"', "answer": {"answer": "yes"}},
        ],
    }  # fmt: skip
    path_of(ws).write_text(json.dumps(forged))
    done = quorum.cast(ws, req.request_id, AnswerIn(answer="yes"), by="alice", channel="http")
    assert done.outcome == "pending" and done.submitted is None
    assert done.approvals is not None and [v["by"] for v in done.approvals["given"]] == ["alice"]
    assert Mailbox(ws).answer_file() is None
    assert "seal" in json.loads(path_of(ws).read_text())  # what the core wrote, it signed
