"""Active/standby: one lease on shared storage decides which daemon of a fleet acts, and fences
an active that froze or was cut off (docs/daemon.md, "Two daemons, one fleet").

Two files, both on the storage the fleet shares:

- `<lease>` (`ha.lease`): an exclusive `flock` held by the active for as long as it lives. It
  dies with the process, so after a crash or a clean stop a standby takes over at its next try.
  On NFSv4 the client turns it into a byte-range lock the server arbitrates across hosts.
- `<lease>.holder`: the record: who holds the lease (host, pid, since), its `epoch` (raised by
  each takeover) and `seq` (raised by each renewal). Read-modify-written in place, only under
  its own short `flock`; anyone may read it (`deltad status`).

A flock alone cannot fence a holder that is alive but stopped (SIGSTOP, a stalled VM, a
partition): it keeps its lock. So the active renews the record every `lease_seconds / 5` (a
thread beside the loop), and a standby that has seen the record unchanged for `lease_seconds`
on its own monotonic clock takes it over with the next epoch, flock or not. The active acts
(starts a turn of its loop, submits a resume) only while its last successful renewal *began*
less than `lease_seconds / 2` ago on its own monotonic clock; after a gap it acts on nothing
until a renewal has re-read the record under its lock and found its own epoch there, or
stops (exit 1) on finding another. No two hosts' wall clocks are compared: each side measures
on its own monotonic clock, and the half lease left is the margin for their rates and for the
time between the last check and a submit.

The rules are pure functions below (`take`, `may_act`, `renewal`, `trust_problem`), tested
from tables (tests/unit/test_ha_rules.py); `Lease` is their imperative shell.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import structlog

from deltad.protocol import iso, utcnow

log = structlog.get_logger("deltad.lease")

HOLDER_SUFFIX = ".holder"
RECORD_MAX = 4096
RENEWALS_PER_LEASE = 5  # the active renews every lease_seconds / 5
ACT_SHARE = 0.5  # ... and acts only within lease_seconds / 2 of its last renewal's start


class LeaseError(Exception):
    """The lease's files cannot be used as they are (one line, for the operator)."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a lease, as its record says: written by the holder (and by the
    standby taking over), read by anyone."""

    host: str
    pid: int
    since: str
    epoch: int = 0  # raised by each takeover: a holder of an older epoch has lost
    seq: int = 0  # raised by each renewal: a standby sees the holder alive by its change
    locked: bool = False  # the holder also holds the flock on `<lease>` ...
    ino: int | None = None  # ... on this inode of it

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.since}"

    def same_daemon(self, other: Holder | None) -> bool:
        return other is not None and (self.host, self.pid, self.since) == (
            other.host,
            other.pid,
            other.since,
        )

    def doc(self) -> dict[str, Any]:
        return dict(self.__dict__)


def holder_path(lease: Path) -> Path:
    return lease.with_name(lease.name + HOLDER_SUFFIX)


def parse_holder(raw: bytes) -> Holder | None:
    """A record's bytes; None when they are not one (empty, torn, hand-written nonsense)."""
    try:
        doc = json.loads(raw[:RECORD_MAX])
        ino = doc.get("ino")
        return Holder(
            str(doc["host"]),
            int(doc["pid"]),
            str(doc["since"]),
            int(doc.get("epoch", 0)),
            int(doc.get("seq", 0)),
            bool(doc.get("locked", False)),
            int(ino) if ino is not None else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def read_holder(lease: Path) -> Holder | None:
    """The record as it is now, read without its lock; None when there is none or it cannot be
    read (a reader may catch a rewrite half done: that proves nothing either)."""
    try:
        fd = os.open(holder_path(lease), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return parse_holder(os.read(fd, RECORD_MAX))
    except OSError:
        return None
    finally:
        os.close(fd)


# -- the rules: pure ---------------------------------------------------------------------------
class Take(Enum):
    """Why a standby may take the lease now."""

    FREE = "free"  # no record: nobody has held it
    RELEASED = "released"  # the flock is ours, on the inode the holder said it locked: it is gone
    EXPIRED = "expired"  # the record has not changed for a whole lease: the holder is fenced


def take(
    record: Holder | None,
    *,
    got_lock: bool,
    lock_ino: int | None,
    unchanged_for: float,
    lease: float,
) -> Take | None:
    """May a standby take the lease? `got_lock`: it holds the flock on `<lease>` (inode
    `lock_ino`); `unchanged_for`: seconds, on its monotonic clock, since it first saw the record
    as it is now. The flock is proof only where the record says its holder held it on that very
    file: a holder that took over by expiry holds none yet, and a lease file deleted and made
    anew is another inode; there only the expiry counts."""
    if got_lock and record is None:
        return Take.FREE
    if got_lock and record is not None and record.locked and record.ino == lock_ino:
        return Take.RELEASED
    if unchanged_for >= lease:
        return Take.EXPIRED
    return None


def may_act(last_renewal_began: float | None, now: float, lease: float, lost: bool) -> bool:
    """May the active act now (monotonic seconds)? Only while its last successful renewal
    began less than half a lease ago: a standby waits a whole lease after it last saw that
    renewal, so the other half is the margin."""
    if lost or last_renewal_began is None:
        return False
    return now - last_renewal_began < lease * ACT_SHARE


class Verdict(Enum):
    RENEW = "renew"
    LOST = "lost"


def renewal(record: Holder | None, me: Holder) -> Verdict:
    """What the active finds in the record under its lock. Its own daemon and epoch: renew. No
    record (removed, or unreadable): write it again, nobody has taken over through it. Anyone
    else, or an older or newer epoch of itself: lost."""
    if record is None:
        return Verdict.RENEW
    if me.same_daemon(record) and record.epoch == me.epoch:
        return Verdict.RENEW
    return Verdict.LOST


def trust_problem(
    mode: int, uid: int, owners: frozenset[int], *, what: str, directory: bool, last: bool
) -> str | None:
    """Why a path on the lease's way cannot be trusted, from its lstat (OpenSSH's StrictModes):
    it must be owned by root (or the daemon's user) and writable by nobody else. A sticky
    directory above the lease's own (`/tmp`) is fine: nobody can rename what is not theirs."""
    if stat.S_ISLNK(mode):
        return f"{what} is a symlink"
    if directory and not stat.S_ISDIR(mode):
        return f"{what} is not a directory"
    if not directory and not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        return f"{what} is {kind}"
    if uid not in owners:
        return f"{what} is owned by uid {uid}, not by root"
    sticky_above = directory and not last and mode & stat.S_ISVTX
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_above:
        return f"{what} is writable by its group or others (mode {stat.S_IMODE(mode):04o})"
    return None


# -- trust: the files as they are --------------------------------------------------------------
def lease_problem(lease: Path, owners: frozenset[int] | None = None) -> str | None:
    """Why the lease at `lease` cannot be trusted (one line), or None. Its directory and every
    one above it, and the lease and record files where they exist. A tenant who could write
    there could hold every daemon on standby, or make two actives by removing the lease."""
    owners = owners if owners is not None else frozenset({0, os.geteuid()})
    for i, d in enumerate([lease.parent, *lease.parent.parents]):
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            continue  # made at start, by the daemon, as its own (then looked at again)
        except OSError as e:
            return f"directory {d}: {e.strerror}"
        problem = trust_problem(
            st.st_mode, st.st_uid, owners, what=f"directory {d}", directory=True, last=i == 0
        )
        if problem is not None:
            return problem
    for path in (lease, holder_path(lease)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{path}: {e.strerror}"
        problem = trust_problem(
            st.st_mode, st.st_uid, owners, what=str(path), directory=False, last=True
        )
        if problem is not None:
            return problem
    return None


# -- the shell ---------------------------------------------------------------------------------
class Lease:
    """The lease as one daemon sees it. A standby calls `try_take(now)` every poll; the active
    calls `start(clock)` once it holds it, then asks `may_act(now)` before acting and `lost`
    after; `release()` at the end."""

    def __init__(self, path: Path, lease_seconds: float = 10.0) -> None:
        self.path = path
        self.seconds = lease_seconds
        self._fd: int | None = None  # the flock on `<lease>`
        self._ino: int | None = None
        self.holder: Holder | None = None  # this daemon's record, once it holds the lease
        self.taken: Take | None = None  # how it was taken
        self.previous: Holder | None = None  # whom it was taken from
        self.taken_by: Holder | None = None  # once lost: who holds it now
        self.lost = False  # another daemon holds it now: this one stops (exit 1)
        self._seen: Holder | None = None  # a standby's last look at the record
        self._seen_at: float | None = None  # ... since when (monotonic) it has looked so
        self._renewed: float | None = None  # monotonic: when the last good renewal began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one renewal at a time (the thread, or `renew`)
        self._failing = False  # renewals fail (said once, until one works again)

    @property
    def held(self) -> bool:
        return self.holder is not None and not self.lost

    @property
    def locked(self) -> bool:
        return self._fd is not None

    # -- standby ------------------------------------------------------------------------------
    def try_take(self, now: float) -> bool:
        """True once this process holds the lease. Never blocks on a lock (the caller paces
        the tries); raises OSError (storage away) or LeaseError (a file that is not one)."""
        if self.holder is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        got = self._flock_lease()
        mine: Holder | None = None
        try:
            with self._record(wait=False) as (fd, record):
                if record != self._seen or self._seen_at is None:
                    self._seen, self._seen_at = record, now
                why = take(
                    record,
                    got_lock=got,
                    lock_ino=self._ino,
                    unchanged_for=now - self._seen_at,
                    lease=self.seconds,
                )
                if why is None:
                    return False
                epoch = record.epoch + 1 if record is not None else 1
                host, pid, since = socket.gethostname(), os.getpid(), iso(utcnow())
                mine = Holder(host, pid, since, epoch, 0, got, self._ino if got else None)
                _write(fd, mine)
        except BlockingIOError:
            return False  # the record is being written: look again at the next try
        finally:
            if mine is None:
                self._unflock()  # not ours: the active may need it back
        self.holder, self.taken, self.previous, self._renewed = mine, why, record, now
        return True

    # -- active -------------------------------------------------------------------------------
    def start(self, monotonic: Callable[[], float]) -> None:
        """Renew beside the loop from now on (a thread: storage that hangs hangs it, not the
        loop, which then stops acting once the half lease has passed)."""
        self._thread = threading.Thread(
            target=self._renew_forever, args=(monotonic,), name="deltad-lease", daemon=True
        )
        self._thread.start()

    def _renew_forever(self, monotonic: Callable[[], float]) -> None:
        every = self.seconds / RENEWALS_PER_LEASE
        while not self.lost and not self._stop.wait(every):
            self.renew(monotonic())

    def renew(self, began: float) -> bool:
        """One renewal, begun at `began` (monotonic): the record re-read under its lock, and
        rewritten with the next `seq` if it is still ours. False when it could not be done
        (said once per run of failures) or the lease is lost (`lost`)."""
        with self._lock:
            me = self.holder
            if me is None or self.lost:
                return False
            try:
                self._flock_lease()  # taken over without it, or the file made anew: try it
                with self._record(wait=True) as (fd, record):
                    if renewal(record, me) is Verdict.LOST:
                        self.lost = True
                        self.taken_by = record
                        return False
                    me = replace(me, seq=me.seq + 1, locked=self.locked, ino=self._ino)
                    _write(fd, me)
            except (OSError, LeaseError) as e:
                if not self._failing:
                    log.warning("lease_renew_failed", lease=str(self.path), error=_error(e))
                self._failing = True
                return False
            if self._failing:
                log.info("lease_renewed", lease=str(self.path), detail="after failures")
            self.holder, self._renewed, self._failing = me, began, False
            return True

    def may_act(self, now: float) -> bool:
        return may_act(self._renewed, now, self.seconds, self.lost)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.seconds)
        self._unflock()  # closing drops the flock

    # -- files --------------------------------------------------------------------------------
    def _flock_lease(self) -> bool:
        """Try the flock on `<lease>`; True while held. A lease file made anew under a held
        lock (removed by hand) is another inode: that lock is let go and the new one tried."""
        if self._fd is not None:
            try:
                if os.stat(self.path).st_ino == self._ino:
                    return True
            except FileNotFoundError:
                pass
            self._unflock()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LeaseError(f"{self.path} is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._ino = fd, st.st_ino
        return True

    def _unflock(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = self._ino = None

    @contextlib.contextmanager
    def _record(self, *, wait: bool) -> Iterator[tuple[int, Holder | None]]:
        """The record file open and exclusively locked, and what it says. The lock is held
        only for a read and a write: the active waits for it, a standby tries again later
        (BlockingIOError)."""
        path = holder_path(self.path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except IsADirectoryError:
            raise LeaseError(f"{path} is a directory, not the lease's record") from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                raise LeaseError(f"{path} is a symlink, not the lease's record") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LeaseError(f"{path} is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            yield fd, parse_holder(os.pread(fd, RECORD_MAX, 0))
        finally:
            os.close(fd)  # drops the lock


def _write(fd: int, holder: Holder) -> None:
    """The record rewritten in place (its lock is held), durable: after a host dies, this is
    what the next holder and `deltad status` read."""
    data = (json.dumps(holder.doc()) + "\n").encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _error(e: Exception) -> str:
    return e.strerror or str(e) if isinstance(e, OSError) else str(e)
