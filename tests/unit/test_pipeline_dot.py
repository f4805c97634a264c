"""The DOT subset parser: every construct, and every syntax error with its line and column."""

from __future__ import annotations

import pytest

from deltad.pipeline import DotSyntaxError, Pos, parse_dot

from .helpers import graph_of, problems_of

LINEAR = """
digraph Simple {
    graph [goal="Run tests and report"]
    rankdir=LR

    start [shape=Mdiamond, label="Start"]
    exit  [shape=Msquare, label="Exit"]

    run_tests [label="Run Tests", prompt="Run the test suite and report results"]
    report    [label="Report", prompt="Summarize the test results"]

    start -> run_tests -> report -> exit
}
"""


def values(attrs: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {k: a.value for k, a in attrs.items()}


def test_parse_simple_linear_pipeline() -> None:
    dot = parse_dot(LINEAR)
    assert dot.name == "Simple"
    assert list(dot.nodes) == ["start", "exit", "run_tests", "report"]
    assert [(e.source, e.target) for e in dot.edges] == [
        ("start", "run_tests"),
        ("run_tests", "report"),
        ("report", "exit"),
    ]
    assert values(dot.attrs) == {"goal": "Run tests and report", "rankdir": "LR"}


def test_chained_edges_carry_their_attributes_on_every_edge() -> None:
    dot = parse_dot('digraph g { a; b; c; a -> b -> c [label="next", weight=2] }')
    assert [(e.source, e.target, values(e.attrs)) for e in dot.edges] == [
        ("a", "b", {"label": "next", "weight": "2"}),
        ("b", "c", {"label": "next", "weight": "2"}),
    ]


def test_node_defaults_apply_to_nodes_declared_after_them_only() -> None:
    dot = parse_dot(
        """digraph g {
        early
        node [shape=hexagon, timeout="900s"]
        late
        mid [shape=box]
        early [label="E"]
    }"""
    )
    assert values(dot.nodes["early"].attrs) == {"label": "E"}  # redeclared: no defaults added
    assert values(dot.nodes["late"].attrs) == {"shape": "hexagon", "timeout": "900s"}
    assert values(dot.nodes["mid"].attrs) == {"shape": "box", "timeout": "900s"}


def test_a_node_gets_the_defaults_in_force_at_its_first_mention() -> None:
    """Graphviz creates a node where an edge first names it."""
    dot = parse_dot("digraph g { node [shape=box]; a -> b; node [shape=hexagon]; b [label=B] }")
    assert values(dot.nodes["b"].attrs) == {"shape": "box", "label": "B"}
    assert dot.nodes["b"].declared and dot.nodes["b"].pos == Pos(1, 61)


def test_edge_defaults_apply_to_later_edges_and_explicit_attributes_win() -> None:
    dot = parse_dot("digraph g { a -> b; edge [weight=3, label=x]; b -> c [label=y]; c -> d }")
    assert [values(e.attrs) for e in dot.edges] == [
        {},
        {"weight": "3", "label": "y"},
        {"weight": "3", "label": "x"},
    ]


def test_subgraphs_are_flattened_and_scope_their_defaults() -> None:
    dot = parse_dot(
        """digraph g {
        node [timeout="60s"]
        subgraph cluster_loop {
            label = "Loop A"
            node [thread_id="loop-a", timeout="900s"]
            Plan      [label="Plan next step"]
            Implement [label="Implement", timeout="1800s"]
            Plan -> Implement
        }
        { node [shape=hexagon]; inner }
        after
    }"""
    )
    assert values(dot.nodes["Plan"].attrs) == {
        "thread_id": "loop-a",
        "timeout": "900s",
        "label": "Plan next step",
    }
    assert values(dot.nodes["Implement"].attrs)["timeout"] == "1800s"
    assert values(dot.nodes["inner"].attrs) == {"timeout": "60s", "shape": "hexagon"}
    assert values(dot.nodes["after"].attrs) == {"timeout": "60s"}  # the subgraph's stay inside
    assert [(e.source, e.target) for e in dot.edges] == [("Plan", "Implement")]
    assert "label" not in dot.attrs  # a subgraph's label is its own, not the graph's


def test_graph_attributes_from_a_block_and_top_level_declarations() -> None:
    dot = parse_dot(
        'digraph g { graph [goal="G", default_max_retries=2]; retry_target = a; label="L"; a }'
    )
    assert values(dot.attrs) == {
        "goal": "G",
        "default_max_retries": "2",
        "retry_target": "a",
        "label": "L",
    }


def test_comments_of_three_kinds_are_ignored() -> None:
    dot = parse_dot(
        """// line comment
    # hash comment
    digraph g { /* block
       comment -> x */ a -> b // trailing
       b [label="not // a comment, not /* either */ # nor this"]  # trailing hash
    }"""
    )
    assert list(dot.nodes) == ["a", "b"]
    assert dot.nodes["b"].attrs["label"].value == "not // a comment, not /* either */ # nor this"


def test_quoted_strings_with_escapes_and_multiline_attribute_blocks() -> None:
    dot = parse_dot(
        r"""digraph g {
        a [
            label="say \"hi\"\tnow\nthen \\ done",
            prompt="keeps \l as written",
            "human.default_choice"="A"
        ]
    }"""
    )
    attrs = values(dot.nodes["a"].attrs)
    assert attrs["label"] == 'say "hi"\tnow\nthen \\ done'
    assert attrs["prompt"] == "keeps \\l as written"
    assert attrs["human.default_choice"] == "A"


def test_qualified_keys_bare_values_and_numbers() -> None:
    dot = parse_dot(
        "digraph g { a [human.default_choice=A, agent.mode=interactive, weight=-1, x=0.5, t=15m] }"
    )
    assert values(dot.nodes["a"].attrs) == {
        "human.default_choice": "A",
        "agent.mode": "interactive",
        "weight": "-1",
        "x": "0.5",
        "t": "15m",
    }


def test_separators_semicolons_and_quoted_ids() -> None:
    dot = parse_dot('digraph "my graph" { "a" [label=x; shape=box] [weight=1]; "a" -> b; b }')
    assert dot.name == "my graph"
    assert values(dot.nodes["a"].attrs) == {"label": "x", "shape": "box", "weight": "1"}


def test_the_seeds_review_gate_parses() -> None:
    graph = graph_of(
        """
        graph [goal="Test human decision gate"]
        start [shape=Mdiamond]
        exit  [shape=Msquare]
        do_work     [shape=box, label="Do Work", prompt="Generate a brief plan for: $goal"]
        review_gate [shape=hexagon, label="Review the plan"]
        apply       [shape=box, label="Apply", prompt="Implement the approved plan"]
        revise      [shape=box, label="Revise", prompt="Revise the plan based on feedback"]
        start -> do_work -> review_gate
        review_gate -> apply  [label="[A] Approve"]
        review_gate -> revise [label="[R] Revise"]
        apply -> exit
        revise -> review_gate
        """,
        header="digraph test_human_gate {",
    )
    assert graph.goal == "Test human decision gate"
    assert len(graph.nodes) == 6 and len(graph.edges) == 6
    assert graph.nodes["do_work"].prompt == "Generate a brief plan for: Test human decision gate"


@pytest.mark.parametrize(
    ("text", "line", "col", "says"),
    [
        ('digraph g {\n  a -> b\n  c [label="x" \n  d -> \n}', 4, 5, "in the '[' of line 3"),
        ("digraph g {\n  a -- b\n}", 2, 5, "'--' is an undirected edge"),
        ("graph g {\n  a -- b\n}", 1, 1, "a pipeline is a digraph"),
        ("strict digraph g { a }", 1, 1, "strict graphs are not supported"),
        ("digraph g { a }\ndigraph h { b }", 2, 1, "one digraph per file"),
        ("digraph g {\n  a\n", 3, 1, "the '{' on line 1 is never closed"),
        ('digraph g {\n  a [label="open\n  ]\n}', 2, 12, "quoted string is never closed"),
        ("digraph g {\n /* never\n closed }", 2, 2, "comment is never closed"),
        ("digraph g {\n  a [label=<b>x</b>]\n}", 2, 12, "HTML labels"),
        ("digraph g {\n  a -> { b c }\n}", 2, 8, "subgraph as an edge end"),
        ("digraph g {\n  my-node\n}", 2, 3, "node id 'my-node' must be letters"),
        ("digraph g {\n  9lives\n}", 2, 3, "node id '9lives'"),
        ("digraph g {\n  a [shape]\n}", 2, 11, "expected '=' after attribute 'shape'"),
        ("digraph g {\n  a [shape=]\n}", 2, 12, "attribute 'shape' needs a value"),
        ("digraph g {\n  node\n}", 3, 1, "expected '[' after 'node'"),
        ("digraph g {\n  a -> node\n}", 2, 8, "'node' is a DOT keyword"),
        ("digraph g {\n  a @ b\n}", 2, 5, "unexpected character '@'"),
        ("digraph g {\n  a:port -> b\n}", 2, 3, "node id 'a:port'"),
        ("", 1, 1, "expected 'digraph', found the end of the file"),
        ("digraph g {\n  ]\n}", 2, 3, "expected a statement, found ']'"),
    ],
)
def test_a_syntax_error_is_one_line_with_its_line_and_column(
    text: str, line: int, col: int, says: str
) -> None:
    with pytest.raises(DotSyntaxError) as err:
        parse_dot(text)
    assert err.value.pos == Pos(line, col), err.value.message
    assert says in err.value.message
    [rendered] = problems_of(text)
    assert rendered.startswith(f"t.dot:{line}:{col}: ") and "\n" not in rendered


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(DotSyntaxError, match="nested more than"):
        parse_dot("digraph g {" + "{" * 500 + "}" * 500 + "}")


def test_a_byte_order_mark_is_not_an_error() -> None:
    graph = graph_of(
        "start [shape=Mdiamond]; exit [shape=Msquare]; start -> exit", header="\ufeffdigraph t {"
    )
    assert list(graph.nodes) == ["start", "exit"]
