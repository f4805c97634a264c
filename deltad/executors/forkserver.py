"""The warm fork server: `python -m deltad.executors.forkserver` (started by deltad).

It imports what a resume needs once (the client's CLI, openai), runs one resume in itself so
that what the client builds on first use is built (executors/rehearsal.py), freezes those
objects out of the garbage collector's way, and forks one child per resume. Each child becomes
what a fresh `delta run` process would be (see `become`), so the client runs unchanged, ~10x
cheaper.

The child is forked ahead of time (`Spare`): it waits, unspecialised, for its resume, and the
server forks the next one once it has answered for this one. A resume's start then costs a
message to the spare and its set-up, not a fork of the whole server on the critical path. A
spare asked for nothing within REHEARSE_AFTER rehearses a resume itself, if the server lets it
(`child` in `started`: `rehearsed`, `spare`, or `forked` when no spare was free).

It talks to deltad over a SOCK_SEQPACKET socket (its fd is the one argument; one JSON message
per packet; the resume log's fd rides along with a start). It is single-threaded, so forking
is safe: a select over that socket and the SIGCHLD wake-up pipe. Messages:

  deltad -> server: start {id, plan, cwd, env, uid, gid, groups} + log fd
                    cancel {pid, force}      SIGTERM to the child's group (SIGKILL: force)
  server -> deltad: ready {pid, unrehearsed}; started {id, pid, child} | failed {id, error};
                    exited {pid, rc}
                    running {pid} | refused {id, pid, error}   the child's set-up, later
                    spare {pid, rehearsed}   the spare has rehearsed a resume (below)
  spare <-> server: rehearse? (spare) -> rehearse (server); rehearsed {unrehearsed} (spare)

`started` goes out as soon as the child has its message (the spare's pid is known before it
is asked), so deltad's loop never waits while a child sets itself up (switches user, closes
fds, imports its entry): it hears `running` once the child runs the resume, or `refused` with
the reason its set-up failed, always before that child's `exited`. `failed`: no child at all.

When deltad closes the socket (it restarts the server, or is gone), the server exits at once;
its children run on in their own sessions.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from deltad.executors.wire import receive, send
from deltad.protocol.printable import show

# encodings.idna: the codec a connect looks host names up with (socket.getaddrinfo)
PRELOAD = ("deltad.client.cli", "deltad.engine.llm", "openai", "encodings.idna")

Dispositions = dict[int, Any]
# After a spare died unused, this long before the next is forked (resumes fork their own).
SPARE_PAUSE = 1.0
# The next spare waits while a child sets itself up (its clone would compete for the CPU with
# it on the resume's path), but never longer than this for a set-up that does not end.
SETUP_GRACE = 0.5
# Nor is it forked within this long of a resume's hand-over: its clone (~6 ms of the server's
# CPU, more copying page tables) and its first touches would compete with that resume on its
# way to ACTION_RESULT (about 10 ms); traced, the next spare was forked 3 ms after the start.
SPARE_AFTER_START = 0.05
# A spare asked for nothing this long rehearses a resume itself (executors/rehearsal.py): the
# pages and caches a resume touches are then its own before its answer comes. Answers closer
# together than this (a burst) find spares that did not rehearse, and spend no CPU on it.
# Short: a spare forked after a resume was handed over (SPARE_AFTER_START) is ready ~0.15 s
# after that hand-over; at 0.25 s, answers 0.3 s apart met it rehearsing half the time.
REHEARSE_AFTER = 0.05


def fresh_dispositions() -> Dispositions:
    """This interpreter's signal dispositions at start: what a fresh `delta` process has."""
    out: Dispositions = {}
    for sig in signal.valid_signals():
        try:
            out[int(sig)] = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
    return out


# -- the server ---------------------------------------------------------------------------------
class Spare:
    """A child forked before it is needed, waiting on its end of a socket pair for the one
    start message it will carry out (`wait_for_a_resume`). Gone with the server: its end of
    the pair closes, and the spare exits."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.rehearsing = False  # let rehearse (`rehearse?` answered): no start goes to it
        self.rehearsed = False  # done rehearsing: the start it gets is a warmer child's

    @property
    def kind(self) -> str:
        """What the resume it takes is, for deltad's `resume_spawned` (`child`)."""
        return "rehearsed" if self.rehearsed else "spare"


