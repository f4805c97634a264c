"""How a channel's message leaves the machine, as the inbox process does it (deltad/privsep):
the core composes each message and hands it over (deltad/outbound/courier.py, `Handed`); the
inbox sends it with the credential it was handed at connect (wire.ChannelTarget), never as
root and never with a workspace in reach.

    target(name, ...)   the core's side: a channel's settings and credential, read once
    sender(target)      the inbox's side: the function its courier sends each message with

Each kind says what a message is (`Delivery.body`) and when a failure is permanent (straight
to the dead letter) rather than retried:

    smtp     body: the whole RFC 5322 message; `url`: the one recipient. A 5xx is permanent.
    slack    a Web API call, composed: `question` (post {ref, text, blocks[, once]} to `url`),
             `update` (the closed message {ref, text, blocks}, over every post of `ref`),
             `thread` (a reply {ref, text} in each post's thread, unless closed) and
             `ephemeral` ({channel, user, text}). The posts of each question (conversation,
             ts) are the sender's own record (`Posts`): Slack's answers never reach the core.
             An error a retry cannot mend (`PERMANENT`) goes to the dead letter.
    webhook  body: the event's JSON, POSTed to the target's URL with the Standard Webhooks
             headers (signed with the target's key, deltad/outbound/webhooks.py); the whole
             attempt ends within `timeout_seconds` (`post_within`). Any 2xx is sent.
    pagerduty  body: an Events API v2 event without its `routing_key` (the sender adds the
             key it was handed, so no outbox file holds it), POSTed to `events_url` within
             `timeout_seconds`. 202 is sent; 429, a 5xx or no answer is retried; any other
             status (400: not a valid event) goes to the dead letter, as PagerDuty says.
    teams    an Adaptive Card activity, composed: `question` ({ref, conversation, activity}:
             POSTed to the conversation's activities; the id Teams answers with is kept in the
             sender's `Posts`), `update` ({ref, activity}: PUT over each post of `ref`) and
             `reply` ({ref, activity}: a reminder or an escalation, POSTed as a reply to each
             post of `ref`, unless it closed). Closed records are pruned as Slack's are.
             The bearer token comes from the client-credentials grant with the app password
             the sender was handed (no outbox file holds it). 429, a 5xx, a 401 (the token
             fetched anew) or no answer is retried; another 4xx goes to the dead letter.
    command  body: the event's JSON, on the command's stdin (`notify.commands`): run once
             (`max_attempts: 1`), as the inbox's user, in a clean environment (PATH, LANG),
             from `/`, ended at its timeout; its output is never read. A run that fails (an
             exit status, a timeout, a missing program) goes to the dead letter, as it did
             not run twice before either.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import smtplib
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import structlog

from deltad import wire
from deltad.outbound import webhooks
from deltad.outbound.config import (
    EmailConfig,
    OutboxConfig,
    PagerDutyConfig,
    SlackConfig,
    TeamsConfig,
)
from deltad.outbound.courier import WEBHOOK, Courier, Failed, Send
from deltad.outbound.outbox import Delivery, target_key
from deltad.platform import SAFE_PATH
from deltad.protocol import atomic_write_json

log = structlog.get_logger("deltad.channels")

CA_MAX = 1024 * 1024  # bytes of a CA bundle handed to the inbox
RESPONSE_MAX = 64 * 1024  # bytes of a receiver's answer read at most; the rest is never read


class SenderError(ValueError):
    """One line: a target's settings cannot be sent with."""


def _target(
    name: str,
    kind: wire.ChannelKind,
    settings: dict[str, Any],
    secret: str | None,
    outbox: OutboxConfig,
) -> wire.ChannelTarget:
    """What the inbox is handed for one channel: its settings, its credential and the outbox's
    retry policy."""
    return wire.ChannelTarget(
        name=name,
        key=target_key(name),
        kind=kind,
        settings=settings,
        secret=secret,
        max_attempts=outbox.max_attempts,
        backoff_seconds=outbox.backoff_seconds,
        backoff_max_seconds=outbox.backoff_max_seconds,
        max_age_seconds=outbox.max_age_seconds,
        outbox_max=outbox.outbox_max,
    )


