"""Parallel fan-out and fan-in (attractor spec §4.8, §4.9), as pure decisions.

A `component` node's outgoing edges are its branches. Each branch runs from its edge's target,
with a copy of the context, until it reaches the fan-in (`tripleoctagon`) node the branches
lead to, or has nowhere to go. The branches run one at a time in this one process (the spec
allows concurrency; a workspace has one driver), interleaved by `schedule`: a branch whose
next node is a human gate waits while another branch can go on, so a gate pauses the run
only when no branch can proceed. The join policy then makes the parallel node's outcome and
`parallel.results`; the run goes on at the fan-in node, which picks the best branch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import values
from .model import Graph, Kind, Node
from .outcome import Outcome, Status
from .problems import Code, Problem

_RANK = {Status.SUCCESS: 0, Status.PARTIAL_SUCCESS: 1, Status.RETRY: 2, Status.SKIPPED: 3}


JOIN_POLICIES = ("wait_all", "first_success")
DEFAULT_MAX_PARALLEL = 4  # the spec's default (§4.8)
MAX_PARALLEL_LIMIT = 1000


@dataclass(frozen=True)
class Lane:
    """What `schedule` needs of a branch."""

    busy: bool  # a node begun and not routed yet: it must finish first
    at: str | None  # the node it begins next
    done: bool
    begun: bool = True  # a node of it has begun (it counts against max_parallel until done)


def fan_in_of(graph: Graph, node_id: str) -> str | None:
    """The fan-in node the branches of `node_id` lead to: the nearest one, breadth first."""
    seen, todo = {node_id}, deque(e.target for e in graph.outgoing(node_id))
    while todo:
        here = todo.popleft()
        if here in seen:
            continue
        seen.add(here)
        if graph.nodes[here].kind == Kind.FAN_IN:
            return here
        todo.extend(e.target for e in graph.outgoing(here))
    return None


def schedule(
    lanes: Sequence[Lane], graph: Graph, max_parallel: int = DEFAULT_MAX_PARALLEL
) -> int | None:
    """The branch to step next: one in the middle of a node; else the first that can go on
    without a human; else the first waiting at a gate (its question pauses the run); None
    when every branch is done. At most `max_parallel` branches are under way (begun, not
    done) at a time: a branch not begun waits for one of them to end (§4.8)."""
    if (busy := next((i for i, b in enumerate(lanes) if b.busy), None)) is not None:
        return busy
    under_way = sum(1 for b in lanes if b.begun and not b.done)
    waiting = [i for i, b in enumerate(lanes) if not b.done and not b.begun]
    may_begin = set(waiting[: max(0, max_parallel - under_way)])  # in the order written
    open_ = [i for i, b in enumerate(lanes) if not b.done and (b.begun or i in may_begin)]
    free = [i for i in open_ if not _at_gate(lanes[i], graph)]
    found = free or open_
    return found[0] if found else None


def _at_gate(lane: Lane, graph: Graph) -> bool:
    return lane.at is not None and graph.nodes[lane.at].kind == Kind.WAIT_HUMAN


def branch_result(start: str, node: str, outcome: Outcome) -> dict[str, Any]:
    return {
        "branch": start,
        "node": node,
        "status": outcome.status.value,
        "notes": outcome.notes[:2000],
        "failure_reason": outcome.failure_reason,
    }


def join(results: Sequence[Mapping[str, Any]], policy: str) -> Outcome:
    """The parallel node's outcome (§4.8): `wait_all` is SUCCESS when no branch failed, else
    PARTIAL_SUCCESS; `first_success` is SUCCESS when one branch succeeded, else FAIL."""
    statuses = [r["status"] for r in results]
    updates = {"parallel.results": list(results)}
    failed = statuses.count(Status.FAIL.value)
    summary = f"{len(results) - failed} of {len(results)} branch(es) did not fail"
    if policy == "first_success":
        if Status.SUCCESS.value in statuses:
            return Outcome(Status.SUCCESS, context_updates=updates, notes=summary)
        return Outcome(Status.FAIL, context_updates=updates, failure_reason="no branch succeeded")
    status = Status.SUCCESS if failed == 0 else Status.PARTIAL_SUCCESS
    return Outcome(status, context_updates=updates, notes=summary)


def fan_in(context: Mapping[str, Any]) -> Outcome:
    """The fan-in node (§4.9, its heuristic): the best branch by outcome, then by id. FAIL
    when there are no results or every branch failed."""
    results = [r for r in context.get("parallel.results") or () if isinstance(r, dict)]
    live = [r for r in results if r.get("status") != Status.FAIL.value]
    if not live:
        why = "every branch failed" if results else "no parallel results to evaluate"
        return Outcome(Status.FAIL, failure_reason=why)
    best = min(live, key=lambda r: (_RANK.get(Status(r["status"]), 9), str(r["branch"])))
    return Outcome(
        Status.SUCCESS,
        context_updates={
            "parallel.fan_in.best_id": best["branch"],
            "parallel.fan_in.best_outcome": best["status"],
        },
        notes=f"selected best candidate: {best['branch']}",
    )


def problems(graph: Graph) -> Iterator[Problem]:
    """A parallel node needs branches, a fan-in they lead to, and a known join policy."""
    for n in graph.of_kind(Kind.PARALLEL):
        if not graph.outgoing(n.id):
            yield Problem(
                "a parallel node needs outgoing edges: its branches",
                n.pos,
                n.subject,
                code=Code.NODE_ATTR,
            )
        elif fan_in_of(graph, n.id) is None:
            yield Problem(
                "its branches lead to no fan-in node (shape=tripleoctagon)",
                n.pos,
                n.subject,
                code=Code.NODE_ATTR,
            )
        yield from _nested(graph, n)
        if (limit := n.attrs.get("max_parallel")) is not None and max_parallel_of(n) is None:
            yield Problem(
                f"max_parallel {limit[:30]!r}: a whole number from 1 to {MAX_PARALLEL_LIMIT}",
                n.where("max_parallel"),
                n.subject,
                code=Code.BAD_VALUE,
            )
        policy = n.attrs.get("join_policy", "wait_all")
        if policy not in JOIN_POLICIES:
            yield Problem(
                f"join_policy {policy[:30]!r}: use {' or '.join(JOIN_POLICIES)}",
                n.where("join_policy"),
                n.subject,
                code=Code.BAD_VALUE,
            )


def max_parallel_of(node: Node) -> int | None:
    """The node's `max_parallel` (default 4); None when it is not a number from 1 to 1000."""
    try:
        n = values.integer(node.attrs.get("max_parallel", str(DEFAULT_MAX_PARALLEL)))
    except ValueError:
        return None
    return n if 1 <= n <= MAX_PARALLEL_LIMIT else None


