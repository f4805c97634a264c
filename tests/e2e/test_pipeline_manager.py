"""The manager loop (attractor §4.11), for real: `delta run --pipeline` processes against the
fake model. A `house` node runs the child pipeline of `stack.child_dotfile` inside the run,
node by node, its journal lines marked `child`; the child's gate asks in the run's mailbox
(and is answered over the inbox, `deltad` resuming the run);
a kill -9 in the middle of the child resumes it without running a finished child node again;
the manager judges the child (completed, failed, its stop condition, its max cycles).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import client, http_url, make_token

from ..conftest import EXAMPLES, Delta, llm_env, write_agent
from .test_pipeline_flow import _run, status

MANAGER = EXAMPLES / "pipelines" / "manager.dot"


def _path(d: Delta) -> list[str]:
    """The run's own node visits (the child's aside)."""
    return [e["payload"]["node"] for e in d.events("NODE_START") if "child" not in e["payload"]]


def _child_starts(d: Delta) -> list[str]:
    return [e["payload"]["node"] for e in d.events("NODE_START") if "child" in e["payload"]]


def _outcome(d: Delta, node: str) -> dict[str, Any]:
    found = [e["payload"] for e in d.events("NODE_OUTCOME") if e["payload"]["node"] == node]
    return found[-1]


def _graphs(d: Delta, parent: str, child: str) -> Path:
    """A parent graph (start, exit and `body`) whose manager supervises `child`'s graph."""
    (d.ws.parent / "child.dot").write_text(textwrap.dedent(child))
    path = d.ws.parent / "parent.dot"
    path.write_text(
        'digraph parent {\n    graph [stack.child_dotfile="child.dot"]\n'
        "    start [shape=Mdiamond]\n    exit [shape=Msquare]\n"
        + textwrap.indent(textwrap.dedent(parent), "    ")
        + "}\n"
    )
    return path


def test_the_manager_runs_its_child_and_the_childs_gate_asks_in_the_mailbox(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.reply("the plan").reply("built it")
    assert _run(delta, MANAGER).code == 101
    assert _child_starts(delta) == ["start", "plan", "build", "accept"]
    request = delta.request()
    assert request["node_id"] == "accept" and request["context"]["reviewed_node"] == "build"
    # The child's prompts have the child's goal; its start is journaled under the manager.
    assert "One sprint of the feature" in fake.requests[0]["messages"][1]["content"]
    [started] = [
        e["payload"] for e in delta.events("EDGE_TAKEN") if e["payload"]["step"] == "child_start"
    ]
    assert (started["source"], started["target"]) == ("supervise", "start")
    delta.answer("A")
    fake.reply("the report")
    r = delta("run")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "supervise", "report"]
    supervised = _outcome(delta, "supervise")
    assert supervised["status"] == "success" and supervised["notes"] == "child completed"
    seen = supervised["context_updates"]
    assert seen["stack.child.status"] == "completed" and seen["stack.child.cycles"] == 3
    # The report's prompt (compact fidelity) sees what the manager observed.
    assert "stack.child.status: completed" in fake.requests[2]["messages"][1]["content"]
    assert len(fake.requests) == 3


def test_kill_mid_child_resumes_the_child_without_rerunning_its_finished_nodes(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.reply("the plan").hang(60)  # build's model call never answers
    proc = delta.popen("run", "--pipeline", str(MANAGER), "--agent", str(delta.agent))
    try:
        wait_for(lambda: len(fake.requests) == 2, "the child's build node's model call")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert delta.status() == "RUNNING" and delta.metadata()["current_node"] == "build"
    fake.reply("built it").reply("the report")
    r = delta("run", "--auto-approve")
    assert r.code == 0, r.err
    assert _child_starts(delta) == ["start", "plan", "build", "accept"]  # plan ran once
    assert len(delta.events("THOUGHT")) == 3  # plan, build, report: once each
    assert len(fake.requests) == 4  # the killed call asked again, nothing else


LOOPING_CHILD = """\
digraph child {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [prompt="work"]
    start -> work
    work -> work [condition="outcome!=fail"]
    work -> exit [condition="outcome=fail"]
}
"""


def test_a_child_that_fails_fails_the_manager_and_routes_its_fail_edge(
    delta: Delta, fake: FakeLLM
) -> None:
    dot = _graphs(
        delta,
        """\
        m [shape=house]
        after_fail [prompt="handle it"]
        start -> m
        m -> exit [condition="outcome=success"]
        m -> after_fail [condition="outcome=fail"]
        after_fail -> exit
        """,
        LOOPING_CHILD.replace("outcome!=fail", "outcome=retry").replace(
            'work -> exit [condition="outcome=fail"]', 'work -> exit [condition="outcome=success"]'
        ),
    )
    fake.reply(status("fail", failure_reason="the build is red")).reply("handled")
    r = _run(delta, dot)
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "m", "after_fail"]
    failed = _outcome(delta, "m")
    assert failed["status"] == "fail"
    assert failed["failure_reason"] == "child failed: node work failed: the build is red"


