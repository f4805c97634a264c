"""The inbox process: HTTP (the API, the event stream, the page, signed links) on the socket
the core handed it, as an unprivileged user with no capabilities and no_new_privs.

It holds the listening socket, its own directory (token hashes to read, the session key and
logouts to keep) and the core's socket, nothing else: no workspace is read here. The event
stream is served from a replica of the core's feed (`welcome`'s buffer, then each `event`);
everything that reads or writes a workspace is a call to the core (`Remote.call`: an operation
of deltad/inbox/ops.py by name), which checks it again as if this process were hostile.

    python -m deltad.http --core-fd N            (started by `deltad serve`)
    deltad inbox --connect /run/deltad/inbox.sock   (deltad-inbox.service)
    deltad inbox --connect /run/deltad/inbox.sock --wait 120   (a pod's inbox container)

The process ends when the core hangs up (the core, or systemd, starts another).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from deltad import logs, tracing, wire
from deltad.health import Health
from deltad.http import sessions
from deltad.inbox import ops
from deltad.inbox.config import HttpConfig
from deltad.inbox.context import Context
from deltad.inbox.feed import EVENT_TYPES, Feed, FeedEvent
from deltad.inbox.ops import ApiError
from deltad.inbox.tokens import Identity, TokenStore
from deltad.outbound.courier import Courier
from deltad.outbound.outbox import target_key
from deltad.protocol.printable import unshow

log = structlog.get_logger("deltad.inbox")

PR_SET_NO_NEW_PRIVS = 38
CALL_SECONDS = 60.0  # a call the core has not answered by then is a 503
CONNECT_PAUSE = 0.2  # seconds between tries of the core's socket (`--wait`)
TEST_HOOK_ENV = "DELTAD_INBOX_TEST_HOOK"


def no_new_privs() -> None:
    """No exec from here on can gain a privilege (setuid binaries, file capabilities)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


