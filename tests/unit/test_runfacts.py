"""Run facts decided once for `delta` and `deltad` (deltad/protocol/runfacts.py), against real
processes: this one (alive), and a child that has exited and been reaped (dead)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deltad.protocol import (
    RunMetadata,
    Workspace,
    load_metadata,
    new_metadata,
    new_run_id,
    save_metadata,
)
from deltad.protocol.process import OwnerProcess, alive, current_owner, proc_stat
from deltad.protocol.runfacts import RunFact, judge, mark_owner_dead, owner_gone
from deltad.protocol.states import RunStatus


def dead_owner() -> OwnerProcess:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now (or a later one, with other ticks)
    return current_owner().model_copy(update={"pid": child.pid, "start_ticks": 1})


def meta_with(status: RunStatus, owner: OwnerProcess | None) -> RunMetadata:
    meta = new_metadata(new_run_id(), "task", "agent")
    meta.status, meta.owner = status, owner
    return meta


@pytest.mark.parametrize(
    ("status", "owner", "locked", "fact"),
    [
        (RunStatus.WAITING_FOR_INPUT, "me", False, RunFact.WAITING),
        (RunStatus.INTERRUPTED, "me", False, RunFact.INTERRUPTED),
        (RunStatus.COMPLETED, "me", False, RunFact.FINISHED),
        (RunStatus.FAILED, "dead", False, RunFact.FINISHED),
        (RunStatus.CANCELED, None, False, RunFact.FINISHED),
        (RunStatus.RUNNING, "me", False, RunFact.RUNNING),
        (RunStatus.RUNNING, "dead", False, RunFact.OWNER_DEAD),
        (RunStatus.RUNNING, None, False, RunFact.OWNER_DEAD),
        (RunStatus.RUNNING, "elsewhere", False, RunFact.ELSEWHERE),
        # under the workspace lock nobody else drives it: RUNNING means its owner died
        (RunStatus.RUNNING, "me", True, RunFact.OWNER_DEAD),
    ],
)
def test_judge(status: RunStatus, owner: str | None, locked: bool, fact: RunFact) -> None:
    who = {
        "me": current_owner(),
        "dead": dead_owner(),
        "elsewhere": current_owner().model_copy(update={"hostname": "another-host.invalid"}),
        None: None,
    }[owner]
    assert judge(meta_with(status, who), locked=locked) is fact


def test_a_dead_owner_is_marked_with_one_wording(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    meta = new_metadata(new_run_id(), "task", "agent")
    meta.owner = dead_owner()
    paths = ws.run(meta.run_id)
    paths.dir.mkdir(parents=True)
    save_metadata(paths.metadata, meta)
    mark_owner_dead(paths.metadata, meta, tmp_path)
    saved = load_metadata(paths.metadata)
    assert saved.status is RunStatus.INTERRUPTED
    assert (
        saved.error
        == owner_gone(meta)
        == (f"process {meta.owner.pid} stopped without finishing (crash or kill -9)")
    )


@pytest.mark.linux_only  # leases, /proc or the fork server (deltad/platform.py)
def test_one_proc_parser_sees_liveness_and_start_ticks() -> None:
    me = proc_stat(os.getpid())
    assert me is not None and not me.dead and me.start_ticks is not None
    assert alive(os.getpid(), me.start_ticks)
    assert not alive(os.getpid(), me.start_ticks + 1)  # a recycled pid has later ticks
    assert not alive(dead_owner().pid, None)
    assert proc_stat(0) is None and proc_stat(1 << 30) is None
