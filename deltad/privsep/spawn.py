"""Starting the inbox process, as the core's lifecycle holds it: `open_inbox` makes an
`InboxHost` (the listening socket bound here, the context its calls are served with, what it
delivers), whose runner starts the process (`Spawned`) or waits for the one systemd starts
(`Listening`) and starts it again after a crash. What cannot be made is `Unusable`, one line
naming the key (`deltad serve` says it and exits 2).

The core binds the listening socket itself (as root: ports below 1024 work) and hands it over;
it keeps its own copy, never accepting on it, so connections wait in the backlog while an inbox
is restarted.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from deltad import wire
from deltad.health import Standalone, Vitals
from deltad.inbox import links
from deltad.inbox.config import HttpConfig
from deltad.inbox.context import Context, Idempotency
from deltad.inbox.feed import Feed
from deltad.inbox.handlers import listed_shown
from deltad.inbox.readahead import ReadAhead
from deltad.inbox.tokens import TokenStore
from deltad.outbound.handoff import Handoff, HandoffError
from deltad.outbound.mail import Received
from deltad.privsep.core import (
    DEFAULT_USER,
    Account,
    InboxUnusable,
    Monitor,
    Serving,
    account,
    child_env,
    prepare,
)
from deltad.protocol.printable import show_path
from deltad.validation import unusable

if TYPE_CHECKING:
    from deltad.metrics import CoreMetrics
    from deltad.outbound.wiring import Sending

log = structlog.get_logger("deltad.privsep")

RESTART_MIN, RESTART_MAX = 0.5, 30.0  # seconds before an inbox that ended is started again
STEADY_SECONDS = 60.0  # an inbox that ran this long starts again at once
STOP_SECONDS = 5.0
CHILD = [sys.executable, "-m", "deltad.http"]


def open_inbox(
    config: HttpConfig | None,
    state_dir: Path,
    feed: Feed,
    vitals: Vitals,
    log_args: list[str],
    sending: Sending,
    metrics: CoreMetrics,
    audit: Path | None = None,
) -> InboxHost:
    """The inbox process's host, its port bound and its certificate loaded, what it delivers
    handed over (their outbox made), not yet started. Webhooks and the channels' messages are
    sent by the inbox process: without `http:` (`config` None) it is started for them alone
    (no socket; the caller asks only when `sending.needs_inbox`). Unusable (one line, naming
    the key) when it cannot be made."""
    from deltad.privsep.listen import ListenError

    try:
        host = InboxHost(config, feed, state_dir, log_args, vitals)
        # four eyes: each vote is a receipt of its own (no context: webhooks alone)
        if audit is not None and host.context is not None:
            host.context.audit = audit
        if host.context is not None:
            docs = host.context.documents
            metrics.page_documents(lambda: len(docs.shown), lambda: docs.held)
        if sending.mail is not None:  # mail from anyone is parsed there, not here
            host.read_mail(sending.mail)
    except (ListenError, InboxUnusable, OSError, ValueError) as e:
        # a certificate's problem, a user's, names its key already
        if config is None:
            raise unusable(f"{sending.where}: the inbox process", e) from e
        raise unusable("http.listen", e, named=("http",)) from e
    if sending.webhooks or sending.channels:
        try:
            host.deliver(
                [t.url for t in sending.webhooks],
                sending.caps,
                sending.webhooks,
                metrics.deliveries,
                sending.channels,
            )
        except (OSError, ValueError) as e:
            host.close_socket()
            raise unusable("notify", e, named=("notify", "channels")) from None  # the outbox's
    return host


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
        from deltad.privsep.listen import _check_tls, bind

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
        # The pages' documents read before they are asked for (inbox/readahead.py).
        self.read_ahead = (
            ReadAhead(self.context, listed_shown) if self.context is not None else None
        )
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
    ) -> Handoff:
        """The webhooks and channel targets this inbox sends: their outbox made (an older
        deltad's moved in), their settings and credentials for its welcome. Before `start`."""
        owner = (self.who.uid, self.who.gid) if self.who is not None else None
        channels = channels or []
        named = [(c.name, c.outbox_max) for c in channels]
        try:
            handoff = Handoff(self.dir, self.state_dir, urls, caps, owner, counted, named)
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
        if self.read_ahead is not None:
            self.read_ahead.start()
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
        if self.read_ahead is not None:
            self.read_ahead.stop()
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
