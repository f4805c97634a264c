"""The decisions of the Kubernetes list-then-watch (deltad/executors/kubewatch.py), from
tables, and the metric that shows them. The thread itself runs against the API stand-in in
tests/e2e/test_kube_contract.py (410, a dropped stream, bookmarks) and test_kube_daemon.py (an
outage)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from deltad.executors.kubewatch import Change, Outcome, Step, change_of, next_step
from deltad.executors.seam import BaseJobExecutor
from deltad.metrics import EngineEvents


@pytest.mark.parametrize(
    ("outcome", "failures", "relist_due", "then"),
    [
        (Outcome.LISTED, 0, False, (Step.WATCH, 0)),  # a list: watch from its version now
        (Outcome.LISTED, 0, True, (Step.WATCH, 0)),  # (a list is the safety net itself)
        (Outcome.LIST_FAILED, 1, False, (Step.LIST, 1)),  # list again after a paced wait
        (Outcome.LIST_FAILED, 4, True, (Step.LIST, 4)),  # ... growing while it fails
        (Outcome.ENDED, 0, False, (Step.WATCH, 0)),  # timeoutSeconds: watch again at once
        (Outcome.ENDED, 0, True, (Step.LIST, 0)),  # ... unless the safety net's list is due
        (Outcome.GONE, 0, False, (Step.LIST, 0)),  # 410: list at once
        (Outcome.GONE, 3, False, (Step.LIST, 0)),
        (Outcome.BROKEN, 1, False, (Step.WATCH, 1)),  # a reset: watch from the last version
        (Outcome.BROKEN, 5, False, (Step.WATCH, 5)),  # ... paced while it keeps failing
        (Outcome.BROKEN, 2, True, (Step.LIST, 0)),
    ],
)
def test_what_the_watcher_does_next(
    outcome: Outcome, failures: int, relist_due: bool, then: tuple[Step, int]
) -> None:
    assert next_step(outcome, failures, relist_due) == then


@pytest.mark.parametrize(
    ("event", "change"),
    [
        (
            {"type": "MODIFIED", "raw_object": {"metadata": {"name": "j", "resourceVersion": "7"}}},
            Change("MODIFIED", "j", "7"),
        ),
        (
            {
                "type": "BOOKMARK",
                "raw_object": {"kind": "Job", "metadata": {"resourceVersion": "9"}},
            },
            Change("BOOKMARK", "", "9"),
        ),
        ({"type": "ADDED", "raw_object": "not an object"}, Change("ADDED", "", "")),
        ({"type": "DELETED", "raw_object": {"metadata": None}}, Change("DELETED", "", "")),
    ],
)
def test_an_event_as_plain_values(event: dict[str, Any], change: Change) -> None:
    assert change_of(event) == change


def test_the_executors_counts_are_counters_in_metrics() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineEvents(lambda: ("kubernetes", {"relists": 2, "watch_restarts": 5})))
    text = generate_latest(registry).decode()
    assert 'deltad_executor_engine_events_total{event="relists",executor="kubernetes"} 2.0' in text
    assert (
        'deltad_executor_engine_events_total{event="watch_restarts",executor="kubernetes"} 5.0'
        in text
    )
    assert BaseJobExecutor().counts() == {}  # an executor that counts nothing shows nothing
