"""Four eyes' rule, from a table: what a vote does to a question needing N agreeing votes
(deltad/inbox/quorum.py `decide`, pure); and the shell on a real workspace without a daemon:
votes bound to the call's digest, kept beside the question, the answer written once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deltad.agent import ApprovalPolicy
from deltad.inbox import AnswerIn, Misfit, ballots, quorum
from deltad.inbox.quorum import Decided, Pending, Refused, Vote
from deltad.protocol import Workspace
from deltad.protocol.models import GatedCall, InteractionRequest, Option
from deltad.testing.stub import paused_workspace

A = '[["act_1","approve","sha256:aa"]]'  # an approval of the call as shown
OPTIONS = [Option(key="a", label="Apple"), Option(key="p", label="Pear")]
E = '[["act_1","edit","sha256:ee"]]'  # an edit: another digest


def v(by: str, verdict: str = "approve", agree: str = A) -> Vote:
    return Vote(by=by, channel="http", at="t", verdict=verdict, agree=agree, answer={})  # type: ignore[arg-type]


CASES = [
    # (required, votes before, the new vote, owner, owner_may_approve) -> outcome, who decided
    (2, [], v("alice"), None, True, "pending", []),
    (2, [v("alice")], v("bob"), None, True, "decided", ["alice", "bob"]),
    (3, [v("alice")], v("bob"), None, True, "pending", []),
    (2, [v("alice")], v("alice"), None, True, "already_voted", []),  # the same person twice
    (2, [v("alice")], v("alice", "reject", "x"), None, True, "already_voted", []),
    (2, [v("alice")], v("bob", "reject", "x"), None, True, "decided", ["bob"]),  # fail closed
    (2, [], v("bob", "reject", "x"), None, True, "decided", ["bob"]),
    (2, [v("alice")], v("bob", agree=E), None, True, "pending", []),  # another digest
    (2, [v("alice", agree=E)], v("bob", agree=E), None, True, "decided", ["alice", "bob"]),
    (2, [v("alice", agree=E), v("carol")], v("bob"), None, True, "decided", ["carol", "bob"]),
    # choices: the same option, or wait
    (2, [v("alice", "answer", "p")], v("bob", "answer", "a"), None, True, "pending", []),
    (
        2,
        [v("alice", "answer", "p"), v("bob", "answer", "a")],
        v("carol", "answer", "p"),
        None,
        True,
        "decided",
        ["alice", "carol"],
    ),
    # the owner
    (2, [], v("olga"), "olga", False, "owner_may_not_approve", []),
    (2, [], v("olga", "answer", "p"), "olga", False, "owner_may_not_approve", []),
    (2, [v("alice")], v("olga", "reject", "x"), "olga", False, "decided", ["olga"]),  # may stop
    (2, [v("alice")], v("olga"), "olga", True, "decided", ["alice", "olga"]),
    (2, [v("alice")], v("bob"), "olga", False, "decided", ["alice", "bob"]),
]


@pytest.mark.parametrize(("required", "votes", "new", "owner", "owner_may", "outcome", "by"), CASES)
def test_what_a_vote_does(
    required: int,
    votes: list[Vote],
    new: Vote,
    owner: str | None,
    owner_may: bool,
    outcome: str,
    by: list[str],
) -> None:
    got = quorum.decide(required, votes, new, owner=owner, owner_may_approve=owner_may)
    if isinstance(got, Refused):
        assert got.error.code == outcome
    elif isinstance(got, Pending):
        assert outcome == "pending"
        assert [x.by for x in got.votes] == [*(x.by for x in votes), new.by]
    else:
        assert isinstance(got, Decided)
        assert outcome == "decided"
        assert [x.by for x in got.by] == by
        assert got.answer == new  # the completing vote's answer is written


def test_votes_are_capped() -> None:
    many = [v(f"p{i}", "answer", str(i)) for i in range(ballots.MAX_VOTES)]
    got = quorum.decide(10, many, v("late", "answer", "x"), owner=None, owner_may_approve=True)
    assert isinstance(got, Refused) and got.error.code == "already_voted"


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        ({"approvals_required": 0}, "greater than or equal to 1"),
        ({"approvals_required": 11}, "less than or equal to 10"),
        ({"approvals_required": "two"}, "valid integer"),
        ({"owner_may_aprove": False}, "Extra inputs"),
    ],
)
def test_the_agents_policy_is_checked(policy: dict[str, object], error: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=error):
        ApprovalPolicy.model_validate(policy)


def _approval(ws: Path, required: int = 2) -> str:
    call = GatedCall(
        action_id="act_1", tool_name="deploy", arguments={"env": "prod"}, resolved_command="x"
    )
    paused_workspace(
        ws, "Approve?", input_type="approval", calls=[call], approvals_required=required
    )
    return _rid(ws)


def _rid(ws: Path) -> str:
    return str(json.loads((ws / ".delta/interaction/request.json").read_text())["request_id"])


def _body(decision: str = "approve", **extra: object) -> AnswerIn:
    return AnswerIn.parse({"decisions": [{"action_id": "act_1", "decision": decision, **extra}]})


def test_two_votes_write_the_answer_once_naming_both(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    rid = _approval(ws)
    first = quorum.cast(ws, rid, _body(), by="alice", channel="http")
    assert first.outcome == "pending" and first.submitted is None
    assert not (ws / ".delta/interaction/response.json").exists()
    rec = ballots.read(Workspace.at(ws), rid)
    assert rec is not None and [x.by for x in rec.votes] == ["alice"]
    assert rec.votes[0].answer["decisions"][0]["digest"].startswith("sha256:")
    with pytest.raises(quorum.AlreadyVoted):
        quorum.cast(ws, rid, _body(), by="alice", channel="http")
    done = quorum.cast(ws, rid, _body(), by="bob", channel="http")
    assert done.outcome == "answered" and done.submitted is not None
    answer = json.loads((ws / ".delta/interaction/response.json").read_text())
    assert answer["answered_by"] == "alice, bob"
    assert [a["by"] for a in answer["approvals"]] == ["alice", "bob"]
    assert answer["decisions"][0]["decision"] == "approve"


def test_a_vote_for_another_digest_is_refused_and_an_edit_waits_for_its_twin(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    rid = _approval(ws)
    with pytest.raises(Misfit, match="changed since it was shown"):
        quorum.cast(ws, rid, _body(digest="sha256:" + "0" * 64), by="alice", channel="http")
    edit = _body("edit", arguments={"env": "staging"})
    assert quorum.cast(ws, rid, edit, by="alice", channel="http").outcome == "pending"
    assert quorum.cast(ws, rid, _body(), by="bob", channel="http").outcome == "pending"
    done = quorum.cast(ws, rid, edit, by="carol", channel="http")
    assert done.outcome == "answered"
    answer = json.loads((ws / ".delta/interaction/response.json").read_text())
    assert answer["answered_by"] == "alice, carol"
    assert answer["decisions"][0]["arguments"] == {"env": "staging"}


def test_a_signed_link_cannot_vote_and_a_secret_is_never_voted_on(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    rid = _approval(ws)
    with pytest.raises(quorum.NoVoter):
        quorum.cast(ws, rid, _body(), by=None, channel="link")
    secret = tmp_path / "secret"
    paused_workspace(secret, "Password?", input_type="password", approvals_required=2)
    done = quorum.cast(
        secret, _rid(secret), AnswerIn.parse({"answer": "hunter2"}), by="a", channel="http"
    )
    assert done.outcome == "answered" and done.approvals is None
    assert not (secret / ".delta/interaction" / ballots.FILE).exists()


def test_a_record_about_another_question_or_damaged_counts_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    rid = _approval(ws)
    quorum.cast(ws, rid, _body(), by="alice", channel="http")
    path = ws / ".delta/interaction" / ballots.FILE
    assert ballots.read(Workspace.at(ws), "another") is None
    path.write_text("{not json")
    assert ballots.read(Workspace.at(ws), rid) is None
    # the next vote starts afresh: one vote, still pending
    assert quorum.cast(ws, rid, _body(), by="bob", channel="http").outcome == "pending"


def test_a_question_file_with_a_bad_quorum_is_refused() -> None:
    with pytest.raises(ValueError, match="approvals_required"):
        InteractionRequest(prompt="q", run_id="r", action_id="a", approvals_required=0)
    choice = InteractionRequest(
        prompt="q",
        run_id="r",
        action_id="a",
        input_type="choice",
        options=[Option(key="p", label="Pear")],
        approvals_required=2,
    )
    assert ballots.shown(choice, None) == {"required": 2, "owner_may_approve": True, "given": []}


def test_an_agent_with_a_bad_quorum_is_one_line(tmp_path: Path) -> None:
    from deltad.agent import load_agent
    from deltad.errors import UsageError

    from ..conftest import write_agent

    home = write_agent(tmp_path, extra="approval:\n  default: required\n  approvals_required: 0\n")
    with pytest.raises(UsageError) as e:
        load_agent(str(home))
    assert "approvals_required" in str(e.value) and "\n" not in str(e.value)
    fine = write_agent(
        tmp_path,
        name="ok",
        extra="approval:\n  default: required\n  approvals_required: 2\n"
        "  owner_may_approve: false\n",
    )
    policy = load_agent(str(fine)).config.approval
    assert policy is not None and (policy.approvals_required, policy.owner_may_approve) == (
        2,
        False,
    )


def test_a_votes_receipt_names_the_voter_and_the_quorum(tmp_path: Path) -> None:
    from deltad.inbox.receipts import vote_receipt

    ws = tmp_path / "ws"
    rid = _approval(ws)
    done = quorum.cast(ws, rid, _body(), by="alice", channel="http")
    assert done.approvals is not None
    vote = _body().model_dump(exclude_none=True, mode="json")
    got = vote_receipt(ws, done.request, "alice", "http", vote, done.approvals, done.outcome)
    assert (got["kind"], got["answered_by"], got["request_id"]) == ("vote", "alice", rid)
    assert got["quorum"] == {"required": 2, "given": ["alice"], "outcome": "pending"}
    [d] = got["what"]["decisions"]
    assert (d["decision"], d["tool_name"]) == ("approve", "deploy")
    assert d["digest"].startswith("sha256:")


@pytest.mark.parametrize(
    ("attr", "required", "problem"),
    [
        ("", 1, None),
        ('approvals_required="2"', 2, None),
        ('approvals_required="0"', 1, "from 1 to 10"),
        ('approvals_required="two"', 1, "from 1 to 10"),
        ('approvals_required="11"', 1, "from 1 to 10"),
    ],
)
def test_a_pipeline_gate_may_ask_several(attr: str, required: int, problem: str | None) -> None:
    from deltad.pipeline.nodes import gate_request

    from .test_pipeline_gates import gate_with

    g = gate_with("[A] Approve", "[R] Revise", attrs=attr)
    assert g.approvals_required == required
    if problem is None:
        assert not g.problems
        assert gate_request(g, "run", "g@1").approvals_required == required
    else:
        assert problem in g.problems[0].message


def test_a_channels_reply_is_a_vote_by_its_sender(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws, "Fruit?", input_type="choice", options=OPTIONS, approvals_required=2)
    pear = AnswerIn.parse({"answer": "p"})
    assert quorum.answer_or_vote(ws, None, pear, answered_by="a@x", channel="email") is None
    done = quorum.answer_or_vote(ws, None, pear, answered_by="b@x", channel="email")
    assert done is not None
    answer = json.loads((ws / ".delta/interaction/response.json").read_text())
    assert (answer["answered_by"], answer["channel"]) == ("a@x, b@x", "email")


def test_every_channels_vote_is_one_receipt_with_its_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channels' answering path (the hub's `voting`) and the API's (`handlers.submit`)
    both write a vote's receipt through `quorum.cast`: one entry per vote, in the order they
    were counted, with its channel, voter and origin, and one `approval_vote` line each."""
    from deltad.inbox import audit, handlers
    from deltad.outbound.hub import voting

    lines: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(quorum.log, "info", lambda event, **kw: lines.append((event, kw)))
    ws, log = tmp_path / "ws", tmp_path / "audit.jsonl"
    rid = _approval(ws, required=3)
    answer = voting(log)
    mail = {"from": "a@x", "message": "1.m1", "message_id": "<m1@x>"}
    got = answer(ws, rid, _body(), answered_by="a@x", channel="email", voter="alice", origin=mail)
    assert got is None  # a vote, the question waits
    click = {"user": "U0BOB", "conversation": "C1", "message_ts": "1700000000.000100"}
    assert answer(ws, rid, _body(), answered_by="U0BOB", channel="slack", voter="bob",
                  origin=click) is None  # fmt: skip
    receipt = handlers.submit(ws, rid, _body(), "carol-laptop", "mcp", audit=log, voter="carol")
    assert receipt.answered is True
    entries = [json.loads(x) for x in audit.read_lines(log)]
    assert audit.verify(audit.read_lines(log)).entries == 3
    assert [(e["kind"], e["channel"], e["answered_by"], e.get("voter")) for e in entries] == [
        ("vote", "email", "a@x", "alice"),
        ("vote", "slack", "U0BOB", "bob"),
        ("vote", "mcp", "carol-laptop", "carol"),
    ]
    assert [e["origin"] for e in entries] == [mail, click, {"token": "carol-laptop"}]
    assert [e["quorum"]["outcome"] for e in entries] == ["pending", "pending", "answered"]
    assert entries[2]["quorum"]["given"] == ["alice", "bob", "carol"]
    votes = [kw for event, kw in lines if event == "approval_vote"]
    assert [(v["channel"], v["voter"], v["outcome"]) for v in votes] == [
        ("email", "alice", "pending"),
        ("slack", "bob", "pending"),
        ("mcp", "carol", "answered"),
    ]


