"""The import rules of deltad/ (docs/design.md, "Layers"), read with `ast` from the source: every
import counts, at the top, inside a function or under TYPE_CHECKING alike.

1. No module imports itself back through others (no module circle), anywhere in deltad/.
2. No package imports itself back (no package circle): `deltad.core` -> `deltad.inbox` ->
   `deltad.core` would be one, even through modules that do not form a module circle.
3. Each package imports only packages of a lower layer (LAYERS, lowest first), so "what can
   this code reach?" is answered by the tree: the inbox process's package (`http`) is below the
   root core's (`core`), and nothing below the core imports it.
"""

from __future__ import annotations

import functools

import pytest

from tests.support.beside import Beside

# Lowest first. A package may import the packages of any layer before its own; packages of one
# layer import nothing of each other. Top-level modules count as packages of their own name.
LAYERS: list[set[str]] = [
    {"errors", "clock", "pacing", "platform", "validation", "health", "keys"},
    {"protocol"},
    {"logs", "agent", "metrics", "tracing"},
    {"engine", "watch"},
    {"pipeline"},
    {"inbox"},
    {"wire"},  # the inbox process's protocol: what both processes import of each other
    {"client"},  # `delta respond` answers through the inbox package
    {"executors"},  # the warm fork server runs `delta` in its children
    {"testing"},  # the public doubles, the executor contract among them
    {"outbound"},
    {"privsep"},  # the core's side of the inbox process, and the wire both speak
    {"http"},  # the inbox process: only what runs as deltad-inbox
    {"core"},  # the root daemon, which composes everything
]


# The parse costs ~1 s of an interpreter: a child does it beside the layer (support/beside.py).
_GRAPH = Beside(
    "import json; from tests.support.importgraph import parse; print(json.dumps(parse()))"
)


@functools.cache  # one graph for the three tests (read-only after)
def module_graph() -> dict[str, set[str]]:
    """Each module of deltad/ -> the deltad modules (or packages) it imports."""
    return {name: set(deps) for name, deps in _GRAPH.result().items()}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "deltad"


def a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (its nodes in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state and (found := visit(d)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(package, package it imports) -> the module pairs that make the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for mod, deps in graph.items():
        for dep in deps:
            a, b = package_of(mod), package_of(dep)
            if a != b and b != "deltad":
                edges.setdefault((a, b), []).append(f"{mod} -> {dep}")
    return edges


def layer_of(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"deltad.{package} is in no layer: add it to LAYERS in {__file__}")


@pytest.mark.spawns  # under xdist only: serially the graph was parsed beside
def test_no_module_imports_itself_back() -> None:
    graph = module_graph()
    assert len(graph) > 150 and graph["deltad.core.service"]  # it did read them
    cycle = a_cycle(graph)
    assert cycle is None, "module circle: " + " -> ".join(cycle or [])


@pytest.mark.spawns  # under xdist only: serially the graph was parsed beside
def test_no_package_imports_itself_back() -> None:
    edges = package_edges(module_graph())
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    cycle = a_cycle(graph)
    assert cycle is None, (
        "package circle: "
        + " -> ".join(cycle or [])
        + "".join(
            f"\n  {a} -> {b}: {', '.join(edges[(a, b)][:3])}"
            for a, b in zip(cycle or [], (cycle or [])[1:], strict=False)
        )
    )


@pytest.mark.spawns  # under xdist only: serially the graph was parsed beside
def test_every_package_imports_only_lower_layers() -> None:
    wrong = [
        f"deltad.{a} (layer {layer_of(a)}) imports deltad.{b} (layer {layer_of(b)}): "
        + ", ".join(pairs[:3])
        for (a, b), pairs in sorted(package_edges(module_graph()).items())
        if layer_of(b) >= layer_of(a)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_rules_see_a_circle_and_a_climb() -> None:
    """The checks above would fail on a circle and on an import against the layers."""
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("http") < layer_of("core") and layer_of("protocol") < layer_of("inbox")
    edges = package_edges({"deltad.inbox.x": {"deltad.core.y"}, "deltad.core.y": set()})
    assert ("inbox", "core") in edges and layer_of("core") >= layer_of("inbox")
