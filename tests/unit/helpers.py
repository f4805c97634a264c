"""Small builders shared by the pipeline unit tests."""

from __future__ import annotations

import textwrap

from deltad.pipeline import Graph, GraphError, build_graph, parse_dot, parse_pipeline
from deltad.pipeline.problems import Problem


def graph_of(body: str, *, header: str = "digraph t {") -> Graph:
    """A graph that must be valid: `body` goes inside the digraph."""
    return parse_pipeline(f"{header}\n{textwrap.dedent(body)}\n}}", "t.dot", check_files=False)


def raw_graph(body: str) -> Graph:
    """The typed graph without validation (to test pieces of an invalid one)."""
    graph, _ = build_graph(parse_dot(f"digraph t {{\n{textwrap.dedent(body)}\n}}"))
    return graph


def problems_of(text: str) -> list[str]:
    """Every problem line for a whole DOT text; fails if the graph is accepted."""
    try:
        parse_pipeline(textwrap.dedent(text), "t.dot", check_files=False)
    except GraphError as e:
        return e.lines()
    raise AssertionError("the graph was accepted")


def problems_in(body: str) -> list[str]:
    return problems_of(f"digraph t {{\n{textwrap.dedent(body)}\n}}")


def only(problems: list[str], needle: str) -> str:
    found = [p for p in problems if needle in p]
    assert len(found) == 1, f"{needle!r} in {problems}"
    return found[0]


__all__ = ["Problem", "graph_of", "only", "problems_in", "problems_of", "raw_graph"]
