"""The warm fork server executor: deltad's side of `forkserver.py`.

deltad starts the server (its own process, own session, a clean environment), hands it each
resume over a socketpair and learns the child's pid and exit code from it. Health:
- the server is started once, and again after SIGHUP or when the installed package changed
  (the old one is drained: it keeps reporting its children's exits, then it is closed);
- a server that dies, does not become ready or does not answer a start is unhealthy: its
  children are watched by pidfd (exit code unknown), the resume is started as a fresh process
  instead, and a new server is tried after a growing pause.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from deltad.clock import SYSTEM, Clock
from deltad.pacing import Pacing
from deltad.platform import SAFE_PATH

from .fresh import FreshExecutor
from .local import Proc, signal_group, switch_to
from .registry import LocalFactory
from .seam import Event, Handle, JobSpec, Refused, SubmitError
from .wire import receive, send

log = structlog.get_logger("deltad.resumer")

READY_TIMEOUT = 30.0  # importing openai on a loaded 2-core machine can take seconds
ANSWER_TIMEOUT = 5.0  # a fork takes milliseconds; this long means the server is stuck
SIGNATURE_EVERY = 2.0  # seconds between looks at the installed package
SIGNATURE_SLICE = 0.0005  # seconds of a look per loop turn; the rest at the next turns
RETRY_PACING = Pacing(1.0, 60.0)
SERVER_MODULE = "deltad.executors.forkserver"
SERVER_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")  # what start-up reads; children get their own


class Unhealthy(Exception):
    """The server cannot be used now; the message says why (one line)."""


def plan(argv: list[str]) -> dict[str, Any]:
    """How the server runs a command: the `delta` console script of this installation and
    `python -m MODULE` with this interpreter run warm; anything else is exec'd."""
    here = Path(sys.executable)
    if argv[0] == str(here.parent / "delta"):
        return {"kind": "delta", "argv": argv}
    if len(argv) > 2 and argv[1] == "-m" and _same_interpreter(argv[0], here):
        return {"kind": "module", "module": argv[2], "argv": argv[3:]}
    return {"kind": "exec", "argv": argv}


def is_warm(argv: list[str]) -> bool:
    return bool(plan(argv)["kind"] != "exec")


def _same_interpreter(program: str, here: Path) -> bool:
    # The same directory (a venv is told by the path it is started from) and the same binary.
    p = Path(program)
    return p.parent == here.parent and os.path.realpath(p) == os.path.realpath(here)


def package_signature() -> str:
    """Changes when the installed deltad or openai changes: a pip install or a checkout
    replaces, adds or removes source files; openai's version file names its release. Looked
    up without importing openai: deltad itself never loads the SDK."""
    return signature_of(_watched_paths())


def signature_of(paths: Iterable[Path]) -> str:
    """Each directory's source files (name, size, mtime) and subdirectory names; a file's own
    stat. Not a directory's mtime: Python writing `__pycache__/` into a fresh tree changes
    that, and the first resumes after a checkout would each restart the server (a 1 s wait)."""
    digest = hashlib.sha256()
    for path in paths:
        _digest_path(digest, path)
    return digest.hexdigest()


def _digest_path(digest: Any, path: Path) -> None:
    with contextlib.suppress(OSError):
        if not path.is_dir():
            st = path.stat()
            digest.update(f"{path}\0{st.st_mtime_ns}\0{st.st_size}\n".encode())
            return
        with os.scandir(path) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                if e.name == "__pycache__" or e.name.endswith(".pyc"):
                    continue
                if e.is_dir(follow_symlinks=False):
                    digest.update(f"{path}/{e.name}/\n".encode())
                    continue
                st = e.stat(follow_symlinks=False)
                digest.update(f"{path}/{e.name}\0{st.st_mtime_ns}\0{st.st_size}\n".encode())


