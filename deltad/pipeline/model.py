"""The typed pipeline graph: nodes with their handler kind, edges with parsed conditions.

`build_graph` turns a parsed `DotGraph` into a `Graph` and lists every attribute it could not
read (a bad number, an unknown shape, a condition that does not parse) instead of stopping at
the first; `validate.py` then checks the graph as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from . import values
from .conditions import Condition, ConditionError, parse_condition
from .dot import Attrs, DotGraph, RawEdge, RawNode
from .orchestra import Given
from .problems import Code, Pos, Problem

T = TypeVar("T")


class Kind(StrEnum):
    """The handler that runs a node (attractor spec §2.8)."""

    START = "start"
    EXIT = "exit"
    CODERGEN = "codergen"
    WAIT_HUMAN = "wait.human"
    CONDITIONAL = "conditional"
    TOOL = "tool"
    PARALLEL = "parallel"
    FAN_IN = "parallel.fan_in"
    MANAGER = "stack.manager_loop"


SHAPES: Mapping[str, Kind] = {
    "Mdiamond": Kind.START,
    "Msquare": Kind.EXIT,
    "box": Kind.CODERGEN,
    "hexagon": Kind.WAIT_HUMAN,
    "diamond": Kind.CONDITIONAL,
    "parallelogram": Kind.TOOL,
    "component": Kind.PARALLEL,
    "tripleoctagon": Kind.FAN_IN,
    "house": Kind.MANAGER,
}
# With no shape, these ids are the start and exit nodes (spec §3.2, §4.4).
START_IDS = ("start", "Start")
EXIT_IDS = ("exit", "end")
INTERACTIVE = "interactive"


@dataclass(frozen=True)
class Node:
    id: str
    kind: Kind
    shape: str
    label: str
    prompt: str  # `$goal` expanded; "" when not given
    max_retries: int  # its own, else the graph's default_max_retries, else 0
    timeout: float | None  # seconds
    default_choice: str | None  # `human.default_choice`: a key, a label or a node id
    agent_mode: str | None  # `agent.mode`; only "interactive" is valid
    agent: Path | None  # `agent`: another agent directory, resolved against the DOT file's
    tool_command: str | None  # `tool_command` of a parallelogram node
    goal_gate: bool
    retry_target: str | None
    fallback_retry_target: str | None
    pos: Pos
    attrs: Mapping[str, str] = field(default_factory=dict)
    attr_pos: Mapping[str, Pos] = field(default_factory=dict)
    declared: bool = True  # False: only mentioned in edges (it has the defaults in force there)
    allow_partial: bool = False  # exhausted retries are a PARTIAL_SUCCESS, not a FAIL (§3.5)
    auto_status: bool = False  # §2.6: every handler here records an outcome; read, validated
    own_attrs: frozenset[str] = frozenset()  # set by its own statements, not by `node [...]`

    @property
    def interactive(self) -> bool:
        return self.agent_mode == INTERACTIVE

    @property
    def subject(self) -> str:
        return f"node {self.id}"

    def where(self, key: str) -> Pos:
        """Where an attribute was written; the node's own line when it was not."""
        return self.attr_pos.get(key, self.pos)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    label: str
    condition: str  # as written; "" when unconditional
    guard: Condition | None  # parsed; None when unconditional or when it does not parse
    weight: int
    pos: Pos
    attrs: Mapping[str, str] = field(default_factory=dict)
    attr_pos: Mapping[str, Pos] = field(default_factory=dict)
    loop_restart: bool = False  # taking it starts the pipeline afresh at its target (§2.7)

    @property
    def conditional(self) -> bool:
        return bool(self.condition.strip())

    @property
    def subject(self) -> str:
        return f"edge {self.source} -> {self.target}"

    def where(self, key: str) -> Pos:
        return self.attr_pos.get(key, self.pos)