class Remote:
    """The operations (deltad/inbox/ops.py), sent to the core; each call waits for its reply
    (a few worker threads wait at once, the reader thread hands the replies out)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the waiting calls
        self._sending = threading.Lock()  # whole frames on the socket
        self._waiting: dict[int, Future[wire.Reply | bytes]] = {}
        self.gone = False

    def tell(self, msg: wire.Told) -> None:
        """A message that gets no reply (the delivery counts)."""
        with self._sending:
            self.sock.sendall(wire.encode(msg))

    def call(self, op: str, who: Identity | None = None, /, **args: Any) -> dict[str, Any]:
        """Operation `op` for `who` (an operation on behalf of a token; None otherwise), its
        arguments checked here first: what a route took and the operation does not is a 422."""
        token, checked = ops.prepared(op, who, args)
        return self.send(op, token, checked.model_dump(mode="json"), ops.person_of(who))

    def call_json(self, op: str, who: Identity | None = None, /, **args: Any) -> bytes:
        """`call`, its result as the JSON the core sent (a list page: passed on, not parsed)."""
        token, checked = ops.prepared(op, who, args)
        got = self.exchange(op, token, checked.model_dump(mode="json"), ops.person_of(who))
        return got if isinstance(got, bytes) else json.dumps(got.result or {}).encode()

    def send(
        self,
        op: str,
        token: str | None,
        args: dict[str, Any],
        person: dict[str, list[str]] | None = None,
    ) -> dict[str, Any]:
        """One `call` frame as given, and its reply (ApiError for a refusal)."""
        got = self.exchange(op, token, args, person)
        if isinstance(got, bytes):
            return json.loads(got) or {}
        return got.result or {}

    def exchange(
        self,
        op: str,
        token: str | None,
        args: dict[str, Any],
        person: dict[str, list[str]] | None = None,
    ) -> wire.Reply | bytes:
        """One `call` frame as given, and its reply: the result's JSON as it came, or the
        parsed reply (ApiError for a refusal)."""
        cid = next(self._ids)
        fut: Future[wire.Reply | bytes] = Future()
        with self._lock:
            if self.gone:
                raise _unavailable()
            self._waiting[cid] = fut
        try:
            carried = tracing.checked(tracing.calling.get())
            frame = wire.Call(
                op=op,
                id=cid,
                token=token,
                args=args,
                traceparent=carried,
                person=wire.Person.model_validate(person) if person is not None else None,
            )
        except ValidationError as e:  # not a frame the core would take: say so
            with self._lock:
                self._waiting.pop(cid, None)
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ApiError(422, "bad_request", f"{where}: {first['msg']}") from None
        try:
            data = wire.encode(frame)
        except ValueError as e:  # JSON carried a lone surrogate ("\ud800"): no UTF-8 text
            with self._lock:
                self._waiting.pop(cid, None)
            if "surrogate" not in str(e):
                raise
            why = "the body holds a lone surrogate (such as \\ud800), which is not text: send UTF-8"
            raise ApiError(422, "misfit", why) from None
        if len(data) - wire.HEADER.size > wire.INBOX_FRAME_MAX:  # the core would hang up
            with self._lock:
                self._waiting.pop(cid, None)
            raise ApiError(413, "too_large", "this request is over what the core takes")
        try:
            with self._sending:
                self.sock.sendall(data)
            reply = fut.result(CALL_SECONDS)
        except (OSError, FutureTimeout):
            raise _unavailable() from None
        finally:
            with self._lock:
                self._waiting.pop(cid, None)
        if isinstance(reply, wire.Reply) and (problem := reply.error) is not None:
            raise ApiError(problem.http, problem.code, problem.message, problem.workspaces)
        return reply

    def resolve(self, cid: int, reply: wire.Reply | bytes) -> None:
        with self._lock:
            fut = self._waiting.get(cid)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def lost(self) -> None:
        with self._lock:
            self.gone = True
            waiting = list(self._waiting.values())
        for fut in waiting:
            if not fut.done():
                fut.set_exception(OSError("the core hung up"))


class RemoteVitals:
    """The core's health and metrics (deltad/health.py's `Vitals`), asked over the socket (one
    small call a probe; the core answers it on a thread beside its loop). A core that does not
    answer is neither live nor ready (503s, by the status code)."""

    FRESH = 0.05  # seconds an answer is reused: /metrics asks for both halves in one request

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self._lock = threading.Lock()
        self._at = -self.FRESH
        self._doc: dict[str, Any] | None = None

    def _ask(self) -> dict[str, Any] | None:
        with self._lock:
            now = time.monotonic()
            if self._doc is None or now - self._at >= self.FRESH:
                try:
                    self._doc = self.remote.call("vitals")
                except ApiError:
                    self._doc = None
                self._at = now
            return self._doc

    def health(self) -> Health:
        doc = self._ask()
        if doc is None:
            return Health(False, False, 0, None)
        try:
            return Health(**doc["health"])
        except (KeyError, TypeError):
            return Health(False, False, 0, None)

    def core_metrics(self) -> bytes:
        doc = self._ask()
        return str(doc.get("metrics", "")).encode() if doc is not None else b""


# -- channels' own endpoints (deltad/outbound) --------------------------------------------------
def channel_routes(app: FastAPI, remote: Remote, deliveries: Deliveries | None = None) -> None:
    """Slack's interactivity endpoint. Its credential is Slack's signature, which only the core
    can check (it alone reads the signing secret): the body (capped by api.limits) and the two
    headers go to the core unread, and its answer comes back as Slack's response. A modal the
    core decided to open is opened here, with the bot token this process holds."""

    @app.post("/v1/channels/slack/interactions", include_in_schema=False)
    async def slack_interactions(request: Request) -> Response:
        timestamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        if not timestamp or not signature:
            raise ApiError(401, "bad_signature", "not signed by Slack (no X-Slack-Signature)")
        try:
            body = (await request.body()).decode()
        except UnicodeDecodeError:
            raise ApiError(400, "bad_payload", "not a Slack interaction payload") from None

        def relay() -> dict[str, Any]:
            args = {"body": body, "timestamp": timestamp, "signature": signature}
            return remote.call("channel_interaction", channel="slack", **args)

        result = await run_in_threadpool(relay)
        if isinstance(opening := result.get("open_view"), dict):
            refused = await run_in_threadpool(open_view, deliveries, opening)
            if refused is not None:
                return JSONResponse(refused)
        if (response := result.get("response")) is None:
            return Response(status_code=200)
        return JSONResponse(response)


def teams_routes(app: FastAPI, remote: Remote, deliveries: Deliveries | None) -> None:
    """Teams' messaging endpoint (Bot Framework activities), POST only. Its credential is the
    bearer JWT the Bot Connector signs: checked here against the keys it publishes (fetched by
    this process, deltad/outbound/botauth.py), so a forged activity is refused without a call
    to the core; then relayed with its token and the key set to the core, which checks it again
    and decides (deltad/outbound/teams.py). Its answer is the invoke's response."""
    from deltad.outbound import botauth

    @app.post("/v1/channels/teams/messages", include_in_schema=False)
    async def teams_messages(request: Request) -> Response:
        teams = deliveries.teams if deliveries is not None else None
        if teams is None:
            raise ApiError(404, "not_found", "the teams channel is not configured")
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            log.warning("teams_activity_refused", code="no_token", where="inbox")
            raise ApiError(401, "bad_token", "not signed by the Bot Connector (no bearer token)")
        token = token.strip()
        try:
            body = (await request.body()).decode()
            activity = json.loads(body)
            if not isinstance(activity, dict):
                raise ValueError("not an object")
        except ValueError:
            raise ApiError(400, "bad_payload", "not a Bot Framework activity") from None
        service_url, channel_id = activity.get("serviceUrl"), activity.get("channelId")

        def check() -> dict[str, Any]:
            keys = teams.keys.for_kid(botauth.kid_of(token))
            botauth.verify(
                token,
                keys,
                teams.app_id,
                service_url if isinstance(service_url, str) else None,
                channel_id if isinstance(channel_id, str) else None,
            )
            return keys  # type: ignore[no-any-return]

        try:
            keys = await run_in_threadpool(check)
        except botauth.Unauthentic as e:
            log.warning("teams_activity_refused", code=e.code, reason=str(e), where="inbox")
            raise ApiError(e.http, e.code, str(e)) from None
        except OSError as e:
            log.error("teams_keys_unavailable", error=str(e)[:300])
            raise ApiError(
                503, "keys_unavailable", "the Bot Connector's keys could not be had"
            ) from None

        def relay() -> dict[str, Any]:
            args = {"body": body, "signature": token, "keys": json.dumps(keys)}
            return remote.call("channel_interaction", channel="teams", **args)

        result = await run_in_threadpool(relay)
        if (response := result.get("response")) is None:
            return Response(status_code=200)
        return JSONResponse(response)


