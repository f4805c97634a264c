"""What bounds a run: the limit checks from tables, `max_steps` read and refused like any graph
attribute, and both counts taken from the journal (so a resume continues them), in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltad.agent import load_agent
from deltad.engine.interviewers import (
    AutoApproveInterviewer,
    Chain,
    MailboxInterviewer,
)
from deltad.engine.limits import over_iterations, over_steps
from deltad.pipeline import values
from deltad.pipeline.state import replay
from deltad.protocol import EventType, Journal, Mailbox, RunStatus
from deltad.protocol.history import History
from deltad.testing import ScriptedModel

from ..conftest import write_agent
from .helpers import Run, example, graph_of, only, pipeline_graph, problems_in

ENDS = "start [shape=Mdiamond]\nexit [shape=Msquare]\n"


@pytest.mark.parametrize(
    ("used", "limit", "why"),
    [
        (0, 1, None),
        (4, 5, None),
        (5, 5, "stopped after max_iterations (5): the run made 5 model calls"),
        (7, 5, "stopped after max_iterations (5): the run made 7 model calls"),  # limit lowered
    ],
)
def test_over_iterations(used: int, limit: int, why: str | None) -> None:
    assert over_iterations(used, limit) == why


@pytest.mark.parametrize(
    ("taken", "limit", "why"),
    [
        (0, 1, None),
        (19, 20, None),
        (20, 20, "stopped after max_steps (20): the pipeline made 20 node visits"),
    ],
)
def test_over_steps(taken: int, limit: int, why: str | None) -> None:
    assert over_steps(taken, limit) == why


@pytest.mark.parametrize(
    ("text", "steps"), [("1", 1), (" 20 ", 20), ("1000000", 1_000_000), ("+7", 7)]
)
def test_max_steps_values(text: str, steps: int) -> None:
    assert values.steps(text) == steps


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "'0' must be from 1 to 1000000"),
        ("-3", "'-3' must be from 1 to 1000000"),
        ("1000001", "'1000001' must be from 1 to 1000000"),
        ("many", "'many' is not a whole number"),
        ("2.5", "'2.5' is not a whole number"),
    ],
)
def test_bad_max_steps_is_a_graph_problem_at_its_place(text: str, says: str) -> None:
    line = only(problems_in(f'graph [max_steps="{text}"]\n{ENDS}start -> exit'), "max_steps")
    assert line.startswith("t.dot:2:") and f"graph: max_steps: {says}" in line


def test_max_steps_is_read_with_a_default() -> None:
    assert graph_of(f"{ENDS}start -> exit").max_steps == values.DEFAULT_MAX_STEPS == 1000
    assert graph_of(f"max_steps = 40\n{ENDS}start -> exit").max_steps == 40


GATE_CYCLE = """
digraph g {
    graph [max_steps=7]
    start [shape=Mdiamond]; exit [shape=Msquare]
    ask [shape=hexagon, label="Again?"]
    redo [shape=parallelogram, tool_command="echo again >> redo.txt"]
    start -> ask
    ask -> redo [label="[A] Again"]
    ask -> exit [label="[S] Stop"]
    redo -> ask
}
"""


@pytest.mark.spawns  # a tool node runs its command
def test_a_gate_in_a_cycle_is_a_step_each_time_it_is_visited(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(GATE_CYCLE), ScriptedModel())
    out = run.drive(Chain(AutoApproveInterviewer()))  # always "Again"
    assert out.status == RunStatus.FAILED
    assert out.message == (
        "stopped after max_steps (7): the pipeline made 7 node visits; next was ask"
    )
    assert run.path() == ["start", "ask", "redo", "ask", "redo", "ask", "redo"]
    assert len(run.asked()) == 3  # each visit of the gate asked once
    assert (run.ws.root / "redo.txt").read_text().count("again") == 3
    assert replay(Journal(run.paths.journal).events, "start").steps == 7


@pytest.mark.spawns  # a tool node runs its command
def test_retries_are_steps(tmp_path: Path) -> None:
    body = """
    digraph t {
        graph [max_steps=4]
        start [shape=Mdiamond]; exit [shape=Msquare]
        check [shape=parallelogram, tool_command="exit 1", max_retries=9, retry_target=check]
        start -> check -> exit
    }"""
    run = Run(tmp_path, pipeline_graph(body), ScriptedModel())
    out = run.drive(Chain(AutoApproveInterviewer()))
    assert out.status == RunStatus.FAILED and "max_steps (4)" in out.message
    assert run.path() == ["start", "check", "check", "check"]


@pytest.mark.spawns  # a tool node runs its command
def test_each_resume_continues_the_step_count(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(GATE_CYCLE), ScriptedModel())
    mailbox = Mailbox(run.ws)
    out = run.drive(Chain(MailboxInterviewer(mailbox, print)))
    pauses = 0
    while out.status == RunStatus.WAITING_FOR_INPUT and pauses < 10:
        pauses += 1
        mailbox.write_answer("A")
        run.journal.snapshot()
        out = run.resume(Chain(MailboxInterviewer(mailbox, print)))
    assert out.status == RunStatus.FAILED and "max_steps (7)" in out.message
    assert pauses == 3  # at the gate's 1st, 2nd and 3rd visit; a 4th is one step too many
    assert len(run.path()) == 7


def test_model_calls_count_across_nodes_and_a_resume_in_a_pipeline(tmp_path: Path) -> None:
    # do_work asks the human (call 1), pauses; resumed, it finishes (call 2); the gate is
    # approved; apply would be call 3 with max_iterations 2: the run fails instead.
    model = ScriptedModel().call("ask_human", {"prompt": "Which DB?"}, id="q").reply("planned")
    model.reply("applied")
    run = Run(tmp_path, example("review-gate.dot"), model)
    run.meta.max_iterations = 2
    mailbox = Mailbox(run.ws)
    assert run.drive(Chain(MailboxInterviewer(mailbox, print))).status == "WAITING_FOR_INPUT"
    assert run.meta.iterations_completed == 1
    mailbox.write_answer("postgres")
    run.journal.snapshot()  # the count comes back from the snapshot of the journal's read
    out = run.resume(Chain(MailboxInterviewer(mailbox, print), AutoApproveInterviewer()))
    assert run.journal.restored_bytes > 0 and run.journal.history.thoughts == 2
    assert out.status == RunStatus.FAILED
    assert out.message == "stopped after max_iterations (2): the run made 2 model calls"
    assert run.path() == ["start", "do_work", "review_gate", "apply"]
    assert len(model.calls) == 2 and model.remaining == 1
    [end] = run.events("RUN_END")
    assert end == {"status": "FAILED", "reason": out.message}


def test_history_thoughts_round_trip_and_an_older_snapshot_is_a_miss(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.jsonl")
    j.append(EventType.RUN_START, {"run_id": "r", "task": "t", "agent_ref": "a"})
    for i in range(3):
        j.append(EventType.THOUGHT, {"content": f"c{i}", "tool_calls": []})
    state = j.history.state()
    assert state["thoughts"] == 3 and History.restored(state).thoughts == 3
    del state["thoughts"]  # a snapshot from before the count: read the journal instead
    with pytest.raises(KeyError):
        History.restored(state)


def test_a_node_with_its_own_agent_keeps_the_run_cap(tmp_path: Path) -> None:
    g = pipeline_graph("""
        digraph t {
            start [shape=Mdiamond]; exit [shape=Msquare]
            a [prompt="first"]; b [prompt="second", agent="reviewer"]
            start -> a -> b -> a
            b -> exit [condition="context.done=yes"]
        }""")
    run = Run(tmp_path, g, ScriptedModel().reply("a1").reply("a2"), extra="max_iterations: 3\n")
    reviewer = load_agent(write_agent(tmp_path, name="reviewer", extra="max_iterations: 50\n"))
    run.other = (reviewer, ScriptedModel().reply("b1").reply("b2"))
    out = run.drive(Chain(AutoApproveInterviewer()))
    assert out.status == RunStatus.FAILED and "max_iterations (3)" in out.message
    assert len(run.model.calls) + len(run.other[1].calls) == 3  # a, b, a: not b again
