"""Every run is bounded: `max_iterations` counts the model calls of the whole run (every
pipeline node, every resume, from the journal) and a pipeline's `max_steps` counts its node
visits (tool nodes and gates too). Reaching either ends the run FAILED with a one-line reason.

Real `delta` processes against the fake model; each graph is a cycle whose exit never holds.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from deltad.testing import FakeLLM, tool_call

from ..conftest import Delta

LLM_CYCLE = """
digraph cycle {
    start [shape=Mdiamond]; exit [shape=Msquare]
    write [prompt="Write the note"]
    review [prompt="Review the note"]
    start -> write -> review
    review -> exit [condition="context.approved=yes"]
    review -> write
}
"""

# The check fails until it has run 60 times: without a step limit the cycle ends on its own
# (COMPLETED) long after max_steps, instead of running for ever.
TOOL_CYCLE = """
digraph tools {
    graph [max_steps=20]
    start [shape=Mdiamond]; exit [shape=Msquare]
    check [shape=parallelogram,
           tool_command="echo run >> checks.txt; test $(wc -l < checks.txt) -ge 60"]
    fix [shape=parallelogram, tool_command="echo fixing"]
    start -> check
    check -> exit [condition="outcome=success"]
    check -> fix [condition="outcome=fail"]
    fix -> check
}
"""


def _dot(d: Delta, name: str, text: str) -> Path:
    path = d.ws.parent / name
    path.write_text(textwrap.dedent(text))
    return path


def _run_end(d: Delta) -> dict[str, str]:
    [end] = [e["payload"] for e in d.events("RUN_END")]
    return end


def test_a_cycle_of_model_nodes_stops_at_max_iterations_across_nodes(
    delta: Delta, fake: FakeLLM
) -> None:
    for i in range(12):  # more than the limit; the script running out would stop it anyway
        fake.reply(f"draft {i}")
    dot = _dot(delta, "cycle.dot", LLM_CYCLE)
    r = delta("run", "--pipeline", str(dot), "--agent", str(delta.agent), "--max-iterations", "5")
    assert r.code == 1, r.err
    assert len(fake.requests) == 5  # write, review, write, review, write: then no more calls
    meta = delta.metadata()
    assert meta["status"] == "FAILED" and meta["iterations_completed"] == 5
    reason = "stopped after max_iterations (5): the run made 5 model calls"
    assert meta["error"] == reason and _run_end(delta) == {"status": "FAILED", "reason": reason}
    assert reason in r.err and len(meta["error"].splitlines()) == 1
    assert reason in delta("status").out
    assert [e["payload"]["node"] for e in delta.events("NODE_START")][-1] == "review"
    assert delta.events("NODE_OUTCOME")[-1]["payload"]["node"] == "write"  # review never ended


def test_a_cycle_of_tool_nodes_stops_at_the_graph_max_steps(delta: Delta, fake: FakeLLM) -> None:
    dot = _dot(delta, "tools.dot", TOOL_CYCLE)
    r = delta("run", "--pipeline", str(dot), "--agent", str(delta.agent))
    assert r.code == 1, r.err
    assert fake.requests == []
    visits = [e["payload"]["node"] for e in delta.events("NODE_START")]
    assert len(visits) == 20 and visits[:4] == ["start", "check", "fix", "check"]
    assert (delta.ws / "checks.txt").read_text().count("run") == 10
    meta = delta.metadata()
    reason = "stopped after max_steps (20): the pipeline made 20 node visits; next was fix"
    assert meta["status"] == "FAILED" and meta["error"] == reason
    assert _run_end(delta) == {"status": "FAILED", "reason": reason}
    assert reason in r.err and reason in delta("status").out
    # The journal is bounded by the steps: a few lines per visit, no more.
    assert len(delta.journal()) <= 2 + 5 * len(visits)


def test_the_iteration_count_survives_a_pause_and_resume(delta: Delta, fake: FakeLLM) -> None:
    fake.call("echo", {"text": "one"})
    fake.reply(None, tool_call("ask_human", {"prompt": "Go on?"}, id="ask"))
    for i in range(3):  # the model would go on calling tools
        fake.call("echo", {"text": f"after {i}"})
    r = delta.start("loop", "--max-iterations", "3")
    assert r.code == 101, r.err
    assert len(fake.requests) == 2
    assert delta.metadata()["iterations_completed"] == 2  # both calls count, while it waits
    delta.answer("yes\n")
    r = delta("run")
    assert r.code == 1, r.err
    assert len(fake.requests) == 3  # one call left after the resume, not three
    meta = delta.metadata()
    assert meta["status"] == "FAILED" and meta["iterations_completed"] == 3
    assert meta["error"] == "stopped after max_iterations (3): the run made 3 model calls"


def test_a_bad_max_steps_is_refused_by_check_and_run(delta: Delta, fake: FakeLLM) -> None:
    dot = _dot(delta, "bad.dot", TOOL_CYCLE.replace("max_steps=20", "max_steps=0"))
    r = delta("pipeline", "check", str(dot))
    assert r.code == 2 and "Traceback" not in r.err
    [line] = [x for x in r.err.splitlines() if "max_steps" in x]
    assert line == (
        f"delta: error: {dot}:3:22: graph: max_steps: '0' must be from 1 to 1000000"
        " [E003 bad-value]"
    )
    r = delta("run", "--pipeline", str(dot), "--agent", str(delta.agent))
    assert r.code == 2 and "max_steps" in r.err
    assert not delta.delta_dir.exists()


GATE_CYCLE = """
digraph g {
    start [shape=Mdiamond]; exit [shape=Msquare]
    ask [shape=hexagon, label="Again?"]
    redo [shape=parallelogram, tool_command="echo again >> redo.txt"]
    start -> ask
    ask -> redo [label="[A] Again"]
    ask -> exit [label="[S] Stop"]
    redo -> ask
}
"""


def test_max_steps_from_the_command_line_for_a_run_and_its_resume(
    delta: Delta, fake: FakeLLM
) -> None:
    tools = _dot(delta, "tools.dot", TOOL_CYCLE)
    r = delta("run", "--pipeline", str(tools), "--agent", str(delta.agent), "--max-steps", "6")
    assert r.code == 1, r.err
    assert len(delta.events("NODE_START")) == 6 and "max_steps (6)" in delta.metadata()["error"]
    # A gate in a cycle, the graph's default limit; the resume lowers it: the count goes on.
    gates = _dot(delta, "gates.dot", GATE_CYCLE)
    r = delta("run", "--new", "--pipeline", str(gates), "--agent", str(delta.agent))
    assert r.code == 101, r.err
    delta.answer("A\n")
    r = delta("run", "--max-steps", "3")
    assert r.code == 1, r.err
    reason = "stopped after max_steps (3): the pipeline made 3 node visits; next was ask"
    assert delta.metadata()["error"] == reason and delta.metadata()["max_steps"] == 3
    assert [e["payload"]["node"] for e in delta.events("NODE_START")] == ["start", "ask", "redo"]


def test_max_steps_without_a_pipeline_is_refused(delta: Delta, fake: FakeLLM) -> None:
    r = delta.start("t", "--max-steps", "5")
    assert r.code == 2 and "--max-steps" in r.err and "--pipeline" in r.err
    assert "Traceback" not in r.err and not delta.delta_dir.exists()
    fake.call("ask_human", {"prompt": "Go on?"}, id="q")
    assert delta.start("t").code == 101
    r = delta("run", "--max-steps", "5")
    assert r.code == 2 and "not a pipeline run" in r.err and "Traceback" not in r.err
    assert delta.status() == "WAITING_FOR_INPUT" and delta.metadata().get("max_steps") is None
