"""Pipelines whose control flow follows the model: real `delta run --pipeline` processes against
the fake model, each outcome scripted in the model's reply (attractor §3.3-§3.7, §5.1, §5.2).

An outcome=fail edge after an LLM node, a preferred label, a goal gate sent back, retries
with backoff (and `allow_partial`), a context update read by a later condition and the
built-in context keys; a pause at a gate after a failed node, and a kill -9 between an
outcome and its routing: a resume routes it the same way and runs nothing twice.
"""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from deltad.testing import FakeLLM
from tests.support.daemon import wait_for

from ..conftest import EXAMPLES, Delta

PIPELINES = sorted((EXAMPLES / "pipelines").glob("*.dot"))


def status(outcome: str, **fields: Any) -> str:
    """A model reply stating its outcome the spec's way: prose, then a fenced status block."""
    return f"Done.\n\n```json\n{json.dumps({'outcome': outcome, **fields})}\n```\n"


def _graph(d: Delta, body: str) -> Path:
    path = d.ws.parent / "flow.dot"
    path.write_text(
        "digraph flow {\n    start [shape=Mdiamond]\n    exit [shape=Msquare]\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
        + "}\n"
    )
    return path


def _run(d: Delta, dot: Path, *extra: str, **kw: Any) -> Any:
    return d("run", "--pipeline", str(dot), "--agent", str(d.agent), *extra, **kw)


def _path(d: Delta) -> list[str]:
    return [e["payload"]["node"] for e in d.events("NODE_START")]


def _outcomes(d: Delta) -> list[tuple[str, str]]:
    return [(e["payload"]["node"], e["payload"]["status"]) for e in d.events("NODE_OUTCOME")]


FAIL_EDGE = """\
work [prompt="make the tests pass"]
fix [prompt="fix: $goal"]
start -> work
work -> exit [condition="outcome=success"]
work -> fix [condition="outcome=fail"]
fix -> exit
"""


def test_a_fail_the_model_states_takes_the_fail_edge(delta: Delta, fake: FakeLLM) -> None:
    fake.reply(status("fail", failure_reason="3 tests red")).reply("fixed")
    r = _run(delta, _graph(delta, FAIL_EDGE))
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "work", "fix"]
    [work] = [e["payload"] for e in delta.events("NODE_OUTCOME") if e["payload"]["node"] == "work"]
    assert work["status"] == "fail" and work["failure_reason"] == "3 tests red"
    [edge] = [e["payload"] for e in delta.events("EDGE_TAKEN") if e["payload"]["source"] == "work"]
    assert edge["target"] == "fix" and edge["step"] == "condition"
    assert _outcomes(delta)[-1] == ("fix", "success")  # plain prose is a success


def test_a_fail_with_no_route_fails_the_run_with_the_models_reason(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.reply(status("fail", failure_reason="no disk"))
    r = _run(delta, _graph(delta, "work\nstart -> work -> exit\n"))
    assert r.code == 1
    assert delta.status() == "FAILED" and "node work failed: no disk" in delta.metadata()["error"]


def test_the_preferred_label_picks_the_edge(delta: Delta, fake: FakeLLM) -> None:
    body = """\
    review [prompt="review it"]
    ship
    hold
    start -> review
    review -> ship [label="[S] Ship", weight=5]
    review -> hold [label="[H] Hold"]
    ship -> exit
    hold -> exit
    """
    fake.reply(status("success", preferred_label="Hold")).reply("held")
    r = _run(delta, _graph(delta, body))
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "review", "hold"]
    [edge] = [
        e["payload"] for e in delta.events("EDGE_TAKEN") if e["payload"]["source"] == "review"
    ]
    assert edge["step"] == "preferred_label"


def test_a_goal_gate_the_model_failed_sends_the_run_back(delta: Delta, fake: FakeLLM) -> None:
    body = """\
    work [goal_gate=true, retry_target=work]
    start -> work
    work -> exit
    """
    fake.reply(status("fail")).reply(status("partial_success"))
    dot = _graph(delta, body.replace("work -> exit", 'work -> exit [condition="outcome!=retry"]'))
    r = _run(delta, dot)
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "work", "work"]
    steps = [e["payload"]["step"] for e in delta.events("EDGE_TAKEN")]
    assert "goal_gate" in steps
    assert _outcomes(delta)[-1] == ("work", "partial_success")