def test_the_stop_condition_ends_the_manager_with_success(delta: Delta, fake: FakeLLM) -> None:
    dot = _graphs(
        delta,
        """\
        m [shape=house, manager.stop_condition="context.stack.child.outcome=partial_success"]
        start -> m -> exit
        """,
        LOOPING_CHILD,
    )
    fake.reply("first").reply(status("partial_success")).reply("never asked")
    r = _run(delta, dot)
    assert r.code == 0, r.err
    assert _child_starts(delta) == ["start", "work", "work"]
    stopped = _outcome(delta, "m")
    assert stopped["status"] == "success" and "stop condition" in stopped["notes"]
    assert len(fake.requests) == 2


def test_max_cycles_fails_the_manager(delta: Delta, fake: FakeLLM) -> None:
    dot = _graphs(
        delta, "m [shape=house, manager.max_cycles=3]\nstart -> m -> exit\n", LOOPING_CHILD
    )
    fake.always("again")
    r = _run(delta, dot)
    assert r.code == 1
    assert "node m failed: max cycles (3) exceeded" in delta.metadata()["error"]
    assert _child_starts(delta) == ["start", "work", "work", "work"]


def test_the_childs_visits_count_toward_the_runs_max_steps(delta: Delta, fake: FakeLLM) -> None:
    dot = _graphs(delta, "m [shape=house]\nstart -> m -> exit\n", LOOPING_CHILD)
    fake.always("again")
    r = _run(delta, dot, "--max-steps", "5")
    assert r.code == 1
    # start, m, then the child's start and two visits of work: the fifth visit was the last.
    assert delta.metadata()["error"] == (
        "stopped after max_steps (5): the pipeline made 5 node visits; next was work"
    )
    assert _child_starts(delta) == ["start", "work", "work"]


def test_check_lists_the_child_pipeline(delta: Delta) -> None:
    r = delta("pipeline", "check", str(MANAGER))
    assert r.code == 0, r.err
    assert "Child pipeline: children/sprint.dot" in r.out
    assert 'manager.max_cycles="12"' in r.out


def test_a_kill_after_every_outcome_runs_each_node_once(delta: Delta, fake: FakeLLM) -> None:
    """Killed right after each NODE_OUTCOME (the child's and the run's), every resume routes
    the recorded outcome and goes on: no node, of the child or the run, runs twice."""
    fake.always("done")
    fault = {"DELTA_FAULT": "after_outcome"}
    r = _run(delta, MANAGER, "--auto-approve", env=fault)
    kills = 0
    while r.code == -signal.SIGKILL and kills < 30:
        kills += 1
        r = delta("run", "--auto-approve", env=fault)
    assert r.code == 0, r.err
    # start, supervise, report; the child's start, plan, build, accept: each killed once
    assert kills == 7
    assert _path(delta) == ["start", "supervise", "report"]
    assert _child_starts(delta) == ["start", "plan", "build", "accept"]
    assert len(delta.events("THOUGHT")) == len(fake.requests) == 3