def open_view(deliveries: Deliveries | None, opening: dict[str, Any]) -> dict[str, Any] | None:
    """Open the modal the core described (channels/slack.py, `open_view`); None once open,
    else the refusal to answer Slack with (also told to the person, from the outbox)."""
    slack = deliveries.slack if deliveries is not None else None
    why = "this inbox process sends nothing to Slack"
    if slack is not None:
        why = slack.open_view(
            str(opening.get("trigger_id", "")),
            dict(opening.get("view") or {}),
            float(opening.get("timeout") or 2.5),
        )
        if why is None:
            return None
    log.error("slack_modal_failed", request_id=opening.get("request_id"), error=why)
    refusal = opening.get("refusal")
    text = refusal.get("text") if isinstance(refusal, dict) else None
    log.warning("slack_action_refused", code="modal_failed", reason=text, user=opening.get("user"))
    told = opening.get("told")
    if slack is not None and isinstance(told, dict) and deliveries is not None:
        courier = deliveries.couriers.get(target_key(slack.name))
        if courier is not None:
            with contextlib.suppress(OSError, TypeError, ValueError):
                courier.put(str(told["channel"]), "ephemeral", json.dumps(told))
    return refusal if isinstance(refusal, dict) else {"text": "the form could not be opened"}


# -- the email channel's Maildir (deltad/outbound/maildir.py) ----------------------------------
def mail_reader(intake: wire.MailIntake | None, remote: Remote) -> Any:
    """The Maildir reader the core's welcome asks for (None: no email channel): it parses
    each message here and relays what it found to the core (`mail_reply`)."""
    if intake is None:
        return None
    from deltad.outbound.maildir import MaildirReader

    def relay(got: Any) -> bool:
        doc = {"message": got.message, "token": got.token, "sender": got.sender}
        doc |= {"automatic": got.automatic, "text": got.text, "problem": got.problem}
        doc |= {"message_id": got.message_id, "authentication": got.authentication}
        try:
            result = remote.call("mail_reply", **doc)
        except ValueError as e:  # not encodable (mail.received makes it so: a bug)
            log.error("email_relay_refused", message=got.message, error=str(e)[:200])
            return True
        except ApiError as e:
            if e.http == 503:  # the core is starting its channel, or gone: kept in new/
                return False
            # Refused as malformed, or the core failed on it: set aside in cur/, not relayed
            # forever (the core's log says why).
            log.error("email_relay_refused", message=got.message, http=e.http, code=e.code)
            return True
        log.info("email_relayed", message=got.message, result=result.get("result"))
        return True

    return MaildirReader(
        Path(intake.maildir),
        intake.reply_local,
        intake.reply_domain,
        relay,
        intake.max_message_bytes,
        intake.max_per_pass,
        intake.poll_seconds,
    )