class SettingUp:
    """A child handed its resume, not yet running it: its error pipe's read end is open."""

    def __init__(self, request: int, pid: int) -> None:
        self.request = request
        self.pid = pid
        self.since = time.monotonic()
        self.error: list[bytes] = []
        self.cancel: bool | None = None  # a cancel that came meanwhile (force?): sent after


class Server:
    def __init__(
        self, sock: socket.socket, dispositions: Dispositions, unrehearsed: str | None = None
    ) -> None:
        self.sock = sock
        self.dispositions = dispositions
        self.unrehearsed = unrehearsed  # why the rehearsal did not run through (None: it did)
        self.children: set[int] = set()
        self.setting_up: dict[int, SettingUp] = {}  # by its error pipe's read end
        self.spare: Spare | None = None
        # Forked when the spare is let rehearse: a resume asked for meanwhile takes it (touched,
        # not rehearsed) instead of a fork of the whole server on its path. It never rehearses.
        self.backup: Spare | None = None
        self.spare_died_at = float("-inf")  # when the last spare died or could not be forked
        self.handed_at = float("-inf")  # when the last resume was handed to a child
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        # deltad signals the whole group on stop only by mistake; the server ends on EOF.
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def serve(self) -> None:
        send(self.sock, {"op": "ready", "pid": os.getpid(), "unrehearsed": self.unrehearsed})
        self._fork_spare()
        while True:
            fds = [self.sock.fileno(), self.wake_r, *self.setting_up]
            fds += [s.sock.fileno() for s in (self.spare, self.backup) if s is not None]
            readable, _, _ = select.select(fds, [], [], self._until_spare())
            if self.wake_r in readable:
                _drain(self.wake_r)
            for fd in readable:
                if fd in self.setting_up:
                    self._hear_setup(fd)
            for spare in (self.spare, self.backup):
                if spare is not None and spare.sock.fileno() in readable:
                    self._hear_spare(spare)
            self._reap()
            if self.sock.fileno() in readable:
                msg, fds = receive(self.sock)
                if msg is None:
                    return
                self._handle(msg, fds)
            # The next resume's child, once this one has its answer and the message's fds
            # are closed (a spare holds none of them while it waits).
            self._fork_spare()

    def _handle(self, msg: dict[str, Any], fds: list[int]) -> None:
        try:
            match msg.get("op"):
                case "start":
                    self._start(msg, fds[0] if fds else -1)
                case "cancel":
                    self._cancel(int(msg["pid"]), bool(msg.get("force")))
                case _:
                    pass
        finally:
            for fd in fds:
                os.close(fd)

    def _start(self, msg: dict[str, Any], log_fd: int) -> None:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        handed = self._hand_to_spare(msg, log_fd, err_w)
        pid, kind = handed if handed is not None else (None, "forked")
        if pid is None:  # no spare free (none, dead, or rehearsing): fork one for this resume
            try:
                pid = os.fork()
            except OSError as e:
                os.close(err_r)
                os.close(err_w)
                send(self.sock, {"op": "failed", "id": msg["id"], "error": f"fork: {e.strerror}"})
                return
            if pid == 0:  # pragma: no cover - the child never returns
                close = [self.sock.fileno(), self.wake_r, err_r, *self.setting_up]
                close += self._spare_fds()  # a rehearsing spare stays the next resume's
                become(msg, log_fd, err_w, self.dispositions, close)
        os.close(err_w)
        os.set_blocking(err_r, False)
        self.children.add(pid)
        self.setting_up[err_r] = SettingUp(int(msg["id"]), pid)
        self.handed_at = time.monotonic()
        send(self.sock, {"op": "started", "id": msg["id"], "pid": pid, "child": kind})

    def _hear_spare(self, spare: Spare) -> None:
        """The spare asks whether it may rehearse (it has waited REHEARSE_AFTER), or says it
        is done. The answer is the server's alone: a spare let rehearse gets no start until it
        says `rehearsed` (a resume asked for meanwhile takes the backup forked now, a second
        one is forked for itself), and one handed a start first reads that start instead of
        the answer, and never rehearses. The backup's own question is never answered."""
        try:
            msg, fds = receive(spare.sock)
        except OSError:
            msg, fds = None, []
        for fd in fds:
            os.close(fd)
        if msg is None:  # it died: reaped as a spare
            return
        match msg.get("op"):
            case "rehearse?" if spare is self.spare and not spare.rehearsed:
                with contextlib.suppress(OSError):
                    send(spare.sock, {"op": "rehearse"})
                    spare.rehearsing = True
                if spare.rehearsing and self.backup is None:
                    self.backup = self._fork_one()  # a backup's question is never answered
            case "rehearsed":  # the run did not go through: it serves as a plain spare
                spare.rehearsing, spare.rehearsed = False, msg.get("unrehearsed") is None
                if spare.rehearsed:
                    send(self.sock, {"op": "spare", "pid": spare.pid, "rehearsed": True})
            case _:
                pass

    def _hear_setup(self, fd: int) -> None:
        """Read what a child setting up wrote: nothing until EOF is success (it runs the
        resume, or exec'd its program); anything is why it failed (it exits 127)."""
        setting_up = self.setting_up[fd]
        try:
            while chunk := os.read(fd, 4096):
                setting_up.error.append(chunk)
        except BlockingIOError:
            return  # more to come
        except OSError:
            pass
        del self.setting_up[fd]
        os.close(fd)
        pid = setting_up.pid
        if setting_up.error:
            error = b"".join(setting_up.error).decode(errors="replace")
            send(self.sock, {"op": "refused", "id": setting_up.request, "pid": pid, "error": error})
            return
        send(self.sock, {"op": "running", "pid": pid})
        if setting_up.cancel is not None:  # in its own session now: its group can be signalled
            _killpg(pid, signal.SIGKILL if setting_up.cancel else signal.SIGTERM)

    def _hand_to_spare(
        self, msg: dict[str, Any], log_fd: int, err_w: int
    ) -> tuple[int, str] | None:
        """The pid of the spare that has this resume's message (it reports on `err_w` as a
        child forked for it does) and what it was; None when there is no spare to take it.
        The spare first, unless it is rehearsing; then the backup."""
        if self.spare is not None and not self.spare.rehearsing:
            spare, self.spare = self.spare, None
        elif self.backup is not None:
            spare, self.backup = self.backup, None
        else:
            return None
        try:
            fds = [err_w, log_fd] if log_fd >= 0 else [err_w]
            send(spare.sock, {"start": msg, "log": log_fd >= 0}, fds)
        except OSError:  # it died: reaped as a spare, never reported
            spare.sock.close()
            return None
        spare.sock.close()
        return spare.pid, spare.kind

    def _spare_fds(self) -> list[int]:
        """The server's ends of its spares' socket pairs (a new child closes them)."""
        return [s.sock.fileno() for s in (self.spare, self.backup) if s is not None]

    def _until_spare(self) -> float | None:
        """How long the server may wait before it owes a spare (None: it has one): after a
        spare died (SPARE_PAUSE), a start (SPARE_AFTER_START), during a set-up (SETUP_GRACE)."""
        if self.spare is not None:
            return None
        now = time.monotonic()
        wait = SPARE_PAUSE - (now - self.spare_died_at)
        wait = max(wait, SPARE_AFTER_START - (now - self.handed_at))
        if self.setting_up:
            wait = max(wait, SETUP_GRACE - (now - min(s.since for s in self.setting_up.values())))
        return max(0.0, wait)

    def _fork_spare(self) -> None:
        if self._until_spare() != 0.0:
            return  # one that cannot live is not forked again and again; a set-up goes first
        self.spare = self._fork_one()

    def _fork_one(self) -> Spare | None:
        """A spare forked now, holding nothing of the server's; None when it cannot be."""
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            self.spare_died_at = time.monotonic()  # out of fds now: tried again after a pause
            return None
        try:
            pid = os.fork()
        except OSError:  # out of processes now: resumes fork their own; tried after a pause
            ours.close()
            theirs.close()
            self.spare_died_at = time.monotonic()
            return None
        if pid == 0:  # pragma: no cover - the child never returns
            ours.close()
            close = [self.sock.fileno(), self.wake_r, *self._spare_fds()]
            wait_for_a_resume(theirs, self.dispositions, close)
        theirs.close()
        return Spare(pid, ours)

    def _cancel(self, pid: int, force: bool) -> None:
        if pid not in self.children:
            return  # already exited (its exit message is on the way): never a recycled pid
        for setting_up in self.setting_up.values():
            if setting_up.pid == pid:  # not yet the leader of its own group: once it is
                setting_up.cancel = force or bool(setting_up.cancel)
                return
        _killpg(pid, signal.SIGKILL if force else signal.SIGTERM)

    def _reap(self) -> None:
        while self.children or self.spare is not None or self.backup is not None:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.spare is not None and pid == self.spare.pid:  # died unused: not a resume
                self.spare.sock.close()
                self.spare, self.spare_died_at = None, time.monotonic()
                continue
            if self.backup is not None and pid == self.backup.pid:  # forked again when needed
                self.backup.sock.close()
                self.backup = None
                continue
            if pid not in self.children:
                continue
            for fd, setting_up in list(self.setting_up.items()):
                if setting_up.pid == pid:  # at EOF now: `running` or `refused` before `exited`
                    self._hear_setup(fd)
            self.children.discard(pid)
            send(self.sock, {"op": "exited", "pid": pid, "rc": _exit_code(status)})