def test_a_child_nodes_own_question_pauses_the_run_and_resumes_in_the_child(
    delta: Delta, fake: FakeLLM
) -> None:
    dot = _graphs(
        delta,
        "m [shape=house]\nafter [prompt=after]\nstart -> m -> after -> exit\n",
        'digraph c {\nstart [shape=Mdiamond]\nexit [shape=Msquare]\nw [prompt="ask"]\n'
        "start -> w -> exit\n}\n",
    )
    fake.call("ask_human", {"prompt": "Which colour?"})
    assert _run(delta, dot).code == 101
    assert delta.request()["prompt"] == "Which colour?"
    delta("respond", "blue")
    fake.reply("blue it is").reply("after done")
    r = delta("run")
    assert r.code == 0, r.err
    assert _child_starts(delta) == ["start", "w"] and _path(delta) == ["start", "m", "after"]
    assert fake.tool_results(1) and "blue" in str(fake.tool_results(1))
    assert _outcome(delta, "m")["context_updates"]["stack.child.last_response"] == "blue it is"


def test_a_resume_reads_the_runs_copy_of_the_child(delta: Delta, fake: FakeLLM) -> None:
    dot = _graphs(
        delta,
        "m [shape=house]\nstart -> m -> exit\n",
        "digraph c {\nstart [shape=Mdiamond]\nexit [shape=Msquare]\nok [shape=hexagon]\n"
        'start -> ok\nok -> exit [label="[Y] Yes"]\n}\n',
    )
    assert _run(delta, dot).code == 101
    copy = delta.run_dir / "configuration" / "child.m.dot"
    assert "ok [shape=hexagon]" in copy.read_text()
    (delta.ws.parent / "child.dot").write_text("digraph broken {")  # edited in flight
    delta.answer("Y")
    r = delta("run")
    assert r.code == 0, r.err
    assert _child_starts(delta) == ["start", "ok"]


def test_a_child_file_broken_before_the_manager_starts_fails_the_node(
    delta: Delta, fake: FakeLLM
) -> None:
    dot = _graphs(
        delta,
        'g [shape=hexagon]\nm [shape=house]\nstart -> g\ng -> m [label="[Y] Yes"]\nm -> exit\n',
        "digraph c {\nstart [shape=Mdiamond]\nexit [shape=Msquare]\nstart -> exit\n}\n",
    )
    assert _run(delta, dot).code == 101
    (delta.ws.parent / "child.dot").write_text("digraph broken {")
    delta.answer("Y")
    r = delta("run")
    assert r.code == 1
    error = delta.metadata()["error"]
    assert error.startswith("node m failed: the child pipeline cannot run: ")
    assert "never closed [E002 syntax]" in error and not _child_starts(delta)


def test_the_childs_gate_is_answered_over_http_and_deltad_resumes_the_run(
    tmp_path: Path, fake: FakeLLM
) -> None:
    """The child's gate is a question like any: the inbox lists it, an answer over HTTP
    makes `deltad` resume the run, which finishes the child and then the run."""
    root = tmp_path / "root"
    ws = root / "ws1"
    ws.mkdir(parents=True)
    fake.reply("the plan").reply("built it").reply("the report")
    agent = write_agent(tmp_path)
    resume = ["delta", "run", "--work-dir", "{workspace}"]
    d = Daemon(tmp_path, [root], resume_command=resume, http={"listen": "127.0.0.1:0"})
    d.start(env=llm_env(fake))
    try:
        delta = str(Path(sys.executable).parent / "delta")
        args = [delta, "run", "--pipeline", str(MANAGER), "--agent", str(agent), "-w", str(ws)]
        out = subprocess.run(args, env=llm_env(fake), capture_output=True, text=True, timeout=60)
        assert out.returncode == 101, out.stderr
        with client(http_url(d), make_token(d.state_dir, "alice")) as http:
            [gate] = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the gate")
            assert (gate["node_id"], gate["prompt"]) == ("accept", "Accept the sprint?")
            r = http.post(f"/v1/requests/{gate['request_id']}/answer", json={"answer": "A"})
            assert r.status_code == 202, r.text
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run to finish")
    finally:
        d.stop()
        d.kill_children()
    assert len(fake.requests) == 3  # plan, build, report: each once
