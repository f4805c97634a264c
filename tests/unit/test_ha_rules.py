"""The lease (one holder at a time, its holder written beside it) and what `delta run` says
when there is nothing to resume, from a table."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from deltad.client.runner import AlreadyTaken, RunOptions, nothing_to_do
from deltad.daemon.lease import Lease, read_holder
from deltad.protocol import RunStatus, current_owner, exitcodes, new_metadata
from deltad.protocol.process import OwnerProcess
from deltad.protocol.runfacts import RunFact


def test_one_holder_at_a_time_and_the_next_one_takes_over(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "deltad.lease"
    active, standby = Lease(path), Lease(path)
    assert active.try_take() and active.held
    assert not standby.try_take() and not standby.held  # two open files: flock excludes
    holder = read_holder(path)
    assert holder is not None
    assert (holder.host, holder.pid) == (socket.gethostname(), os.getpid())
    active.release()
    assert standby.try_take()
    assert read_holder(path) is not None


def test_an_unreadable_holder_file_is_no_holder(tmp_path: Path) -> None:
    path = tmp_path / "deltad.lease"
    assert read_holder(path) is None
    (tmp_path / "deltad.lease.holder").write_text("{not json")
    assert read_holder(path) is None


ELSEWHERE = OwnerProcess(pid=4242, hostname="node-17.example")


@pytest.mark.parametrize(
    ("status", "owner", "fact", "by_daemon", "run_id", "code", "says"),
    [
        # deltad's resume: someone else got there first -> busy, never a usage error
        (RunStatus.COMPLETED, None, RunFact.FINISHED, True, False, 75, "already took"),
        (RunStatus.FAILED, None, RunFact.FINISHED, True, True, 75, "already took"),
        (RunStatus.RUNNING, ELSEWHERE, RunFact.ELSEWHERE, True, False, 75, "node-17"),
        # a person: as before
        (RunStatus.COMPLETED, None, RunFact.FINISHED, False, True, 2, "nothing to resume"),
        (RunStatus.RUNNING, ELSEWHERE, RunFact.ELSEWHERE, False, False, 2, "node-17"),
    ],
)
def test_nothing_to_do(
    status: RunStatus,
    owner: OwnerProcess | None,
    fact: RunFact,
    by_daemon: bool,
    run_id: bool,
    code: int,
    says: str,
) -> None:
    meta = new_metadata("20260101_000000_abcdef", "t", "agent")
    meta.status, meta.owner = status, owner or current_owner()
    opts = RunOptions(Path("/ws"), run_id=meta.run_id if run_id else None, by_daemon=by_daemon)
    err = nothing_to_do(meta, opts, fact)
    assert err.exit_code == code and says in str(err)
    assert isinstance(err, AlreadyTaken) is (code == exitcodes.BUSY)