def _exit_code(status: int) -> int:
    """As subprocess reports it: the exit status, or minus the signal that ended the child."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


# -- the child: a fresh `delta run`, as far as anyone can tell -------------------------------------
def wait_for_a_resume(sock: socket.socket, dispositions: Dispositions, close: list[int]) -> None:
    """A spare: wait for the start message (with the log fd and the error pipe), then become
    that resume. The server's socket and wake-up pipe are closed first, so the spare holds
    nothing of the server's while it waits; end of stream (the server is gone) ends it."""
    try:
        for fd in close:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        _touch_what_a_resume_writes_first()
        msg, fds = _wait_or_rehearse(sock)
    except BaseException:
        os._exit(0)
    if msg is None or len(fds) != 1 + bool(msg.get("log")):
        os._exit(0)
    err_w, log_fd = fds[0], fds[1] if msg.get("log") else -1
    os.set_inheritable(err_w, False)  # as the server's pipe end is: an exec'd plan closes it
    sock.close()
    become(msg["start"], log_fd, err_w, dispositions, [])


def _wait_or_rehearse(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The start message, and its fds. Asked for nothing within REHEARSE_AFTER, the spare asks
    the server whether it may rehearse a resume (executors/rehearsal.py, ~60 ms of CPU) and,
    let, does it before it waits on: the resume it then becomes finds its pages its own and
    its caches warm (`bench/rehearsal_bench.py`: about half the time to ACTION_RESULT). A start
    the server sent before it read the question comes instead of the answer."""
    ready, _, _ = select.select([sock], [], [], REHEARSE_AFTER)
    if ready:
        return receive(sock)
    try:
        send(sock, {"op": "rehearse?"})
    except OSError:  # the server handed it a start meanwhile and let go of its end
        return receive(sock)  # the start is still there to read
    msg, fds = receive(sock)
    if msg is None or msg.get("op") != "rehearse":
        return msg, fds
    from deltad.executors import rehearsal

    with _idle_priority():
        why = rehearsal.rehearse(_delta)  # whatever goes wrong, it still serves, as the server does
        gc.collect()  # what the rehearsal left is collected now, not during the resume
    with contextlib.suppress(OSError):  # a server gone: the receive below says so
        send(sock, {"op": "rehearsed", "unrehearsed": why})
    return receive(sock)


# Whether a spare may rehearse at SCHED_IDLE and come back (`preload` asks a child to try it).
IDLE_REHEARSAL = False


@contextlib.contextmanager
def _idle_priority() -> Iterator[None]:
    """The spare's rehearsal runs at SCHED_IDLE where it can come back from it: it is CPU
    nobody else wants, never taken from a resume (the one handed over just before, or one
    forked for itself meanwhile) or from deltad. A spare that cannot come back ends (the
    server forks another) rather than run a resume at that priority."""
    if not IDLE_REHEARSAL:
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        yield
    finally:
        try:
            os.sched_setscheduler(0, policy, param)
        except OSError:
            os._exit(0)


def idle_is_reversible() -> bool:
    """Whether this process may go to SCHED_IDLE and back to its policy: a child of it tries.
    Root may (CAP_SYS_NICE), unless a unit took that away; another user may not (its
    RLIMIT_NICE keeps it from coming back)."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:  # pragma: no cover - the child's code ends in _exit
        try:
            policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, policy, param)
        except BaseException:
            os._exit(1)
        os._exit(0)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return False
    return os.waitstatus_to_exitcode(status) == 0


