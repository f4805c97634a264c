"""Parallel branches as the attractor spec runs them (§4.8), for real: `delta run --pipeline`
processes against the fake model, each outcome scripted in its reply.

A gate in a branch reviews its own branch's output; a codergen node's own `ask_human` in a
branch pauses only that branch; `max_parallel` bounds the branches under way; a nested
parallel node is refused by `check`.
"""

from __future__ import annotations

import signal

from deltad.testing import FakeLLM

from ..conftest import EXAMPLES, Delta
from .test_pipeline_flow import _graph, _path, _run, status

REVIEWED_FAN = """\
fan [shape=component]
join [shape=tripleoctagon]
a [prompt="write a"]
b [prompt="write b"]
ok [shape=hexagon, label="Is a good?"]
start -> fan
fan -> a
fan -> b
a -> ok
ok -> join [label="[Y] Yes"]
b -> join
join -> exit
"""


def test_a_gate_in_a_branch_reviews_its_own_branchs_output(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("the output of a").reply("the output of b")
    assert _run(delta, _graph(delta, REVIEWED_FAN)).code == 101
    # b ran after a (the gate waits while b can go on): the last output journaled is b's.
    assert _path(delta) == ["start", "fan", "a", "b", "ok"]
    context = delta.request()["context"]
    assert context["reviewed_node"] == "a"
    assert context["reviewed_output"] == "the output of a"


GATED_FAN = """\
fan [shape=component%s]
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


def test_max_parallel_bounds_the_branches_under_way(delta: Delta, fake: FakeLLM) -> None:
    # Without a bound, b runs while the first branch waits at its gate (test_pipeline_flow);
    # with max_parallel=1 the first branch is under way until it ends: b has not begun.
    assert _run(delta, _graph(delta, GATED_FAN % ", max_parallel=1")).code == 101
    assert _path(delta) == ["start", "fan", "ok"] and not fake.requests
    delta.answer("Y")
    fake.reply("a done").reply("b done")
    r = delta("run")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "fan", "ok", "a", "b", "join"]


RESTART = """\
a [prompt="write a"]
b [prompt="check a"]
start -> a -> b
b -> a [condition="outcome=fail", loop_restart=true]
b -> exit [condition="outcome=success"]
"""


def test_a_loop_restart_edge_starts_the_pipeline_afresh(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("first a").reply(status("fail", context_updates={"kept": "no"}))
    fake.reply("second a").reply(status("success"))
    r = _run(delta, _graph(delta, RESTART))
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "a", "b", "a", "b"]
    [restart] = [
        e["payload"] for e in delta.events("EDGE_TAKEN") if e["payload"]["step"] == "loop_restart"
    ]
    assert (restart["source"], restart["target"]) == ("b", "a")
    # The second pass begins with a fresh context: nothing of the first pass in a's prompt.
    first, second = fake.requests[0], fake.requests[2]
    assert first["messages"][1]["content"] == second["messages"][1]["content"]
    assert "first a" not in second["messages"][1]["content"]
    assert "first a" in fake.requests[1]["messages"][1]["content"]  # b saw it, in its pass


PARALLEL_REVIEW = EXAMPLES / "pipelines" / "parallel-review.dot"


def test_the_parallel_review_example_reworks_afresh_after_a_kill(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.always("looks fine")
    assert _run(delta, PARALLEL_REVIEW).code == 101  # the sign-off waits; the checks ran
    assert _path(delta) == ["start", "review", "lint", "tests", "signoff"]
    delta.answer("S")
    assert delta("run").code == 101  # the fan-in's summary, then the merge gate
    delta.answer("R")
    # Killed right after the gate's outcome, then the rework's: the resume takes the
    # loop_restart edge and runs the second pass to the sign-off.
    fault = {"DELTA_FAULT": "after_outcome"}
    assert delta("run", env=fault).code == -signal.SIGKILL  # after the merge gate's outcome
    assert delta("run", env=fault).code == -signal.SIGKILL  # after rework's
    assert delta("run").code == 101
    [restart] = [
        e["payload"] for e in delta.events("EDGE_TAKEN") if e["payload"]["step"] == "loop_restart"
    ]
    assert (restart["source"], restart["target"]) == ("rework", "review")
    assert _path(delta)[-5:] == ["rework", "review", "lint", "tests", "signoff"]
    delta.answer("S")
    assert delta("run").code == 101
    # The second pass's summary starts from a fresh context: nothing of the first pass.
    second_pick = fake.requests[2]["messages"][1]["content"]
    assert second_pick.startswith("Summarise the reviews")
    assert "response.rework" not in second_pick and "response.pick" not in second_pick
    delta.answer("M")
    r = delta("run")
    assert r.code == 0, r.err
    assert len(fake.requests) == 3  # pick, rework, pick: each once
