"""Run facts decided once for `delta` and `deltad` (deltad/protocol/runfacts.py), against real
processes: this one (alive), and a child that has exited and been reaped (dead)."""

from __future__ import annotations

import os
import subprocess
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
from deltad.protocol.runfacts import (
    Elsewhere,
    JobEnd,
    JobFact,
    RemoteOwner,
    RunFact,
    job_fact,
    judge,
    judge_elsewhere,
    mark_job_ended,
    mark_owner_dead,
    owner_gone,
    remote_owner,
    still_elsewhere,
)
from deltad.protocol.states import RunStatus

pytestmark = pytest.mark.spawns  # a reaped child's pid is a dead owner (`true`, not a Python start)


def dead_owner() -> OwnerProcess:
    child = subprocess.Popen(["true"])  # the smallest process there is (not a Python start)
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


B = RemoteOwner("r1", "node-b", 42)


@pytest.mark.parametrize(
    ("in_flight", "ended", "answered", "fact"),
    [
        (True, None, True, JobFact.ACTIVE),
        (True, JobEnd(B, -9), False, JobFact.ACTIVE),  # a new job for it runs
        (False, JobEnd(B, -9), True, JobFact.ENDED),
        (False, JobEnd(B, None), True, JobFact.ENDED),  # the engine lost it
        (False, JobEnd(B, -15), False, JobFact.ENDED),  # seen ending: the engine is not needed
        (False, JobEnd(B, 127), True, JobFact.ENDED),  # not delta's code: it never ran
        (False, JobEnd(B, 75), True, JobFact.NONE),  # busy: another process drove the run
        # delta's own codes: the client settled the run itself (RUNNING: a stale read)
        (False, JobEnd(B, 0), True, JobFact.NONE),
        (False, JobEnd(B, 1), True, JobFact.NONE),
        (False, JobEnd(B, 101), True, JobFact.NONE),
        (False, JobEnd(B, 130), True, JobFact.NONE),
        (False, JobEnd(RemoteOwner("r0", "node-b", 42), -9), True, JobFact.NONE),  # other run
        (False, JobEnd(RemoteOwner("r1", "node-c", 42), -9), True, JobFact.NONE),  # other host
        (False, JobEnd(RemoteOwner("r1", "node-b", 7), -9), True, JobFact.NONE),  # taken over
        (False, JobEnd(None, -9), True, JobFact.NONE),  # the run was not elsewhere when it ended
        (False, None, True, JobFact.NONE),
        (False, None, False, JobFact.UNREACHABLE),
    ],
)
def test_job_fact(in_flight: bool, ended: JobEnd | None, answered: bool, fact: JobFact) -> None:
    assert job_fact(B, in_flight=in_flight, ended=ended, engine_answered=answered) is fact


@pytest.mark.parametrize(
    ("job", "fact"),
    [
        (JobFact.ACTIVE, RunFact.RUNNING),
        (JobFact.ENDED, RunFact.JOB_ENDED),
        (JobFact.NONE, RunFact.ELSEWHERE),
        (JobFact.UNREACHABLE, RunFact.UNKNOWN),
    ],
)
def test_judge_elsewhere(job: JobFact, fact: RunFact) -> None:
    assert judge_elsewhere(job) is fact


def elsewhere_owner(pid: int = 42, host: str = "node-b.invalid") -> OwnerProcess:
    return current_owner().model_copy(update={"hostname": host, "pid": pid})


def test_only_a_running_run_on_another_host_has_a_remote_owner() -> None:
    meta = meta_with(RunStatus.RUNNING, elsewhere_owner())
    assert remote_owner(meta) == RemoteOwner(meta.run_id, "node-b.invalid", 42)
    assert remote_owner(meta_with(RunStatus.RUNNING, current_owner())) is None
    assert remote_owner(meta_with(RunStatus.WAITING_FOR_INPUT, elsewhere_owner())) is None


def test_a_run_whose_job_ended_is_marked_once_for_the_same_owner(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    meta = meta_with(RunStatus.RUNNING, elsewhere_owner())
    paths = ws.run(meta.run_id)
    paths.dir.mkdir(parents=True)
    save_metadata(paths.metadata, meta)
    judged = remote_owner(meta)
    assert judged is not None
    seen = Elsewhere(judged, "job deltad-1 (7) ended: killed_by_SIGKILL")
    assert not still_elsewhere(meta_with(RunStatus.RUNNING, elsewhere_owner(pid=43)), seen)
    assert still_elsewhere(meta, seen)
    mark_job_ended(paths.metadata, meta, tmp_path, seen.why)
    saved = load_metadata(paths.metadata)
    assert saved.status is RunStatus.INTERRUPTED
    assert saved.error == (
        "process 42 on node-b.invalid stopped without finishing: "
        "job deltad-1 (7) ended: killed_by_SIGKILL"
    )
    assert not still_elsewhere(saved, seen)  # marked: nothing to mark again
