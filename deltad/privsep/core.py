"""The core's side of the split: the inbox's user and directory, the monitor that serves an
inbox connection (its calls answered from the operation table by monitor.py), and the
supervisor that starts the inbox process (or waits for the one systemd starts) and starts it
again after a crash.

The core binds the listening socket itself (as root: ports below 1024 work) and hands it over;
it keeps its own copy, never accepting on it, so connections wait in the backlog while an inbox
is restarted. Resumes are the loop's: nothing here touches them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import queue
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from deltad.health import Standalone, Vitals
from deltad.http import sessions
from deltad.inbox import links
from deltad.inbox.config import HttpConfig
from deltad.inbox.context import Context, Idempotency
from deltad.inbox.feed import Feed, FeedEvent
from deltad.inbox.tokens import TOKENS_NAME, TokenStore
from deltad.outbound.mail import Received
from deltad.platform import SAFE_PATH
from deltad.privsep import monitor, wire
from deltad.privsep.handoff import Handoff, HandoffError
from deltad.privsep.monitor import decode as decode  # the monitor's, as the counts' tests name it
from deltad.privsep.monitor import decode_message
from deltad.protocol.printable import json_safe, show_path

log = structlog.get_logger("deltad.privsep")

DEFAULT_USER = "deltad-inbox"
INBOX_DIR = "inbox"  # under the state dir: token hashes (root's), sessions (the inbox's)
MOVED_IN = (TOKENS_NAME, sessions.KEY_NAME, sessions.CLOSED_NAME)  # from the state dir
HELLO_SECONDS = 30.0
CALL_THREADS = 4  # as many as the HTTP server's worker threads
CALLS_IN_FLIGHT = 64  # read no more calls from the inbox while this many are unanswered
OUT_QUEUE = 10_000  # frames waiting for the inbox (events beyond it are dropped, counted)
RESTART_MIN, RESTART_MAX = 0.5, 30.0  # seconds before an inbox that ended is started again
STEADY_SECONDS = 60.0  # an inbox that ran this long starts again at once
STOP_SECONDS = 5.0
# Only the allowlist reaches the inbox process (never the core's credentials or resume_env);
# it delivers the webhooks, so a site's proxy and CA bundle settings go along (httpx reads them).
ENV_KEPT: tuple[str, ...] = ("LANG", "LC_ALL", "TZ", "PYTHONPATH", "COVERAGE_PROCESS_START")
ENV_KEPT += ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR")
ENV_KEPT += ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
TEST_HOOK_ENV = "DELTAD_INBOX_TEST_HOOK"  # tests only: see deltad/http/testhook.py
CHILD = [sys.executable, "-m", "deltad.http"]


class InboxUnusable(ValueError):
    """One line: why the inbox cannot be started."""


# -- who the inbox runs as, and where its files are ----------------------------------------------
@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


def account(name: str) -> Account | None:
    """The inbox's user; None when the core is not root (the inbox then runs as the core's
    own user: it still gets no capabilities and no_new_privs, and has no other tenant's
    files to protect from it). The default user is made as a system user when missing."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        if name != DEFAULT_USER:
            raise InboxUnusable(f"http.user {name}: no such user") from None
        pw = _make_user(name)
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        raise InboxUnusable(f"http.user {name}: the inbox must not run as root or group root")
    return Account(name, pw.pw_uid, pw.pw_gid)


def _make_user(name: str) -> pwd.struct_passwd:
    shell = next((s for s in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(s)), None)
    cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
    cmd += ["--shell", shell or "/bin/false", name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        lines = done.stderr.strip().splitlines()
        made, why = done.returncode == 0, lines[-1] if lines else f"exit {done.returncode}"
    except (OSError, subprocess.TimeoutExpired) as e:
        made, why = False, str(e)
    with contextlib.suppress(KeyError):  # made (by us, or by a daemon starting beside us)
        pw = pwd.getpwnam(name)
        if made:
            log.info("inbox_user_created", user=name, uid=pw.pw_uid)
        return pw
    raise InboxUnusable(
        f"http.user {name} does not exist and cannot be made ({why}): make it "
        f"(useradd --system --user-group {name}, or systemd-sysusers) or set http.user"
    )


def inbox_dir(state_dir: Path) -> Path:
    return state_dir / INBOX_DIR


def tokens_dir(state_dir: Path) -> Path:
    """Where `deltad token` keeps tokens.json: the inbox's directory (a tokens.json left in
    the state dir by an older deltad is moved in first)."""
    d = inbox_dir(state_dir)
    _move_in(state_dir, d, (TOKENS_NAME,))
    return d


def _move_in(state_dir: Path, d: Path, names: tuple[str, ...]) -> None:
    for name in names:
        old = state_dir / name
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(old).st_mode):
                continue
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not os.path.lexists(d / name):
                os.rename(old, d / name)
                log.info("inbox_file_moved", file=name, to=str(d))


