"""Whole-graph checks before anything runs (attractor spec §7.2, plus the gate rules).

Every problem is reported, not only the first. Where the spec says a warning but running would
go wrong (a retry target that does not exist, an unknown type), this is an error: a pipeline run
is hard to undo, a refused graph is easy to fix. What only warns is in `lint.py`.

Linear in nodes and edges: edges are looked up through the graph's index, never scanned per node.
"""

from __future__ import annotations

from collections.abc import Container, Iterator

from . import manager, parallel
from .gates import gate
from .model import Graph, Kind, Node
from .problems import Code, Problem
from .settings_check import settings_problems

_TARGET_KEYS = ("retry_target", "fallback_retry_target")


def _one(graph: Graph, kind: Kind, what: str, hint: str) -> Iterator[Problem]:
    found = graph.of_kind(kind)
    if not found:
        yield Problem(f"no {what} node: {hint}", code=Code.START_EXIT)
    for extra in found[1:]:
        yield Problem(
            f"a second {what} node ({found[0].id} on line {found[0].pos.line} is one): a "
            "pipeline has exactly one",
            extra.pos,
            extra.subject,
            code=Code.START_EXIT,
        )


def _ends(graph: Graph) -> Iterator[Problem]:
    yield from _one(graph, Kind.START, "start", "add one with shape=Mdiamond")
    yield from _one(graph, Kind.EXIT, "exit", "add one with shape=Msquare")
    for start in graph.of_kind(Kind.START):
        for e in graph.incoming(start.id):
            yield Problem(
                "the start node cannot have incoming edges", e.pos, e.subject, code=Code.START_EXIT
            )
    for end in graph.of_kind(Kind.EXIT):
        for e in graph.outgoing(end.id):
            yield Problem(
                "the exit node cannot have outgoing edges", e.pos, e.subject, code=Code.START_EXIT
            )


def _existing(graph: Graph, *targets: str | None) -> list[str]:
    return [t for t in targets if t is not None and t in graph.nodes]


def reachable(graph: Graph, starts: list[str]) -> set[str]:
    """Every node a run can get to from `starts`: along edges, and by a jump to a retry target
    (a node's own once the node is reached; the graph's from any failing node)."""
    whole = _existing(graph, graph.retry_target, graph.fallback_retry_target)
    seen = set(starts) | set(whole)
    todo = list(seen)
    while todo:
        node_id = todo.pop()
        nexts = [e.target for e in graph.outgoing(node_id)]
        node = graph.nodes[node_id]
        nexts += _existing(graph, node.retry_target, node.fallback_retry_target)
        for target in nexts:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _reachable(graph: Graph) -> Iterator[Problem]:
    starts = [n.id for n in graph.of_kind(Kind.START)]  # with two, each one's reach counts
    if not starts:
        return
    seen = reachable(graph, starts)
    for n in graph.nodes.values():
        if n.id not in seen:
            yield Problem(
                "not reachable from the start node", n.pos, n.subject, code=Code.UNREACHABLE
            )


def _gates(graph: Graph) -> Iterator[Problem]:
    for n in graph.of_kind(Kind.WAIT_HUMAN):
        g = gate(graph, n.id)
        if not graph.outgoing(n.id):
            yield Problem(
                "a human gate with no outgoing edge: there is nothing to choose",
                n.pos,
                n.subject,
                code=Code.GATE,
            )
        yield from g.problems
        for e in graph.outgoing(n.id):
            if e.conditional:
                yield Problem(
                    "a gate's edges are its choices: they cannot have a condition",
                    e.where("condition"),
                    e.subject,
                    code=Code.GATE,
                )
        _, why = g.resolve_default()
        if why and g.choices:
            yield Problem(why, n.where("human.default_choice"), n.subject, code=Code.GATE)


def _misplaced(n: Node, key: str, kinds: tuple[Kind, ...], shapes: str) -> Iterator[Problem]:
    if key in n.attrs and n.kind not in kinds:
        yield Problem(
            f"{key} applies to {shapes} nodes only", n.where(key), n.subject, code=Code.NODE_ATTR
        )


def _node_attrs(n: Node, check_files: bool, claimed: Container[str]) -> Iterator[Problem]:
    yield from _misplaced(n, "human.default_choice", (Kind.WAIT_HUMAN,), "hexagon (gate)")
    yield from _misplaced(n, "agent.mode", (Kind.CODERGEN,), "box (LLM)")
    yield from _misplaced(n, "agent", (Kind.CODERGEN,), "box (LLM)")
    yield from _misplaced(n, "tool_command", (Kind.TOOL,), "parallelogram (tool)")
    yield from _misplaced(n, "join_policy", (Kind.PARALLEL,), "component (parallel)")
    if n.kind == Kind.TOOL and "command" in n.attrs:
        yield Problem(
            "the attribute is tool_command, not command",
            n.where("command"),
            n.subject,
            code=Code.NODE_ATTR,
        )
    elif n.kind == Kind.TOOL and n.tool_command is None:
        yield Problem(
            "a tool node needs tool_command (the command to run)",
            n.pos,
            n.subject,
            code=Code.NODE_ATTR,
        )
    if (
        check_files
        and n.agent is not None
        and n.kind == Kind.CODERGEN
        and n.id not in claimed  # orchestra.yaml's agents: load.py checks them
        and not n.agent.is_dir()
    ):
        yield Problem(
            f"agent directory {n.agent} does not exist",
            n.where("agent"),
            n.subject,
            code=Code.NO_AGENT_DIR,
        )


def _retry_targets(graph: Graph) -> Iterator[Problem]:
    for key in _TARGET_KEYS:
        value = graph.attrs.get(key, "").strip()
        if value and value not in graph.nodes:
            yield Problem(
                f"{key} {value!r} is not a node",
                graph.attr_pos.get(key),
                "graph",
                code=Code.RETRY_TARGET,
            )
    for n in graph.nodes.values():
        for key in _TARGET_KEYS:
            value = n.attrs.get(key, "").strip()
            if value and value not in graph.nodes:
                yield Problem(
                    f"{key} {value!r} is not a node",
                    n.where(key),
                    n.subject,
                    code=Code.RETRY_TARGET,
                )


def validate(graph: Graph, *, check_files: bool = True) -> list[Problem]:
    """Every problem of the graph as a whole; empty when it can run. `check_files` also checks
    that `agent` directories exist."""
    problems = [*_ends(graph), *_reachable(graph), *_gates(graph), *parallel.problems(graph)]
    problems += manager.problems(graph)
    for n in graph.nodes.values():
        problems += _node_attrs(n, check_files, graph.orchestra)
    return problems + list(_retry_targets(graph)) + settings_problems(graph)