def test_retries_wait_the_backoff_and_begin_the_node_again(delta: Delta, fake: FakeLLM) -> None:
    body = """\
    flaky [max_retries=2]
    start -> flaky -> exit
    """
    fake.reply(status("retry", failure_reason="rate limited")).reply(status("retry")).reply("ok")
    r = _run(delta, _graph(delta, body))
    assert r.code == 0, r.err
    starts = [e["payload"] for e in delta.events("NODE_START") if e["payload"]["node"] == "flaky"]
    assert [s["attempt"] for s in starts] == [1, 2, 3]
    # The spec's standard policy: 200 ms, doubled; jittered into [d/2, d).
    assert "backoff_seconds" not in starts[0]
    assert 0.1 <= starts[1]["backoff_seconds"] <= 0.2
    assert 0.2 <= starts[2]["backoff_seconds"] <= 0.4
    assert _outcomes(delta)[1:] == [("flaky", "retry"), ("flaky", "retry"), ("flaky", "success")]


def test_retries_exhausted_fail_or_with_allow_partial_go_on(delta: Delta, fake: FakeLLM) -> None:
    body = """\
    flaky [max_retries=1 %s]
    start -> flaky -> exit
    """
    fake.reply(status("retry")).reply(status("retry"))
    r = _run(delta, _graph(delta, body % ""))
    assert r.code == 1 and "gave up after 2 attempt(s) (max_retries 1)" in delta.metadata()["error"]

    fake.reply(status("retry")).reply(status("retry", notes="half"))
    r = _run(delta, _graph(delta, body % ", allow_partial=true"), "--new")
    assert r.code == 0, r.err
    assert _outcomes(delta)[-1] == ("flaky", "partial_success")


def test_a_context_update_routes_a_later_condition(delta: Delta, fake: FakeLLM) -> None:
    body = """\
    test [prompt="run the tests"]
    check [shape=diamond]
    good [prompt="ship"]
    bad [prompt="report"]
    start -> test -> check
    check -> good [condition="context.tests=passed && context.graph.goal=ship"]
    check -> bad [condition="context.tests!=passed"]
    good -> exit
    bad -> exit
    """
    fake.reply(status("success", context_updates={"tests": "passed"})).reply("shipped")
    r = _run(delta, _graph(delta, body), "--task", "ship")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "test", "check", "good"]
    # A later prompt shows the model's context, never the engine's bookkeeping.
    prompt = fake.requests[1]["messages"][1]["content"]
    assert "- tests: passed" in prompt
    assert "internal.retry_count" not in prompt and "graph.goal" not in prompt


def test_a_gate_after_a_failed_node_pauses_and_resumes(delta: Delta, fake: FakeLLM) -> None:
    body = """\
    work
    gate [shape=hexagon, label="Work failed: retry?"]
    start -> work
    work -> exit [condition="outcome=success"]
    work -> gate [condition="outcome=fail"]
    gate -> work [label="[R] Retry"]
    gate -> exit [label="[G] Give up"]
    """
    fake.reply(status("fail", failure_reason="flaky network"))
    dot = _graph(delta, body)
    assert _run(delta, dot).code == 101
    assert delta.request()["node_id"] == "gate"
    delta.answer("R")
    fake.reply("worked")
    r = delta("run")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "work", "gate", "work"]
    assert len(fake.requests) == 2


def test_kill_after_an_outcome_routes_it_the_same_on_resume(delta: Delta, fake: FakeLLM) -> None:
    fake.reply(status("fail", failure_reason="red"))
    dot = _graph(delta, FAIL_EDGE)
    r = _run(delta, dot, env={"DELTA_FAULT": "after_outcome"})
    assert r.code == -signal.SIGKILL
    assert _outcomes(delta) == [("start", "success")]  # start's outcome: killed right there
    assert delta("run", env={"DELTA_FAULT": "after_outcome"}).code == -signal.SIGKILL
    assert _outcomes(delta)[-1] == ("work", "fail") and len(fake.requests) == 1
    fake.reply("fixed")
    r = delta("run")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "work", "fix"]  # work's recorded fail routed, not re-run
    assert len(fake.requests) == 2


