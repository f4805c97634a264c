"""A question's context, its respondents and a run's outcome: the pure parts, from tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from deltad.agent import load_agent
from deltad.client import display
from deltad.engine import briefing
from deltad.engine.ask_human import question_from_args
from deltad.errors import ConfigError
from deltad.inbox.outcome import SENSITIVE, answer_shown, answers_of
from deltad.inbox.respondents import Answerer, may_answer, refusal
from deltad.inbox.tokens import TokenError, TokenStore
from deltad.protocol import EventType, InteractionRequest, JournalEvent
from deltad.protocol.models import respondent_problem
from deltad.protocol.replies import Reply
from deltad.protocol.viewing import event_of

from ..conftest import write_agent
from .test_pipeline_gates import gate_with

_seq = iter(range(1, 1_000_000))


def ev(type_: EventType, **payload: Any) -> JournalEvent:
    return JournalEvent(seq=next(_seq), timestamp=datetime.now(UTC), type=type_, payload=payload)


def call(action_id: str, tool: str = "echo", result: str = "ok", **args: Any) -> list[JournalEvent]:
    return [
        ev(EventType.ACTION_REQUEST, action_id=action_id, tool_name=tool, tool_args=args),
        ev(
            EventType.ACTION_RESULT,
            action_id=action_id,
            status="SUCCESS",
            observation_content=result,
        ),
    ]


def thought(text: str | None) -> JournalEvent:
    return ev(EventType.THOUGHT, content=text, tool_calls=[])


# -- the context ----------------------------------------------------------------------------
def test_context_holds_the_task_the_last_message_and_the_calls_since_the_last_question() -> None:
    events = [
        *call("old", result="before the question"),
        ev(EventType.HUMAN_INTERACTION, phase="answered", request_id="r", action_id="a", reply={}),
        thought("Looking around."),
        *call("c1", text="hi"),
        *call("ask", tool="ask_human"),
        thought(None),  # a turn with only tool calls says nothing
    ]
    ctx = briefing.question_context(events, "the task")
    assert ctx.task == "the task" and ctx.last_message == "Looking around."
    assert [(s.action_id, s.arguments, s.status, s.result) for s in ctx.tool_calls] == [
        ("c1", {"text": "hi"}, "SUCCESS", "ok")
    ]
    assert ctx.reviewed_node is None


@pytest.mark.parametrize(
    ("calls", "result_chars", "kept", "omitted"),
    [
        (3, 10, 3, 0),
        (25, 10, 20, 5),  # at most 20 entries, the most recent
        (20, 5000, 15, 5),  # each result cut to 2,000 characters; past 32 KB the oldest go
    ],
)
def test_context_is_bounded(calls: int, result_chars: int, kept: int, omitted: int) -> None:
    events = [e for i in range(calls) for e in call(f"c{i}", result="r" * result_chars)]
    ctx = briefing.question_context(events, "t")
    assert (len(ctx.tool_calls), ctx.tool_calls_omitted) == (kept, omitted)
    assert ctx.tool_calls[-1].action_id == f"c{calls - 1}"
    size = len(json.dumps(ctx.model_dump(mode="json"), ensure_ascii=False))
    assert size <= briefing.TOTAL_CHARS
    if result_chars > briefing.RESULT_CHARS:
        assert ctx.tool_calls[0].result.endswith(f"[cut: {result_chars - 2000} more characters]")


def test_a_last_message_the_prompt_holds_is_not_repeated() -> None:
    events = [thought("Here is my draft.")]
    asked = "Here is my draft.\n\n(reply to the agent; /done or /approve ends this step)"
    assert briefing.question_context(events, "t", asked).last_message is None
    assert briefing.question_context(events, "t", "Deploy?").last_message == "Here is my draft."


def test_huge_arguments_are_cut_to_a_string() -> None:
    ctx = briefing.question_context(call("c", text="a" * 5000), "t")
    shown = ctx.tool_calls[0].arguments
    assert isinstance(shown, str) and "[cut: " in shown and len(shown) < 1100


def node_start(node: str, kind: str, **lane: Any) -> JournalEvent:
    return ev(EventType.NODE_START, node=node, kind=kind, **lane)


def node_outcome(
    node: str, branch: int | None = None, child: str = "", **updates: str
) -> JournalEvent:
    """A node's outcome, in a parallel branch or a child pipeline when given."""
    lane: dict[str, Any] = {"branch": branch} if branch is not None else {}
    lane |= {"child": child} if child else {}
    return ev(EventType.NODE_OUTCOME, node=node, status="success", context_updates=updates, **lane)


