"""A spare that waited rehearses a resume, and only when the fork server lets it
(deltad/executors/forkserver.py): the handshake on both ends of the spare's socket pair,
with the server's and the spare's own code and no fork. The real thing, a real server whose
spare rehearses and becomes the resume: tests/e2e/test_executor_server.py."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from deltad.executors import forkserver, rehearsal
from deltad.executors.forkserver import Server, Spare, fresh_dispositions
from deltad.executors.wire import receive, send


@pytest.fixture
def server() -> Iterator[tuple[Server, socket.socket]]:
    """A server (its deltad end returned beside it), its signal set-up put back after."""
    ours, deltad = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sigchld, sigint = signal.getsignal(signal.SIGCHLD), signal.getsignal(signal.SIGINT)
    s = Server(ours, fresh_dispositions())
    try:
        yield s, deltad
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, sigchld)
        signal.signal(signal.SIGINT, sigint)
        for sock in (ours, deltad):
            sock.close()


def _spare(s: Server) -> socket.socket:
    """A spare the server holds (its pid: ours, never waited for); the spare's end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.spare = Spare(os.getpid(), ours)
    return theirs


def _start(s: Server, rid: int) -> tuple[int, str] | None:
    """Hand a start to a spare, as `_start` does: (its pid, what it was), or None: no spare
    could take it (`_start` forks one for the resume)."""
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    try:
        return s._hand_to_spare({"op": "start", "id": rid}, -1, err_w)
    finally:
        os.close(err_r)
        os.close(err_w)


BACKUP_PID = 1  # a backup's pid in these tests: never waited for


@pytest.fixture
def backups(monkeypatch: pytest.MonkeyPatch) -> list[socket.socket]:
    """The backups the server forks, as socket pairs (their ends here), not processes."""
    made: list[socket.socket] = []

    def fork_one(self: Server) -> Spare:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        made.append(theirs)
        return Spare(BACKUP_PID, ours)

    monkeypatch.setattr(Server, "_fork_one", fork_one)
    return made


def test_a_spare_let_rehearse_takes_no_start_until_it_has(
    server: Any, backups: list[socket.socket]
) -> None:
    s, deltad = server
    theirs = _spare(s)
    assert s.spare is not None and s.spare.kind == "spare"
    send(theirs, {"op": "rehearse?"})
    s._hear_spare(s.spare)
    assert receive(theirs)[0] == {"op": "rehearse"}
    # Letting it rehearse, the server forks a backup: a start meanwhile is the backup's, a
    # second one is forked for itself (None here).
    assert s.backup is not None and len(backups) == 1
    assert _start(s, 1) == (BACKUP_PID, "spare")
    assert receive(backups[0])[0]["start"]["id"] == 1  # type: ignore[index]
    assert s.backup is None and _start(s, 2) is None
    assert s.spare is not None and s.spare.rehearsing
    send(theirs, {"op": "rehearsed", "unrehearsed": None})
    s._hear_spare(s.spare)
    assert receive(deltad)[0] == {"op": "spare", "pid": os.getpid(), "rehearsed": True}
    assert s.spare.kind == "rehearsed"
    assert _start(s, 3) == (os.getpid(), "rehearsed")  # now it is the resume's
    msg, fds = receive(theirs)
    assert msg is not None and msg["start"]["id"] == 3
    for fd in fds:
        os.close(fd)
    assert s.spare is None
    for sock in (theirs, *backups):
        sock.close()


def test_a_backup_is_never_let_rehearse(server: Any, backups: list[socket.socket]) -> None:
    s, _ = server
    theirs = _spare(s)
    assert s.spare is not None
    send(theirs, {"op": "rehearse?"})
    s._hear_spare(s.spare)
    [backup] = backups
    assert s.backup is not None
    send(backup, {"op": "rehearse?"})
    s._hear_spare(s.backup)
    backup.settimeout(0.0)
    with pytest.raises(BlockingIOError):
        backup.recv(1)  # no answer: it waits for its start
    assert not s.backup.rehearsing
    for sock in (theirs, backup):
        sock.close()