def _touch_what_a_resume_writes_first() -> None:
    """Done by a spare while it waits: parse a resume's command line and set up logging as
    `delta` does first thing, then put logging back as it was. Every object a child touches
    is copied from the server page by page (copy-on-write) as it is first written; these
    pages are then the spare's own before any answer comes (about 600 fewer page faults and
    3 ms less to ACTION_RESULT for 4 ms of the spare's CPU, `bench/rehearsal_bench.py`)."""
    import logging

    import structlog

    from deltad import logs

    root = logging.getLogger()
    handlers, level, config = list(root.handlers), root.level, structlog.get_config()
    try:
        _warm_up_the_cli()
        logs.configure(level="warning", fmt="json")
    except Exception:
        pass  # an optimisation only
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)


def become(
    msg: dict[str, Any], log_fd: int, err_w: int, dispositions: Dispositions, close: list[int]
) -> None:
    """Turn this forked child into the resume, in the order Popen sets up a child (stdio, cwd,
    umask, signals, session, groups, gid, uid, no inherited fds), then run it. Any failure
    before the resume runs is written to `err_w` (the server reports it) and ends the child."""
    try:
        _setup(msg, log_fd, err_w, dispositions, close)
        entry = _entry(msg["plan"], msg["env"], err_w)
    except BaseException as e:
        os.write(err_w, show(f"{type(e).__name__}: {e}").encode())  # e may quote a path
        os._exit(127)
    os.close(err_w)  # the server reads EOF: started
    _run(entry)