@dataclass(frozen=True)
class Graph:
    name: str | None
    goal: str
    label: str
    default_max_retries: int
    retry_target: str | None
    fallback_retry_target: str | None
    nodes: Mapping[str, Node]  # in the order of their first mention
    edges: tuple[Edge, ...]
    attrs: Mapping[str, str] = field(default_factory=dict)
    attr_pos: Mapping[str, Pos] = field(default_factory=dict)
    max_steps: int = values.DEFAULT_MAX_STEPS  # node visits a run may make (engine/limits.py)
    child_dotfile: Path | None = None  # `stack.child_dotfile`, resolved against the DOT file's
    # nodes whose `agent` names an entry of orchestra.yaml: what they are given (None: refused)
    orchestra: Mapping[str, Given | None] = field(default_factory=dict)

    def outgoing(self, node_id: str) -> Sequence[Edge]:
        """The node's edges out, in the order written."""
        return self._by_source.get(node_id, ())

    def incoming(self, node_id: str) -> Sequence[Edge]:
        return self._by_target.get(node_id, ())

    # Built once, on first use: scanning every edge per node made `check` quadratic.
    @cached_property
    def _by_source(self) -> Mapping[str, tuple[Edge, ...]]:
        return _index(self.edges, lambda e: e.source)

    @cached_property
    def _by_target(self) -> Mapping[str, tuple[Edge, ...]]:
        return _index(self.edges, lambda e: e.target)

    def of_kind(self, kind: Kind) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == kind]

    @property
    def start(self) -> Node | None:
        """The start node when there is exactly one."""
        found = self.of_kind(Kind.START)
        return found[0] if len(found) == 1 else None


def _index(edges: Sequence[Edge], end: Callable[[Edge], str]) -> dict[str, tuple[Edge, ...]]:
    grouped: dict[str, list[Edge]] = {}
    for e in edges:
        grouped.setdefault(end(e), []).append(e)
    return {k: tuple(v) for k, v in grouped.items()}


class _Reader:
    """Reads typed attributes, turning each unreadable one into a Problem at its position."""

    def __init__(self, attrs: Attrs, subject: str, problems: list[Problem]) -> None:
        self.attrs = attrs
        self.subject = subject
        self.problems = problems

    def text(self, key: str, default: str = "") -> str:
        attr = self.attrs.get(key)
        return attr.value if attr is not None else default

    def optional(self, key: str) -> str | None:
        return self.text(key).strip() or None

    def typed(self, key: str, convert: Callable[[str], T]) -> T | None:
        attr = self.attrs.get(key)
        if attr is None:
            return None
        try:
            return convert(attr.value)
        except ValueError as e:
            self.problem(key, f"{key}: {e}")
            return None

    def problem(self, key: str, message: str, code: Code = Code.BAD_VALUE) -> None:
        attr = self.attrs.get(key)
        self.problems.append(Problem(message, attr.pos if attr else None, self.subject, code=code))


def _kind(raw: RawNode, r: _Reader) -> tuple[Kind, str]:
    shape = r.text("shape")
    kind = SHAPES.get(shape or "box")
    if not shape and raw.id in START_IDS:
        kind = Kind.START
    elif not shape and raw.id in EXIT_IDS:
        kind = Kind.EXIT
    elif kind is None:
        known = ", ".join(f"{s} ({k})" for s, k in SHAPES.items())
        r.problem("shape", f"unknown shape {shape[:30]!r}: use one of {known}")
    if (explicit := r.text("type")) and explicit in {k.value for k in Kind}:
        kind = Kind(explicit)
    elif explicit:
        r.problem("type", f"unknown type {explicit[:30]!r}: use one of {', '.join(Kind)}")
    return kind or Kind.CODERGEN, shape or "box"


