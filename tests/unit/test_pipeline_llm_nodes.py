"""The pure rules of per-node model settings and context fidelity, from tables, and the cost of
a pipeline step counted in journal events read (no timing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltad.engine import budget
from deltad.engine.interviewers import AutoApproveInterviewer, Chain
from deltad.pipeline.fidelity import Stage, compose, resolve_fidelity, resolve_thread
from deltad.pipeline.stylesheet import (
    StylesheetError,
    node_settings,
    offset_pos,
    parse_stylesheet,
)
from deltad.protocol import EventType, RunStatus, utcnow
from deltad.protocol.models import JournalEvent
from deltad.testing import ScriptedModel

from .helpers import Run, pipeline_graph

SHEET = """
    * { llm_model: any; }
    box { llm_model: boxed; temperature: 0.2 }
    .fast { llm_model: fast; reasoning_effort: low; }
    .deep { llm_model: deep; reasoning_effort: high; }
    #one { llm_model: only-one; }
    .fast { llm_model: fast-later; }
"""


@pytest.mark.parametrize(
    ("node_id", "shape", "attrs", "expected"),
    [
        ("x", "diamond", {}, {"llm_model": "any"}),  # only *
        ("x", "box", {}, {"llm_model": "boxed", "temperature": "0.2"}),  # shape beats *
        ("x", "box", {"class": "fast"}, {"llm_model": "fast-later", "reasoning_effort": "low",
                                         "temperature": "0.2"}),  # a later equal rule wins
        ("x", "box", {"class": "fast,deep"}, {"llm_model": "fast-later",
                                              "reasoning_effort": "high", "temperature": "0.2"}),
        ("one", "box", {"class": "deep"}, {"llm_model": "only-one", "reasoning_effort": "high",
                                           "temperature": "0.2"}),  # #id beats .class
        ("one", "box", {"llm_model": "mine"}, {"llm_model": "mine", "temperature": "0.2"}),
    ],
)  # fmt: skip
def test_stylesheet_specificity_order_and_node_overrides(
    node_id: str, shape: str, attrs: dict[str, str], expected: dict[str, str]
) -> None:
    assert node_settings(node_id, shape, attrs, {"model_stylesheet": SHEET}) == expected


def test_graph_attributes_come_after_the_stylesheet() -> None:
    graph = {"model_stylesheet": ".a { llm_model: m; }", "llm_model": "g", "llm_provider": "p"}
    assert node_settings("n", "box", {"class": "a"}, graph) == {
        "llm_model": "m",
        "llm_provider": "p",
    }
    assert node_settings("n", "box", {}, {}) == {}  # the agent's own settings stand


@pytest.mark.parametrize(
    ("text", "offset", "says"),
    [
        ("* { llm_model m; }", 14, "expected ':' after llm_model"),
        ("* { model: m; }", 4, "unknown property 'model'"),
        ("~ { llm_model: m; }", 0, "expected a selector"),
        ("* { llm_model: m; ", 18, "expected a property"),
        ("* { temperature: hot }", 17, "temperature 'hot'"),
        ("* { reasoning_effort: max }", 22, "reasoning_effort 'max'"),
        ("/* open", 0, "a comment is never closed"),
        ("  ", 0, "no rules"),
    ],
)
def test_a_stylesheet_that_does_not_parse_says_where(text: str, offset: int, says: str) -> None:
    with pytest.raises(StylesheetError) as err:
        parse_stylesheet(text)
    assert err.value.offset == offset and says in err.value.message


def test_quoted_values_comments_and_a_missing_last_semicolon_parse() -> None:
    [rule] = parse_stylesheet('/* c */ #n { llm_model: "a b"; llm_provider: p }')
    assert rule.selector == "#n" and dict(rule.declarations) == {
        "llm_model": "a b",
        "llm_provider": "p",
    }


def test_an_offset_maps_to_the_line_and_column_of_the_dot_file() -> None:
    assert offset_pos((3, 10), "* { x }", 4) == (3, 15)  # after the opening quote
    assert offset_pos((3, 10), "\n  * { x }", 7) == (4, 7)


@pytest.mark.parametrize(
    ("edge", "node", "graph", "expected"),
    [
        ({"fidelity": "truncate"}, {"fidelity": "full"}, {"default_fidelity": "compact"},
         "truncate"),
        (None, {"fidelity": "full"}, {"default_fidelity": "summary:low"}, "full"),
        (None, {}, {"default_fidelity": "summary:low"}, "summary:low"),
        (None, {}, {}, "compact"),
    ],
)  # fmt: skip
def test_fidelity_precedence(
    edge: dict[str, str] | None, node: dict[str, str], graph: dict[str, str], expected: str
) -> None:
    assert resolve_fidelity(edge, node, graph) == expected


@pytest.mark.parametrize(
    ("fidelity", "edge", "node", "graph", "previous", "expected"),
    [
        ("compact", None, {"thread_id": "t"}, {}, "p", "n"),  # not full: a thread of its own
        ("full", {"thread_id": "e"}, {"thread_id": "t"}, {}, "p", "t"),
        ("full", {"thread_id": "e"}, {}, {"thread_id": "g"}, "p", "e"),
        ("full", None, {}, {"thread_id": "g"}, "p", "g"),
        ("full", None, {}, {}, "p", "p"),  # the previous node's thread
        ("full", None, {}, {}, None, "n"),
    ],
)
def test_thread_resolution(
    fidelity: str,
    edge: dict[str, str] | None,
    node: dict[str, str],
    graph: dict[str, str],
    previous: str | None,
    expected: str,
) -> None:
    assert resolve_thread("n", fidelity, edge, node, graph, previous) == expected


def test_summaries_are_deterministic_digests_of_growing_detail() -> None:
    stages = [Stage(f"s{i}", "success", f"note {i}\nmore") for i in range(40)]
    context = {"k": "v" * 2000, "last_response": "hidden"}
    low = compose("P", "summary:low", "g", "r", context, stages)
    medium = compose("P", "summary:medium", "g", "r", context, stages)
    high = compose("P", "summary:high", "g", "r", context, stages)
    assert low.count("\n- s") == 3 and "- k:" not in low
    assert medium.count("\n- s") == 10
    assert f"- k: {'v' * 600}" in medium and f"- k: {'v' * 601}" not in medium
    assert high.count("\n- s") == 30 and "- s39: success (note 39)" in high
    assert "hidden" not in low + medium + high
    assert compose("P", "summary:high", "g", "r", context, stages) == high


def test_a_context_cut_is_looked_for_only_since_the_node_began() -> None:
    """A model call in a pipeline node reads back to its NODE_START, not the whole run."""
    cut = budget.Cut(3, 2, {}, "left out").payload(1000, 10)
    events = [
        JournalEvent(seq=1, timestamp=utcnow(), type=EventType.NODE_START, payload={}),
        JournalEvent(seq=5, timestamp=utcnow(), type=EventType.SYSTEM_MESSAGE, payload=cut),
        JournalEvent(seq=9, timestamp=utcnow(), type=EventType.NODE_START, payload={}),
        JournalEvent(seq=10, timestamp=utcnow(), type=EventType.THOUGHT, payload={}),
    ]
    found = budget.last_cut(events)
    assert found is not None and found.through_seq == 3
    assert budget.last_cut(events, 9) is None  # an earlier node's cut
    assert budget.last_cut(events, 4) is not None


def test_branch_nodes_and_a_prompted_fan_in_get_their_own_fidelity_and_settings(
    tmp_path: Path,
) -> None:
    """Inside a parallel branch a node's fidelity comes from the edge it took in its branch,
    its prompt from the branch's context; a fan-in with a prompt gets the model settings too."""
    graph = pipeline_graph(
        "digraph t {\n"
        'graph [model_stylesheet="* { llm_model: small; } #join { llm_model: big; }"]\n'
        "start [shape=Mdiamond]\nexit [shape=Msquare]\n"
        'fan [shape=component]\njoin [shape=tripleoctagon, prompt="rank"]\n'
        'a [prompt="do a"]\nb [prompt="do b"]\n'
        "start -> fan\nfan -> a [fidelity=truncate]\nfan -> b\n"
        "a -> join\nb -> join\njoin -> exit\n}"
    )
    model = ScriptedModel().reply("a done").reply("b done").reply("ranked")
    run = Run(tmp_path, graph, model)
    assert run.drive(Chain(AutoApproveInterviewer())).status == RunStatus.COMPLETED
    starts = {p["node"]: p for p in run.events("NODE_START")}
    assert starts["a"]["fidelity"] == "truncate" and starts["a"]["branch"] == 0
    assert starts["b"]["fidelity"] == "compact" and "a done" not in starts["b"]["prompt"]
    assert starts["a"]["llm"] == {"llm_model": "small"}
    assert starts["join"]["llm"] == {"llm_model": "big"}
    assert "parallel.results" in starts["join"]["prompt"]
    assert "current_node" not in starts["join"]["prompt"]