def _setup(
    msg: dict[str, Any], log_fd: int, err_w: int, dispositions: Dispositions, close: list[int]
) -> None:
    for fd in close:
        os.close(fd)
    signal.set_wakeup_fd(-1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    out = log_fd if log_fd >= 0 else os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.chdir(msg["cwd"])
    os.umask(0o077)
    for sig, handler in dispositions.items():
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError, TypeError):
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.setsid()
    if msg.get("groups") is not None:
        os.setgroups(msg["groups"])
    if msg.get("gid") is not None:
        os.setresgid(msg["gid"], msg["gid"], msg["gid"])
    if msg.get("uid") is not None:
        os.setresuid(msg["uid"], msg["uid"], msg["uid"])
    os.closerange(3, err_w)
    os.closerange(err_w + 1, _max_fd())
    _fresh_environment(msg["env"])
    _fresh_stdio()


def _max_fd() -> int:
    try:
        return max(int(os.sysconf("SC_OPEN_MAX")), 256)
    except (OSError, ValueError):
        return 65536


def _fresh_environment(env: dict[str, str]) -> None:
    import locale

    os.environ.clear()
    os.environ.update(env)
    time.tzset()  # TZ is read at start-up by a fresh interpreter
    with contextlib.suppress(locale.Error):
        locale.setlocale(locale.LC_CTYPE, "")