class SignatureWalk:
    """`signature_of`, one path per step: the loop's turn that looks at the package digests
    one directory (a scandir and a stat of its source files, ~0.15 ms), not the whole package
    (~2 ms for deltad's 13 directories, a delay for whatever event came with that turn, an
    answer's close among them)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._paths = iter(paths)
        self._digest = hashlib.sha256()

    def step(self) -> str | None:
        """Digest the next path; the signature once every path is in (None until then)."""
        path = next(self._paths, None)
        if path is None:
            return self._digest.hexdigest()
        _digest_path(self._digest, path)
        return None


def package_walk() -> SignatureWalk:
    """`package_signature`, a step at a time."""
    return SignatureWalk(_watched_paths())


@functools.cache
def _watched_paths() -> tuple[Path, ...]:
    import deltad

    top = Path(deltad.__file__).parent
    dirs = [top, *(p for p in top.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    spec = importlib.util.find_spec("openai")
    extra = [Path(spec.origin).with_name("_version.py")] if spec and spec.origin else []
    return (*sorted(dirs), *extra)


@dataclass
class ServerProcess:
    """One fork server as deltad sees it."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    signature: str
    started: float
    ready: bool = False
    children: set[int] = field(default_factory=set)
    exits: dict[int, int] = field(default_factory=dict)
    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    running: set[int] = field(default_factory=set)  # children whose set-up ended: they run
    refusals: dict[int, str] = field(default_factory=dict)  # children whose set-up failed
    forgotten: set[int] = field(default_factory=set)  # refused: their exits are nobody's
    children_kind: dict[int, str] = field(default_factory=dict)  # `started`'s `child`, once
    spare_rehearsed: int | None = None  # the pid of the spare that said it has rehearsed
    dead: bool = False

    @classmethod
    def spawn(cls, signature: str) -> ServerProcess:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", SERVER_MODULE, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                cwd="/",
                env=server_env(),
                start_new_session=True,  # a Ctrl-C on deltad's terminal is not for it
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(proc, ours, signature, time.monotonic())

    def fileno(self) -> int:
        return self.sock.fileno()

    def pump(self, wait: float = 0.0) -> None:
        """Read what the server said (waiting up to `wait` for the first message)."""
        if self.dead:
            return
        if wait > 0:
            select.select([self.sock], [], [], wait)
        while True:
            try:
                msg, fds = receive(self.sock)
            except BlockingIOError:
                return
            except OSError:
                msg, fds = None, []
            for fd in fds:
                os.close(fd)
            if msg is None:
                self.dead = True
                return
            self._note(msg)

    def _note(self, msg: dict[str, Any]) -> None:
        match msg.get("op"):
            case "ready":
                self.ready = True
                ms = int((time.monotonic() - self.started) * 1000)
                # A server that could not rehearse a resume serves colder: said, never fatal.
                why = msg.get("unrehearsed")
                rehearsal = {} if why is None else {"unrehearsed": str(why)[:200]}
                log.info("fork_server_ready", pid=self.proc.pid, duration_ms=ms, **rehearsal)
            case "exited":
                pid = int(msg["pid"])
                self.children.discard(pid)
                if pid in self.forgotten:  # refused: its resume is submitted again
                    self.forgotten.discard(pid)
                else:
                    self.exits[pid] = int(msg["rc"])
            case "running":
                self.running.add(int(msg["pid"]))
            case "refused":
                pid = int(msg["pid"])
                self.children.discard(pid)
                self.forgotten.add(pid)
                self.refusals[pid] = str(msg.get("error") or "failed")
            case "started" | "failed":
                self.replies[int(msg["id"])] = msg
            case "spare":
                self.spare_rehearsed = int(msg["pid"]) if msg.get("rehearsed") else None
            case _:
                pass

    def wait_for(self, what: str, done: Any, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not done():
            if self.dead or self.proc.poll() is not None:
                self.dead = True
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
                code = self.proc.returncode
                raise Unhealthy(f"the fork server exited ({code}) {what}")
            left = end - time.monotonic()
            if left <= 0:
                raise Unhealthy(f"the fork server did not answer within {timeout:g} s {what}")
            self.pump(wait=min(left, 1.0))

    def start(self, spec: JobSpec, log_fd: int, request_id: int) -> int:
        """Hand the resume to a child; its pid (its set-up is heard of later: `running` or
        `refusals`). Raises Unhealthy, or OSError for this job alone."""
        self.wait_for("while starting up", lambda: self.ready, READY_TIMEOUT)
        switch = switch_to(spec.identity, os.geteuid())
        msg = {
            "op": "start",
            "id": request_id,
            "plan": plan(list(spec.argv)),
            "cwd": str(spec.key.workspace),
            "env": dict(spec.env),
            "uid": switch.uid if switch else None,
            "gid": switch.gid if switch else None,
            "groups": list(switch.groups) if switch else None,
        }
        if not self._send(msg, [log_fd]):
            raise Unhealthy("the fork server cannot be reached")
        self.wait_for("to a start", lambda: request_id in self.replies, ANSWER_TIMEOUT)
        reply = self.replies.pop(request_id)
        if reply["op"] == "failed":
            raise OSError(str(reply.get("error", "failed")))
        pid = int(reply["pid"])
        if pid not in self.exits and pid not in self.refusals:  # news may come with the reply
            self.children.add(pid)
        if isinstance(kind := reply.get("child"), str):
            self.children_kind[pid] = kind[:16]
        return pid

    def cancel(self, pid: int, force: bool) -> bool:
        return self._send({"op": "cancel", "pid": pid, "force": force})

    def _send(self, msg: dict[str, Any], fds: list[int] | None = None) -> bool:
        """False (and dead) when the server cannot take it within ANSWER_TIMEOUT."""
        try:
            self.sock.settimeout(ANSWER_TIMEOUT)
            send(self.sock, msg, fds)
            return True
        except OSError:
            self.dead = True
            return False
        finally:
            with contextlib.suppress(OSError):
                self.sock.setblocking(False)

    def close(self) -> None:
        """EOF on its socket ends the server; its children run on."""
        with contextlib.suppress(OSError):
            self.sock.close()
        self.dead = True


def server_env() -> dict[str, str]:
    return {"PATH": SAFE_PATH} | {k: os.environ[k] for k in SERVER_ENV if k in os.environ}


class ForkExecutor(FreshExecutor):
    """Forked by the server; a fresh process (the parent's `start`) while it is unhealthy."""

    name = "fork"

    def __init__(self, state_dir: Path, clock: Clock = SYSTEM) -> None:
        super().__init__(state_dir, clock)
        self.server: ServerProcess | None = None
        self._draining: list[ServerProcess] = []
        self._owner: dict[int, ServerProcess] = {}  # a forked child's pid -> its server
        self._ids = 0
        self._failures = 0
        self._retry_at = 0.0
        self._signature_checked = 0.0
        self._walk: SignatureWalk | None = None  # a look at the package under way
        self._ensure_server()

    # -- the server's life --------------------------------------------------------------------
    def _ensure_server(self, look: bool = True) -> ServerProcess | None:
        """The server, started if need be; `look`: first whether the installed package changed
        since it started (at most every SIGNATURE_EVERY: a stat of every source file, a
        directory per call, so `poll` looks, between resumes, and a resume's `start` does not)."""
        now = time.monotonic()
        if look and self.server is not None and now - self._signature_checked >= SIGNATURE_EVERY:
            # A slice of the package per look (`SignatureWalk`): its ~2 ms are spread over
            # the loop's turns (`due` brings the next at once), none of which then holds up an
            # event for long.
            self._walk = self._walk or package_walk()
            until = now + SIGNATURE_SLICE
            while (signature := self._walk.step()) is None and time.monotonic() < until:
                pass
            if signature is not None:
                self._walk, self._signature_checked = None, now
                if signature != self.server.signature:
                    self.restart("package_changed")
        if self.server is None and now >= self._retry_at:
            try:
                self.server = ServerProcess.spawn(package_signature())
            except OSError as e:
                self._unhealthy(f"cannot start the fork server: {e.strerror}")
                return None
            self._walk, self._signature_checked = None, now
            log.info("fork_server_started", pid=self.server.proc.pid)
        return self.server

    def restart(self, reason: str) -> None:
        """A new server for new resumes; the old one reports its children's exits first."""
        old, self.server = self.server, None
        self._walk = None  # a look under way was for that server
        self._retry_at = 0.0
        if old is not None:
            log.info("fork_server_restarting", reason=reason, pid=old.proc.pid)
            self._retire(old)
        self._ensure_server()

    def _retire(self, server: ServerProcess) -> None:
        if server.children and not server.dead:
            self._draining.append(server)
        else:
            self._bury(server)

    def _bury(self, server: ServerProcess) -> None:
        server.close()
        for pid in list(server.children):
            self._lost(pid)
        # It would exit on EOF, but maybe only after its imports: it holds no state and its
        # children are in their own sessions, so end it now (and never leave a zombie).
        with contextlib.suppress(OSError):
            server.proc.kill()
        server.proc.wait()

    def _unhealthy(self, reason: str) -> None:
        self._failures += 1
        pause = RETRY_PACING.delay(self._failures)
        self._retry_at = time.monotonic() + pause
        log.warning(
            "fork_server_unhealthy",
            reason=reason,
            fallback="fresh",
            retry_in_s=round(pause, 3),
        )
        if self.server is not None:
            server, self.server = self.server, None
            self._walk = None  # a look under way was for that server
            server.dead = True
            with contextlib.suppress(OSError):
                server.proc.kill()
            self._bury(server)

    def _lost(self, pid: int) -> None:
        """A child whose server is gone: watched by pidfd from now on, exit code unknown."""
        self._owner.pop(pid, None)
        for proc in self.procs.values():
            if proc.pid == pid and not proc.exited:
                proc.adopted = True
        self.refresh_polling()

    # -- the executor -------------------------------------------------------------------------
    def start(self, spec: JobSpec, log_fd: int) -> tuple[int, str]:
        server = self._ensure_server(look=False)  # `poll` looks for a changed package
        if server is not None:
            self._ids += 1
            try:
                pid = server.start(spec, log_fd, self._ids)
            except Unhealthy as e:
                self._unhealthy(str(e))
            except OSError as e:
                raise SubmitError(str(e)) from None
            else:
                self._failures = 0
                self._owner[pid] = server
                return pid, self.name
        return self.popen(spec, log_fd), "fresh"  # the server is unhealthy: a fresh process

    def shown_of(self, pid: int) -> tuple[tuple[str, int | str], ...]:
        """What the server said the child was: `rehearsed` (a spare that had rehearsed a
        resume), `spare` (forked ahead, not rehearsed) or `forked` (for this resume)."""
        server = self._owner.get(pid)
        kind = server.children_kind.pop(pid, None) if server is not None else None
        return (("child", kind),) if kind is not None else ()

    def forked(self, handle: Handle) -> bool:
        """Started by the server (not a fresh-process fallback) and still its child."""
        proc = self.procs.get(handle.key.name)
        return proc is not None and proc.pid in self._owner

    def reload(self) -> None:
        self.restart("reload")

    def watched(self, proc: Proc) -> bool:
        return proc.pid not in self._owner  # else the server's socket tells its exit

    def running(self, proc: Proc) -> bool:
        server = self._owner.get(proc.pid)
        return server is None or proc.pid in server.running

    def fds(self) -> list[int]:
        return [s.fileno() for s in self._servers() if not s.dead] + super().fds()

    def _servers(self) -> list[ServerProcess]:
        return [*([self.server] if self.server else []), *self._draining]

    def poll(self, now: float) -> list[Event]:
        refused: list[Event] = []
        for server in self._servers():
            server.pump()
            refused += self._refused(server)
            if server.dead or server.proc.poll() is not None:
                self._server_died(server)
        for server in list(self._draining):
            if not server.children:
                self._draining.remove(server)
                self._bury(server)
        if self.server is not None or time.monotonic() >= self._retry_at:
            # warm again before the next resume needs it; a new one for a changed package
            self._ensure_server()
        return refused + super().poll(now)

    def _refused(self, server: ServerProcess) -> list[Event]:
        """Children whose set-up failed (a program that cannot be exec'd, a user that cannot
        be switched to): never started, their resumes are submitted again after a pause."""
        events: list[Event] = []
        for pid, error in server.refusals.items():
            self._owner.pop(pid, None)
            for name, proc in list(self.procs.items()):
                if proc.pid == pid and not proc.adopted:
                    del self.procs[name]
                    events.append(Refused(proc.handle, error))
        if server.refusals:
            server.refusals.clear()
            self._changed()
        return events

    def _server_died(self, server: ServerProcess) -> None:
        for pid, rc in server.exits.items():
            self._deliver(pid, rc)
        server.exits.clear()
        if server is self.server:
            self._unhealthy("the fork server exited")
        elif server in self._draining:
            self._draining.remove(server)
            self._bury(server)

    def collect(self, proc: Proc) -> None:
        server = self._owner.get(proc.pid)
        if server is not None and proc.pid in server.exits:
            self._deliver(proc.pid, server.exits.pop(proc.pid))
        elif server is None:
            super().collect(proc)

    def _deliver(self, pid: int, rc: int) -> None:
        server = self._owner.pop(pid, None)
        if server is not None:
            server.running.discard(pid)
        for proc in self.procs.values():
            if proc.pid == pid:
                proc.rc, proc.exited = rc, True

    def cancel(self, handle: Handle, force: bool) -> None:
        proc = self.procs.get(handle.key.name)
        if proc is None or proc.handle != handle:
            return
        server = self._owner.get(proc.pid)
        if server is None or not server.cancel(proc.pid, force):
            super().cancel(handle, force)  # the server signals its own children

    def due(self, now: float) -> float | None:
        due = super().due(now)
        if self._walk is not None:  # a look at the package under way: its next slice
            return now
        if self.server is None:  # when to try a new server
            retry = now + max(0.0, self._retry_at - time.monotonic())
            due = retry if due is None else min(due, retry)
        return due

    def signal(self, proc: Proc, sig: signal.Signals) -> None:
        if proc.pid not in self._owner:  # the server signals its own children
            signal_group(proc.pid, sig)

    def close(self) -> None:
        self._owner.clear()
        for server in self._servers():
            server.children.clear()
            self._bury(server)
        self.server, self._draining = None, []
        super().close()


make_fork = LocalFactory("fork", ForkExecutor, linux_only=True)
