"""The unit layer's scale tests (moved from tests/unit/, unchanged): a startup walk of 450
workspaces, a 20,000-node pipeline, pipelines of 60 and 200 steps. Seconds each, so in the
slow layer (`slowunit`); the helpers and fixtures stay with the tests they came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltad.core.lifecycle import Lifecycle
from deltad.core.service import Service
from deltad.engine.interviewers import AutoApproveInterviewer, Chain
from deltad.pipeline import GraphError, check_pipeline
from deltad.pipeline import state as pipeline_state
from deltad.protocol import RunStatus
from deltad.testing import ScriptedModel
from deltad.testing.stub import paused_workspace
from tests.unit.helpers import Run, pipeline_graph
from tests.unit.test_daemon_ready import service  # noqa: F401 - the fixture
from tests.unit.test_pipeline_lint import chain
from tests.unit.test_pipeline_run import _queue


def test_the_startup_walk_reads_the_backends_events_between_its_slices(
    service: Service,  # noqa: F811 - the fixture
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel's event queue must not overflow while a long startup walk runs (a fanotify
    mark fills it with every write on the filesystem; an overflow starts a second full
    reconcile that reads every workspace): events are read between the walk's slices."""
    total = 450  # more than two slices of 200
    for i in range(total):
        paused_workspace(tmp_path / "root" / f"ws{i:03d}")
    seen_at: list[int] = []
    process = Lifecycle.process

    def reading(life: Lifecycle, backend: object) -> None:
        seen_at.append(len(service.registry))
        process(life, backend)  # type: ignore[arg-type]

    monkeypatch.setattr(Lifecycle, "process", reading)
    service.life.start()
    assert any(0 < found < total for found in seen_at), seen_at  # during the walk, not after
    assert len(service.registry) == total
    service.life.close_backends()


def test_a_20000_node_chain_is_accepted_and_one_lost_node_is_named() -> None:
    text = f"digraph t {{\n{chain(20000)}\n}}"
    checked = check_pipeline(text, "t.dot", check_files=False)
    assert len(checked.graph.nodes) == 20002 and checked.warnings == []
    assert [e.target for e in checked.graph.outgoing("n19999")] == ["exit"]
    with pytest.raises(GraphError) as err:
        check_pipeline(f"digraph t {{\n{chain(20000, 'lost')}\n}}", "t.dot")
    assert [line.split(": ", 2)[1] for line in err.value.lines()] == ["node lost"]


def test_a_step_reads_only_the_new_journal_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's state is kept up to date, not replayed: every journal event is added to it
    once over the whole run, so a step's cost does not grow with the steps before it."""
    n = 60
    chain = " -> ".join(f"t{i}" for i in range(n))
    tools = "\n".join(f't{i} [shape=parallelogram, tool_command="true"]' for i in range(n))
    graph = pipeline_graph(
        "digraph t {\nstart [shape=Mdiamond]\nexit [shape=Msquare]\n"
        f"{tools}\nstart -> {chain} -> exit\n}}"
    )
    added: list[int] = []
    real_add = pipeline_state.State.add

    def counting(self: pipeline_state.State, e: object) -> None:
        added.append(1)
        real_add(self, e)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline_state.State, "add", counting)
    run = Run(tmp_path, graph, ScriptedModel())
    assert run.drive(Chain(AutoApproveInterviewer())).status == RunStatus.COMPLETED
    assert len(run.path()) == n + 1
    assert len(added) <= len(run.journal.events)  # each event once (replaying: ~n² / 2)


# -- each step costs the same: the journal is folded once, not replayed per step --------------
def test_a_long_chain_folds_each_journal_event_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltad.pipeline import state as pipeline_state

    n = 200
    chain = " -> ".join(f"n{i}" for i in range(n))
    nodes = "\n".join(f"n{i} [shape=diamond]" for i in range(n))
    graph = pipeline_graph(
        f"digraph c {{\nstart [shape=Mdiamond]\nexit [shape=Msquare]\n{nodes}\n"
        f"start -> {chain} -> exit\n}}\n"
    )
    folded = 0
    add = pipeline_state.State.add

    def counting(self: Any, e: Any) -> None:
        nonlocal folded
        folded += 1
        add(self, e)

    monkeypatch.setattr(pipeline_state.State, "add", counting)
    run = Run(tmp_path, graph, ScriptedModel())
    assert run.drive(_queue()).status == RunStatus.COMPLETED
    assert len(run.path()) == n + 1
    assert folded <= len(run.journal.events)  # replaying per step would fold ~n²/2 * 3
