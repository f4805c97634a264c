"""Parallel fan-out and fan-in decisions (attractor §4.8, §4.9), from tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltad.engine.interviewers import QueueInterviewer
from deltad.pipeline.outcome import Status
from deltad.pipeline.parallel import Lane, fan_in, fan_in_of, join, schedule
from deltad.protocol import RunStatus
from deltad.testing import ScriptedModel

from .helpers import Run, pipeline_graph, problems_in

GRAPH = pipeline_graph(
    """\
    digraph p {
        start [shape=Mdiamond]
        exit [shape=Msquare]
        fan [shape=component]
        join [shape=tripleoctagon]
        gate [shape=hexagon]
        start -> fan
        fan -> a
        fan -> gate
        fan -> c
        gate -> b [label="Go"]
        a -> join
        b -> join
        c -> d -> join
        join -> exit
    }
    """
)


def test_the_fan_in_is_the_nearest_one() -> None:
    assert fan_in_of(GRAPH, "fan") == "join"
    assert fan_in_of(GRAPH, "a") == "join" and fan_in_of(GRAPH, "join") is None


@pytest.mark.parametrize(
    ("lanes", "expected"),
    [
        # A node in progress is finished first, even behind a free branch.
        ([Lane(False, "a", False), Lane(True, None, False)], 1),
        # A branch at a gate waits while another can go on.
        ([Lane(False, "gate", False), Lane(False, "c", False)], 1),
        ([Lane(False, "gate", False), Lane(False, None, True)], 0),  # none free: the gate
        ([Lane(False, None, True), Lane(False, None, True)], None),  # all done: join
        ([Lane(False, "a", False), Lane(False, "c", False)], 0),  # in order
    ],
)
def test_schedule(lanes: list[Lane], expected: int | None) -> None:
    assert schedule(lanes, GRAPH) == expected


NEW = False  # a branch not begun yet


@pytest.mark.parametrize(
    ("lanes", "max_parallel", "expected"),
    [
        # max_parallel=1: the first branch, at its gate, is the one under way: c waits.
        ([Lane(False, "gate", False, NEW), Lane(False, "c", False, NEW)], 1, 0),
        ([Lane(False, "gate", False, True), Lane(False, "c", False, NEW)], 1, 0),
        ([Lane(False, "gate", False, True), Lane(False, "c", False, NEW)], 2, 1),
        # One ended: the next may begin.
        ([Lane(False, None, True, True), Lane(False, "gate", False, NEW)], 1, 1),
        ([Lane(False, "gate", False, NEW), Lane(False, "c", False, NEW)], 4, 1),
    ],
)
def test_schedule_keeps_at_most_max_parallel_branches_under_way(
    lanes: list[Lane], max_parallel: int, expected: int
) -> None:
    assert schedule(lanes, GRAPH, max_parallel) == expected


FANNED = """\
start [shape=Mdiamond]
exit [shape=Msquare]
fan [shape=component%s]
join [shape=tripleoctagon]
start -> fan
fan -> a -> join
fan -> %s -> join
join -> exit
%s
"""


@pytest.mark.parametrize(
    ("attrs", "second", "extra", "expected"),
    [
        (", max_parallel=0", "b", "", "max_parallel '0': a whole number from 1 to 1000"),
        (", max_parallel=x", "b", "", "max_parallel 'x'"),
        (
            "",
            "inner",
            "inner [shape=component]\nj2 [shape=tripleoctagon]\ninner -> c -> j2",
            "node inner: a parallel node inside a branch of parallel node fan is not supported",
        ),
        ("", "m", "m [shape=house]", "node m: a manager loop (house) inside a branch"),
        ("", "b", "b -> a [loop_restart=true]", "loop_restart inside a branch of parallel node"),
    ],
)
def test_check_refuses_what_a_branch_cannot_run(
    attrs: str, second: str, extra: str, expected: str
) -> None:
    problems = problems_in(FANNED % (attrs, second, extra))
    assert any(expected in p for p in problems), problems


def _r(branch: str, status: Status) -> dict[str, Any]:
    return {"branch": branch, "node": branch, "status": status.value}


OK, PART, FAIL = Status.SUCCESS, Status.PARTIAL_SUCCESS, Status.FAIL


@pytest.mark.parametrize(
    ("policy", "statuses", "expected"),
    [
        ("wait_all", [OK, OK], OK),
        ("wait_all", [OK, FAIL], PART),
        ("wait_all", [FAIL, FAIL], PART),  # the spec's table: no FAIL from wait_all
        ("wait_all", [PART, OK], OK),
        ("first_success", [FAIL, OK], OK),
        ("first_success", [PART, FAIL], FAIL),
    ],
)
def test_join(policy: str, statuses: list[Status], expected: Status) -> None:
    results = [_r(f"b{i}", s) for i, s in enumerate(statuses)]
    got = join(results, policy)
    assert got.status == expected and got.context_updates["parallel.results"] == results


@pytest.mark.parametrize(
    ("results", "best"),
    [
        ([_r("b", OK), _r("a", OK)], "a"),  # by id on a tie
        ([_r("a", PART), _r("b", OK)], "b"),  # by outcome first
        ([_r("a", FAIL), _r("b", PART)], "b"),
        ([_r("a", FAIL)], None),  # every branch failed
        ([], None),  # nothing to evaluate
    ],
)
def test_fan_in_picks_the_best_branch(results: list[dict[str, Any]], best: str | None) -> None:
    got = fan_in({"parallel.results": results})
    if best is None:
        assert got.status == Status.FAIL and got.failure_reason
    else:
        assert got.status == Status.SUCCESS
        assert got.context_updates["parallel.fan_in.best_id"] == best


def test_an_edge_straight_to_the_fan_in_is_an_empty_branch(tmp_path: Path) -> None:
    graph = pipeline_graph(
        """\
        digraph p {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            join [shape=tripleoctagon]
            start -> fan
            fan -> a -> join
            fan -> join
            join -> exit
        }
        """
    )
    run = Run(tmp_path, graph, ScriptedModel().reply("a done"))
    assert run.drive(QueueInterviewer([])).status == RunStatus.COMPLETED
    assert run.path() == ["start", "fan", "a", "join"]
    results = run.outcome("fan")["context_updates"]["parallel.results"]
    assert [(r["branch"], r["status"]) for r in results] == [("a", "success"), ("join", "success")]
