"""The lease (one holder at a time, fenced by its record's epoch; where it may live) and
what `delta run` says when there is nothing to resume, from tables."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from deltad.client.runner import AlreadyTaken, RunOptions, nothing_to_do
from deltad.core.lease import (
    Holder,
    Lease,
    LeaseError,
    Take,
    Verdict,
    holder_path,
    lease_problem,
    may_act,
    read_holder,
    renewal,
    take,
    trust_problem,
)
from deltad.protocol import RunStatus, current_owner, exitcodes, new_metadata
from deltad.protocol.process import OwnerProcess
from deltad.protocol.runfacts import RunFact

L = 10.0  # lease_seconds
A = Holder("node-1", 100, "2026-01-01T00:00:00Z", epoch=3, seq=7, locked=True, ino=55)
A_NOLOCK = Holder("node-1", 100, "2026-01-01T00:00:00Z", epoch=3, seq=7)


@pytest.mark.parametrize(
    ("record", "got_lock", "lock_ino", "unchanged_for", "expected"),
    [
        (None, True, 55, 0.0, Take.FREE),  # nobody ever held it
        (None, False, None, 0.0, None),  # no record but the flock is held: a holder starting
        (None, False, None, L, Take.EXPIRED),  # ... that never wrote its record in a lease
        (A, True, 55, 0.0, Take.RELEASED),  # the holder's flock died with it (kill -9, stop)
        (A, True, 56, 0.0, None),  # the lease file made anew: its flock proves nothing
        (A, True, 56, L, Take.EXPIRED),
        (A_NOLOCK, True, 55, 0.0, None),  # took over by expiry, holds no flock yet: alive
        (A, False, None, L - 0.01, None),  # renewed within the lease: alive
        (A, False, None, L, Take.EXPIRED),  # frozen (SIGSTOP), cut off, or a stalled VM
    ],
)
def test_when_a_standby_takes_the_lease(
    record: Holder | None,
    got_lock: bool,
    lock_ino: int | None,
    unchanged_for: float,
    expected: Take | None,
) -> None:
    got = take(record, got_lock=got_lock, lock_ino=lock_ino, unchanged_for=unchanged_for, lease=L)
    assert got is expected


@pytest.mark.parametrize(
    ("last_renewal_began", "now", "lost", "expected"),
    [
        (None, 100.0, False, False),  # never renewed
        (100.0, 100.0, False, True),
        (100.0, 104.99, False, True),  # within half a lease
        (100.0, 105.0, False, False),  # half a lease: the margin a standby's wait leaves
        (100.0, 130.0, False, False),  # woke from a 30 s freeze: nothing before a renewal
        (100.0, 101.0, True, False),  # lost: never again
    ],
)
def test_when_the_active_may_act(
    last_renewal_began: float | None, now: float, lost: bool, expected: bool
) -> None:
    assert may_act(last_renewal_began, now, L, lost) is expected


def _other(**changes: object) -> Holder:
    fields = {**A.__dict__, **changes}
    return Holder(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (None, Verdict.RENEW),  # removed or unreadable: written again
        (A, Verdict.RENEW),
        (_other(seq=99, locked=False), Verdict.RENEW),  # its own, whatever it last wrote
        (_other(epoch=4), Verdict.LOST),  # a standby took over (the next epoch)
        (_other(epoch=4, pid=200, host="node-2"), Verdict.LOST),
        (_other(pid=101), Verdict.LOST),  # another process, same epoch (hand-written)
        (_other(since="2026-01-02T00:00:00Z"), Verdict.LOST),  # a restart reusing the pid
    ],
)
def test_what_a_renewal_finds(record: Holder | None, expected: Verdict) -> None:
    assert renewal(record, A) is expected


DIR, REG, LNK = stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK
ROOTS = frozenset({0})


@pytest.mark.parametrize(
    ("mode", "uid", "directory", "last", "says"),
    [
        (DIR | 0o755, 0, True, True, None),
        (DIR | 0o700, 0, True, True, None),
        (DIR | 0o775, 0, True, True, "writable by its group or others (mode 0775)"),
        (DIR | 0o777, 0, True, True, "writable by its group or others"),
        (DIR | 0o1777, 0, True, True, "writable by its group or others"),  # the lease's own dir
        (DIR | 0o1777, 0, True, False, None),  # /tmp above it: nobody renames what is not theirs
        (DIR | 0o755, 1001, True, True, "owned by uid 1001, not by root"),
        (DIR | 0o777, 0, True, False, "writable by its group or others"),  # not sticky, above
        (LNK | 0o777, 0, True, True, "is a symlink"),
        (REG | 0o644, 0, True, True, "is not a directory"),
        (REG | 0o600, 0, False, True, None),
        (REG | 0o644, 0, False, True, None),
        (REG | 0o666, 0, False, True, "writable by its group or others (mode 0666)"),
        (REG | 0o600, 1001, False, True, "owned by uid 1001"),
        (DIR | 0o755, 0, False, True, "is a directory"),  # a planted `<lease>.holder`
        (stat.S_IFIFO | 0o600, 0, False, True, "is not a regular file"),
    ],
)
def test_what_the_lease_may_live_in(
    mode: int, uid: int, directory: bool, last: bool, says: str | None
) -> None:
    got = trust_problem(mode, uid, ROOTS, what="x", directory=directory, last=last)
    if says is None:
        assert got is None
    else:
        assert got is not None and says in got


def test_a_tenant_writable_lease_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    lease = shared / "deltad.lease"
    owners = frozenset({os.geteuid()})
    assert lease_problem(lease, owners) is None
    shared.chmod(0o1777)
    problem = lease_problem(lease, owners)
    assert problem is not None and str(shared) in problem and "others" in problem
    shared.chmod(0o755)
    holder_path(lease).mkdir()  # planted: a directory where the record goes
    problem = lease_problem(lease, owners)
    assert problem == f"{holder_path(lease)} is a directory"


def test_one_holder_at_a_time_and_the_next_one_takes_over(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "deltad.lease"
    active, standby = Lease(path, L), Lease(path, L)
    assert active.try_take(0.0) and active.held and active.taken is Take.FREE
    assert not standby.try_take(0.0) and not standby.held  # two open files: flock excludes
    holder = read_holder(path)
    assert holder is not None and holder.epoch == 1 and holder.locked
    assert (holder.host, holder.pid) == (socket.gethostname(), os.getpid())
    active.release()
    assert standby.try_take(1.0) and standby.taken is Take.RELEASED
    assert standby.holder is not None and standby.holder.epoch == 2


def test_a_frozen_holder_is_fenced(tmp_path: Path) -> None:
    """The active stops renewing (SIGSTOP) but keeps its flock: the standby takes over once
    the record has not changed for a lease, and the active's next renewal finds it lost."""
    path = tmp_path / "deltad.lease"
    active, standby = Lease(path, L), Lease(path, L)
    assert active.try_take(0.0)
    assert active.may_act(1.0)
    assert not standby.try_take(1.0)
    assert active.renew(4.0)  # seen by the standby as a change: its wait starts again
    assert not standby.try_take(5.0)
    assert not standby.try_take(14.9)
    assert not active.may_act(9.0)  # frozen from 4.0: acts on nothing after half a lease
    assert standby.try_take(15.0) and standby.taken is Take.EXPIRED
    assert standby.holder is not None and standby.holder.epoch == 2
    assert not standby.locked  # the frozen one still holds the flock
    assert not active.renew(34.0) and active.lost  # it wakes: lost, and it acts on nothing
    assert active.taken_by is not None and active.taken_by.epoch == 2
    assert not active.may_act(34.0)
    active.release()
    assert standby.renew(35.0) and standby.locked  # its flock now, said in the record
    record = read_holder(path)
    assert record is not None and record.locked and record.seq == 1
    third = Lease(path, L)
    assert not third.try_take(36.0)


def test_a_renewal_keeps_a_fenced_active_that_nobody_replaced(tmp_path: Path) -> None:
    path = tmp_path / "deltad.lease"
    active = Lease(path, L)
    assert active.try_take(0.0)
    assert not active.may_act(30.0)  # woke from a freeze with no standby around
    assert active.renew(30.0) and active.may_act(30.1)


def test_a_planted_record_directory_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "deltad.lease"
    holder_path(path).mkdir()
    with pytest.raises(LeaseError, match=r"deltad\.lease\.holder is a directory"):
        Lease(path, L).try_take(0.0)


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


def test_a_deleted_lease_file_makes_no_second_active(tmp_path: Path) -> None:
    """Removing the lease file while the active holds it used to give the next daemon a fresh
    file to lock: two actives. The record still names the active, on the old inode."""
    path = tmp_path / "deltad.lease"
    active, standby = Lease(path, L), Lease(path, L)
    assert active.try_take(0.0)
    path.unlink()
    assert not standby.try_take(0.1)  # its flock on the new file proves nothing
    assert active.renew(2.0) and active.locked  # the active locks the new file ...
    record = read_holder(path)
    assert record is not None and record.ino == os.stat(path).st_ino  # ... and says so
    assert not standby.try_take(5.0)