def outbox_config(t: wire.ChannelTarget) -> OutboxConfig:
    return OutboxConfig(
        max_attempts=t.max_attempts,
        backoff_seconds=t.backoff_seconds,
        backoff_max_seconds=t.backoff_max_seconds,
        max_age_seconds=t.max_age_seconds,
        outbox_max=t.outbox_max,
    )


# -- SMTP -----------------------------------------------------------------------------------------
def email_target(config: EmailConfig, name: str = "email") -> wire.ChannelTarget:
    """The email channel's sending, as the inbox is handed it: the MTA, the From, the
    password (read here, by the core) and the CA file's certificates (the inbox may not read
    the file itself). OSError/ValueError, one line, if a file cannot be read."""
    s = config.smtp
    ca = ca_text(s.ca_file) if s.ca_file is not None else None
    return _target(
        name,
        "smtp",
        {
            "host": s.host,
            "port": s.port,
            "security": s.security,
            "username": s.username,
            "timeout_seconds": s.timeout_seconds,
            "from_address": config.from_address,
            "ca": ca,
        },
        s.password.read().decode() if s.password is not None else None,
        config.outbox,
    )


def ca_text(path: Path) -> str:
    """The CA file's certificates, as the inbox is handed them (it may not read the file):
    ValueError, one line, for a file over CA_MAX or with no certificate TLS can use."""
    try:
        with open(path, "rb") as f:
            data = f.read(CA_MAX + 1)
    except OSError as e:
        raise ValueError(f"email.smtp.ca_file: {path}: {e.strerror}") from None
    if len(data) > CA_MAX:
        raise ValueError(f"email.smtp.ca_file: {path}: over {CA_MAX} bytes")
    text = data.decode("ascii", "replace")
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as e:
        raise ValueError(
            f"email.smtp.ca_file: {path}: no CA certificate TLS can use ({e})"
        ) from None
    return text


def _permanent(codes: list[int]) -> bool:
    return bool(codes) and all(c >= 500 for c in codes)


def smtp_sender(t: wire.ChannelTarget) -> Send:
    """One attempt at handing a message to the MTA per call; None once it took it."""
    s = t.settings
    try:
        host, port, security = str(s["host"]), int(s["port"]), str(s["security"])
        timeout, sender = float(s["timeout_seconds"]), str(s["from_address"])
        username = s.get("username")
        ca = s.get("ca")
        tls = ssl.create_default_context(cadata=ca) if ca else ssl.create_default_context()
    except (KeyError, TypeError, ValueError, ssl.SSLError) as e:
        raise SenderError(f"{t.name}: the SMTP settings: {e}") from None
    password = t.secret

    def send(d: Delivery) -> Failed | None:
        try:
            if security == "tls":
                conn: smtplib.SMTP = smtplib.SMTP_SSL(host, port, timeout=timeout, context=tls)
            else:
                conn = smtplib.SMTP(host, port, timeout=timeout)
            with conn:
                if security == "starttls":
                    conn.starttls(context=tls)
                if username is not None and password is not None:
                    conn.login(str(username), password)
                conn.sendmail(sender, [d.url], d.body.encode())
        except smtplib.SMTPRecipientsRefused as e:
            codes = [c for c, _ in e.recipients.values()]
            return Failed(f"refused recipient ({codes[0] if codes else '?'})", _permanent(codes))
        except smtplib.SMTPResponseException as e:
            return Failed(f"SMTP {e.smtp_code}", e.smtp_code >= 500)
        except (smtplib.SMTPException, OSError) as e:
            return Failed(type(e).__name__ + (f": {e}" if str(e) else ""))
        return None

    return send