def prepare(state_dir: Path, who: Account | None) -> Path:
    """The inbox's directory, `<state_dir>/inbox`. As root for another user: root's, group
    the inbox's, mode 1770 — the inbox makes its own files there (session key, logouts) and
    the sticky bit keeps it from replacing root's `tokens.json` (0640, group the inbox's), so
    it cannot mint or widen a token the core would honour. Otherwise 0700, the core's own."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    d = inbox_dir(state_dir)
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o700)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise InboxUnusable(f"{d} is not a directory")
    _move_in(state_dir, d, MOVED_IN)
    if who is None:
        os.chmod(d, 0o700)
        return d
    os.lchown(d, 0, who.gid)
    os.chmod(d, 0o1770)
    for entry in os.scandir(d):
        est = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(est.st_mode) or est.st_nlink != 1:
            continue  # never a link the inbox planted
        if entry.name == TOKENS_NAME:
            if est.st_uid == 0:
                os.lchown(entry.path, 0, who.gid)
                os.chmod(entry.path, 0o640)
        elif est.st_uid == 0 and entry.name in MOVED_IN:  # an older deltad's, moved in
            os.lchown(entry.path, who.uid, who.gid)
            os.chmod(entry.path, 0o600)
    return d


# -- the monitor: one connection to an inbox ------------------------------------------------------
def event_message(e: FeedEvent) -> wire.EventMsg:
    data = dict(e.data)
    if "workspace" in data:  # names are bytes: shown escaped, unshown by the inbox
        data["workspace"] = show_path(str(data["workspace"]))
    return wire.EventMsg(id=e.id, type=e.type, at=e.at, data=json_safe(data))


@dataclass
class Serving:
    """What an inbox connection is served: the HTTP context (None: no HTTP, the inbox
    delivers webhooks only) and the webhooks it delivers (their hand-off and settings)."""

    ctx: Context | None
    inbox_dir: str = ""  # shown in the inbox's log lines (it reaches it by a descriptor)
    handoff: Handoff | None = None
    targets: list[wire.WebhookTarget] = dataclasses.field(default_factory=list)
    channels: list[wire.ChannelTarget] = dataclasses.field(default_factory=list)
    # The email channel's Maildir, read by the inbox (its welcome says where), and the
    # channel's `receive` in the core once it started (None until then: the inbox waits).
    mail_intake: wire.MailIntake | None = None
    mail: Callable[[Received], dict[str, Any]] | None = None


class Monitor:
    """Serves one inbox connection: its hello, then its calls (on a few threads: the
    reader never waits on a handler), while the feed's events and the outbox's hints are
    pushed to it. Whatever the inbox sends, the core goes on: a refused frame is logged and
    answered, a broken framing ends this connection only. The loop only ever queues (`_event`
    never waits)."""

    def __init__(
        self, serving: Serving | Context, sock: socket.socket, fds: list[int], peer: str
    ) -> None:
        self.serving = serving if isinstance(serving, Serving) else Serving(serving)
        self.ctx = self.serving.ctx
        self.sock, self.fds, self.peer = sock, fds, peer
        self.out: queue.Queue[bytes | None] = queue.Queue(OUT_QUEUE)
        self.slots = threading.BoundedSemaphore(CALLS_IN_FLIGHT)
        self.sending = threading.Lock()  # whole frames: replies from workers, the rest queued
        self.refused = 0
        self.dropped = 0

    def serve(self) -> None:
        """Until the inbox hangs up (or breaks the framing)."""
        reader = wire.Reader(self.sock, wire.INBOX_FRAME_MAX)
        pool = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="deltad-inbox-call")
        sender = threading.Thread(target=self._send_all, name="deltad-inbox-send", daemon=True)
        unsubscribe = None
        handoff = self.serving.handoff
        try:
            self.sock.settimeout(HELLO_SECONDS)
            if not self._hello(reader.frame()):
                return
            self.sock.settimeout(None)
            ctx = self.ctx
            if handoff is not None:  # before the welcome: the inbox looks in `new/` after it
                handoff.connected()
                handoff.hint = self._hint
            if ctx is not None:
                unsubscribe = ctx.feed.subscribe(self._event)  # before the snapshot: no gap
                welcome = wire.Welcome(
                    version=wire.VERSION,
                    http=ctx.config.model_dump(mode="json"),
                    base_url=ctx.base_url,
                    tls=ctx.config.tls,
                    events=[event_message(e) for e in ctx.feed.since(0)],
                    floor=ctx.feed.floor,
                    webhooks=self.serving.targets,
                    channels=self.serving.channels,
                    inbox_dir=self.serving.inbox_dir,
                    mail=self.serving.mail_intake,
                )
            else:
                welcome = wire.Welcome(
                    version=wire.VERSION,
                    http={},
                    base_url="",
                    tls=False,
                    events=[],
                    listening=False,
                    webhooks=self.serving.targets,
                    channels=self.serving.channels,
                    inbox_dir=self.serving.inbox_dir,
                    mail=self.serving.mail_intake,
                )
            wire.send(self.sock, welcome, self.fds)
            sender.start()
            while True:
                self._take(reader.frame(), pool)
        except (wire.WireError, OSError) as e:
            log.info("inbox_disconnected", peer=self.peer, reason=str(e) or type(e).__name__)
        finally:
            if unsubscribe is not None:
                unsubscribe()
            if handoff is not None and handoff.hint == self._hint:
                handoff.hint = _no_hint
            pool.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(queue.Full):
                self.out.put_nowait(None)
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            with self.sending:  # never under a worker's send: the fd must not be reused
                self.sock.close()

    def _hello(self, raw: bytes) -> bool:
        try:
            msg = wire.FROM_INBOX.validate_json(raw)
        except ValidationError as e:
            self._refused(raw, monitor.summary(e))
            return False
        if not isinstance(msg, wire.Hello) or msg.version != wire.VERSION:
            self._refused(raw, f"expected hello version {wire.VERSION}")
            return False
        return True

    def _take(self, raw: bytes, pool: ThreadPoolExecutor) -> None:
        call = decode_message(raw)
        if isinstance(call, str):
            self._refused(raw, call)
            return
        if isinstance(call, wire.DeliveryCounts):
            if self.serving.handoff is not None:
                self.serving.handoff.report(call)
            return
        if isinstance(call, wire.ChannelSends):
            if self.serving.handoff is not None:
                self.serving.handoff.report_channel(call)
            return
        self.slots.acquire()  # back-pressure on the inbox only
        pool.submit(self._run, call)

    def _hint(self, key: str) -> None:
        """From the notifier's thread: deliveries wait in `new/` (a hint lost to a full queue
        is found by the inbox's own look, every few seconds)."""
        with contextlib.suppress(queue.Full):
            self.out.put_nowait(wire.encode(wire.OutboxHint(target=key)))

    def _run(self, call: monitor.Request) -> None:
        try:
            frame = monitor.reply_to(self.ctx, self.serving.mail, call)
            with contextlib.suppress(OSError), self.sending:  # straight out: no thread hop
                self.sock.sendall(frame)
        finally:
            self.slots.release()

    def _refused(self, raw: bytes, why: str) -> None:
        self.refused += 1
        cid = wire.call_id_of(raw)
        if self.refused <= 10 or self.refused % 1000 == 0:  # a flood does not flood the log
            log.warning(
                "inbox_message_refused",
                peer=self.peer,
                call_id=cid,
                reason=why[:300],
                refused=self.refused,
            )
        if cid is not None:
            with contextlib.suppress(queue.Full):
                error = monitor.error_reply(cid, 400, "protocol", why[:300])
                self.out.put_nowait(wire.encode(error))

    def _event(self, e: FeedEvent) -> None:
        """On the daemon's loop: queue and return."""
        try:
            frame = wire.encode(event_message(e))
            self.out.put_nowait(frame)
        except queue.Full:
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.warning(
                    "inbox_events_dropped", dropped=self.dropped, detail="inbox not reading"
                )
        except ValueError as err:
            log.error("inbox_event_failed", event_id=e.id, error=str(err))

    def _send_all(self) -> None:
        """The events (and refusals), in order, on their own thread: the loop never sends."""
        while (frame := self.out.get()) is not None:
            try:
                with self.sending:
                    self.sock.sendall(frame)
            except OSError:
                return  # the reader sees the connection end too


