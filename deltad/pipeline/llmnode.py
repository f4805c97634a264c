"""What a codergen node's NODE_START records so that every process sends the same: its model
settings (stylesheet and attributes, `stylesheet.py`), its fidelity and thread
(`fidelity.py`) and the prompt composed at that fidelity. A resume reads them back from the
journal (`state.Visit`) and never resolves them again."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from deltad.engine.llm import ChatModel, ChatReply, OpenAIChatModel
from deltad.errors import LLMError
from deltad.protocol import iso, utcnow

from .fidelity import compose, resolve_fidelity, resolve_thread
from .model import Edge, Graph, Kind, Node
from .state import Lane, State
from .stylesheet import node_settings


def arrival(graph: Graph, lane: Lane, node_id: str) -> Edge | None:
    """The edge the lane took to `node_id` (None: the start, or a jump to a retry target)."""
    if lane.came_from is None:
        return None
    return next((e for e in graph.outgoing(lane.came_from) if e.target == node_id), None)


def asks_model(node: Node) -> bool:
    """A codergen node, or a fan-in with a prompt (the model ranks the branches)."""
    return node.kind == Kind.CODERGEN or (node.kind == Kind.FAN_IN and bool(node.prompt))


def start_payload(
    graph: Graph, node: Node, state: State, lane: Lane, goal: str, run_id: str
) -> dict[str, Any]:
    """NODE_START's fields for a node that asks the model: `prompt`, `llm`, `fidelity`,
    `thread` and `thread_history` (the thread's earlier visits, for a `full` node). `lane` is
    the run's own (`state`) or the branch the node runs in: its context and arrival edge."""
    if not asks_model(node):
        return {"prompt": ""}
    edge = arrival(graph, lane, node.id)
    edge_attrs: Mapping[str, str] | None = edge.attrs if edge else None
    fidelity = resolve_fidelity(edge_attrs, node.attrs, graph.attrs)
    thread = resolve_thread(node.id, fidelity, edge_attrs, node.attrs, graph.attrs, lane.thread)
    prompt = (node.attrs.get("prompt") or node.label).replace("$goal", goal)
    history = state.threads.get(thread, []) if fidelity == "full" else []
    return {
        "prompt": compose(prompt, fidelity, goal, run_id, lane.context, state.stages),
        "llm": given_settings(graph, node),
        "fidelity": fidelity,
        "thread": thread,
        "thread_history": [list(h) for h in history],
        **deadline_field(node),
        **given_prompt(graph, node),
    }


def given_settings(graph: Graph, node: Node) -> dict[str, str]:
    """The node's model settings: its own and the stylesheet's over its orchestra agent's."""
    given = graph.orchestra.get(node.id)
    own = node_settings(node.id, node.shape, node.attrs, graph.attrs)
    return {**(given.llm if given else {}), **own}


def given_prompt(graph: Graph, node: Node) -> dict[str, Any]:
    """NODE_START's `system_prompt` for a node with an orchestra agent (a resume sends it)."""
    given = graph.orchestra.get(node.id)
    return {"system_prompt": given.system_prompt} if given else {}


# -- a codergen node's timeout: a durable deadline ------------------------------------------
class NodeTimedOut(Exception):
    """The node's deadline passed before the model answered. Not an LLMError: the engine
    lets it through, and the node ends FAIL (its timeout path) instead of the run."""


def deadline_field(node: Node) -> dict[str, Any]:
    """NODE_START's `deadline` for a codergen node with a `timeout` (now + timeout, UTC)."""
    if node.kind != Kind.CODERGEN or node.timeout is None:
        return {}
    return {"deadline": iso(utcnow() + timedelta(seconds=node.timeout))}


class Bounded:
    """A model whose every call ends by `deadline`: a call starts only before it, waits at
    most until it, and what the deadline cut short is `NodeTimedOut`."""

    def __init__(self, model: ChatModel, deadline: datetime, timeout: float) -> None:
        self.model, self.deadline, self.timeout = model, deadline, timeout

    def request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return self.model.request_body(messages, tools)

    def _left(self) -> float:
        return (self.deadline - utcnow()).total_seconds()

    def _expired(self) -> NodeTimedOut:
        return NodeTimedOut(f"timed out: the node's timeout ({self.timeout:g} s) passed")

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], body: bytes | None = None
    ) -> ChatReply:
        left = self._left()
        if left <= 0:
            raise self._expired()
        try:
            return within(self.model, left).complete(messages, tools, body)
        except LLMError:
            if self._left() <= 0:
                raise self._expired() from None
            raise


def within(model: ChatModel, seconds: float) -> ChatModel:
    """`model` with each attempt and all attempts together bounded by `seconds`."""
    if not isinstance(model, OpenAIChatModel):
        return model
    s = model.settings
    update = {
        "timeout_seconds": max(0.001, min(s.timeout_seconds, seconds)),
        "total_timeout_seconds": max(0.001, min(s.total_timeout_seconds, seconds)),
    }
    return OpenAIChatModel(s.model_copy(update=update), model.say, model.endpoint)