# -- Slack's Web API -----------------------------------------------------------------------
# Web API errors that a retry cannot mend: straight to the dead letter.
PERMANENT = frozenset(
    {
        "account_inactive",
        "channel_not_found",
        "invalid_arguments",
        "invalid_auth",
        "invalid_blocks",
        "is_archived",
        "missing_scope",
        "msg_too_long",
        "no_permission",
        "not_authed",
        "not_in_channel",
        "token_revoked",
        "user_not_found",
        "cant_update_message",
        "message_not_found",
        "edit_window_closed",
    }
)
REF = re.compile(r"[0-9a-f]{32}")
POSTS_MAX = 1024 * 1024  # bytes of one question's record of posts
KEEP_CLOSED = 30 * 86400.0  # seconds a closed question's posts are kept (as the core's records)
PRUNE_EVERY = 3600.0


def slack_target(config: SlackConfig, name: str = "slack") -> wire.ChannelTarget:
    """The Slack channel's sending, as the inbox is handed it: the Web API's URL and the bot
    token (read here, by the core). The signing secret is never handed: only the core checks
    Slack's signatures."""
    return _target(
        name,
        "slack",
        {"api_url": config.api_url, "timeout_seconds": config.timeout_seconds},
        config.token.read().decode(),
        config.outbox,
    )