def _no_hint(key: str) -> None:
    pass


# -- running the inbox ---------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}
    env |= {k: v for k in (*ENV_KEPT, TEST_HOOK_ENV) if (v := os.environ.get(k)) is not None}
    return env


class Spawned:
    """The inbox as the core's child: `python -m deltad.http`, as the inbox's user
    with no supplementary groups (the kernel clears every capability on that switch, and the
    child sets no_new_privs before reading anything), started again after any end, with a
    backoff, until the core stops."""

    def __init__(
        self, ctx: Serving | Context, fds: list[int], who: Account | None, log_args: list[str]
    ) -> None:
        self.ctx, self.fds, self.who, self.log_args = ctx, fds, who, log_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="deltad-inbox", daemon=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        if self.who is None:
            log.info(
                "inbox_same_user",
                uid=os.geteuid(),
                detail="deltad is not root: the inbox runs as this user (no_new_privs, no setuid)",
            )
        self._thread.start()

    def _spawn(self) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen(
                [*CHILD, "--core-fd", str(theirs.fileno()), *self.log_args],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=child_env(),
                cwd="/",
                user=self.who.uid if self.who else None,
                group=self.who.gid if self.who else None,
                extra_groups=[] if self.who else None,
                start_new_session=True,  # a terminal's ^C reaches the core, which stops it
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return proc, ours

    def _supervise(self) -> None:
        backoff = RESTART_MIN
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                proc, sock = self._spawn()
            except OSError as e:
                log.error("inbox_spawn_failed", error=e.strerror or str(e), retry_in_s=backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, RESTART_MAX)
                continue
            self.proc = proc
            self.starts += 1
            log.info(
                "inbox_started",
                pid=proc.pid,
                uid=self.who.uid if self.who else os.geteuid(),
                user=self.who.name if self.who else None,
                start=self.starts,
            )
            Monitor(self.ctx, sock, self.fds, f"pid {proc.pid}").serve()
            code = _reap(proc)
            if self._stopping.is_set():
                break
            backoff = RESTART_MIN if time.monotonic() - started > STEADY_SECONDS else backoff
            log.error("inbox_exited", pid=proc.pid, code=code, restart_in_s=backoff)
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, RESTART_MAX)

    def stop(self) -> None:
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        self._thread.join(STOP_SECONDS * 2)
        if proc is not None:
            _reap(proc)


