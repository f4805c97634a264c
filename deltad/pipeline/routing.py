"""Which edge to take after a node (attractor spec §3.3), and why — for the journal.

In order: (1) edges whose condition holds, best by weight then target id; (2) the first
unconditional edge whose label matches the outcome's preferred label (case, whitespace and
accelerator prefixes ignored); (3) the first unconditional edge to a suggested next id; (4) the
unconditional edge of highest weight; (5) among equal weights, the first target id in lexical
order; (6) when every edge has a condition and none holds: any edge, by the same weight and id
order (the spec's "Fallback: any edge", attractor spec 1.0 §3.3; its 2026-03 revision ends the run
there instead, which let a graph whose conditions read a key nobody sets skip its release gate).
Only a node with no outgoing edge at all ends the pipeline there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from deltad.protocol.questions import parse_accelerator

from .model import Edge, Graph
from .outcome import Outcome


class Step(StrEnum):
    CONDITION = "condition"
    PREFERRED_LABEL = "preferred_label"
    SUGGESTED_ID = "suggested_next_id"
    WEIGHT = "weight"
    LEXICAL = "lexical"
    FALLBACK = "fallback"
    NONE = "none"


@dataclass(frozen=True)
class Selection:
    edge: Edge | None
    step: Step
    reason: str  # one line, for the journal and `delta status`


def normalize_label(label: str) -> str:
    """`[Y] Yes, deploy` → `yes, deploy`: prefix stripped, whitespace trimmed (and runs of it
    made one space), case folded."""
    return " ".join(parse_accelerator(" ".join(label.split()))[1].split()).casefold()


def _best(edges: Sequence[Edge]) -> Edge:
    return sorted(edges, key=lambda e: (-e.weight, e.target))[0]


def _by_weight(edges: Sequence[Edge], why: str) -> Selection:
    best = _best(edges)
    rivals = [e for e in edges if e is not best and e.weight == best.weight]
    if rivals:
        return Selection(
            best, Step.LEXICAL, f"{why}: weight {best.weight} tied, {best.target} first by id"
        )
    return Selection(best, Step.WEIGHT, f"{why}: highest weight ({best.weight})")


def select_edge(
    graph: Graph, node_id: str, outcome: Outcome, context: Mapping[str, Any]
) -> Selection:
    edges = graph.outgoing(node_id)
    if not edges:
        return Selection(None, Step.NONE, f"{node_id} has no outgoing edge")
    status, preferred = outcome.status.value, outcome.preferred_label
    held = [e for e in edges if e.guard is not None and e.guard.holds(status, preferred, context)]
    if held:
        best = _best(held)
        among = f" (first of {len(held)} by weight, then id)" if len(held) > 1 else ""
        return Selection(best, Step.CONDITION, f"condition {best.condition!r} holds{among}")
    plain = [e for e in edges if not e.conditional]
    if preferred.strip():
        want = normalize_label(preferred)
        if found := next((e for e in plain if normalize_label(e.label) == want), None):
            return Selection(found, Step.PREFERRED_LABEL, f"preferred label {preferred!r}")
    for target in outcome.suggested_next_ids:
        if found := next((e for e in plain if e.target == target), None):
            return Selection(found, Step.SUGGESTED_ID, f"suggested next node {target}")
    if plain:
        return _by_weight(plain, "unconditional")
    best = _best(edges)
    return Selection(
        best,
        Step.FALLBACK,
        f"no condition holds and every edge has one: fallback to any edge, {best.target} "
        f"(highest weight {best.weight}, then id)",
    )
