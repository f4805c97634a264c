"""Property tests: no input makes the graph layer or `delta pipeline check` raise anything but
its one-line errors; gate answers and routing agree for every well-formed gate."""

from __future__ import annotations

import tempfile
from pathlib import Path

from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st

from deltad.pipeline import (
    ConditionError,
    GraphError,
    Outcome,
    Status,
    gate,
    parse_condition,
    parse_pipeline,
    select_edge,
)
from deltad.pipeline.cli import pipeline
from tests.fuzz import fuzz_settings
from tests.unit.helpers import raw_graph

FUZZ = fuzz_settings(300)

anytext = st.text(st.characters(codec=None, exclude_categories=()), max_size=80)
# Pieces of DOT, so that generated text gets past the first token and into the grammar.
TOKENS = [
    "digraph", "graph", "subgraph", "node", "edge", "strict", "{", "}", "[", "]", "=", ";", ",",
    "->", "--", "a", "b", "start", "exit", "shape", "Mdiamond", "Msquare", "hexagon", "diamond",
    "box", "parallelogram", "label", "condition", "weight", "timeout", "max_retries", "goal",
    "human.default_choice", "agent.mode", "interactive", '"[A] Approve"', '"outcome=success"',
    '"x', "\n", "//", "/*", "*/", "#", "<", "1", "-1", "5m", '"\\"', "\\", "\ufeff", "\x00",
]  # fmt: skip
dotish = st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join)
wrapped = dotish.map(
    lambda body: f"digraph g {{ start [shape=Mdiamond]; exit [shape=Msquare]; {body} }}"
)


def _checked(text: str) -> None:
    try:
        parse_pipeline(text, "f.dot", check_files=False)
    except GraphError as e:
        assert e.lines() and all(
            "\n" not in line and line.startswith("f.dot") for line in e.lines()
        )


@FUZZ
@given(st.one_of(anytext, dotish, wrapped))
def test_any_text_is_a_graph_or_one_line_errors(text: str) -> None:
    _checked(text)


@FUZZ
@given(anytext)
def test_any_condition_parses_or_is_one_line_error(text: str) -> None:
    try:
        cond = parse_condition(text)
    except ConditionError as e:
        assert "\n" not in str(e)
        return
    cond.holds("success", "", {"x": text})


labels = st.one_of(st.none(), anytext.filter(lambda s: '"' not in s and "\\" not in s))


@FUZZ
@given(st.lists(labels, min_size=1, max_size=8), anytext)
# Found by this test (8751e16): a multi-line label defeated its own "[K] label" answer.
@example(["0\n0"], "0")
def test_every_choice_is_found_by_its_key_and_label_and_routes_to_its_edge(
    gate_labels: list[str | None], answer: str
) -> None:
    lines = ["g [shape=hexagon]"]
    for i, label in enumerate(gate_labels):
        lines.append(f"t{i}\ng -> t{i}" + (f' [label="{label}"]' if label is not None else ""))
    graph = raw_graph("\n".join(lines))
    g = gate(graph, "g")
    g.choice_for(answer)  # never raises
    if g.problems:
        return
    assert len({c.key.casefold() for c in g.choices}) == len(g.choices)
    for c in g.choices:
        assert g.choice_for(c.key) is c
        assert g.choice_for(c.label) is c
        assert g.choice_for(f"[{c.key}] {c.label}") is c
        outcome = g.selected(c)
        assert select_edge(graph, "g", outcome, {}).edge is c.edge
    assert len(g.options()) == len(g.choices)


@FUZZ
@given(anytext, st.dictionaries(anytext, anytext | st.integers() | st.booleans(), max_size=3))
def test_routing_never_raises(label: str, context: dict[str, object]) -> None:
    graph = raw_graph('n -> a [condition="context.x=1"]\nn -> b [label="Fix"]\nn -> c [weight=2]')
    outcome = Outcome(Status.SUCCESS, preferred_label=label, suggested_next_ids=(label,))
    assert select_edge(graph, "n", outcome, context).edge is not None


@fuzz_settings(60)
@given(
    st.one_of(anytext, dotish, wrapped, st.binary(max_size=60).map(lambda b: b.decode("latin-1")))
)
def test_pipeline_check_never_shows_a_traceback(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.dot"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        result = CliRunner().invoke(pipeline, ["check", str(path)])
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
