"""Refusing model settings and context fidelity that cannot run, before anything runs: a
`model_stylesheet` that does not parse (at the line and column of the fault), a
`reasoning_effort`, `temperature` or `fidelity` that is not one of its values."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from .fidelity import FIDELITIES
from .model import Graph
from .problems import Code, Pos, Problem
from .stylesheet import PROPERTIES, StylesheetError, offset_pos, parse_stylesheet, property_problem


def _values(
    attrs: Mapping[str, str], where: Mapping[str, Pos], default: Pos | None, subject: str
) -> Iterator[Problem]:
    for prop in PROPERTIES:
        if prop in attrs and (why := property_problem(prop, attrs[prop])) is not None:
            yield Problem(why, where.get(prop, default), subject, code=Code.BAD_VALUE)
    fidelity = attrs.get("fidelity") or attrs.get("default_fidelity")
    if fidelity is not None and fidelity not in FIDELITIES:
        key = "fidelity" if "fidelity" in attrs else "default_fidelity"
        yield Problem(
            f"{key} {fidelity[:30]!r}: use one of {', '.join(FIDELITIES)}",
            where.get(key, default),
            subject,
            code=Code.BAD_VALUE,
        )


def _stylesheet(graph: Graph) -> Iterator[Problem]:
    sheet = graph.attrs.get("model_stylesheet")
    if sheet is None:
        return
    try:
        parse_stylesheet(sheet)
    except StylesheetError as e:
        pos = graph.attr_pos.get("model_stylesheet")
        at = Pos(*offset_pos(pos, sheet, e.offset)) if pos else None
        yield Problem(f"model_stylesheet: {e.message}", at, "graph", code=Code.BAD_VALUE)


def settings_problems(graph: Graph) -> list[Problem]:
    found = [*_stylesheet(graph), *_values(graph.attrs, graph.attr_pos, None, "graph")]
    for n in graph.nodes.values():
        found += _values(n.attrs, n.attr_pos, n.pos, n.subject)
    for e in graph.edges:
        found += _values(e.attrs, e.attr_pos, e.pos, e.subject)
    return found