def _unavailable() -> ApiError:
    return ApiError(503, "core_unavailable", "the daemon's core did not answer; try again")


def relayed(msg: wire.EventMsg) -> FeedEvent | None:
    if msg.type not in EVENT_TYPES:
        return None
    data = dict(msg.data)
    if isinstance(data.get("workspace"), str):
        with contextlib.suppress(ValueError):
            data["workspace"] = unshow(data["workspace"])
    return FeedEvent(msg.id, msg.type, msg.at, data)


def listen_from_core(
    reader: wire.Reader,
    remote: Remote,
    feed: Feed,
    on_lost: Any,
    deliveries: Deliveries | None = None,
) -> None:
    """The reader thread: replies to their callers, events into the replica feed, the
    outbox's hints to its webhook's thread."""
    try:
        while True:
            frame = reader.frame()
            if (result := wire.result_of(frame)) is not None:
                remote.resolve(*result)  # parsed by who needs it (a page: by nobody)
                continue
            msg = wire.FROM_CORE.validate_json(frame)
            if isinstance(msg, wire.Reply):
                remote.resolve(msg.id, msg)
            elif isinstance(msg, wire.EventMsg) and (e := relayed(msg)) is not None:
                feed.relay(e)
            elif isinstance(msg, wire.OutboxHint) and deliveries is not None:
                deliveries.hint(msg.target)
    except (wire.WireError, OSError, ValueError) as e:
        log.error("inbox_core_gone", reason=str(e))
    finally:
        remote.lost()
        on_lost()


class Deliveries:
    """What this process delivers: one Courier per target (deltad/outbound/courier.py), from
    the outbox in its directory, each with its transport (deltad/outbound/senders.py): the
    webhooks' HTTP POST, and for the channels' and commands' targets SMTP, Slack's Web API or
    the command, with the credential it was handed; and the counts it tells the core, at most
    every REPORT_SECONDS."""

    REPORT_SECONDS = 0.2

    def __init__(
        self,
        targets: list[wire.WebhookTarget],
        state: Path,
        remote: Remote,
        shown: str = "",
        channels: list[wire.ChannelTarget] | None = None,
    ) -> None:
        from deltad.outbound import senders

        self.remote = remote
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        named = Path(shown) if shown else None
        self.sent: dict[str, dict[str, int]] = {}
        self._counting = threading.Lock()
        self._last: dict[str, dict[str, int]] = {}
        self.couriers: dict[str, Courier] = {}
        self.slack: Any = None  # senders.SlackSender: opens the modals a button asks for
        self.teams: Any = None  # senders.TeamsSender: holds the Bot Connector's keys
        for t in targets:
            self.sent[t.name] = {"sent": 0, "retry": 0, "dead": 0}
            self.couriers[t.key] = senders.webhook_courier(t, state, named, self._tally(t.name))
        for c in channels or []:
            try:
                send = senders.sender(c, state)
            except senders.SenderError as e:  # the core checked them: a bug, said once
                log.error("channel_unusable", channel=c.name, error=str(e))
                continue
            self.sent[c.name] = {"sent": 0, "retry": 0, "dead": 0}
            self.couriers[c.key] = Courier(
                c.name,
                state,
                senders.outbox_config(c),
                send,
                handed=True,
                tally=self._tally(c.name),
                queued=senders.queued_hook(send),
                named=named,
            )
            if isinstance(send, senders.SlackSender):
                self.slack = send
            if isinstance(send, senders.TeamsSender):
                self.teams = send
        self._reporter = threading.Thread(
            target=self._report, name="deltad-inbox-report", daemon=True
        )

    def _tally(self, name: str) -> Callable[[str], None]:
        def tally(result: str) -> None:
            with self._counting:  # a courier's thread, or a route's burying for room
                counts = self.sent[name]
                counts[result] = counts.get(result, 0) + 1
            self._dirty.set()

        return tally

    def start(self) -> None:
        for c in self.couriers.values():
            c.start()
        self._reporter.start()
        self._dirty.set()  # what waits at start

    def hint(self, key: str) -> None:
        if (c := self.couriers.get(key)) is not None:
            c.hint()
            self._dirty.set()  # its depth changes

    def _report(self) -> None:
        while not self._stopping.is_set():
            self._dirty.wait()
            self._dirty.clear()
            try:
                for c in self.couriers.values():
                    with self._counting:
                        now = {**self.sent[c.name], "depth": c.waiting()}
                    if now != self._last.get(c.name):
                        self.remote.tell(wire.Deliveries(op="deliveries", target=c.name, **now))
                        self._last[c.name] = now
            except OSError:
                return  # the core is gone: this process ends
            self._stopping.wait(self.REPORT_SECONDS)

    def stop(self) -> None:
        self._stopping.set()
        self._dirty.set()
        for c in self.couriers.values():
            c._stopping.set()
        for c in self.couriers.values():
            c.stop()


