"""`delta run --pipeline` end to end: real `delta` (and `deltad`) processes, the fake model.

The seed's end-to-end rows (a gate approved or sent back, --auto-approve, an interactive node,
two gates) through scripted answers; pausing at a gate and answering by file; misfits
refused; crashes between nodes and in the middle of an interactive node; refused graphs; and
deltad resuming a pipeline (an answer, a deadline with and without a default).
"""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path
from typing import Any

from deltad.testing import FakeLLM
from tests.support.daemon import metadata_status, wait_for

from ..conftest import EXAMPLES, Delta
from .test_daemon_client import _daemon

REVIEW = EXAMPLES / "pipelines" / "review-gate.dot"
TWO_GATES = EXAMPLES / "pipelines" / "two-gates.dot"
INTERACTIVE = EXAMPLES / "pipelines" / "interactive.dot"


def _pipeline(d: Delta, dot: Path, *extra: str, **kw: Any) -> Any:
    return d("run", "--pipeline", str(dot), "--agent", str(d.agent), *extra, **kw)


def _answers(d: Delta, *items: str) -> str:
    path = d.ws.parent / "answers.json"
    path.write_text(json.dumps(list(items)))
    return str(path)


def _path(d: Delta) -> list[str]:
    return [e["payload"]["node"] for e in d.events("NODE_START")]


def _write(d: Delta, name: str, text: str) -> Path:
    path = d.ws.parent / name
    path.write_text(textwrap.dedent(text))
    return path


