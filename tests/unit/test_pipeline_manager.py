"""The manager loop's decisions (attractor §4.11), from tables: its settings, how it judges
the child after each cycle, and what `check` refuses or warns about."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from deltad.pipeline import GraphError, check_pipeline
from deltad.pipeline.conditions import parse_condition
from deltad.pipeline.manager import Child, Settings, judge, observe
from deltad.pipeline.outcome import Status
from deltad.pipeline.state import replay
from deltad.protocol import EventType, JournalEvent

from .helpers import problems_in

RUNNING = Child("running", "success", "work", 2)
_seq = iter(range(1, 1_000_000))


def ev(type_: EventType, **payload: Any) -> JournalEvent:
    return JournalEvent(seq=next(_seq), timestamp=datetime.now(UTC), type=type_, payload=payload)


START = [
    ev(EventType.NODE_START, node="start", kind="start"),
    ev(EventType.NODE_OUTCOME, node="start", status="success"),
    ev(EventType.EDGE_TAKEN, source="start", target="work", step="lexical"),
]
WORKED = [
    *START,
    ev(EventType.NODE_START, node="work", kind="codergen"),
    ev(EventType.NODE_OUTCOME, node="work", status="fail", context_updates={"last_response": "x"}),
]
ENDED = [
    *WORKED,
    ev(EventType.EDGE_TAKEN, source="work", target="", step="child_end", status="failed",
       reason="node work failed: red"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], Child("running", "", "start", 0)),
        (START, Child("running", "success", "work", 0)),  # the start node is no cycle
        (WORKED[:-1], Child("running", "success", "work", 0)),
        (WORKED, Child("running", "fail", "work", 1, "x")),  # an outcome not routed yet
        (ENDED, Child("failed", "fail", "work", 1, "x", "node work failed: red")),
    ],
)
def test_observe(events: list[JournalEvent], expected: Child) -> None:
    assert observe(replay(events, "start"), "start") == expected


STOP = parse_condition("context.stack.child.outcome=partial_success")


@pytest.mark.parametrize(
    ("settings", "child", "context", "expected"),
    [
        (Settings(10, None, True), RUNNING, {}, None),  # let the child go on
        (Settings(10, None, True), Child("completed", "success", "", 3), {}, Status.SUCCESS),
        (Settings(10, None, True), Child("failed", "fail", "w", 3, "", "red"), {}, Status.FAIL),
        (Settings(2, None, True), RUNNING, {}, Status.FAIL),  # max cycles reached
        (Settings(3, None, True), RUNNING, {}, None),
        (Settings(10, STOP, True), Child("running", "partial_success", "w", 1), {}, Status.SUCCESS),
        (Settings(10, STOP, True), RUNNING, {}, None),
        # Not observing: the child's telemetry is not in the context the condition reads.
        (Settings(10, STOP, False), Child("running", "partial_success", "w", 1), {}, None),
        # The run's own context counts too.
        (
            Settings(10, parse_condition("context.stop=yes"), True),
            RUNNING,
            {"stop": "yes"},
            Status.SUCCESS,
        ),
        # The child's end wins over max cycles, as in the spec's loop.
        (Settings(1, None, True), Child("completed", "success", "", 5), {}, Status.SUCCESS),
    ],
)
def test_judge(
    settings: Settings, child: Child, context: dict[str, Any], expected: Status | None
) -> None:
    got = judge(settings, child, context)
    assert (got.status if got else None) == expected


def test_a_judgement_records_what_the_manager_observed() -> None:
    got = judge(Settings(10, None, True), Child("failed", "fail", "w", 3, "said", "red"), {})
    assert got is not None and got.failure_reason == "child failed: red"
    assert got.context_updates == {
        "stack.child.status": "failed",
        "stack.child.outcome": "fail",
        "stack.child.current_node": "w",
        "stack.child.cycles": 3,
        "stack.child.last_response": "said",
        "stack.child.failure_reason": "red",
    }


ENDS = "start [shape=Mdiamond]\nexit [shape=Msquare]\n"
WITH_CHILD = 'graph [stack.child_dotfile="child.dot"]\n' + ENDS


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (f"{ENDS}m [shape=house]\nstart -> m -> exit", "needs the graph attribute stack.child"),
        (
            f"{WITH_CHILD}m [shape=house, manager.max_cycles=0]\nstart -> m -> exit",
            "manager.max_cycles: must be from 1 to 1000000 [E003",
        ),
        (
            f'{WITH_CHILD}m [shape=house, manager.stop_condition="a=="]\nstart -> m -> exit',
            "manager.stop_condition 'a=='",
        ),
        (
            f'{WITH_CHILD}m [shape=house, manager.actions="observe,nap"]\nstart -> m -> exit',
            "manager.actions 'nap': use observe, steer, wait [E003",
        ),
        (
            f"{WITH_CHILD}m [shape=house, manager.poll_interval=soon]\nstart -> m -> exit",
            "manager.poll_interval: 'soon' is not a duration",
        ),
        (
            f"{WITH_CHILD}w [manager.max_cycles=3]\nstart -> w -> exit",
            "node w: manager.max_cycles applies to house (manager loop) nodes only [E008",
        ),
    ],
)
def test_check_refuses_a_manager_it_cannot_run(body: str, expected: str) -> None:
    problems = problems_in(body)
    assert any(expected in p for p in problems), problems


def _check(tmp_path: Path, child: str, node: str = "m [shape=house]") -> list[str]:
    (tmp_path / "child.dot").write_text(child)
    text = f"digraph t {{\n{WITH_CHILD}{node}\nstart -> m -> exit\n}}"
    try:
        checked = check_pipeline(text, "t.dot", tmp_path)
    except Exception as e:  # GraphError: its lines
        return [str(line) for line in e.lines()]
    return checked.warning_lines()


CHILD = "digraph c {\nstart [shape=Mdiamond]\nexit [shape=Msquare]\nstart -> exit\n}\n"


def test_check_reads_the_child_pipeline(tmp_path: Path) -> None:
    assert _check(tmp_path, CHILD) == []
    [line] = _check(tmp_path, CHILD.replace("start -> exit", "start -> exit\nlost"))
    assert line.startswith("t.dot:2:28: graph: the child pipeline does not run: ")
    assert "child.dot:5:1: node lost: not reachable from the start node" in line
    assert line.endswith("[E011 child-pipeline]")
    nested = CHILD.replace("start -> exit", "m2 [shape=house]\nstart -> m2 -> exit")
    [line] = _check(tmp_path, nested)
    assert "a manager loop in a child pipeline is not supported" in line
    (tmp_path / "child.dot").unlink()
    text = f"digraph t {{\n{WITH_CHILD}m [shape=house]\nstart -> m -> exit\n}}"
    with pytest.raises(GraphError, match="no such file"):
        check_pipeline(text, "t.dot", tmp_path)


def test_what_the_manager_does_not_carry_out_is_a_warning(tmp_path: Path) -> None:
    node = 'm [shape=house, manager.actions="observe,steer", manager.poll_interval=5s]'
    warnings = _check(tmp_path, CHILD, node)
    assert [w.rsplit(" [", 1)[1] for w in warnings] == ["W001 ignored-attribute]"] * 2
    assert "manager.actions steer is ignored" in warnings[0]
    assert "manager.poll_interval is ignored" in warnings[1]