def _connect(args: argparse.Namespace) -> socket.socket:
    if args.core_fd is not None:
        return socket.socket(fileno=args.core_fd)
    return connect_waiting(args.connect, args.wait)


def connect_waiting(
    path: Path,
    wait: float,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> socket.socket:
    """The core's socket, connected; tried again every CONNECT_PAUSE seconds for up to `wait`
    while it is not there yet or nobody accepts on it. In a pod the inbox's container starts
    beside the core's, often first; under systemd (wait 0) the unit's restart does this."""
    end = clock() + wait
    said = False
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            if clock() >= end:
                raise
            if not said:
                log.info("inbox_waiting_for_core", socket=str(path), up_to_s=wait, why=e.strerror)
                said = True
        except BaseException:
            sock.close()
            raise
        pause(CONNECT_PAUSE)


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 86400:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to 86400")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deltad inbox")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--core-fd", type=int)
    where.add_argument("--connect", type=Path)
    p.add_argument(
        "--wait",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="with --connect: wait this long for the core's socket (default 0)",
    )
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", default="auto")
    return p


def main(argv: list[str] | None = None) -> int:
    no_new_privs()  # first, before a byte from anyone is read
    args = parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    if os.geteuid() == 0:
        print("deltad inbox: refusing to run as root (it parses the network)", file=sys.stderr)
        return 2
    try:
        core = _connect(args)
    except OSError as e:
        where = f" at {args.connect}" if args.connect is not None else ""
        print(f"deltad inbox: cannot reach the core{where}: {e.strerror or e}", file=sys.stderr)
        return 1
    return serve(core)


