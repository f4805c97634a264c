"""The listing `delta pipeline check` prints: nodes, edges and gates."""

from __future__ import annotations

import json
from collections.abc import Container

from .gates import gate
from .model import Edge, Graph, Kind, Node


def quoted(text: str) -> str:
    """A label on one line, whatever it holds."""
    return json.dumps(text, ensure_ascii=False)


def plain(text: str) -> str:
    return text if text.isprintable() else quoted(text)


def seconds_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


_SHOWN = ("max_parallel", "manager.max_cycles", "manager.stop_condition")


def _details(n: Node, orchestra: Container[str]) -> str:
    parts = []
    if n.timeout is not None:
        parts.append(f"timeout={seconds_text(n.timeout)}")
    if n.max_retries:
        parts.append(f"max_retries={n.max_retries}")
    if n.agent is not None and n.id in orchestra:
        parts.append(f"agent={n.attrs['agent']} (orchestra.yaml)")
    elif n.agent is not None:
        parts.append(f"agent={n.agent}")
    if n.tool_command is not None:
        parts.append(f"tool_command={quoted(n.tool_command)}")
    if n.goal_gate:
        parts.append("goal_gate")
    parts += [f"{k}={quoted(n.attrs[k])}" for k in _SHOWN if k in n.attrs]
    return "  ".join(parts)


def _kind(n: Node) -> str:
    return f"{n.kind} (interactive)" if n.interactive else str(n.kind)


def _edge(e: Edge) -> str:
    parts = [f"{e.source} -> {e.target}"]
    if e.label:
        parts.append(f"label={quoted(e.label)}")
    if e.conditional:
        parts.append(f"condition={quoted(e.condition)}")
    if e.weight:
        parts.append(f"weight={e.weight}")
    return "  ".join(parts)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def describe(graph: Graph, source: str) -> str:
    lines = [f"Pipeline {graph.name or '(unnamed)'} ({source})"]
    if graph.goal:
        lines.append(f"Goal: {quoted(graph.goal)}")
    if graph.child_dotfile is not None and graph.of_kind(Kind.MANAGER):
        lines.append(f"Child pipeline: {plain(str(graph.attrs['stack.child_dotfile']))}")
    lines += ["", f"Nodes ({len(graph.nodes)}):"]
    lines += _table(
        [
            [n.id, n.shape, _kind(n), quoted(n.label), _details(n, graph.orchestra)]
            for n in graph.nodes.values()
        ]
    )
    lines += ["", f"Edges ({len(graph.edges)}):"] + [f"  {_edge(e)}" for e in graph.edges]
    gates = graph.of_kind(Kind.WAIT_HUMAN)
    lines += ["", f"Gates ({len(gates)}):"]
    for n in gates:
        g = gate(graph, n.id)
        lines.append(f"  {n.id}: {quoted(g.question)}")
        lines += [f"    [{c.key}] {plain(c.label)} -> {c.target}" for c in g.choices]
        default, _ = g.resolve_default()
        if default is not None:
            when = f"taken after {seconds_text(n.timeout)}" if n.timeout else "no timeout: never"
            lines.append(f"    default: [{default.key}] {plain(default.label)} ({when})")
        elif n.timeout is not None:
            lines.append(f"    no answer after {seconds_text(n.timeout)}: RETRY (no default)")
    return "\n".join(lines)