class Posts:
    """Where each question (its `ref`) was posted, and its closed message once it closed: one
    JSON file per question, replaced whole, read without following a link."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.lock = threading.RLock()
        self._pruned = 0.0

    def get(self, ref: str) -> dict[str, Any]:
        if not REF.fullmatch(ref):
            raise ValueError("not a question's ref")
        try:
            fd = os.open(self.dir / f"{ref}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {"posts": [], "closed": None}
        with os.fdopen(fd, "rb") as f:
            data = f.read(POSTS_MAX + 1)
        doc = json.loads(data) if len(data) <= POSTS_MAX else None
        return doc if isinstance(doc, dict) else {"posts": [], "closed": None}

    def put(self, ref: str, doc: dict[str, Any]) -> None:
        atomic_write_json(self.dir / f"{ref}.json", {**doc, "at": time.time()}, 0o600)

    def close(self, ref: str, text: str, blocks: list[Any]) -> None:
        with self.lock:
            doc = self.get(ref)
            if doc.get("closed") is None:
                self.put(ref, {**doc, "closed": {"text": text, "blocks": blocks}})
        self.prune(time.time())

    def prune(self, now: float) -> int:
        """Records of questions closed more than KEEP_CLOSED ago, hourly; how many went."""
        if now - self._pruned < PRUNE_EVERY:
            return 0
        self._pruned, gone = now, 0
        with self.lock:
            for entry in os.scandir(self.dir):
                ref = entry.name.removesuffix(".json")
                with contextlib.suppress(OSError, ValueError):
                    doc = self.get(ref)
                    if doc.get("closed") and now - float(doc.get("at", now)) > KEEP_CLOSED:
                        os.unlink(entry.path)
                        gone += 1
        return gone


class SlackSender:
    """Sends the Slack channel's composed calls with the bot token (`slack_sdk.WebClient`),
    keeping where each question was posted (`posts`, in `directory`)."""

    def __init__(self, t: wire.ChannelTarget, directory: Path) -> None:
        from slack_sdk import WebClient

        try:
            api_url, timeout = str(t.settings["api_url"]), float(t.settings["timeout_seconds"])
        except (KeyError, TypeError, ValueError) as e:
            raise SenderError(f"{t.name}: the Slack settings: {e}") from None
        self.name = t.name
        self.client = WebClient(token=t.secret, base_url=api_url, timeout=int(max(1, timeout)))
        self.posts = Posts(directory)

    def queued(self, d: Delivery) -> None:
        """A message entered the outbox: a question's closing is known from now on, so a post
        of it not yet made is made closed (it waits behind, in the order it was queued)."""
        if d.event != "update":
            return
        with contextlib.suppress(ValueError, KeyError, TypeError):
            doc = json.loads(d.body)
            self.posts.close(str(doc["ref"]), str(doc["text"]), list(doc["blocks"]))

    def __call__(self, d: Delivery) -> Failed | None:
        from slack_sdk.errors import SlackApiError, SlackClientError

        try:
            doc = json.loads(d.body)
            if d.event == "question":
                self._post(d.url, doc)
            elif d.event == "update":
                self._update(doc)
            elif d.event == "thread":
                self._thread(doc)
            elif d.event == "ephemeral":
                self.client.chat_postEphemeral(
                    channel=doc["channel"], user=doc["user"], text=doc["text"]
                )
            else:
                return Failed(f"slack: not a message kind: {d.event[:40]}", permanent=True)
        except SlackApiError as e:
            error = str(e.response.get("error", "")) or f"HTTP {e.response.status_code}"
            return Failed(f"slack: {error}", error in PERMANENT)
        except (SlackClientError, OSError) as e:
            return Failed(f"{type(e).__name__}: {e}"[:300])
        except (ValueError, KeyError, TypeError) as e:
            return Failed(f"slack: not a message ({type(e).__name__})", permanent=True)
        return None

    def _post(self, to: str, doc: dict[str, Any]) -> None:
        ref = str(doc["ref"])
        record = self.posts.get(ref)
        posts = record.get("posts", [])
        if doc.get("once") and any(to in (p.get("to"), p.get("channel")) for p in posts):
            return  # an escalation's DM to someone asked there already
        text, message = doc["text"], doc["blocks"]
        if (closed := record.get("closed")) is not None:  # closed before it was posted
            text, message = closed["text"], closed["blocks"]
        r = self.client.chat_postMessage(
            channel=to, text=text, blocks=message, unfurl_links=False, unfurl_media=False
        )
        post = {"channel": str(r.get("channel") or to), "ts": str(r.get("ts") or ""), "to": to}
        with self.posts.lock:
            record = self.posts.get(ref)
            self.posts.put(ref, {**record, "posts": [*record.get("posts", []), post]})

    def _known(self, ref: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """`ref`'s posts: the sender's own, and those an older deltad recorded in the core
        (handed along in `posts`)."""
        own = list(self.posts.get(ref).get("posts", []))
        seen = {(o.get("channel"), o.get("ts")) for o in own}
        for p in doc.get("posts") or []:
            if isinstance(p, dict) and isinstance(p.get("channel"), str) and p.get("ts"):
                post = {"channel": p["channel"], "ts": str(p["ts"])}
                if (post["channel"], post["ts"]) not in seen:
                    own.append(post)
        return own

    def _update(self, doc: dict[str, Any]) -> None:
        ref, text, message = str(doc["ref"]), str(doc["text"]), list(doc["blocks"])
        self.posts.close(ref, text, message)
        for post in self._known(ref, doc):
            self.client.chat_update(
                channel=post["channel"], ts=post["ts"], text=text, blocks=message
            )

    def _thread(self, doc: dict[str, Any]) -> None:
        record = self.posts.get(str(doc["ref"]))
        if record.get("closed"):
            return  # answered or gone meanwhile: nothing to remind of
        for post in self._known(str(doc["ref"]), doc):
            if post.get("ts"):
                self.client.chat_postMessage(
                    channel=post["channel"],
                    thread_ts=post["ts"],
                    reply_broadcast=True,
                    text=doc["text"],
                    unfurl_links=False,
                    unfurl_media=False,
                )

    def open_view(self, trigger_id: str, view: dict[str, Any], timeout: float) -> str | None:
        """A modal opened at once (a trigger_id lives 3 s); why not, or None."""
        from slack_sdk.errors import SlackApiError, SlackClientError

        try:
            self.client.views_open(trigger_id=trigger_id, view=view, timeout=timeout)
        except (SlackApiError, SlackClientError, OSError) as e:
            return str(e)[:300]
        return None


# -- notify.commands -------------------------------------------------------------------------
COMMAND_ENV = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}
COMMAND_QUEUE = 10_000  # events waiting for a command, at most (as the core's queue was)


def command_target(name: str, argv: list[str], timeout_seconds: float) -> wire.ChannelTarget:
    """A `notify.commands` entry, as the inbox is handed it: run once per event, no secret."""
    return wire.ChannelTarget(
        name=name,
        key=target_key(name),
        kind="command",
        settings={"argv": list(argv), "timeout_seconds": timeout_seconds},
        max_attempts=1,
        backoff_seconds=1.0,
        backoff_max_seconds=1.0,
        max_age_seconds=86400.0,
        outbox_max=COMMAND_QUEUE,
    )


def command_sender(t: wire.ChannelTarget) -> Send:
    """One run of the command per call, the message's body on its stdin."""
    try:
        argv = [str(a) for a in t.settings["argv"]]
        timeout = float(t.settings["timeout_seconds"])
        if not argv:
            raise ValueError("no argv")
    except (KeyError, TypeError, ValueError) as e:
        raise SenderError(f"{t.name}: the command's settings: {e}") from None

    def run(d: Delivery) -> Failed | None:
        try:
            done = subprocess.run(
                argv,
                input=d.body.encode(),
                stdout=subprocess.DEVNULL,  # never read into this process's memory
                stderr=subprocess.DEVNULL,
                env=dict(COMMAND_ENV),
                cwd="/",
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Failed(f"timed out after {timeout:g} s", permanent=True)
        except OSError as e:
            return Failed(f"cannot run it: {e.strerror or e}", permanent=True)
        if done.returncode != 0:
            log.warning("notify_command_failed", target=t.name, rc=done.returncode)
            return Failed(f"exit status {done.returncode}", permanent=True)
        return None

    return run


# -- webhooks (HTTP POST) ----------------------------------------------------------------------
class _Cutoff:
    """Ends one attempt at its deadline, whatever it is waiting for (a status line dripped a
    byte at a time passes every per-read timeout): the attempt's socket, learnt from the
    client's trace as it connects, is shut down, and the blocked read returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.fired = False

    def trace(self, name: str, info: dict[str, Any]) -> None:
        if name not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sock = sock  # under TLS, the TLS socket (the plain one is detached)
                if self.fired:
                    _shut(sock)

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                _shut(self._sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def post_within(
    client: httpx.Client, url: str, body: bytes, headers: dict[str, str], deadline: float
) -> int | str:
    """POST `body`; the status code, or why there is none. The whole attempt (connect, send,
    status line, headers, body) ends within `deadline` seconds, and at most RESPONSE_MAX bytes
    of the answer are read: only its status counts."""
    cutoff = _Cutoff()
    timer = threading.Timer(deadline, cutoff.fire)
    timer.daemon = True
    timer.start()
    try:
        with client.stream(
            "POST", url, content=body, headers=headers, extensions={"trace": cutoff.trace}
        ) as r:
            status = r.status_code
            read = 0
            with contextlib.suppress(httpx.HTTPError):
                for chunk in r.iter_raw(RESPONSE_MAX):
                    read += len(chunk)
                    if read >= RESPONSE_MAX or cutoff.fired:
                        break  # the rest is never read: the connection closes
            return status
    except httpx.HTTPError as e:
        return "deadline" if cutoff.fired else type(e).__name__
    finally:
        timer.cancel()


class WebhookSender:
    """One attempt at a webhook delivery per call: POSTed to the target's URL, signed, within
    its deadline; None on a 2xx."""

    def __init__(self, t: wire.WebhookTarget) -> None:
        self.url, self.timeout = t.url, t.timeout_seconds
        self.key = base64.b64decode(t.signing_key) if t.signing_key else None
        # No pooled connections: each attempt connects, so its deadline can cut it off.
        self.client = httpx.Client(
            timeout=t.timeout_seconds,
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def __call__(self, d: Delivery) -> Failed | None:
        body = d.body.encode()
        headers = webhooks.headers(d.msg_id, int(time.time()), body, self.key, d.event)
        status = post_within(self.client, self.url, body, headers, self.timeout)
        if isinstance(status, str):
            return Failed(status)
        return None if 200 <= status < 300 else Failed(f"HTTP {status}")

    def close(self) -> None:
        self.client.close()


def webhook_outbox(t: wire.WebhookTarget) -> OutboxConfig:
    return OutboxConfig(
        max_attempts=t.max_attempts,
        backoff_seconds=t.backoff_seconds,
        backoff_max_seconds=t.backoff_max_seconds,
        max_age_seconds=t.max_age_seconds,
        outbox_max=t.outbox_max,
    )


def webhook_courier(
    t: wire.WebhookTarget,
    state: Path,
    named: Path | None = None,
    tally: Callable[[str], None] | None = None,
    send: Send | None = None,
) -> Courier:
    """A webhook target's courier in the inbox process: its outbox named by the URL, what the
    core hands over for it taken from `new/`; `send`: another transport (tests)."""
    return Courier(
        t.name,
        state,
        webhook_outbox(t),
        send if send is not None else WebhookSender(t),
        handed=True,
        tally=tally,
        keyed=t.url,
        accepts=lambda d: d.url == t.url,
        voice=WEBHOOK,
        named=named,
    )


# -- PagerDuty ------------------------------------------------------------------------------
def pagerduty_target(config: PagerDutyConfig, name: str = "pagerduty") -> wire.ChannelTarget:
    """The PagerDuty channel's sending, as the inbox is handed it: the Events API's URL and
    the integration key (read here, by the core)."""
    return _target(
        name,
        "pagerduty",
        {"events_url": config.events_url, "timeout_seconds": config.timeout_seconds},
        config.routing_key.read().decode(),
        config.outbox,
    )


class PagerDutySender:
    """One attempt at an Events API v2 event per call (`client`: the transport seam; tests
    hand one of their own)."""

    def __init__(self, t: wire.ChannelTarget, client: httpx.Client | None = None) -> None:
        try:
            self.url = str(t.settings["events_url"])
            self.timeout = float(t.settings["timeout_seconds"])
        except (KeyError, TypeError, ValueError) as e:
            raise SenderError(f"{t.name}: the PagerDuty settings: {e}") from None
        if not t.secret:
            raise SenderError(f"{t.name}: no routing key")
        self.key = t.secret
        self.client = client or httpx.Client(
            timeout=self.timeout,
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def __call__(self, d: Delivery) -> Failed | None:
        try:
            event = json.loads(d.body)
            body = json.dumps({**event, "routing_key": self.key}).encode()
        except (ValueError, TypeError) as e:
            return Failed(f"pagerduty: not an event ({type(e).__name__})", permanent=True)
        headers = {"Content-Type": "application/json"}
        status = post_within(self.client, self.url, body, headers, self.timeout)
        if isinstance(status, str):
            return Failed(status)
        if status == 202:
            return None
        return Failed(f"HTTP {status}", permanent=status != 429 and status < 500)

    def close(self) -> None:
        self.client.close()


# -- Microsoft Teams (Bot Framework) -----------------------------------------------------------
BOT_SCOPE = "https://api.botframework.com/.default"
TOKEN_MARGIN = 60.0  # seconds before its expiry a bot token is fetched anew


def teams_target(config: TeamsConfig, name: str = "teams") -> wire.ChannelTarget:
    """The Teams channel's sending, as the inbox is handed it: the service and token URLs, the
    app id, where the Bot Connector's keys are published (the inbox checks incoming activities
    against them) and the app password (read here, by the core)."""
    return _target(
        name,
        "teams",
        {
            "app_id": config.app_id,
            "service_url": config.service_url,
            "token_url": config.token_url,
            "openid_metadata_url": config.openid_metadata_url,
            "timeout_seconds": config.timeout_seconds,
        },
        config.app_password.read().decode(),
        config.outbox,
    )


class TeamsSender:
    """Sends the Teams channel's cards with a bot token from the client-credentials grant
    (kept until a minute before it expires), keeping each post's activity id (`posts`, in
    `directory`) so the closed card replaces it. Holds the Bot Connector's keys for the inbox's
    route (`keys`). `client`: the transport seam; tests hand one of their own."""

    def __init__(
        self, t: wire.ChannelTarget, directory: Path, client: httpx.Client | None = None
    ) -> None:
        from deltad.outbound.botauth import BotKeys

        try:
            self.app_id = str(t.settings["app_id"])
            self.service_url = str(t.settings["service_url"]).rstrip("/")
            self.token_url = str(t.settings["token_url"])
            metadata_url = str(t.settings["openid_metadata_url"])
            self.timeout = float(t.settings["timeout_seconds"])
        except (KeyError, TypeError, ValueError) as e:
            raise SenderError(f"{t.name}: the Teams settings: {e}") from None
        if not t.secret:
            raise SenderError(f"{t.name}: no app password")
        self.name, self._password = t.name, t.secret
        self.client = client or httpx.Client(timeout=self.timeout, follow_redirects=False)
        self.keys = BotKeys(metadata_url, self.timeout, client)
        self.posts = Posts(directory)
        self._token: tuple[str, float] | None = None  # (token, monotonic expiry)
        self._lock = threading.Lock()

    def queued(self, d: Delivery) -> None:
        """A closed card entered the outbox: a post not yet made is made closed."""
        if d.event != "update":
            return
        with contextlib.suppress(ValueError, KeyError, TypeError):
            doc = json.loads(d.body)
            self._close(str(doc["ref"]), dict(doc["activity"]))

    def _close(self, ref: str, activity: dict[str, Any]) -> None:
        with self.posts.lock:
            doc = self.posts.get(ref)
            if doc.get("closed") is None:
                self.posts.put(ref, {**doc, "closed": {"activity": activity}})
        self.posts.prune(time.time())  # closed long ago: gone (hourly, as Slack's)

    def token(self) -> str | Failed:
        """The bot's bearer token for the Bot Connector (fetched when none is fresh)."""
        with self._lock:
            now = time.monotonic()
            if self._token is not None and now < self._token[1]:
                return self._token[0]
            form = {
                "grant_type": "client_credentials",
                "client_id": self.app_id,
                "client_secret": self._password,
                "scope": BOT_SCOPE,
            }
            try:
                r = self.client.post(self.token_url, data=form)
            except httpx.HTTPError as e:
                return Failed(f"teams: the token endpoint: {type(e).__name__}")
            if r.status_code != 200:
                permanent = r.status_code in (400, 401, 403)  # a wrong app id or password
                return Failed(f"teams: the token endpoint: HTTP {r.status_code}", permanent)
            try:
                doc = r.json()
                token, lasts = str(doc["access_token"]), float(doc.get("expires_in", 3600))
            except (ValueError, KeyError, TypeError):
                return Failed("teams: the token endpoint's answer holds no access_token")
            self._token = (token, now + max(0.0, lasts - TOKEN_MARGIN))
            return token

    def __call__(self, d: Delivery) -> Failed | None:
        try:
            doc = json.loads(d.body)
            ref = str(doc["ref"])
            if d.event == "question":
                return self._post(ref, str(doc["conversation"]), dict(doc["activity"]))
            if d.event == "update":
                self._close(ref, dict(doc["activity"]))
                return self._update(ref)
            if d.event == "reply":
                return self._reply(ref, dict(doc["activity"]), d.msg_id)
        except (ValueError, KeyError, TypeError) as e:
            return Failed(f"teams: not a message ({type(e).__name__})", permanent=True)
        return Failed(f"teams: not a message kind: {d.event[:40]}", permanent=True)

    def _call(self, method: str, url: str, activity: dict[str, Any]) -> httpx.Response | Failed:
        token = self.token()
        if isinstance(token, Failed):
            return token
        headers = {"Authorization": f"Bearer {token}"}
        try:
            r = self.client.request(method, url, json=activity, headers=headers)
        except httpx.HTTPError as e:
            return Failed(f"teams: {type(e).__name__}")
        if r.status_code < 300:
            return r
        if r.status_code == 401:
            with self._lock:
                self._token = None  # fetched anew on the retry
        permanent = r.status_code not in (401, 429) and r.status_code < 500
        return Failed(f"teams: HTTP {r.status_code}", permanent)

    def _activities(self, conversation: str) -> str:
        c = urllib.parse.quote(conversation, safe="")
        return f"{self.service_url}/v3/conversations/{c}/activities"

    def _post(self, ref: str, conversation: str, activity: dict[str, Any]) -> Failed | None:
        record = self.posts.get(ref)
        if any(p.get("conversation") == conversation for p in record.get("posts", [])):
            return None  # posted already (its record written, the outbox's not yet)
        if (closed := record.get("closed")) is not None:  # closed before it was posted
            activity = dict(closed["activity"])
        r = self._call("POST", self._activities(conversation), activity)
        if isinstance(r, Failed):
            return r
        try:
            posted = str(r.json()["id"])
        except (ValueError, KeyError, TypeError):
            posted = ""  # sent, but nothing to update later: said in the record
        post = {"conversation": conversation, "id": posted}
        with self.posts.lock:
            record = self.posts.get(ref)
            self.posts.put(ref, {**record, "posts": [*record.get("posts", []), post]})
        return None

    def _update(self, ref: str) -> Failed | None:
        record = self.posts.get(ref)
        activity = dict(record["closed"]["activity"])
        done = set(record.get("updated") or [])
        for post in record.get("posts", []):
            if not post.get("id") or post["id"] in done:
                continue
            its = urllib.parse.quote(str(post["id"]), safe="")
            url = f"{self._activities(str(post['conversation']))}/{its}"
            r = self._call("PUT", url, {**activity, "id": post["id"]})
            if isinstance(r, Failed):
                return r
            done.add(post["id"])
            with self.posts.lock:
                self.posts.put(ref, {**self.posts.get(ref), "updated": sorted(done)})
        return None

    def _reply(self, ref: str, activity: dict[str, Any], msg_id: str) -> Failed | None:
        """A reminder or an escalation, as a reply to each post of `ref` (`replyToId`: in
        Teams, the card's thread); none once it closed. Each post's reply is recorded under
        the message's id, so a retry after a failure or a crash replies to the rest only."""
        record = self.posts.get(ref)
        if record.get("closed") is not None:
            return None  # answered or gone meanwhile: nothing to remind of
        posts = record.get("posts", [])
        if not posts:  # its card waits in the outbox (a retry): the reply waits behind
            return Failed("teams: the question's card is not posted yet")
        done = set(record.get("replied") or [])
        for post in posts:
            if not post.get("id") or f"{msg_id} {post['id']}" in done:
                continue
            its = urllib.parse.quote(str(post["id"]), safe="")
            url = f"{self._activities(str(post['conversation']))}/{its}"
            r = self._call("POST", url, {**activity, "replyToId": post["id"]})
            if isinstance(r, Failed):
                return r
            done.add(f"{msg_id} {post['id']}")
            with self.posts.lock:
                self.posts.put(ref, {**self.posts.get(ref), "replied": sorted(done)})
        return None

    def close(self) -> None:
        self.client.close()


# -- which ---------------------------------------------------------------------------------
def sender(t: wire.ChannelTarget, state: Path) -> Send:
    """How the inbox sends `t`'s messages (SenderError, one line, for settings it cannot use);
    `state`: the directory a sender keeps its own records in (a Slack channel's posts)."""
    if t.kind == "smtp":
        return smtp_sender(t)
    if t.kind == "slack":
        return SlackSender(t, state / f"{t.name}-posts")
    if t.kind == "command":
        return command_sender(t)
    if t.kind == "pagerduty":
        return PagerDutySender(t)
    if t.kind == "teams":
        return TeamsSender(t, state / f"{t.name}-posts")
    raise SenderError(f"{t.name}: the inbox cannot send {t.kind} messages")


def queued_hook(send: Send) -> Callable[[Delivery], None] | None:
    """What a sender is told as each message enters the outbox (None: nothing)."""
    return send.queued if isinstance(send, (SlackSender, TeamsSender)) else None