@pytest.mark.parametrize(
    ("events", "reviewed"),
    [
        (
            [node_start("plan", "codergen"), thought("THE PLAN"),
             node_outcome("plan", last_response="THE PLAN"), node_start("gate", "wait.human")],
            ("plan", "THE PLAN"),
        ),
        (
            [node_outcome("build", **{"tool.output": "built"}), node_start("gate", "wait.human")],
            ("build", "built"),
        ),
        # a question asked inside a working node reviews nothing
        ([node_outcome("plan", last_response="P"), node_start("work", "codergen")], (None, None)),
        # a gate first thing: nothing to review
        ([node_start("gate", "wait.human")], (None, None)),
        # a gate in branch 0 reviews its branch's node, not branch 1's that ran last
        (
            [node_outcome("pre", last_response="PRE"),
             node_outcome("a", last_response="A", branch=0),
             node_outcome("b", last_response="B", branch=1),
             node_start("gate", "wait.human", branch=0)],
            ("a", "A"),
        ),
        # first in its branch: the node before the fan-out
        (
            [node_outcome("pre", last_response="PRE"),
             node_outcome("b", last_response="B", branch=1),
             node_start("gate", "wait.human", branch=0)],
            ("pre", "PRE"),
        ),
        # in a child pipeline: the child's node
        (
            [node_outcome("a", last_response="A", child="m"),
             node_start("gate", "wait.human", child="m")],
            ("a", "A"),
        ),
    ],
)  # fmt: skip
def test_a_gate_reviews_the_last_node_output(
    events: list[JournalEvent], reviewed: tuple[str | None, str | None]
) -> None:
    ctx = briefing.question_context(events, "goal")
    assert (ctx.reviewed_node, ctx.reviewed_output) == reviewed
    if reviewed[0] == "plan":
        assert ctx.last_message is None  # the node's final message is its output: shown once


def test_requests_without_context_or_respondents_stay_valid() -> None:
    req = InteractionRequest.model_validate({"prompt": "p", "run_id": "r", "action_id": "a"})
    assert req.context is None and req.respondents == []


# -- respondents ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "ok"),
    [("alice", True), ("group:ops", True), ("ci.bot@x", True), ("", False),
     ("group:", False), ("a b", False), (3, False), ("-x", False)],
)  # fmt: skip
def test_respondent_names(name: object, ok: bool) -> None:
    assert (respondent_problem(name) is None) == ok


@pytest.mark.parametrize(
    ("respondents", "who", "may"),
    [
        ([], None, True),  # no respondents: anyone the scope allows, a link too
        ([], Answerer("bob"), True),
        (["alice"], Answerer("alice"), True),
        (["alice"], Answerer("bob"), False),
        (["alice"], None, False),  # a signed link names nobody
        (["group:ops"], Answerer("bob", ("ops",)), True),
        (["group:ops"], Answerer("bob", ("dev",)), False),
        (["ops"], Answerer("bob", ("ops",)), False),  # a bare name is a token, not a group
        (["alice"], Answerer("root", (), admin=True), True),
    ],
)
def test_who_may_answer(respondents: list[str], who: Answerer | None, may: bool) -> None:
    assert may_answer(respondents, who) == may
    assert (refusal(respondents, who) is None) == may


@pytest.mark.parametrize(
    ("respondents", "said"),
    [
        (["alice", "group:ops", "alice"], ["alice", "group:ops"]),
        ("alice", "Error: respondents must be a list of token names or group:NAME"),
        (["a b"], "Error: respondent 'a b' is not a token name, oidc:PERSON or group:NAME"),
    ],
)
def test_ask_human_respondents(respondents: object, said: object) -> None:
    raw = json.dumps({"prompt": "Merge?", "respondents": respondents})
    req = question_from_args(raw, "run", "call")
    if isinstance(said, list):
        assert isinstance(req, InteractionRequest) and req.respondents == said
    else:
        assert isinstance(req, str) and req.startswith(str(said))


