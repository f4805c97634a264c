"""Seed 004's interviewer and accelerator tables, adapted: pure functions and stand-ins."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from deltad.engine.ask_human import question_from_args
from deltad.engine.interviewers import (
    AutoApproveInterviewer,
    CallbackInterviewer,
    Chain,
    QueueInterviewer,
)
from deltad.errors import UsageError
from deltad.protocol import InteractionRequest, utcnow
from deltad.protocol.kinds import on_timeout
from deltad.protocol.models import GatedCall, InputType
from deltad.protocol.questions import (
    AnswerRejected,
    Reply,
    build_options,
    interpret_json,
    interpret_text,
    parse_accelerator,
)


def q(kind: str = "text", **kw: object) -> InteractionRequest:
    fields: dict[str, object] = {"action_id": "a", **kw}
    return InteractionRequest(prompt="Q?", input_type=InputType(kind), run_id="r", **fields)


def choice(*labels: str, **kw: object) -> InteractionRequest:
    return q("choice", options=build_options(list(labels)), **kw)


def approval(*ids: str, **kw: object) -> InteractionRequest:
    calls = [GatedCall(action_id=i, tool_name="deploy", arguments={"env": i}) for i in ids]
    return q("approval", calls=calls, action_id=ids[0], **kw)


# -- accelerator keys -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("label", "key", "text"),
    [
        ("[A] Approve", "A", "Approve"),
        ("Y) Yes, deploy", "Y", "Yes, deploy"),
        ("R - Revise", "R", "Revise"),
        ("Fix issues", None, "Fix issues"),
    ],
)
def test_accelerator_patterns(label: str, key: str | None, text: str) -> None:
    assert parse_accelerator(label) == (key, text)


def test_first_character_fallback_and_clashes_get_the_next_free_character() -> None:
    opts = build_options(["Fix issues", "[F] Fast path", "fine", "Finish"])
    assert [o.key for o in opts] == ["F", "A", "I", "N"]
    assert [o.label for o in opts] == ["Fix issues", "Fast path", "fine", "Finish"]


def test_choice_matches_key_or_label_case_insensitively() -> None:
    req = choice("[A] Approve", "[R] Reject")
    assert interpret_text(req, "r").value == "Reject"
    assert interpret_text(req, "APPROVE").key == "A"
    assert interpret_text(req, "[r] reject").key == "R"
    with pytest.raises(AnswerRejected, match="not one of the options"):
        interpret_text(req, "maybe")


@pytest.mark.parametrize(
    ("text", "value"), [("y", "yes"), ("YES", "yes"), ("n", "no"), (" No ", "no")]
)
def test_yes_no(text: str, value: str) -> None:
    assert interpret_text(q("yes_no"), text).value == value


def test_approval_text_applies_to_every_call_and_carries_a_reason() -> None:
    req = approval("c1", "c2")
    reply = interpret_text(req, "reject: too risky on a Friday")
    assert [(d.action_id, d.decision, d.reason) for d in reply.decisions] == [
        ("c1", "reject", "too risky on a Friday"),
        ("c2", "reject", "too risky on a Friday"),
    ]
    assert {d.decision for d in interpret_text(req, "approve").decisions} == {"approve"}
    with pytest.raises(AnswerRejected):
        interpret_text(req, "sure, why not")


def test_structured_answers_are_checked_not_guessed() -> None:
    req = approval("c1", "c2")
    ok = interpret_json(
        req,
        json.dumps(
            {
                "request_id": req.request_id,
                "answered_by": "ops@example",
                "decisions": [
                    {"action_id": "c2", "decision": "reject", "reason": "no"},
                    {"action_id": "c1", "decision": "edit", "arguments": {"env": "dev"}},
                ],
            }
        ),
    )
    assert [d.action_id for d in ok.decisions] == ["c1", "c2"]  # in call order
    assert ok.answered_by == "ops@example"
    bad = [
        ({"request_id": "other", "answer": "x"}, "pending question is"),
        (
            {
                "request_id": req.request_id,
                "decisions": [{"action_id": "c1", "decision": "approve"}],
            },
            "no decision for call 'c2'",
        ),
        (
            {
                "request_id": req.request_id,
                "decisions": [{"action_id": "zz", "decision": "approve"}],
            },
            "no pending call",
        ),
        (
            {
                "request_id": req.request_id,
                "decisions": [
                    {"action_id": "c1", "decision": "edit"},
                    {"action_id": "c2", "decision": "approve"},
                ],
            },
            "needs arguments",
        ),
        (
            {"request_id": req.request_id, "decisions": [{"action_id": "c1", "decision": "maybe"}]},
            "response.json",
        ),
    ]
    for doc, reason in bad:
        with pytest.raises(AnswerRejected, match=reason):
            interpret_json(req, json.dumps(doc))
    with pytest.raises(AnswerRejected, match="not valid JSON"):
        interpret_json(req, "{nope")


# -- stand-in interviewers ---------------------------------------------------------------------
def test_auto_approve_per_kind() -> None:
    auto = AutoApproveInterviewer()
    assert auto.ask(q("yes_no")).value == "yes"
    assert auto.ask(q("confirmation")).value == "yes"
    assert auto.ask(choice("Deploy", "Abort")).value == "Deploy"
    assert auto.ask(q("text")).value == "auto-approved"
    assert auto.ask(q("text", default="blue")).value == "blue"
    assert {d.decision for d in auto.ask(approval("a", "b")).decisions} == {"approve"}
    assert auto.ask(q("password")).outcome == "skipped"  # never invents a secret
    assert auto.ask(q("text", sensitive=True)).outcome == "skipped"


def test_queue_single_multiple_and_exhausted() -> None:
    queue = QueueInterviewer(["blue", "y", {"answer": "R"}])
    assert queue.ask(q()).value == "blue"
    assert queue.ask(q("yes_no")).value == "yes"
    assert queue.ask(choice("[A] Approve", "[R] Reject")).value == "Reject"
    exhausted = queue.ask(q())
    assert exhausted.outcome == "skipped" and exhausted.value is None


def test_queue_resumes_where_the_journal_says() -> None:
    assert QueueInterviewer(["one", "two"], start=1).ask(q()).value == "two"


def test_queue_answer_that_does_not_fit_is_an_error_not_a_guess() -> None:
    with pytest.raises(UsageError, match="does not fit"):
        QueueInterviewer(["perhaps"]).ask(q("yes_no"))


def test_callback_receives_the_question_and_its_return_is_the_answer() -> None:
    seen: list[InteractionRequest] = []

    def decide(req: InteractionRequest) -> str:
        seen.append(req)
        return "n"

    reply = CallbackInterviewer(decide).ask(q("yes_no"))
    assert reply.value == "no" and reply.source == "callback" and seen[0].prompt == "Q?"
    assert CallbackInterviewer(lambda r: Reply(value="direct")).ask(q()).value == "direct"


def test_chain_takes_the_first_reply() -> None:
    class Nobody:
        def ask(self, req: InteractionRequest) -> None:
            return None

        def settle(self, req: InteractionRequest) -> None:
            return None

    assert Chain(Nobody(), AutoApproveInterviewer()).ask(q("yes_no")).value == "yes"
    assert Chain(Nobody()).ask(q()) is None


# -- timeouts -----------------------------------------------------------------------------------
def test_timeout_with_default_uses_it_and_without_default_is_explicit() -> None:
    req = choice("[A] Approve", "[R] Reject", default="R", timeout_seconds=5)
    r = on_timeout(req)
    assert (r.outcome, r.value, r.source) == ("timeout", "Reject", "default")
    bare = on_timeout(q(timeout_seconds=5))
    assert bare.outcome == "timeout" and bare.value is None


def test_approval_timeout_rejects_every_call() -> None:
    r = on_timeout(approval("a", "b", timeout_seconds=5))
    assert {d.decision for d in r.decisions} == {"reject"}


def test_question_from_model_arguments() -> None:
    req = question_from_args(
        json.dumps(
            {
                "prompt": "Ship it?",
                "options": ["[S] Ship", "[W] Wait"],
                "default": "W",
                "timeout_seconds": 60,
            }
        ),
        "r",
        "a",
    )
    assert isinstance(req, InteractionRequest)
    assert req.input_type == "choice" and [o.key for o in req.options] == ["S", "W"]
    assert req.expires_at is not None
    assert timedelta(seconds=59) < req.expires_at - utcnow() <= timedelta(seconds=60)
    for bad, why in [
        ({"prompt": "x", "options": ["only one"]}, "at least two"),
        ({"prompt": "x", "options": ["A", "B"], "default": "C"}, "default"),
        ({"prompt": "x", "timeout_seconds": -1}, "timeout_seconds"),
        ({"prompt": "x", "input_type": "approval"}, "input_type"),
        ({"prompt": ""}, "prompt"),
    ]:
        got = question_from_args(json.dumps(bad), "r", "a")
        assert isinstance(got, str) and why in got, (bad, got)