def _reap(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()  # it hung up on the core but lives on: it is ended
        return proc.wait()


class Listening:
    """The inbox under its own systemd unit (deltad-inbox.service): the core listens on a
    Unix socket the unit connects to, takes one connection at a time and only from the inbox's
    user (SO_PEERCRED), and hands it the same descriptors a spawned inbox gets."""

    def __init__(self, ctx: Serving | Context, fds: list[int], path: Path, user: str) -> None:
        self.ctx, self.fds, self.path, self.user = ctx, fds, path, user
        self.pid: int | None = None
        self._stopping = threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(str(path))
        except OSError as e:
            self.sock.close()
            raise InboxUnusable(f"http.inbox_socket {path}: {e.strerror}") from None
        os.chmod(path, 0o666)  # anyone may connect; only the inbox's user is served
        self.sock.listen(4)
        self._thread = threading.Thread(target=self._serve, name="deltad-inbox", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("inbox_socket_listening", path=str(self.path), user=self.user)

    def _expected_uid(self) -> int | None:
        if os.geteuid() != 0:
            return os.geteuid()
        try:
            return pwd.getpwnam(self.user).pw_uid  # a DynamicUser= resolves while it runs
        except KeyError:
            return None

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed by stop()
            pid, uid, _ = _peer(conn)
            want = self._expected_uid()
            if want is None or uid != want or (uid == 0 and os.geteuid() == 0):
                log.warning("inbox_peer_refused", pid=pid, uid=uid, expected=want)
                conn.close()
                continue
            self.pid = pid
            log.info("inbox_connected", pid=pid, uid=uid)
            Monitor(self.ctx, conn, self.fds, f"pid {pid}").serve()
            self.pid = None

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(STOP_SECONDS)
        with contextlib.suppress(OSError):
            self.path.unlink()


def _peer(conn: socket.socket) -> tuple[int, int, int]:
    import struct

    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


# -- what the daemon's lifecycle holds ------------------------------------------------------------
class InboxHost:
    """The inbox as the core sees it: the listening socket (bound here), the context its
    calls are served with, the webhooks it delivers, and the process (spawned, or the
    unit's). With `config` None there is no HTTP: the inbox process is started to deliver
    webhooks only (as `deltad-inbox`, with the same directory), never listening."""

    def __init__(
        self,
        config: HttpConfig | None,
        feed: Feed,
        state_dir: Path,
        log_args: list[str],
        vitals: Vitals | None = None,
    ) -> None:
        from deltad.http.server import _check_tls, bind

        self.config, self.state_dir = config, state_dir
        self.sock: socket.socket | None = None
        if config is not None:
            _check_tls(config)
            # The port first: taken, it is the one line `serve` says, before anything is made
            # (the inbox's user, its directory) or logged.
            self.sock = bind(config.listen)
        try:
            self.who = account(config.user if config is not None else DEFAULT_USER)
            self.dir = prepare(state_dir, self.who)
        except BaseException:
            if self.sock is not None:
                self.sock.close()
            raise
        self.port: int | None = None
        self.url: str | None = None
        self.context: Context | None = None
        if config is not None and self.sock is not None:
            self.port = int(self.sock.getsockname()[1])
            self.url = config.base_url(self.port)
            self.context = Context(
                feed=feed,
                tokens=TokenStore(self.dir, owner=os.geteuid()),
                config=config,
                link_key=links.load_key(state_dir),  # the core's alone: links are signed here
                base_url=self.url,
                vitals=vitals if vitals is not None else Standalone(),  # the inbox's calls ask
                idempotency=Idempotency(state_dir),  # the core's: kept across restarts
            )
        self.serving = Serving(self.context, show_path(self.dir))
        self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        self._tls = _tls_fds(config) if config is not None else []
        fds = [self.sock.fileno()] if self.sock is not None else []
        fds += [self._dir_fd, *self._tls]
        self.runner: Spawned | Listening
        if config is not None and config.inbox_socket is not None:
            self.runner = Listening(self.serving, fds, config.inbox_socket, config.user)
        else:
            self.runner = Spawned(self.serving, fds, self.who, log_args)

    @property
    def pid(self) -> int | None:
        return self.runner.pid

    def deliver(
        self,
        urls: list[str],
        caps: list[int],
        targets: list[wire.WebhookTarget],
        counted: Any,
        channels: list[wire.ChannelTarget] | None = None,
        sends: Any = None,
    ) -> Handoff:
        """The webhooks and channel targets this inbox sends: their outbox made (an older
        deltad's moved in), their settings and credentials for its welcome. Before `start`."""
        owner = (self.who.uid, self.who.gid) if self.who is not None else None
        channels = channels or []
        named = [(c.name, c.outbox_max) for c in channels]
        try:
            handoff = Handoff(self.dir, self.state_dir, urls, caps, owner, counted, named, sends)
        except (HandoffError, OSError) as e:
            where = "notify.webhooks" if urls else "channels"
            raise InboxUnusable(f"{where}: the inbox's outbox: {e}") from None
        self.serving.handoff, self.serving.targets = handoff, targets
        self.serving.channels = channels
        return handoff

    def read_mail(self, intake: wire.MailIntake) -> None:
        """The email channel's Maildir, for the inbox to read (before `start`)."""
        self.serving.mail_intake = intake

    def take_mail(self, receive: Callable[[Received], dict[str, Any]] | None) -> None:
        """The channel that decides on what the inbox relays (None: no longer taken)."""
        self.serving.mail = receive

    def start(self) -> None:
        self.runner.start()
        if self.config is not None:
            log.info("http_listening", url=self.url, port=self.port, tls=self.config.tls)
        else:
            what = [w for w, on in (("webhooks", self.serving.targets),
                                    ("channels' messages", self.serving.channels),
                                    ("mail", self.serving.mail_intake)) if on]  # fmt: skip
            log.info(
                "inbox_for_webhooks",
                user=self.who.name if self.who is not None else None,
                serves=what,
                detail=f"no http: the inbox process is started for {', '.join(what)} only",
            )

    def close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()

    def stop(self) -> None:
        self.runner.stop()
        self.close_socket()
        for fd in (self._dir_fd, *self._tls):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.serving.handoff is not None:
            self.serving.handoff.close()


def _tls_fds(config: HttpConfig) -> list[int]:
    """The certificate and key as in-memory files the inbox reads by /proc/self/fd (the key
    file itself stays root's 0600)."""
    if config.tls_cert is None or config.tls_key is None:
        return []
    out = []
    for path, name in ((config.tls_cert, "deltad-tls-cert"), (config.tls_key, "deltad-tls-key")):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        with open(path, "rb") as src, os.fdopen(os.dup(fd), "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.fchmod(fd, 0o444)
        out.append(fd)
    return out
