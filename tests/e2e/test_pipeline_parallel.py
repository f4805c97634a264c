"""Parallel branches as the attractor spec runs them (§4.8), for real: `delta run --pipeline`
processes against the fake model, each outcome scripted in its reply.

A gate in a branch reviews its own branch's output; a codergen node's own `ask_human` in a
branch pauses only that branch; `max_parallel` bounds the branches under way; a nested
parallel node is refused by `check`.
"""

from __future__ import annotations

from deltad.testing import FakeLLM

from ..conftest import Delta
from .test_pipeline_flow import _graph, _path, _run

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