def test_a_gate_reads_its_respondents_attribute() -> None:
    g = gate_with("[A] Approve", attrs='respondents="alice, group:ops"')
    assert g.respondents == ("alice", "group:ops") and not g.problems
    bad = gate_with("[A] Approve", attrs='respondents="alice, no one"')
    assert [p.message for p in bad.problems] == [
        "respondent 'no one' is not a token name, oidc:PERSON or group:NAME (letters, digits "
        "and . _ @ -, up to 64)"
    ]
    empty = gate_with("[A] Approve", attrs='respondents=""')
    assert "respondents is empty" in empty.problems[0].message


# -- outcomes -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "secret", "shown"),
    [
        ({"value": "Blue", "key": "B"}, False, "B: Blue"),
        ({"value": "hi"}, False, "hi"),
        ({"value": "${secret:k}"}, True, SENSITIVE),
        ({"outcome": "timeout", "value": "d"}, False, "timeout"),
        ({"decisions": [{"action_id": "c1", "decision": "reject", "reason": "no"}]}, False,
         "reject c1 (no)"),
    ],
)  # fmt: skip
def test_answer_shown(reply: dict[str, Any], secret: bool, shown: str) -> None:
    assert answer_shown(Reply.model_validate(reply), secret) == shown


def test_answers_of_pairs_answers_with_their_questions() -> None:
    asked = {"request_id": "r1", "prompt": "Key?", "input_type": "password", "run_id": "r",
             "action_id": "a"}  # fmt: skip
    lines = [
        {"type": "HUMAN_INTERACTION", "payload": {"phase": "asked", "request": asked}},
        {"type": "NEWER_EVENT", "payload": {}},  # not typed: skipped
        {
            "type": "HUMAN_INTERACTION",
            "payload": {"phase": "answered", "request_id": "r1", "action_id": "a",
                        "reply": {"value": "${secret:a}", "answered_by": "alice",
                                  "source": "mailbox"}},
        },
        {"type": "RUN_END", "payload": {"status": "COMPLETED", "reason": "all done"}},
    ]  # fmt: skip
    events = [
        event_of(json.dumps({"seq": i, "timestamp": "2030-01-01T00:00:00Z", **x}).encode())
        for i, x in enumerate(lines, start=1)
    ]
    answers, reason = answers_of(e for e in events if e is not None)
    assert reason == "all done"
    assert [(a["prompt"], a["answered_by"], a["answer"]) for a in answers] == [
        ("Key?", "alice", SENSITIVE)
    ]


# -- the terminal ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "shown"),
    [("plain\nlines\tok", "plain\nlines\tok"), ("\x1b[2J", "\\x1b[2J"), ("a\rb\x07", "a\\rb\\x07"),
     ("\u202eevil", "\\u202eevil")],
)  # fmt: skip
def test_run_text_is_escaped_for_the_terminal(text: str, shown: str) -> None:
    assert display.escaped(text) == shown


def test_durations() -> None:
    shown = [display.duration(s) for s in (2.25, 65, 3725)]
    assert shown == ["2.2 s", "1 min 05 s", "1 h 02 min 05 s"]


def test_a_token_keeps_its_groups(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token = store.add("carol", [], "answerer", ("ops", "db"))
    who = store.verify(token)
    assert who is not None and who.groups == ("ops", "db")
    assert store.list()[0]["groups"] == ["ops", "db"]
    with pytest.raises(TokenError, match="'no one'"):
        store.add("dave", [], "answerer", ("no one",))


def test_an_approval_policy_names_its_respondents(tmp_path: Path) -> None:
    tools = '[{name: deploy, exec: "echo hi"}]'
    good = write_agent(tmp_path, tools, "approval:\n  respondents: [alice, 'group:ops']\n", "good")
    policy = load_agent(good).config.approval
    assert policy is not None and policy.respondents == ["alice", "group:ops"]
    bad = write_agent(tmp_path, tools, "approval:\n  respondents: ['no one']\n", "bad")
    with pytest.raises(ConfigError, match=r"approval\.respondents.*'no one' is not a token name"):
        load_agent(bad)


@pytest.mark.parametrize(
    ("status", "shows_message"), [("COMPLETED", True), ("FAILED", False), ("CANCELED", False)]
)
def test_outcome_lines_show_the_final_message_of_a_completed_run(
    status: str, shows_message: bool
) -> None:
    outcome = {"status": status, "final_message": "the end", "duration_seconds": 3.0}
    lines = display.outcome_lines(outcome)
    assert lines[0] == "Duration:   3.0 s"
    assert ("  the end" in lines) == shows_message  # a failure's reason is shown as Reason:
