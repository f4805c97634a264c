"""Whole-graph checks before anything runs (attractor spec §7.2, plus the gate rules).

Every problem is reported, not only the first. Where the spec says a warning but running would
go wrong (an edge to a node never declared, a retry target that does not exist, an unknown
type), this is an error: a pipeline run is hard to undo, a refused graph is easy to fix.
"""

from __future__ import annotations

from collections.abc import Iterator

from .gates import gate
from .model import Graph, Kind, Node
from .problems import Problem

_TARGET_KEYS = ("retry_target", "fallback_retry_target")


def _one(graph: Graph, kind: Kind, what: str, hint: str) -> Iterator[Problem]:
    found = graph.of_kind(kind)
    if not found:
        yield Problem(f"no {what} node: {hint}")
    for extra in found[1:]:
        yield Problem(
            f"a second {what} node ({found[0].id} on line {found[0].pos.line} is one): a "
            "pipeline has exactly one",
            extra.pos,
            extra.subject,
        )


def _ends(graph: Graph) -> Iterator[Problem]:
    yield from _one(graph, Kind.START, "start", "add one with shape=Mdiamond")
    yield from _one(graph, Kind.EXIT, "exit", "add one with shape=Msquare")
    for start in graph.of_kind(Kind.START):
        for e in graph.incoming(start.id):
            yield Problem("the start node cannot have incoming edges", e.pos, e.subject)
    for end in graph.of_kind(Kind.EXIT):
        for e in graph.outgoing(end.id):
            yield Problem("the exit node cannot have outgoing edges", e.pos, e.subject)


def _declared(graph: Graph) -> Iterator[Problem]:
    """Graphviz would create a node it has not seen; a typo would then become an LLM step."""
    for e in graph.edges:
        for end in dict.fromkeys((e.source, e.target)):
            if end not in graph.nodes:
                yield Problem(
                    f"node {end} is never declared: declare it (e.g. {end} [shape=box, "
                    'prompt="..."]) or fix the name',
                    e.pos,
                    e.subject,
                )


def _reachable(graph: Graph) -> Iterator[Problem]:
    starts = [n.id for n in graph.of_kind(Kind.START)]  # with two, each one's reach counts
    if not starts:
        return
    seen, todo = set(starts), list(starts)
    while todo:
        for e in graph.outgoing(todo.pop()):
            if e.target in graph.nodes and e.target not in seen:
                seen.add(e.target)
                todo.append(e.target)
    for n in graph.nodes.values():
        if n.id not in seen:
            yield Problem("not reachable from the start node", n.pos, n.subject)


def _gates(graph: Graph) -> Iterator[Problem]:
    for n in graph.of_kind(Kind.WAIT_HUMAN):
        g = gate(graph, n.id)
        if not graph.outgoing(n.id):
            yield Problem(
                "a human gate with no outgoing edge: there is nothing to choose", n.pos, n.subject
            )
        yield from g.problems
        for e in graph.outgoing(n.id):
            if e.conditional:
                yield Problem(
                    "a gate's edges are its choices: they cannot have a condition",
                    e.where("condition"),
                    e.subject,
                )
        _, why = g.resolve_default()
        if why and g.choices:
            yield Problem(why, n.where("human.default_choice"), n.subject)


def _misplaced(n: Node, key: str, kinds: tuple[Kind, ...], shapes: str) -> Iterator[Problem]:
    if key in n.attrs and n.kind not in kinds:
        yield Problem(f"{key} applies to {shapes} nodes only", n.where(key), n.subject)


def _node_attrs(n: Node, check_files: bool) -> Iterator[Problem]:
    yield from _misplaced(n, "human.default_choice", (Kind.WAIT_HUMAN,), "hexagon (gate)")
    yield from _misplaced(n, "agent.mode", (Kind.CODERGEN,), "box (LLM)")
    yield from _misplaced(n, "agent", (Kind.CODERGEN,), "box (LLM)")
    yield from _misplaced(n, "tool_command", (Kind.TOOL,), "parallelogram (tool)")
    if n.kind == Kind.TOOL and "command" in n.attrs:
        yield Problem("the attribute is tool_command, not command", n.where("command"), n.subject)
    elif n.kind == Kind.TOOL and n.tool_command is None:
        yield Problem("a tool node needs tool_command (the command to run)", n.pos, n.subject)
    if check_files and n.agent is not None and n.kind == Kind.CODERGEN and not n.agent.is_dir():
        yield Problem(f"agent directory {n.agent} does not exist", n.where("agent"), n.subject)


def _retry_targets(graph: Graph) -> Iterator[Problem]:
    for key in _TARGET_KEYS:
        value = graph.attrs.get(key, "").strip()
        if value and value not in graph.nodes:
            yield Problem(f"{key} {value!r} is not a node", graph.attr_pos.get(key), "graph")
    for n in graph.nodes.values():
        for key in _TARGET_KEYS:
            value = n.attrs.get(key, "").strip()
            if value and value not in graph.nodes:
                yield Problem(f"{key} {value!r} is not a node", n.where(key), n.subject)


def validate(graph: Graph, *, check_files: bool = True) -> list[Problem]:
    """Every problem of the graph as a whole; empty when it can run. `check_files` also checks
    that `agent` directories exist."""
    problems = [*_ends(graph), *_declared(graph), *_reachable(graph), *_gates(graph)]
    for n in graph.nodes.values():
        problems += _node_attrs(n, check_files)
    return problems + list(_retry_targets(graph))
