"""The pipeline runner in-process: a ScriptedModel instead of a server, interviewers instead of
files (the mailbox where the test is about files). Real workspaces and journals on a temp dir.

Covers the seed's wait.human, interactive and end-to-end rows at the runner level; the same
rows run through real `delta` processes in tests/e2e/test_pipeline_run.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltad.agent import load_agent
from deltad.engine.interviewers import (
    AutoApproveInterviewer,
    CallbackInterviewer,
    Chain,
    Interviewer,
    MailboxInterviewer,
    QueueInterviewer,
)
from deltad.errors import UsageError
from deltad.pipeline.driver import after_attempt, backoff_seconds, compose_prompt
from deltad.pipeline.outcome import Outcome, Status
from deltad.pipeline.state import replay
from deltad.protocol import (
    EventType,
    Mailbox,
    RunStatus,
    save_metadata,
    utcnow,
)
from deltad.protocol.replies import Reply
from deltad.testing import ScriptedModel

from ..conftest import write_agent
from .helpers import DEPLOY, Run, example, pipeline_graph


def _queue(*answers: str) -> QueueInterviewer:
    return QueueInterviewer(list(answers))


# -- end to end (in-process) ------------------------------------------------------------------
def test_pipeline_with_human_gate_approve_routes_to_exit(tmp_path: Path) -> None:
    run = Run(tmp_path, example("review-gate.dot"), ScriptedModel().reply("plan").reply("done"))
    out = run.drive(_queue("approve"))
    assert out.status == RunStatus.COMPLETED and out.message == "done"
    assert run.path() == ["start", "do_work", "review_gate", "apply"]
    assert run.outcome("review_gate")["context_updates"] == {
        "human.gate.selected": "A",
        "human.gate.label": "Approve",
    }
    [edge] = [e for e in run.events("EDGE_TAKEN") if e["source"] == "review_gate"]
    assert edge["target"] == "apply" and edge["step"] == "preferred_label"
    assert run.meta.current_node == "apply"


def test_pipeline_with_reject_routes_to_the_retry_path(tmp_path: Path) -> None:
    model = ScriptedModel().reply("plan").reply("revised").reply("applied")
    run = Run(tmp_path, example("review-gate.dot"), model)
    assert run.drive(_queue("R", "[A] Approve")).status == RunStatus.COMPLETED
    assert run.path() == ["start", "do_work", "review_gate", "revise", "review_gate", "apply"]
    # Each visit of the gate is its own question, both recorded with the node id.
    assert [q["node_id"] for q in run.asked()] == ["review_gate", "review_gate"]
    assert len({q["action_id"] for q in run.asked()}) == 2


def test_pipeline_with_auto_approve_takes_the_first_option(tmp_path: Path) -> None:
    run = Run(tmp_path, example("review-gate.dot"), ScriptedModel().reply("p").reply("a"))
    assert run.drive(Chain(AutoApproveInterviewer())).status == RunStatus.COMPLETED
    assert run.path()[-1] == "apply"
    [answered] = [p for p in run.events("HUMAN_INTERACTION") if p["phase"] == "answered"]
    assert answered["reply"]["source"] == "auto" and answered["node_id"] == "review_gate"


def test_multiple_human_gates_each_route_correctly(tmp_path: Path) -> None:
    model = ScriptedModel().reply("plan").reply("built").reply("held")
    run = Run(tmp_path, example("two-gates.dot"), model)
    assert run.drive(_queue("A", "hold")).status == RunStatus.COMPLETED
    assert run.path() == ["start", "plan", "plan_gate", "build", "release_gate", "hold"]


def test_every_human_interaction_is_recorded_with_its_node_question_answer_and_key(
    tmp_path: Path,
) -> None:
    """The journal is the recording (the seed's RecordingInterviewer): every pair, after the run."""
    model = ScriptedModel().reply("plan").reply("built").reply("shipped")
    run = Run(tmp_path, example("two-gates.dot"), model)
    run.drive(_queue("approve", "s"))
    records = run.events("HUMAN_INTERACTION")
    asked = {p["request"]["request_id"]: p["request"] for p in records if p["phase"] == "asked"}
    pairs = [
        (p["node_id"], asked[p["request_id"]]["prompt"], p["input_type"], p["reply"]["value"],
         p["reply"]["key"])
        for p in records
        if p["phase"] == "answered"
    ]  # fmt: skip
    assert pairs == [
        ("plan_gate", "Approve the plan?", "choice", "Approve", "A"),
        ("release_gate", "Ship it?", "choice", "Ship", "S"),
    ]


def test_a_callback_receives_the_gate_question_and_its_answer_routes(tmp_path: Path) -> None:
    seen: list[Any] = []

    def decide(req: Any) -> str:
        seen.append(req)
        return "Revise" if len(seen) == 1 else "A"

    model = ScriptedModel().reply("plan").reply("revised").reply("applied")
    run = Run(tmp_path, example("review-gate.dot"), model)
    assert run.drive(CallbackInterviewer(decide)).status == RunStatus.COMPLETED
    assert [r.node_id for r in seen] == ["review_gate", "review_gate"]
    assert [o.label for o in seen[0].options] == ["Approve", "Revise"]
    assert run.path()[-3:] == ["revise", "review_gate", "apply"]


def test_later_prompts_carry_earlier_responses_and_the_gate_choice(tmp_path: Path) -> None:
    run = Run(tmp_path, example("review-gate.dot"), ScriptedModel().reply("PLAN-X").reply("ok"))
    run.drive(_queue("A"))
    first, second = run.prompts()
    assert first == "Generate a brief plan for: Write a release note for version 1.4"
    assert "response.do_work: PLAN-X" in second and "human.gate.label: Approve" in second


def test_compose_prompt_expands_the_run_goal_not_only_the_graph_goal() -> None:
    g = pipeline_graph(
        'digraph t { start [shape=Mdiamond]; exit [shape=Msquare]; w [prompt="Do $goal"]; '
        "start -> w -> exit }"
    )
    assert compose_prompt(g.nodes["w"], "the task", {}) == "Do the task"


# -- wait.human --------------------------------------------------------------------------------
GATE = """
digraph g {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    gate [shape=hexagon, label="Ship?", timeout="1h" %s]
    start -> gate
    gate -> ship [label="[S] Ship"]
    gate -> hold [label="[H] Hold"]
    ship [prompt="ship"]
    hold [prompt="hold"]
    ship -> exit
    hold -> exit
}
"""


def _timeout() -> CallbackInterviewer:
    """Nobody answered in time (what the console reports; the mailbox's is `expires_at`)."""
    return CallbackInterviewer(lambda req: Reply(outcome="timeout"))


def test_gate_question_is_a_choice_with_the_node_id_options_and_deadline(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(GATE % ', human.default_choice="H"'), ScriptedModel())
    out = run.drive(Chain(MailboxInterviewer(Mailbox(run.ws), print)))
    assert out.status == RunStatus.WAITING_FOR_INPUT and out.request is not None
    req = Mailbox(run.ws).read_request()
    assert req is not None and req == out.request
    assert req.input_type == "choice" and req.node_id == "gate" and req.prompt == "Ship?"
    assert [(o.key, o.label) for o in req.options] == [("S", "Ship"), ("H", "Hold")]
    assert req.default == "H" and req.timeout_seconds == 3600
    assert req.expires_at is not None and req.expires_at > utcnow()
    assert run.meta.status == RunStatus.WAITING_FOR_INPUT and run.meta.current_node == "gate"


def test_timeout_with_default_takes_it(tmp_path: Path) -> None:
    run = Run(
        tmp_path, pipeline_graph(GATE % ', human.default_choice="hold"'), ScriptedModel().reply("h")
    )
    assert run.drive(_timeout()).status == RunStatus.COMPLETED
    assert run.path() == ["start", "gate", "hold"]
    assert run.outcome("gate")["context_updates"]["human.gate.selected"] == "H"


def test_timeout_without_default_retries_within_max_retries_then_fails(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(GATE % ", max_retries=1"), ScriptedModel())
    out = run.drive(_timeout())
    assert out.status == RunStatus.FAILED
    assert run.path() == ["start", "gate", "gate"]  # asked again once, then FAIL
    assert len(run.slept) == 1 and run.slept[0] > 0  # after one backoff
    assert [p["status"] for p in run.events("NODE_OUTCOME")][1:] == ["retry", "fail"]
    assert "timeout, no default" in out.message and "gave up after 2 attempt(s)" in out.message
    assert len(run.asked()) == 2


def test_skipped_answer_is_fail(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(GATE % ""), ScriptedModel())
    out = run.drive(_queue())
    assert out.status == RunStatus.FAILED and "human skipped interaction" in out.message


def test_a_misfit_scripted_answer_stops_the_run_never_a_fallback(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(GATE % ""), ScriptedModel())
    with pytest.raises(UsageError, match="not one of the options"):
        run.drive(_queue("Deploy"))
    assert run.events("NODE_OUTCOME")[-1]["node"] == "start"  # the gate decided nothing


def test_a_misfit_answer_file_is_refused_and_the_gate_keeps_waiting(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(GATE % ""), ScriptedModel().reply("shipped"))
    mailbox = Mailbox(run.ws)
    assert run.drive(Chain(MailboxInterviewer(mailbox, print))).status == "WAITING_FOR_INPUT"
    mailbox.write_answer("maybe")
    assert run.resume(Chain(MailboxInterviewer(mailbox, print))).status == "WAITING_FOR_INPUT"
    assert mailbox.answer_file() is None and "not one of the options" in (
        mailbox.last_refusal() or ""
    )
    mailbox.write_answer("s")
    assert run.resume(Chain(MailboxInterviewer(mailbox, print))).status == RunStatus.COMPLETED
    assert run.path() == ["start", "gate", "ship"]
    assert mailbox.read_request() is None


# -- interactive nodes -------------------------------------------------------------------------
def test_multi_turn_exchange_ends_on_done(tmp_path: Path) -> None:
    model = ScriptedModel().reply("Name it tern?").reply("Then heron?").reply("summary")
    run = Run(tmp_path, example("interactive.dot"), model)
    out = run.drive(_queue("shorter please", "/done"))
    assert out.status == RunStatus.COMPLETED and out.message == "summary"
    assert run.path() == ["start", "brainstorm", "write_up"]
    second_call = model.calls[1]
    assert [m["role"] for m in second_call[1:]] == ["user", "assistant", "user"]
    assert second_call[-1]["content"] == "shorter please"
    assert [q["prompt"].split("\n")[0] for q in run.asked()] == ["Name it tern?", "Then heron?"]
    # Every human turn is a checkpoint: its answer recorded, then (unless it ends) the message.
    assert [m["text"] for m in run.events("NODE_MESSAGE")] == ["shorter please"]
    assert run.outcome("brainstorm")["context_updates"]["response.brainstorm"] == "Then heron?"


ENDS = [("/approve", "success", "write_up"), ("/reject", "fail", "brainstorm")]


@pytest.mark.parametrize(("reply", "status", "last"), ENDS)
def test_approve_and_reject_end_the_node(
    tmp_path: Path, reply: str, status: str, last: str
) -> None:
    run = Run(tmp_path, example("interactive.dot"), ScriptedModel().reply("tern?").reply("sum"))
    assert run.drive(_queue(reply)).status == RunStatus.COMPLETED
    assert run.outcome("brainstorm")["status"] == status
    assert run.path()[-1] == last  # /reject takes the outcome=fail edge to the exit


def test_auto_approve_ends_an_interactive_node_after_the_first_message(tmp_path: Path) -> None:
    model = ScriptedModel().reply("tern?").reply("sum")
    run = Run(tmp_path, example("interactive.dot"), model)
    assert run.drive(Chain(AutoApproveInterviewer())).status == RunStatus.COMPLETED
    assert len(model.calls) == 2 and run.outcome("brainstorm")["status"] == "success"


def test_resume_mid_conversation_continues_at_the_next_turn(tmp_path: Path) -> None:
    model = ScriptedModel().reply("one?").reply("two?").reply("three?").reply("sum")
    run = Run(tmp_path, example("interactive.dot"), model)
    mailbox = Mailbox(run.ws)

    def post() -> Interviewer:
        return Chain(MailboxInterviewer(mailbox, print))

    assert run.drive(post()).status == "WAITING_FOR_INPUT"
    for turn, answer in enumerate(["more", "again"], start=1):
        assert len(model.calls) == turn  # a paused run asks the model nothing more
        mailbox.write_answer(answer)
        assert run.resume(post()).status == "WAITING_FOR_INPUT"  # stopped after this turn
    assert run.resume(post()).status == "WAITING_FOR_INPUT"  # nothing new: nothing asked
    assert len(model.calls) == 3 and len(run.asked()) == 3
    mailbox.write_answer("/done")
    assert run.resume(post()).status == RunStatus.COMPLETED
    assert [m["text"] for m in run.events("NODE_MESSAGE")] == ["more", "again"]
    assert model.remaining == 0


# -- other nodes, routing and replay ---------------------------------------------------------
TOOLS = """
digraph t {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    check [shape=parallelogram, tool_command="%s"]
    route [shape=diamond]
    good [prompt="good"]
    start -> check -> route
    route -> good [condition="outcome=success && context.tool.output=ok"]
    route -> exit [condition="outcome!=success"]
    check -> exit [condition="outcome=fail"]
    good -> exit
}
"""


@pytest.mark.spawns  # a tool node runs its command
def test_a_tool_node_runs_its_command_and_a_conditional_routes_on_context(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(TOOLS % "printf ok"), ScriptedModel().reply("fine"))
    assert run.drive(_queue()).status == RunStatus.COMPLETED
    assert run.path() == ["start", "check", "route", "good"]
    assert run.outcome("check")["context_updates"] == {"tool.output": "ok"}


@pytest.mark.spawns  # a tool node runs its command
def test_a_failing_tool_takes_the_fail_edge(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(TOOLS % "exit 3"), ScriptedModel())
    assert run.drive(_queue()).status == RunStatus.COMPLETED
    assert run.path() == ["start", "check"] and run.outcome("check")["status"] == "fail"


@pytest.mark.spawns  # a tool node runs its command
def test_a_fail_with_no_fail_edge_fails_the_run_unless_a_retry_target(tmp_path: Path) -> None:
    body = """
    digraph t { %s
        start [shape=Mdiamond]; exit [shape=Msquare]
        check [shape=parallelogram, tool_command="test -e flag || { touch flag; exit 1; }"]
        start -> check -> exit
    }"""
    run = Run(tmp_path / "a", pipeline_graph(body % ""), ScriptedModel())
    out = run.drive(_queue())
    assert out.status == RunStatus.FAILED and "node check failed" in out.message
    run = Run(
        tmp_path / "b", pipeline_graph(body % 'graph [retry_target="check"]'), ScriptedModel()
    )
    run.ws.root.joinpath("flag").unlink(missing_ok=True)
    assert run.drive(_queue()).status == RunStatus.COMPLETED  # failed once, then went round
    assert run.path() == ["start", "check", "check"]


def test_a_codergen_node_pauses_on_ask_human_and_resumes_inside_the_node(tmp_path: Path) -> None:
    model = ScriptedModel().call("ask_human", {"prompt": "Which DB?"}, id="q").reply("planned")
    model.reply("applied")
    run = Run(tmp_path, example("review-gate.dot"), model)
    mailbox = Mailbox(run.ws)
    assert run.drive(Chain(MailboxInterviewer(mailbox, print))).status == "WAITING_FOR_INPUT"
    assert run.meta.current_node == "do_work"
    mailbox.write_answer("postgres")
    out = run.resume(Chain(MailboxInterviewer(mailbox, print), AutoApproveInterviewer()))
    assert out.status == RunStatus.COMPLETED
    assert run.path() == ["start", "do_work", "review_gate", "apply"]
    assert model.calls[1][-1] == {"role": "tool", "tool_call_id": "q", "content": "postgres"}
    assert len(model.calls[2]) == 2  # the next node is a conversation of its own


@pytest.mark.spawns  # a tool node runs its command
def test_a_goal_gate_that_failed_sends_the_run_back_or_fails_it(tmp_path: Path) -> None:
    body = """
    digraph t {
        start [shape=Mdiamond]; exit [shape=Msquare]
        check [shape=parallelogram, goal_gate=true, %s
               tool_command="test -e flag || { touch flag; exit 1; }"]
        start -> check
        check -> exit [condition="outcome=success"]
        check -> exit [condition="outcome=fail"]
    }"""
    run = Run(tmp_path / "a", pipeline_graph(body % ""), ScriptedModel())
    out = run.drive(_queue())
    assert out.status == RunStatus.FAILED and "goal gate check did not succeed" in out.message
    run = Run(tmp_path / "b", pipeline_graph(body % 'retry_target="check",'), ScriptedModel())
    assert run.drive(_queue()).status == RunStatus.COMPLETED
    assert run.path() == ["start", "check", "check"]
    assert run.events("EDGE_TAKEN")[-2]["step"] == "goal_gate"


def test_a_node_with_its_own_agent_uses_that_agent_and_model(tmp_path: Path) -> None:
    g = pipeline_graph("""
        digraph t {
            start [shape=Mdiamond]; exit [shape=Msquare]
            a [prompt="first"]; b [prompt="second", agent="reviewer"]
            start -> a -> b -> exit
        }""")
    run = Run(tmp_path, g, ScriptedModel().reply("from the main agent"))
    other = load_agent(write_agent(tmp_path, name="reviewer"))
    run.other = (other, ScriptedModel().reply("from the reviewer"))
    assert run.drive(_queue()).message == "from the reviewer"
    assert run.loaded == [Path("reviewer")] and len(run.model.calls) == 1
    assert run.other[1].calls[0][0]["content"] == other.system_prompt


@pytest.mark.spawns  # a tool node runs its command
def test_an_approval_in_a_codergen_node_pauses_the_pipeline(tmp_path: Path) -> None:
    model = ScriptedModel().call("deploy", {}, id="d").reply("deployed it").reply("applied")
    run = Run(tmp_path, example("review-gate.dot"), model, DEPLOY)
    mailbox = Mailbox(run.ws)
    out = run.drive(Chain(MailboxInterviewer(mailbox, print)))
    assert out.status == "WAITING_FOR_INPUT" and out.request is not None
    assert out.request.input_type == "approval" and run.meta.current_node == "do_work"
    assert not (run.ws.root / "deployed.txt").exists()
    mailbox.write_answer("approve")
    out = run.resume(Chain(MailboxInterviewer(mailbox, print), AutoApproveInterviewer()))
    assert out.status == RunStatus.COMPLETED and (run.ws.root / "deployed.txt").exists()
    assert run.outcome("do_work")["context_updates"]["response.do_work"] == "deployed it"


def test_a_model_failure_fails_the_run_and_a_retry_continues_the_same_node(
    tmp_path: Path,
) -> None:
    model = ScriptedModel().refuse().reply("plan").reply("applied")
    run = Run(tmp_path, example("review-gate.dot"), model)
    out = run.drive(_queue("A"))
    assert out.status == RunStatus.FAILED and run.meta.error_kind == "model_refused"
    retry = {"level": "INFO", "content": "retried on purpose", "retry": True}
    run.journal.append(EventType.SYSTEM_MESSAGE, retry)  # what `delta run --retry` writes
    assert run.resume(_queue("A")).status == RunStatus.COMPLETED
    assert run.path() == ["start", "do_work", "review_gate", "apply"]


def test_an_outcome_not_yet_routed_is_routed_on_resume_without_running_again(
    tmp_path: Path,
) -> None:
    """A crash after NODE_OUTCOME and before EDGE_TAKEN: the resume takes the edge."""
    run = Run(tmp_path, example("review-gate.dot"), ScriptedModel().reply("plan"))
    run.drive(Chain(MailboxInterviewer(Mailbox(run.ws), print)))
    lines = run.paths.journal.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"NODE_OUTCOME"' in line and "do_work" in line)
    run.paths.journal.write_text("".join(lines[: cut + 1]))
    Mailbox(run.ws).withdraw()
    out = run.resume(Chain(MailboxInterviewer(Mailbox(run.ws), print)))
    assert out.status == RunStatus.WAITING_FOR_INPUT
    assert run.path() == ["start", "do_work", "review_gate"] and len(run.model.calls) == 1


@pytest.mark.spawns  # a tool node runs its command
def test_a_tool_node_cut_short_by_a_crash_is_not_run_again(tmp_path: Path) -> None:
    run = Run(tmp_path, pipeline_graph(TOOLS % "echo run >> runs.txt; printf ok"), ScriptedModel())
    run.drive(_queue())
    lines = run.paths.journal.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"ACTION_REQUEST"' in line)
    run.paths.journal.write_text("".join(lines[: cut + 1]))  # as if killed while it ran
    run.meta.status = RunStatus.RUNNING
    save_metadata(run.paths.metadata, run.meta)
    assert run.resume(_queue()).status == RunStatus.COMPLETED
    assert (run.ws.root / "runs.txt").read_text() == "run\n"
    assert "not re-run" in run.outcome("check")["failure_reason"]
    assert run.path() == ["start", "check"]  # its fail edge to the exit


def test_replay_finds_the_node_in_progress_and_the_context() -> None:
    run_events = [
        ("NODE_START", {"node": "start", "kind": "start"}),
        ("NODE_OUTCOME", {"node": "start", "status": "success"}),
        ("EDGE_TAKEN", {"source": "start", "target": "w", "step": "weight"}),
        ("NODE_START", {"node": "w", "kind": "codergen", "attempt": 2, "prompt": "p"}),
    ]
    from deltad.protocol.models import JournalEvent

    events = [
        JournalEvent(seq=i, timestamp=utcnow(), type=t, payload=p)
        for i, (t, p) in enumerate(run_events, start=1)
    ]
    state = replay(events, "start")
    assert state.visit is not None and (state.visit.node, state.visit.seq) == ("w", 4)
    assert state.visit.attempt == 2 and state.at is None and state.path == ["start"]
    done = JournalEvent(
        seq=5,
        timestamp=utcnow(),
        type="NODE_OUTCOME",
        payload={"node": "w", "status": "success", "context_updates": {"k": "v"}},
    )
    state = replay([*events, done], "start", "ship it")
    assert state.visit is None and state.decided is not None and state.context["k"] == "v"
    # The spec's built-in keys (§5.1), derived from the same lines.
    builtins = {k: v for k, v in state.context.items() if k != "k"}
    assert builtins == {
        "graph.goal": "ship it",
        "current_node": "w",
        "outcome": "success",
        "preferred_label": "",
        "internal.retry_count.start": 0,
        "internal.retry_count.w": 1,
    }
    assert replay([], "start").at == "start"


@pytest.mark.parametrize(
    ("status", "attempt", "max_retries", "allow_partial", "expected"),
    [
        (Status.RETRY, 1, 1, False, Status.RETRY),  # a retry left
        (Status.RETRY, 2, 1, False, Status.FAIL),
        (Status.RETRY, 2, 1, True, Status.PARTIAL_SUCCESS),
        (Status.RETRY, 1, 0, True, Status.PARTIAL_SUCCESS),
        (Status.FAIL, 5, 1, True, Status.FAIL),  # allow_partial is about retries only
        (Status.SUCCESS, 9, 0, False, Status.SUCCESS),
    ],
)
def test_after_attempt(
    status: Status, attempt: int, max_retries: int, allow_partial: bool, expected: Status
) -> None:
    got = after_attempt(Outcome(status), attempt, max_retries, allow_partial)
    assert got.status == expected
    if expected != status:
        assert f"after {attempt} attempt(s) (max_retries {max_retries})" in (
            got.failure_reason + got.notes
        )


@pytest.mark.parametrize(
    ("attempt", "r", "expected"),
    [(2, 0.0, 0.1), (2, 0.5, 0.15), (3, 0.0, 0.2), (4, 0.0, 0.4), (30, 0.0, 30.0)],
)
def test_backoff_follows_the_spec_standard_policy(attempt: int, r: float, expected: float) -> None:
    assert backoff_seconds(attempt, r) == pytest.approx(expected)