# -- the examples ------------------------------------------------------------------------------
@pytest.mark.parametrize("dot", PIPELINES, ids=[p.stem for p in PIPELINES])
def test_every_example_pipeline_runs_to_its_exit(delta: Delta, fake: FakeLLM, dot: Path) -> None:
    fake.always("done")
    r = _run(delta, dot, "--auto-approve")
    assert r.code == 0, r.err
    assert delta.status() == "COMPLETED" and _path(delta)[0] == "start"


def test_the_test_fix_loop_example_follows_the_model(delta: Delta, fake: FakeLLM) -> None:
    red = status("fail", failure_reason="2 red", context_updates={"failing": "test_a"})
    fake.reply(red).reply("fixed test_a").reply(status("success")).reply("summary")
    r = _run(delta, EXAMPLES / "pipelines" / "test-fix-loop.dot", "--auto-approve")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "run_tests", "fix", "run_tests", "review", "ship"]
    assert "- failing: test_a" in fake.requests[1]["messages"][1]["content"]


# -- parallel fan-out and fan-in -------------------------------------------------------------
FAN = """\
fan [shape=component %s]
join [shape=tripleoctagon]
start -> fan
fan -> a
fan -> b
a -> join
b -> join
join -> exit
"""


def _branch_results(d: Delta) -> list[dict[str, Any]]:
    [joined] = [e["payload"] for e in d.events("NODE_OUTCOME") if e["payload"]["node"] == "fan"]
    return list(joined["context_updates"]["parallel.results"])


def test_parallel_branches_join_at_the_fan_in(delta: Delta, fake: FakeLLM) -> None:
    fake.reply(status("fail", failure_reason="a broke")).reply("b done")
    r = _run(delta, _graph(delta, FAN % ""))
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "fan", "a", "b", "join"]
    results = _branch_results(delta)
    assert [(x["branch"], x["status"]) for x in results] == [("a", "fail"), ("b", "success")]
    # wait_all: a failed branch makes the parallel node a partial success; the fan-in picks b.
    outcomes = dict(_outcomes(delta))
    assert outcomes["fan"] == "partial_success" and outcomes["join"] == "success"
    [best] = [e["payload"] for e in delta.events("NODE_OUTCOME") if e["payload"]["node"] == "join"]
    assert best["context_updates"]["parallel.fan_in.best_id"] == "b"
    # Each branch had its own copy of the context: b's prompt does not show a's response.
    assert "response.a" not in fake.requests[1]["messages"][1]["content"]


def test_first_success_fails_when_no_branch_succeeds(delta: Delta, fake: FakeLLM) -> None:
    fake.reply(status("fail")).reply(status("fail"))
    r = _run(delta, _graph(delta, FAN % ", join_policy=first_success"))
    assert r.code == 1 and "node fan failed: no branch succeeded" in delta.metadata()["error"]


GATED_FAN = """\
fan [shape=component]
join [shape=tripleoctagon]
ok [shape=hexagon, label="Go on with a?"]
start -> fan
fan -> ok
fan -> b
ok -> a [label="[Y] Yes"]
a -> join
b -> join
join -> exit
"""


def test_a_gate_in_a_branch_pauses_only_that_branch(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("b done")
    dot = _graph(delta, GATED_FAN)
    assert _run(delta, dot).code == 101
    # The other branch ran to its end before the run paused at the gate.
    assert _path(delta) == ["start", "fan", "b", "ok"] and len(fake.requests) == 1
    assert delta.request()["node_id"] == "ok"
    delta.answer("Y")
    fake.reply("a done")
    r = delta("run")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "fan", "b", "ok", "a", "join"]
    assert len(fake.requests) == 2  # b never ran again
    assert [x["branch"] for x in _branch_results(delta)] == ["ok", "b"]