def serve(core: socket.socket) -> int:
    # Every call is a hand-off between threads (a route's worker, the reader of replies): a
    # thread woken by a reply takes the interpreter within 0.5 ms, not the default 5 ms.
    sys.setswitchinterval(0.0005)
    reader = wire.Reader(core, wire.CORE_FRAME_MAX, fds=True)
    try:
        wire.send(core, wire.Hello(op="hello", version=wire.VERSION))
        welcome = wire.FROM_CORE.validate_json(reader.frame())
    except ValidationError as e:  # never its text: it quotes the input (the welcome's keys)
        log.error("inbox_handshake_failed", reason=f"not a welcome ({e.error_count()} errors)")
        return 1
    except (wire.WireError, OSError, ValueError) as e:
        log.error("inbox_handshake_failed", reason=str(e))
        return 1
    fds, reader.fds = reader.received, False
    if not isinstance(welcome, wire.Welcome):
        log.error("inbox_handshake_failed", reason="no welcome")
        return 1
    want = (4 if welcome.tls else 2) if welcome.listening else 1
    if len(fds) != want:
        log.error("inbox_handshake_failed", reason="no welcome with the descriptors")
        return 1
    if not welcome.listening:
        return deliver_only(core, reader, welcome, Path(f"/proc/self/fd/{fds[0]}"))
    # The web stack only where it serves (an inbox for webhooks alone starts without it).
    from deltad.http.app import create_app
    from deltad.http.server import serve_bounded, uvicorn_server

    config = HttpConfig.model_validate(welcome.http)
    listening = socket.socket(fileno=fds[0])
    state = Path(f"/proc/self/fd/{fds[1]}")  # the directory, reached by the handed fd
    certfile, keyfile = (
        (f"/proc/self/fd/{fds[2]}", f"/proc/self/fd/{fds[3]}") if welcome.tls else (None, None)
    )

    feed = Feed(config.event_buffer)
    for m in welcome.events:
        if (event := relayed(m)) is not None:
            feed.relay(event)
    feed.relay_floor(welcome.floor)
    remote = Remote(core)
    deliveries = (
        Deliveries(welcome.webhooks, state, remote, welcome.inbox_dir, welcome.channels)
        if welcome.webhooks or welcome.channels
        else None
    )
    ctx = Context(
        feed=feed,
        tokens=TokenStore(state),
        config=config,
        link_key=b"",  # the core's: it checks and signs links
        base_url=welcome.base_url,
        core=remote,
        vitals=RemoteVitals(remote),
    )
    stopping = threading.Event()
    web = sessions.Sessions(
        sessions.load_key(state), config.session_ttl_seconds, state / sessions.CLOSED_NAME
    )
    provider = None
    if config.oidc is not None:  # its discovery and keys are fetched here, never by the core
        from deltad.http.oidc import Provider

        provider = Provider(config.oidc, welcome.oidc_client_secret, welcome.base_url)
    app = create_app(ctx, stopping, web, provider)
    channel_routes(app, remote, deliveries)
    teams_routes(app, remote, deliveries)
    if os.environ.get(TEST_HOOK_ENV) == "1":
        from deltad.http.testhook import install

        install(app, remote)
        log.warning("inbox_test_hook_enabled", detail=f"{TEST_HOOK_ENV}=1: tests only")
    server = uvicorn_server(app, config, certfile, keyfile)
    lost = threading.Event()
    exit_on_signal = server.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        stopping.set()  # open event streams say the daemon is stopping, and end
        exit_on_signal(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]

    def on_lost() -> None:
        lost.set()
        stopping.set()
        server.should_exit = True

    threading.Thread(
        target=listen_from_core,
        args=(reader, remote, feed, on_lost, deliveries),
        name="deltad-inbox-core",
        daemon=True,
    ).start()
    if deliveries is not None:
        deliveries.start()
    mail = mail_reader(welcome.mail, remote)
    if mail is not None:
        mail.start()
    log.info("inbox_serving", pid=os.getpid(), uid=os.getuid(), url=welcome.base_url)
    try:
        asyncio.run(serve_bounded(server, listening))
    finally:
        stopping.set()
        if mail is not None:
            mail.stop()
        if deliveries is not None:
            deliveries.stop()
    return 3 if lost.is_set() else 0


def deliver_only(
    core: socket.socket, reader: wire.Reader, welcome: wire.Welcome, state: Path
) -> int:
    """No HTTP (the daemon has no `http:`): this process only delivers the webhooks and the
    channels' messages and reads the email channel's Maildir, until the core hangs up or a
    signal ends it."""
    remote = Remote(core)
    deliveries = Deliveries(welcome.webhooks, state, remote, welcome.inbox_dir, welcome.channels)
    ended = threading.Event()
    lost = threading.Event()

    def on_lost() -> None:
        lost.set()
        ended.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: ended.set())
    threading.Thread(
        target=listen_from_core,
        args=(reader, remote, Feed(10), on_lost, deliveries),
        name="deltad-inbox-core",
        daemon=True,
    ).start()
    deliveries.start()
    mail = mail_reader(welcome.mail, remote)
    if mail is not None:
        mail.start()
    log.info("inbox_serving", pid=os.getpid(), uid=os.getuid(), url=None, webhooks_only=True)
    try:
        while not ended.wait(3600):
            pass
    finally:
        if mail is not None:
            mail.stop()
        deliveries.stop()
    return 3 if lost.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
