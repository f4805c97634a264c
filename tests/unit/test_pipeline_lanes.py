"""The branches' lanes: the scheduling rule for questions asked inside branches (a table),
which journal lines are a branch's own, and in-process runs where branches ask."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from deltad.engine.interviewers import CallbackInterviewer, QueueInterviewer
from deltad.pipeline.lanes import in_lane
from deltad.pipeline.parallel import Lane, next_step
from deltad.protocol import EventType, JournalEvent, RunStatus
from deltad.testing import ScriptedModel, tool_call

from .helpers import Run, pipeline_graph

GRAPH = pipeline_graph(
    """\
    digraph p {
        start [shape=Mdiamond]
        exit [shape=Msquare]
        fan [shape=component]
        join [shape=tripleoctagon]
        gate [shape=hexagon]
        start -> fan
        fan -> a
        fan -> gate
        fan -> c
        gate -> b [label="Go"]
        a -> join
        b -> join
        c -> join
        join -> exit
    }
    """
)

IDLE, DONE = Lane(False, "a", False), Lane(False, None, True)
BLOCKED = Lane(True, None, False, True, "q1")  # in a node, blocked on question q1
BLOCKED2 = Lane(True, None, False, True, "q2")
WORKING = Lane(True, None, False)  # in a node, no question
AT_GATE = Lane(False, "gate", False)


@pytest.mark.parametrize(
    ("lanes", "posted", "expected"),
    [
        ([BLOCKED, IDLE], None, (1, False)),  # a blocked branch waits while another goes on
        ([BLOCKED, WORKING], None, (1, False)),  # a node under way finishes first
        ([BLOCKED, DONE], None, (0, True)),  # nothing else can go on: it asks
        ([BLOCKED, BLOCKED2], None, (0, True)),  # both blocked: the first asks
        ([BLOCKED, BLOCKED2], "q2", (1, True)),  # the one in the mailbox goes first
        ([BLOCKED, IDLE], "q1", (0, True)),  # its answer may be there
        ([BLOCKED, IDLE], "other", (1, False)),  # a question not of these branches
        ([AT_GATE, BLOCKED], None, (0, True)),  # a gate and a question: in order
        ([DONE, AT_GATE, IDLE], None, (2, False)),  # a gate waits as before
        ([Lane(False, None, True, True, "q1"), DONE], "q1", None),  # done: join
        ([DONE, DONE], None, None),
    ],
)
def test_next_step(
    lanes: list[Lane], posted: str | None, expected: tuple[int, bool] | None
) -> None:
    assert next_step(lanes, GRAPH, 4, posted) == expected


def test_a_blocked_branch_holds_its_max_parallel_place() -> None:
    new = Lane(False, "c", False, False)
    assert next_step([BLOCKED, new], GRAPH, 1) == (0, True)  # c may not begin: it asks
    assert next_step([BLOCKED, new], GRAPH, 2) == (1, False)


def _event(seq: int, type_: EventType, **payload: Any) -> JournalEvent:
    return JournalEvent(seq=seq, timestamp=datetime.now(UTC), type=type_, payload=payload)


@pytest.mark.parametrize(
    ("event", "mine"),
    [
        (_event(3, EventType.THOUGHT, content="before the fan-out"), True),
        (_event(12, EventType.THOUGHT, content="b's", branch=1), True),
        (_event(12, EventType.THOUGHT, content="a's", branch=0), False),
        (_event(12, EventType.THOUGHT, content="the run's"), False),
        (_event(12, EventType.THOUGHT, content="a child's b", branch=1, child="m"), False),
        (_event(12, EventType.RUN_END, status="failed", reason="x"), True),
        (_event(12, EventType.SYSTEM_MESSAGE, level="INFO", content="r", retry=True), True),
        (_event(12, EventType.SYSTEM_MESSAGE, level="INFO", content="a note"), False),
    ],
)
def test_a_branchs_lane_of_the_journal(event: JournalEvent, mine: bool) -> None:
    assert in_lane(event, {"branch": 1}, since=10) is mine


TWO = pipeline_graph(
    """\
    digraph p {
        start [shape=Mdiamond]
        exit [shape=Msquare]
        fan [shape=component]
        join [shape=tripleoctagon]
        ok [shape=hexagon, label="Is a good?"]
        start -> fan
        fan -> a
        fan -> b
        a -> ok
        ok -> join [label="[Y] Yes"]
        b -> join
        join -> exit
    }
    """
)


def test_each_answer_goes_to_its_own_branchs_question(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.reply(None, tool_call("ask_human", {"prompt": "A?"}, "qa"))
    model.reply(None, tool_call("ask_human", {"prompt": "B?"}, "qb"))
    model.reply("a done").reply("b done")
    run = Run(tmp_path, TWO, model)
    assert run.drive(QueueInterviewer(["x", "Y", "y"])).status == RunStatus.COMPLETED
    # a asked first and got x; its gate waited while b's question (asked next) got y.
    assert run.path() == ["start", "fan", "a", "b", "ok", "join"]
    a_turn, b_turn = model.calls[2], model.calls[3]
    assert a_turn[-1] == {"role": "tool", "tool_call_id": "qa", "content": "x"}
    assert b_turn[-1] == {"role": "tool", "tool_call_id": "qb", "content": "y"}
    assert "A?" not in str(b_turn) and "a done" not in str(b_turn)  # b's own conversation


def test_a_gates_context_is_its_own_branchs(tmp_path: Path) -> None:
    model = ScriptedModel().reply("the output of a").reply("the output of b")
    run = Run(tmp_path, TWO, model)
    nobody = CallbackInterviewer(lambda req: None)
    assert run.drive(nobody).status == RunStatus.WAITING_FOR_INPUT
    [asked] = [p for p in run.events("HUMAN_INTERACTION") if p["phase"] == "asked"]
    context = asked["request"]["context"]
    assert context["reviewed_output"] == "the output of a"
    assert context["last_message"] != "the output of b"  # b's words are not a's context


def test_an_interactive_turn_in_a_branch_waits_while_the_other_goes_on(tmp_path: Path) -> None:
    graph = pipeline_graph(
        """\
        digraph p {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            join [shape=tripleoctagon]
            a [prompt="talk", agent.mode="interactive"]
            b [prompt="write b"]
            start -> fan
            fan -> a -> join
            fan -> b -> join
            join -> exit
        }
        """
    )
    model = ScriptedModel().reply("shall I go on?").reply("b done")
    run = Run(tmp_path, graph, model)
    asked: list[str] = []

    def nobody(req: Any) -> None:
        asked.append(req.prompt)

    assert run.drive(CallbackInterviewer(nobody)).status == RunStatus.WAITING_FOR_INPUT
    # b ran to its outcome before a's turn was put to the human.
    assert [p["node"] for p in run.events("NODE_OUTCOME")] == ["start", "b"]
    assert len(asked) == 1 and asked[0].startswith("shall I go on?")
    assert "shall I go on?" not in str(model.calls[1])
    assert run.resume(QueueInterviewer(["/done"])).status == RunStatus.COMPLETED
    assert run.path() == ["start", "fan", "a", "b", "join"]


@pytest.mark.spawns  # a tool node runs its command
def test_a_context_cut_in_one_branch_keeps_the_others_turns(tmp_path: Path) -> None:
    graph = pipeline_graph(
        """\
        digraph p {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            join [shape=tripleoctagon]
            start -> fan
            fan -> a -> join
            fan -> b -> join
            join -> exit
        }
        """
    )
    model = ScriptedModel().reply(None, tool_call("ask_human", {"prompt": "A?"}, "qa"))
    for i in range(4):  # b's long turns: its conversation is cut
        model.reply(None, tool_call("echo", {"text": f"{i}" * 600}, f"e{i}"))
    model.reply("b done").reply("a done")
    run = Run(tmp_path, graph, model)
    run.agent.config.llm.context_budget = 500
    assert run.drive(CallbackInterviewer(lambda req: None)).status == RunStatus.WAITING_FOR_INPUT
    cuts = [p for p in run.events("SYSTEM_MESSAGE") if p.get("context_cut")]
    assert cuts and all(c["branch"] == 1 for c in cuts)
    # A new process reads the journal from b's cut on; a's turns before it are still a's.
    assert run.resume(QueueInterviewer(["x"])).status == RunStatus.COMPLETED
    a_again = model.calls[-1]
    assert a_again[-1] == {"role": "tool", "tool_call_id": "qa", "content": "x"}
    assert a_again[-2]["role"] == "assistant" and "0000" not in str(a_again)