def test_kill_mid_branch_resumes_without_rerunning_finished_nodes(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.reply("a done").hang(60)  # b's model call never answers
    proc = delta.popen(
        "run", "--pipeline", str(_graph(delta, FAN % "")), "--agent", str(delta.agent)
    )
    try:
        wait_for(lambda: len(fake.requests) == 2, "branch b's model call")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert delta.status() == "RUNNING" and delta.metadata()["current_node"] == "b"
    fake.reply("b done")
    r = delta("run")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "fan", "a", "b", "join"]
    assert len(delta.events("THOUGHT")) == 2  # a's once, b's once
    assert len(fake.requests) == 3  # the killed call is asked again, nothing else


def test_kill_after_a_retry_outcome_begins_the_next_attempt_on_resume(
    delta: Delta, fake: FakeLLM
) -> None:
    body = """\
    flaky [max_retries=1]
    check [shape=diamond]
    good
    start -> flaky -> check
    check -> good [condition="context.tried=once"]
    good -> exit
    """
    dot = _graph(delta, body)
    fake.reply(status("retry", context_updates={"tried": "once"}))
    fault = {"DELTA_FAULT": "after_outcome"}
    assert _run(delta, dot, env=fault).code == -signal.SIGKILL  # after start's outcome
    assert delta("run", env=fault).code == -signal.SIGKILL  # after flaky's retry
    assert _outcomes(delta)[-1] == ("flaky", "retry")
    fake.reply("ok").reply("good")
    r = delta("run")
    assert r.code == 0, r.err
    starts = [e["payload"] for e in delta.events("NODE_START") if e["payload"]["node"] == "flaky"]
    assert [s["attempt"] for s in starts] == [1, 2]
    assert _path(delta) == ["start", "flaky", "flaky", "check", "good"]
    assert len(fake.requests) == 3  # attempt 1 once, attempt 2, good


def test_a_fan_in_with_a_prompt_lets_the_model_pick(delta: Delta, fake: FakeLLM) -> None:
    body = FAN.replace(
        "join [shape=tripleoctagon]", 'join [shape=tripleoctagon, prompt="Pick one"]'
    )
    pick = status("success", context_updates={"parallel.fan_in.best_id": "b"})
    fake.reply("a done").reply("b done").reply(pick)
    r = _run(delta, _graph(delta, body % ""))
    assert r.code == 0, r.err
    asked = fake.requests[2]["messages"][1]["content"]
    assert asked.startswith("Pick one") and "parallel.results" in asked and "b done" in asked
    [joined] = [
        e["payload"] for e in delta.events("NODE_OUTCOME") if e["payload"]["node"] == "join"
    ]
    assert joined["context_updates"]["parallel.fan_in.best_id"] == "b"  # the heuristic says a


def test_no_condition_holding_falls_back_to_the_heaviest_edge_and_asks_the_gate_after_it(
    delta: Delta, fake: FakeLLM
) -> None:
    """A corpus graph (every edge out of its test gate reads `context.tool.last_line`, which
    nothing sets) ended COMPLETED at that gate and never asked "Approve for release?". Attractor
    spec 1.0 §3.3's "Fallback: any edge" takes the heaviest edge instead: the release gate is
    asked, and the journal says why the edge was taken."""
    body = """\
    test [prompt="run the tests"]
    test_gate [shape=diamond]
    fix [prompt="fix them"]
    final_review [prompt="review everything"]
    release [shape=hexagon, label="Approve for release?"]
    start -> test -> test_gate
    test_gate -> fix [condition="context.tool.last_line=fail"]
    test_gate -> final_review [condition="context.tool.last_line=pass", weight=10]
    fix -> test
    final_review -> release
    release -> exit [label="[A] Approve"]
    release -> fix [label="[F] Fix"]
    """
    fake.reply("tests ran").reply("reviewed")
    assert _run(delta, _graph(delta, body)).code == 101
    assert delta.request()["node_id"] == "release"
    assert _path(delta) == ["start", "test", "test_gate", "final_review", "release"]
    [taken] = [
        e["payload"] for e in delta.events("EDGE_TAKEN") if e["payload"]["target"] == "final_review"
    ]
    assert taken["step"] == "fallback" and "no condition holds" in taken["reason"], taken