def test_a_spare_handed_a_start_is_never_let_rehearse(
    server: Any, rehearsals: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server hands the spare a start and lets go of its end just as the spare, having
    waited, asks to rehearse: the spare's question finds no one, and it takes the start."""
    s, _ = server
    theirs = _spare(s)
    # The spare's wait ran out just before the start came.
    monkeypatch.setattr(select, "select", lambda *a: ([], [], []))
    assert _start(s, 1) == (os.getpid(), "spare") and s.spare is None
    msg, fds = forkserver._wait_or_rehearse(theirs)
    assert msg is not None and msg["start"]["id"] == 1 and rehearsals == []
    for fd in fds:
        os.close(fd)
    theirs.close()


def test_a_spare_whose_rehearsal_did_not_go_through_serves_as_a_plain_spare(
    server: Any, backups: list[socket.socket]
) -> None:
    s, deltad = server
    theirs = _spare(s)
    assert s.spare is not None
    send(theirs, {"op": "rehearse?"})
    s._hear_spare(s.spare)
    send(theirs, {"op": "rehearsed", "unrehearsed": "the resume exited 1"})
    s._hear_spare(s.spare)
    assert not s.spare.rehearsing and s.spare.kind == "spare"
    deltad.settimeout(0.0)
    with pytest.raises(BlockingIOError):
        deltad.recv(1)  # deltad is not told of a rehearsed spare
    theirs.close()


def test_a_spare_rehearses_once(server: Any) -> None:
    s, _ = server
    theirs = _spare(s)
    assert s.spare is not None
    s.spare.rehearsed = True
    send(theirs, {"op": "rehearse?"})
    s._hear_spare(s.spare)
    theirs.settimeout(0.0)
    with pytest.raises(BlockingIOError):
        theirs.recv(1)
    assert not s.spare.rehearsing
    theirs.close()


@pytest.fixture
def rehearsals(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The spare's rehearsal, recorded instead of run; and no wait before it asks."""
    ran: list[object] = []
    monkeypatch.setattr(rehearsal, "rehearse", lambda delta: ran.append(delta))  # None: ran
    monkeypatch.setattr(forkserver, "REHEARSE_AFTER", 0.0)
    return ran


def test_the_spare_asks_rehearses_says_so_and_takes_its_start(
    server: Any, rehearsals: list[object], backups: list[socket.socket]
) -> None:
    """Both ends' own code, turn by turn: the spare asks (in a thread, as it waits in its own
    process), the server lets it, it rehearses and says so, and the next start is its."""
    s, _ = server
    theirs = _spare(s)
    got: list[tuple[dict[str, Any] | None, list[int]]] = []
    spare = threading.Thread(target=lambda: got.append(forkserver._wait_or_rehearse(theirs)))
    spare.start()
    assert s.spare is not None
    s._hear_spare(s.spare)  # blocks until the question is there
    assert s.spare.rehearsing
    s._hear_spare(s.spare)  # and until the rehearsal's end
    assert s.spare.kind == "rehearsed" and rehearsals == [forkserver._delta]
    assert _start(s, 7) == (os.getpid(), "rehearsed")
    spare.join(timeout=30)
    [(msg, fds)] = got
    assert msg is not None and msg["start"]["id"] == 7
    for fd in fds:
        os.close(fd)
    theirs.close()


def test_a_start_already_there_is_taken_without_a_question(rehearsals: list[object]) -> None:
    spare, srv = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    send(srv, {"start": {"id": 8}, "log": False})
    msg, _ = forkserver._wait_or_rehearse(spare)
    assert msg == {"start": {"id": 8}, "log": False} and rehearsals == []
    srv.settimeout(0.0)
    with pytest.raises(BlockingIOError):
        srv.recv(1)  # no question was asked
    spare.close()
    srv.close()


def test_a_spare_whose_server_is_gone_ends(rehearsals: list[object]) -> None:
    spare, srv = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.close()
    assert forkserver._wait_or_rehearse(spare) == (None, [])
    assert rehearsals == []
    spare.close()


def test_the_next_spare_is_not_forked_right_after_a_start(server: Any) -> None:
    """Its clone would compete with the resume just handed over, on its way to ACTION_RESULT."""
    s, _ = server
    assert s.spare is None and s._until_spare() == 0.0  # owed at once: none was handed over
    s.handed_at = time.monotonic()
    assert 0.0 < s._until_spare() <= forkserver.SPARE_AFTER_START
    s.handed_at -= forkserver.SPARE_AFTER_START
    assert s._until_spare() == 0.0


@pytest.mark.spawns  # two forks: the probe's, and a user's process trying it
@pytest.mark.skipif(os.geteuid() != 0, reason="as root, and as a user it becomes")
def test_only_a_process_that_can_come_back_from_sched_idle_rehearses_at_it() -> None:
    assert forkserver.idle_is_reversible()  # root: CAP_SYS_NICE
    pid = os.fork()
    if pid == 0:  # a user's process: its RLIMIT_NICE keeps it from coming back
        try:
            os.setresuid(65534, 65534, 65534)
            os._exit(0 if not forkserver.idle_is_reversible() else 1)
        except BaseException:
            os._exit(2)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="coming back from SCHED_IDLE needs root")
def test_the_rehearsal_runs_at_sched_idle_and_the_spare_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(forkserver, "IDLE_REHEARSAL", True)
    before = os.sched_getscheduler(0)
    with forkserver._idle_priority():
        assert os.sched_getscheduler(0) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == before != os.SCHED_IDLE
    monkeypatch.setattr(forkserver, "IDLE_REHEARSAL", False)  # where it could not come back
    with forkserver._idle_priority():
        assert os.sched_getscheduler(0) == before