def _node(raw: RawNode, g: Graph, base_dir: Path | None, problems: list[Problem]) -> Node:
    r = _Reader(raw.attrs, f"node {raw.id}", problems)
    kind, shape = _kind(raw, r)
    mode = r.optional("agent.mode")
    if mode is not None and mode != INTERACTIVE:
        r.problem(
            "agent.mode", f"agent.mode {mode[:30]!r} is not known: the only mode is interactive"
        )
    agent = r.optional("agent")
    max_retries = r.typed("max_retries", values.count)
    return Node(
        id=raw.id,
        kind=kind,
        shape=shape,
        label=r.text("label").strip() or raw.id,
        prompt=r.text("prompt").replace("$goal", g.goal),
        max_retries=g.default_max_retries if max_retries is None else max_retries,
        timeout=r.typed("timeout", values.duration),
        default_choice=r.optional("human.default_choice"),
        agent_mode=mode,
        agent=(base_dir / agent if base_dir else Path(agent)) if agent else None,
        tool_command=r.optional("tool_command"),
        goal_gate=bool(r.typed("goal_gate", values.boolean)),
        retry_target=r.optional("retry_target"),
        fallback_retry_target=r.optional("fallback_retry_target"),
        pos=raw.pos,
        attrs={k: a.value for k, a in raw.attrs.items()},
        attr_pos={k: a.pos for k, a in raw.attrs.items()},
        declared=raw.declared,
        allow_partial=bool(r.typed("allow_partial", values.boolean)),
        auto_status=bool(r.typed("auto_status", values.boolean)),
        own_attrs=frozenset(raw.own),
    )


def _guard(text: str, r: _Reader) -> Condition | None:
    if not text.strip():
        return None
    try:
        return parse_condition(text)
    except ConditionError as e:
        r.problem("condition", f"condition {text[:60]!r}: {e}", Code.BAD_CONDITION)
        return None


def _edge(raw: RawEdge, problems: list[Problem]) -> Edge:
    r = _Reader(raw.attrs, f"edge {raw.source} -> {raw.target}", problems)
    condition = r.text("condition")
    return Edge(
        source=raw.source,
        target=raw.target,
        label=r.text("label").strip(),
        condition=condition,
        guard=_guard(condition, r),
        weight=r.typed("weight", values.integer) or 0,
        pos=raw.pos,
        attrs={k: a.value for k, a in raw.attrs.items()},
        attr_pos={k: a.pos for k, a in raw.attrs.items()},
        loop_restart=bool(r.typed("loop_restart", values.boolean)),
    )


def _graph_attrs(dot: DotGraph, problems: list[Problem], base_dir: Path | None) -> Graph:
    r = _Reader(dot.attrs, "graph", problems)
    child = r.optional("stack.child_dotfile")
    key = "default_max_retries" if "default_max_retries" in dot.attrs else "default_max_retry"
    return Graph(
        name=dot.name,
        goal=r.text("goal"),
        label=r.text("label"),
        default_max_retries=r.typed(key, values.count) or 0,
        retry_target=r.optional("retry_target"),
        fallback_retry_target=r.optional("fallback_retry_target"),
        nodes={},
        edges=(),
        attrs={k: a.value for k, a in dot.attrs.items()},
        attr_pos={k: a.pos for k, a in dot.attrs.items()},
        max_steps=r.typed("max_steps", values.steps) or values.DEFAULT_MAX_STEPS,
        child_dotfile=(base_dir / child if base_dir else Path(child)) if child else None,
    )


def build_graph(dot: DotGraph, base_dir: Path | None = None) -> tuple[Graph, list[Problem]]:
    """The typed graph and every attribute problem found on the way. A node only mentioned in
    edges is a node too, with the defaults in force there (attractor spec §2.13's human gate);
    validation warns about it."""
    problems: list[Problem] = []
    g = _graph_attrs(dot, problems, base_dir)
    nodes = {n.id: _node(n, g, base_dir, problems) for n in dot.nodes.values()}
    edges = tuple(_edge(e, problems) for e in dot.edges)
    return replace(g, nodes=nodes, edges=edges), problems
