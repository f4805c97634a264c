"""What a codergen node's NODE_START records so that every process sends the same: its model
settings (stylesheet and attributes, `stylesheet.py`), its fidelity and thread
(`fidelity.py`) and the prompt composed at that fidelity. A resume reads them back from the
journal (`state.Visit`) and never resolves them again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .fidelity import compose, resolve_fidelity, resolve_thread
from .model import Edge, Graph, Kind, Node
from .state import State
from .stylesheet import node_settings


def arrival(graph: Graph, state: State, node_id: str) -> Edge | None:
    """The edge the run took to `node_id` (None: the start, or a jump to a retry target)."""
    if state.came_from is None:
        return None
    return next((e for e in graph.outgoing(state.came_from) if e.target == node_id), None)


def start_payload(graph: Graph, node: Node, state: State, goal: str, run_id: str) -> dict[str, Any]:
    """NODE_START's fields for a codergen node: `prompt`, `llm`, `fidelity`, `thread` and
    `thread_history` (the thread's earlier visits, for a `full` node)."""
    if node.kind != Kind.CODERGEN:
        return {"prompt": ""}
    edge = arrival(graph, state, node.id)
    edge_attrs: Mapping[str, str] | None = edge.attrs if edge else None
    fidelity = resolve_fidelity(edge_attrs, node.attrs, graph.attrs)
    thread = resolve_thread(node.id, fidelity, edge_attrs, node.attrs, graph.attrs, state.thread)
    prompt = (node.attrs.get("prompt") or node.label).replace("$goal", goal)
    history = state.threads.get(thread, []) if fidelity == "full" else []
    return {
        "prompt": compose(prompt, fidelity, goal, run_id, state.context, state.stages),
        "llm": node_settings(node.id, node.shape, node.attrs, graph.attrs),
        "fidelity": fidelity,
        "thread": thread,
        "thread_history": [list(h) for h in history],
    }
