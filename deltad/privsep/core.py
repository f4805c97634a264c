"""The core's side of the split: the inbox's user and directory, the monitor that serves an
inbox connection (its calls answered from the operation table by monitor.py), and the
environment the inbox process is started with (the supervisor that starts it, or waits for the
one systemd starts, is `spawn.py`). Resumes are the loop's: nothing here touches them.
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
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from deltad import wire
from deltad.inbox.config import HttpConfig
from deltad.inbox.context import Context
from deltad.inbox.feed import FeedEvent
from deltad.inbox.tokens import TOKENS_NAME
from deltad.outbound.handoff import Handoff
from deltad.outbound.mail import Received
from deltad.platform import SAFE_PATH
from deltad.privsep import monitor
from deltad.privsep.monitor import decode as decode  # the monitor's, as the counts' tests name it
from deltad.privsep.monitor import decode_message
from deltad.protocol.printable import json_safe, show_path

log = structlog.get_logger("deltad.privsep")

DEFAULT_USER = "deltad-inbox"
INBOX_DIR = "inbox"  # under the state dir: token hashes (root's), sessions (the inbox's)
MOVED_IN = (TOKENS_NAME, wire.SESSION_KEY_NAME, wire.SESSIONS_CLOSED_NAME)  # from the state dir
HELLO_SECONDS = 30.0
CALL_THREADS = 4  # as many as the HTTP server's worker threads
CALLS_IN_FLIGHT = 64  # read no more calls from the inbox while this many are unanswered
OUT_QUEUE = 10_000  # frames waiting for the inbox (events beyond it are dropped, counted)
# Only the allowlist reaches the inbox process (never the core's credentials or resume_env);
# it delivers the webhooks, so a site's proxy and CA bundle settings go along (httpx reads them).
ENV_KEPT: tuple[str, ...] = ("LANG", "LC_ALL", "TZ", "PYTHONPATH", "COVERAGE_PROCESS_START")
ENV_KEPT += ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR")
ENV_KEPT += ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
TEST_HOOK_ENV = "DELTAD_INBOX_TEST_HOOK"  # tests only: see deltad/http/testhook.py


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
    if (problem := _not_for_the_inbox(name, pw)) is not None:
        raise InboxUnusable(problem)
    return Account(name, pw.pw_uid, pw.pw_gid)


def account_problem(name: str) -> str | None:
    """What `account` would refuse, judged without making anything (`deltad check`): a user
    missing that `account` may not make, or could not (useradd cannot write /etc: read-only
    under deltad.service's ProtectSystem=strict, or in a read-only container)."""
    if os.geteuid() != 0:
        return None  # the inbox runs as the core's own user
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        if name != DEFAULT_USER:
            return f"http.user {name}: no such user"
        if (why := _cannot_make_users()) is not None:
            return _unmade(name, why)
        return None
    return _not_for_the_inbox(name, pw)


def _not_for_the_inbox(name: str, pw: pwd.struct_passwd) -> str | None:
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        return f"http.user {name}: the inbox must not run as root or group root"
    return None


def _cannot_make_users() -> str | None:
    """Why `useradd` would fail here, or None: it needs to write /etc (its lock files sit
    beside passwd and group, and each is replaced by a rename)."""
    if shutil.which("useradd") is None:
        return "no useradd on PATH"
    for path in ("/etc", "/etc/passwd", "/etc/group"):
        try:
            if os.statvfs(path).f_flag & os.ST_RDONLY:
                return f"{path} is read-only"
        except OSError as e:
            return f"{path}: {e.strerror}"
        if not os.access(path, os.W_OK):
            return f"{path} is not writable"
    return None


def _unmade(name: str, why: str) -> str:
    return (
        f"http.user {name} does not exist and cannot be made ({why}): make it "
        f"(useradd --system --user-group {name}, or systemd-sysusers with "
        f"systemd/sysusers.d/deltad.conf) or set http.user"
    )


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
    raise InboxUnusable(_unmade(name, why))


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
                    http=http_for_inbox(ctx.config),
                    base_url=ctx.base_url,
                    tls=ctx.config.tls,
                    events=[event_message(e) for e in ctx.feed.since(0)],
                    floor=ctx.feed.floor,
                    webhooks=self.serving.targets,
                    channels=self.serving.channels,
                    inbox_dir=self.serving.inbox_dir,
                    mail=self.serving.mail_intake,
                    oidc_client_secret=oidc_secret(ctx.config),
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
                raw = reader.frame()
                try:
                    self._take(raw, pool)
                except Exception as e:  # one frame, whatever it holds, never ends the monitor
                    self._refused(raw, f"not taken: {type(e).__name__}")
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
        if isinstance(call, wire.Deliveries):
            if self.serving.handoff is not None:
                self.serving.handoff.report(call)
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


# -- what the inbox process is started with --------------------------------------------------------
def child_env() -> dict[str, str]:
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}
    env |= {k: v for k in (*ENV_KEPT, TEST_HOOK_ENV) if (v := os.environ.get(k)) is not None}
    return env


def http_for_inbox(config: HttpConfig) -> dict[str, Any]:
    """The HTTP config as the welcome carries it, without `oidc` when it is not set: an inbox
    of the release before (deltad-inbox.service, upgraded apart) forbids keys it does not know."""
    return config.model_dump(mode="json", exclude={"oidc"} if config.oidc is None else None)


def oidc_secret(config: HttpConfig) -> str | None:
    """http.oidc's client secret, read here (root's file) for the inbox; None: none set, or
    unreadable now (`deltad check` says why; the code exchange is then refused by the provider)."""
    oidc = config.oidc
    if oidc is None or oidc.client_secret is None:
        return None
    try:
        return oidc.client_secret.read().decode()
    except (OSError, ValueError, UnicodeDecodeError) as e:
        log.error("oidc_secret_unreadable", error=str(getattr(e, "strerror", None) or e))
        return None