# -- the seed's end-to-end rows ----------------------------------------------------------------
def test_pipeline_with_human_gate_approved_routes_to_exit(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("the plan").reply("applied")
    r = _pipeline(delta, REVIEW, "--answers", _answers(delta, "approve"))
    assert r.code == 0, r.err
    assert r.out.strip() == "applied"
    assert _path(delta) == ["start", "do_work", "review_gate", "apply"]
    assert delta.status() == "COMPLETED" and delta.metadata()["current_node"] == "apply"
    # The run is a run: its configuration holds the graph it was started with.
    copy = delta.run_dir / "configuration" / "pipeline.dot"
    assert copy.read_text() == REVIEW.read_text()
    assert delta.metadata()["task"] == "Write a release note for version 1.4"
    [asked] = [e["payload"] for e in delta.events("HUMAN_INTERACTION")][:1]
    assert asked["request"]["node_id"] == "review_gate"
    assert asked["request"]["input_type"] == "choice"


def test_pipeline_with_auto_approve_never_pauses(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("plan").reply("applied")
    r = _pipeline(delta, REVIEW, "--auto-approve", "--task", "ship 2.0")
    assert r.code == 0, r.err
    assert _path(delta)[-1] == "apply"
    assert not (delta.delta_dir / "interaction" / "request.json").exists()
    assert "ship 2.0" in fake.requests[0]["messages"][1]["content"]  # --task is $goal


def test_pipeline_with_interactive_node(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("How about tern?").reply("Then heron?").reply("We chose heron.")
    r = _pipeline(delta, INTERACTIVE, "--answers", _answers(delta, "shorter", "/done"))
    assert r.code == 0, r.err
    assert r.out.strip() == "We chose heron."
    assert fake.requests[1]["messages"][-1] == {"role": "user", "content": "shorter"}
    outcomes = {e["payload"]["node"]: e["payload"]["status"] for e in delta.events("NODE_OUTCOME")}
    assert outcomes["brainstorm"] == "success"


def test_multiple_human_gates(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("plan").reply("built").reply("shipped")
    r = _pipeline(delta, TWO_GATES, "--answers", _answers(delta, "A", "[S] Ship"))
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "plan", "plan_gate", "build", "release_gate", "ship"]


# -- pausing at a gate -------------------------------------------------------------------------
def test_a_gate_pauses_refuses_a_misfit_and_takes_a_choice(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("plan").reply("applied")
    r = _pipeline(delta, REVIEW)
    assert r.code == 101, r.err
    assert "Node:     review_gate (pipeline)" in r.out and "[A] Approve" in r.out
    req = delta.request()
    assert req["input_type"] == "choice" and req["node_id"] == "review_gate"
    assert [o["key"] for o in req["options"]] == ["A", "R"]
    status = delta("status")
    assert "Node:       review_gate" in status.out

    delta.answer("Deploy")  # matches no choice: refused, never the first choice
    r = delta("run")
    assert r.code == 101 and "not one of the options" in r.err
    assert delta.status() == "WAITING_FOR_INPUT" and delta.request() == req
    assert list((delta.delta_dir / "interaction").glob("response.rejected-*.txt"))

    assert delta("respond", "--choice", "approve").code == 0
    r = delta("run")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "do_work", "review_gate", "apply"]
    assert len(fake.requests) == 2  # no node ran twice
    assert not (delta.delta_dir / "interaction" / "request.json").exists()


def test_a_gate_at_the_terminal_shows_its_keys_and_asks_until_one_fits(
    delta: Delta, fake: FakeLLM
) -> None:
    """Also the seed's "pipeline with reject": revise, then the gate asks again."""
    fake.reply("plan").reply("revised").reply("applied")
    r = _pipeline(delta, REVIEW, "-i", input="Deploy\nR\nA\n")
    assert r.code == 0, r.err
    assert "[review_gate] Review the plan" in r.out and "  [A] Approve\n  [R] Revise" in r.out
    assert "'Deploy' is not one of the options" in r.out
    assert _path(delta) == ["start", "do_work", "review_gate", "revise", "review_gate", "apply"]


def test_refused_graphs_exit_2_and_leave_nothing(delta: Delta, fake: FakeLLM) -> None:
    broken = _write(
        delta,
        "broken.dot",
        """\
        digraph t {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            gate [shape=hexagon]
            lost [prompt="never reached"]
            start -> gate
        }
        """,
    )
    r = _pipeline(delta, broken)
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert all(line.startswith("delta: error: ") for line in lines) and len(lines) >= 3
    assert any("node gate" in line and "outgoing" in line for line in lines)
    assert any("node lost: not reachable" in line for line in lines)
    assert "Traceback" not in r.err
    syntax = _write(delta, "syntax.dot", "digraph t { start -> }\n")
    r = _pipeline(delta, syntax)
    assert r.code == 2 and "syntax.dot:1:" in r.err
    missing = _pipeline(delta, delta.ws.parent / "nope.dot")
    assert missing.code == 2 and "no such file" in missing.err
    assert not delta.delta_dir.exists() and not fake.requests


def test_the_spec_human_gate_runs_and_warns_once_at_start(delta: Delta, fake: FakeLLM) -> None:
    """Attractor spec §2.13: nodes only named in edges run as LLM steps; the warnings (those
    two, and a tool_hooks.pre that is not carried out) are printed when the run starts, not when
    it resumes."""
    dot = _write(
        delta,
        "review.dot",
        """\
        digraph Review {
            start [shape=Mdiamond, label="Start"]
            exit  [shape=Msquare, label="Exit"]
            review_gate [shape=hexagon, label="Review Changes", type="wait.human"]
            node [tool_hooks.pre="audit.sh"]
            start -> review_gate
            review_gate -> ship_it [label="[A] Approve"]
            review_gate -> fixes   [label="[F] Fix"]
            ship_it -> exit
            fixes -> review_gate
        }
        """,
    )
    r = _pipeline(delta, dot)
    assert r.code == 101, r.err
    warnings = [line for line in r.err.splitlines() if line.startswith("delta: warning: ")]
    assert [w.rsplit(" [", 1)[1] for w in warnings] == [
        "W001 ignored-attribute]",  # the node default, once for both nodes
        "W003 edge-only-node]",
        "W003 edge-only-node]",
    ]
    assert "node ship_it and 1 more: tool_hooks.pre is ignored" in warnings[0]
    fake.reply("shipped")
    assert delta("respond", "--choice", "A").code == 0
    r = delta("run")
    assert r.code == 0, r.err
    assert "warning" not in r.err
    assert _path(delta) == ["start", "review_gate", "ship_it"]
    assert "ship_it" in json.dumps(fake.requests[0])  # its prompt is its label: the id


# -- crashes -----------------------------------------------------------------------------------
def test_kill_between_nodes_resumes_without_running_the_finished_node(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.reply("the plan").hang(60)  # the second node's model call never answers
    argv = ["run", "--pipeline", str(REVIEW), "--agent", str(delta.agent), "--auto-approve"]
    proc = delta.popen(*argv)
    try:
        wait_for(lambda: len(fake.requests) == 2, "the second node's model call")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert delta.status() == "RUNNING" and delta.metadata()["current_node"] == "apply"
    fake.reply("applied")
    r = delta("run", "--auto-approve")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "do_work", "review_gate", "apply"]
    assert len(delta.events("THOUGHT")) == 2  # do_work's plan once, apply's once
    assert len(fake.requests) == 3  # the killed call is asked again, nothing else
    assert "crash or kill -9" in json.dumps(delta.events("SYSTEM_MESSAGE"))


def test_kill_mid_interactive_node_continues_at_the_next_turn(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("one?").reply("two?")
    assert _pipeline(delta, INTERACTIVE).code == 101
    delta.answer("more")
    assert delta("run").code == 101  # turn 2 asked
    delta.answer("again")
    # Killed at the commit point of turn 2's answer: recorded, not yet given to the agent.
    assert delta("run", env={"DELTA_FAULT": "after_journal"}).code == -signal.SIGKILL
    fake.reply("three?")
    assert delta("run").code == 101  # turn 3: the agent heard "again", nobody asked twice
    assert delta.request()["prompt"].startswith("three?")
    delta.answer("/approve")
    fake.reply("summary")
    r = delta("run")
    assert r.code == 0 and r.out.strip() == "summary"
    asked = [e for e in delta.events("HUMAN_INTERACTION") if e["payload"]["phase"] == "asked"]
    assert len(asked) == 3
    assert [e["payload"]["text"] for e in delta.events("NODE_MESSAGE")] == ["more", "again"]
    assert len(fake.requests) == 4 and fake.requests[2]["messages"][-1]["content"] == "again"


# -- deltad resumes pipelines ------------------------------------------------------------------
def _daemon_ws(tmp: Path, fake: FakeLLM) -> Delta:
    from ..conftest import write_agent

    (tmp / "root" / "ws").mkdir(parents=True)
    return Delta(tmp / "root" / "ws", fake, write_agent(tmp))


GATED = """\
digraph g {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    gate [shape=hexagon, label="Ship?", timeout="1s" %s]
    ship [prompt="ship it"]
    hold [prompt="hold it"]
    start -> gate
    gate -> ship [label="[S] Ship"]
    gate -> hold [label="[H] Hold"]
    ship -> exit
    hold -> exit
}
"""


def test_deltad_resumes_a_gate_answered_by_file(tmp_path: Path, fake: FakeLLM) -> None:
    d = _daemon_ws(tmp_path, fake)
    fake.reply("plan").reply("applied")
    with _daemon(tmp_path, tmp_path / "root", fake):
        assert _pipeline(d, REVIEW).code == 101
        d.answer("A")
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "deltad to finish the pipeline")
    assert _path(d) == ["start", "do_work", "review_gate", "apply"]


def test_deltad_takes_the_default_at_a_gate_deadline(tmp_path: Path, fake: FakeLLM) -> None:
    d = _daemon_ws(tmp_path, fake)
    dot = _write(d, "g.dot", GATED % ', human.default_choice="hold"')
    fake.reply("held")
    with _daemon(tmp_path, tmp_path / "root", fake):
        assert _pipeline(d, dot).code == 101
        assert d.request()["expires_at"] and d.request()["default"] == "H"
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the deadline to take the default")
    assert _path(d) == ["start", "gate", "hold"]
    [answered] = [e["payload"] for e in d.events("HUMAN_INTERACTION")][1:]
    assert answered["reply"]["outcome"] == "timeout" and answered["reply"]["key"] == "H"


def test_deltad_retries_a_gate_without_default_then_fails(tmp_path: Path, fake: FakeLLM) -> None:
    d = _daemon_ws(tmp_path, fake)
    dot = _write(d, "g.dot", GATED % ", max_retries=1")
    with _daemon(tmp_path, tmp_path / "root", fake):
        assert _pipeline(d, dot).code == 101
        wait_for(lambda: metadata_status(d.ws) == "FAILED", "two deadlines to pass")
    assert _path(d) == ["start", "gate", "gate"]
    assert "gave up after 2 attempt(s)" in d.metadata()["error"]
    assert not fake.requests