def inside_branches(graph: Graph, node_id: str) -> set[str]:
    """The nodes a branch of parallel node `node_id` may visit: from its edges' targets up to
    (not including) a fan-in or the exit, where a branch ends."""
    seen: set[str] = set()
    todo = [e.target for e in graph.outgoing(node_id)]
    while todo:
        here = todo.pop()
        if here in seen or graph.nodes[here].kind in (Kind.FAN_IN, Kind.EXIT):
            continue
        seen.add(here)
        todo.extend(e.target for e in graph.outgoing(here))
    return seen


# Kinds a branch cannot run: they drive lanes of their own.
_NOT_IN_BRANCH = {Kind.PARALLEL: "a parallel node", Kind.MANAGER: "a manager loop (house)"}


def _nested(graph: Graph, n: Node) -> Iterator[Problem]:
    """A parallel node or a manager loop inside a branch is refused: one set of branches
    runs at a time (a nested fan-out would need branches within a branch)."""
    inside = inside_branches(graph, n.id)
    for e in graph.edges:
        if e.loop_restart and e.source in inside:
            yield Problem(
                f"loop_restart inside a branch of parallel node {n.id} is not supported: a "
                "branch cannot restart the pipeline",
                e.where("loop_restart"),
                e.subject,
                code=Code.NODE_ATTR,
            )
    for inner in sorted(inside):
        node = graph.nodes[inner]
        if (what := _NOT_IN_BRANCH.get(node.kind)) is not None:
            yield Problem(
                f"{what} inside a branch of parallel node {n.id} is not supported: move it "
                f"after the fan-in, or make it a separate pipeline step",
                node.pos,
                node.subject,
                code=Code.NODE_ATTR,
            )