def _fresh_stdio() -> None:
    """New sys.std* on fds 0-2, set up as this interpreter's were at start (same locale
    variables as the child's): files are block-buffered, stderr line-buffered."""
    enc, errors = sys.stdout.encoding, sys.stdout.errors
    streams = {
        "stdin": io.TextIOWrapper(
            io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=enc, errors=errors
        ),
        "stdout": io.TextIOWrapper(_buffered(1), encoding=enc, errors=errors),
        "stderr": io.TextIOWrapper(
            _buffered(2), encoding=enc, errors="backslashreplace", line_buffering=True
        ),
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _buffered(fd: int) -> io.BufferedWriter:
    return io.BufferedWriter(io.FileIO(fd, "w", closefd=False))


def _entry(plan: dict[str, Any], env: dict[str, str], err_w: int) -> Callable[[], object]:
    """What the child runs: the `delta` console script or `python -m MODULE` in this warm
    interpreter, or any other program exec'd (the error pipe closes on exec)."""
    match plan["kind"]:
        case "delta":
            return lambda: _delta(plan["argv"])
        case "module":
            return lambda: _module(plan["module"], plan["argv"])
        case "exec":
            os.execvpe(plan["argv"][0], plan["argv"], env)
    raise ValueError(f"unknown plan {plan['kind']!r}")


def _delta(argv: list[str]) -> None:
    from deltad.client.cli import main

    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(argv[0])  # a console script's own directory
    sys.exit(main())


def _module(module: str, argv: list[str]) -> None:
    import runpy

    sys.argv = [module, *argv]
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _run(entry: Callable[[], object]) -> None:
    """Run the resume and end the process the way the interpreter ends a script."""
    code = 0
    try:
        entry()
    except SystemExit as e:
        code = _system_exit_code(e.code)
    except KeyboardInterrupt:
        _finish(0, die_by=signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish(code)


def _system_exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(code: int, die_by: signal.Signals | None = None) -> None:
    import atexit
    import threading

    # CPython's private steps of an exit (3.11 to 3.13 have both): join non-daemon threads,
    # run atexit's functions. Where one is missing, it is skipped (the streams are still
    # flushed below): tests/unit_slow/test_private_cpython.py.
    shutdown = getattr(threading, "_shutdown", None)
    for step in (shutdown, getattr(atexit, "_run_exitfuncs", None)):
        if step is not None:
            with contextlib.suppress(BaseException):
                step()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if die_by is not None:  # as CPython does for an uncaught KeyboardInterrupt
        signal.signal(die_by, signal.SIG_DFL)
        os.kill(os.getpid(), die_by)
    os._exit(code)


# -- start-up -----------------------------------------------------------------------------------
def preload() -> str | None:
    """Import and warm what a resume needs; None, or why the rehearsal did not run through."""
    import importlib

    from deltad.executors.rehearsal import rehearse

    for name in PRELOAD:
        importlib.import_module(name)
    _warm_up_the_sdk()
    _warm_up_the_cli()
    failed = rehearse(_delta)
    global IDLE_REHEARSAL
    IDLE_REHEARSAL = idle_is_reversible()  # before the first spare: every spare inherits it
    gc.collect()
    gc.freeze()  # the children share these pages; the collector must not touch them
    return failed


def _warm_up_the_cli() -> None:
    """Parse a resume's command line once (nothing runs): click builds its parsers on first
    use, ~1 ms each child would pay."""
    try:
        from deltad.client.cli import main

        with main.make_context("delta", ["run"]) as ctx:
            if (command := main.get_command(ctx, "run")) is not None:
                command.make_context("run", ["--work-dir", "/"], parent=ctx).close()
    except Exception:
        pass  # an optimisation only


def _warm_up_the_sdk() -> None:
    """Make one request the way a resume does (engine/llm.py), answered in-process by a mock
    transport: the SDK loads much of itself, the TLS machinery and its caches (the platform
    headers, else a `uname -p` subprocess per child; the typing ABCs' isinstance caches) on
    first use; done here, no resume pays for it. Nothing leaves the process."""
    try:
        import httpx2
        import openai

        from deltad.engine.llm import JSON_HEADERS, parse_completion, tls_context

        # The TLS context every child's client uses: loaded once, here.
        http = openai.DefaultHttpxClient(verify=tls_context())
        http.close()
        reply = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
        mock = openai.DefaultHttpxClient(
            transport=httpx2.MockTransport(lambda request: httpx2.Response(200, json=reply))
        )
        warm = openai.OpenAI(
            api_key="warm-up", base_url="http://127.0.0.1:9/v1", max_retries=0, http_client=mock
        )
        response = warm.post(
            "/chat/completions",
            content=b"{}",
            cast_to=httpx2.Response,
            options={"timeout": 5.0, "headers": JSON_HEADERS},
        )
        parse_completion(response.read())
        warm.close()
    except Exception:
        pass  # an optimisation only


def main(argv: list[str] | None = None) -> int:
    dispositions = fresh_dispositions()
    fd = int((argv if argv is not None else sys.argv[1:])[0])
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    failed = preload()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        Server(sock, dispositions, failed).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