def test_a_vote_the_log_will_not_take_still_counts_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltad.inbox import audit

    errors: list[str] = []
    monkeypatch.setattr(quorum.log, "error", lambda event, **kw: errors.append(event))
    ws, log = tmp_path / "ws", tmp_path / "audit.jsonl"
    log.write_bytes(b'{"torn')  # a crash in mid-write: the log takes nothing more
    rid = _approval(ws)
    done = quorum.cast(ws, rid, _body(), by="alice", channel="email", audit=log)
    assert done.outcome == "pending" and errors == ["audit_failed"]
    assert log.read_bytes() == b'{"torn'
    with pytest.raises(audit.Broken):
        audit.verify(audit.read_lines(log))


def test_a_record_too_big_to_read_back_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws, "Fruit?", input_type="choice", options=OPTIONS, approvals_required=3)
    rid = _rid(ws)
    pear = AnswerIn.parse({"answer": "p"})
    assert quorum.cast(ws, rid, pear, by="alice", channel="http").outcome == "pending"
    before = (ws / ".delta/interaction" / ballots.FILE).read_bytes()
    monkeypatch.setattr(quorum, "MAX_BYTES", len(before) + 10)
    with pytest.raises(quorum.TooLarge):
        quorum.cast(ws, rid, pear, by="bob", channel="http")
    assert (ws / ".delta/interaction" / ballots.FILE).read_bytes() == before
