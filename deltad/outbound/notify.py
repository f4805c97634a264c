"""Notifications: webhooks (Standard Webhooks: `webhook-id`, `webhook-timestamp`,
`webhook-signature`; deltad/outbound/webhooks.py) and commands (argv, the event as JSON on stdin).

The daemon's loop only queues an event. One intake thread in the core turns it into a document
(read from the disk, never on the loop) and hands it to each target: a webhook delivery is
written into the target's outbox, which belongs to the inbox process (deltad/privsep/handoff.py),
and the inbox process (unprivileged, `WebhookWorker`, one thread per target) attempts it, so the
core never speaks to a receiver, and a stop, a crash of either process or a dead receiver loses
nothing and a slow target slows nobody else. A command's event is handed over the same way and
the inbox process runs the command, as its own user (deltad/outbound/senders.py): no command
runs as root. (A Notifier made without the inbox's hand-off, in tests, runs them itself.)

A notification carries the question (prompt, type, options — never an answer), a deep link to
it in the web page and, with `answer_links: true`, a signed single-use answer link."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import random
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import structlog

from deltad.inbox import scopes
from deltad.inbox.config import Command, NotifyConfig, Target, Webhook
from deltad.inbox.feed import Feed, FeedEvent
from deltad.outbound import webhooks
from deltad.outbound.outbox import (
    DEAD_LETTER,
    Dead,
    Delivery,
    Outbox,
    Policy,
    after_failure,
    target_key,
    too_old,
)
from deltad.outbound.outbox import FILE_MAX as FILE_MAX
from deltad.outbound.outbox import load_capped as _load_capped
from deltad.privsep.handoff import NEW, Handoff
from deltad.privsep.wire import WebhookTarget
from deltad.protocol import Workspace

if TYPE_CHECKING:  # the core's side: the inbox process loads this module for its worker only
    from deltad.inbox import handlers

log = structlog.get_logger("deltad.notify")
QUEUE_CAP = 10_000
STOP_WAIT = 10.0  # seconds a stop waits for queued events to reach the outbox
# A delivery's body at most: with `outbox_max` it bounds what one target holds on disk.
DELIVERY_MAX = 64 * 1024
CONTEXT_TEXT_MAX = 2048  # characters of each text in a question's `context`, in a delivery
CONTEXT_CALLS_MAX = 5  # the latest tool calls of a `context`, in a delivery
RESPONSE_MAX = 64 * 1024  # bytes of a receiver's answer read at most; the rest is never read
# Events that ask someone to answer, and carry the question: a new one, a reminder of it, its
# escalation (the escalated-to respondents are in `escalated_to`) and its SLA passing.
ASKING = ("request.created", "request.reminder", "request.escalated", "request.overdue")


# -- what a delivery carries (pure) ---------------------------------------------------------
def _cut(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[:limit] + "\u2026", True)


def trimmed_context(context: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A question's `context` as a delivery carries it: each text cut to CONTEXT_TEXT_MAX
    characters (ending in an ellipsis) and the latest CONTEXT_CALLS_MAX tool calls (the rest
    counted in `tool_calls_omitted`); and whether anything was cut. A tenant writes it: the
    full one is what `GET /v1/requests/{id}` answers."""
    out, cut = dict(context), False
    for key in ("task", "last_message", "reviewed_output"):
        if isinstance(out.get(key), str):
            out[key], was = _cut(out[key], CONTEXT_TEXT_MAX)
            cut |= was
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        kept = calls[-CONTEXT_CALLS_MAX:]
        if len(kept) < len(calls):
            omitted = out.get("tool_calls_omitted")
            out["tool_calls_omitted"] = (
                (omitted if isinstance(omitted, int) else 0) + len(calls) - len(kept)
            )
            cut = True
        steps = []
        for step in kept:
            if isinstance(step, dict):
                step = dict(step)
                for key in ("result", "arguments"):
                    v = step.get(key)
                    text = v if isinstance(v, str) else json.dumps(v)
                    if len(text) > CONTEXT_TEXT_MAX:
                        step[key], _ = _cut(text, CONTEXT_TEXT_MAX)
                        cut = True
            steps.append(step)
        out["tool_calls"] = steps
    return out, cut


def delivery_body(doc: dict[str, Any]) -> str:
    """The JSON a webhook delivery sends, at most DELIVERY_MAX bytes: the question's `context`
    trimmed (then `request.context_truncated: true`); if still too large, the question itself
    left out (then `request_truncated: true`: the receiver fetches it from `url`)."""
    request = doc.get("request")
    if isinstance(request, dict) and isinstance(request.get("context"), dict):
        context, cut = trimmed_context(request["context"])
        if cut:
            doc = {**doc, "request": {**request, "context": context, "context_truncated": True}}
    body = json.dumps(doc)
    if len(body.encode()) <= DELIVERY_MAX:
        return body
    slim = {k: v for k, v in doc.items() if k not in ("request",)}
    slim["request_truncated"] = True
    body = json.dumps(slim)
    if len(body.encode()) <= DELIVERY_MAX:
        return body
    # What is left is the daemon's own (ids, paths, links): only a workspace path this long.
    keep = ("id", "type", "at", "request_id", "run_id", "url")
    return json.dumps({k: doc[k] for k in keep if k in doc} | {"truncated": True})


def _wanted(target: Target, quiet: list[Path], e: FeedEvent) -> bool:
    if e.type not in target.events:
        return False
    if any(Path(e.workspace).is_relative_to(root) for root in quiet):
        return False
    return not any(scopes.matches(g, e.workspace) for g in target.exclude)


class _Worker:
    """One target and its thread."""

    def __init__(self, target: Target, name: str, quiet: list[Path]) -> None:
        self.target, self.name, self.quiet = target, name, quiet
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"deltad-notify-{name}", daemon=True)

    def wants(self, e: FeedEvent) -> bool:
        return _wanted(self.target, self.quiet, e)

    def submit(self, doc: dict[str, Any]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)


def webhook_target(target: Webhook, name: str) -> WebhookTarget:
    """What the inbox is told of a webhook: its settings and its signing key (read here, by
    the core; SecretError names the target)."""
    try:
        key = webhooks.signing_key(target.signing.read()) if target.signing else None
    except webhooks.SecretError as e:
        raise webhooks.SecretError(f"{name}: {e}") from None
    return WebhookTarget(
        name=name,
        key=target_key(target.url),
        url=target.url,
        signing_key=base64.b64encode(key).decode() if key is not None else None,
        timeout_seconds=target.timeout_seconds,
        max_attempts=target.max_attempts,
        backoff_seconds=target.backoff_seconds,
        backoff_max_seconds=target.backoff_max_seconds,
        max_age_seconds=target.max_age_seconds,
        outbox_max=target.outbox_max,
    )


def new_delivery(doc: dict[str, Any], url: str, now: float) -> Delivery:
    """A delivery of the event `doc` to `url`: its webhook-id and body fixed for its life."""
    return Delivery(
        msg_id=f"msg_{uuid.uuid4().hex}",
        event_id=int(doc["id"]),
        event=str(doc["type"]),
        url=url,
        body=delivery_body(doc),
        created_at=now,
        next_at=now,
    )


RESCAN_SECONDS = 30.0  # the inbox looks in `new/` this often even without the core's hint


class Results:
    """The inbox's deliveries by result and what waits, told to the core for its /metrics
    (`report` is called after each change, from the targets' threads)."""

    def __init__(self, report: Callable[[dict[str, int]], None] | None = None) -> None:
        self.report = report
        self.counts = {"delivered": 0, "retry": 0, "dead": 0}
        self.workers: list[WebhookWorker] = []
        self._lock = threading.Lock()

    def count(self, result: str) -> None:
        with self._lock:
            self.counts[result] += 1
        self.changed()

    def depth(self) -> int:
        return sum(w.depth() for w in self.workers)

    def changed(self) -> None:
        if self.report is not None:
            with self._lock:
                doc = {**self.counts, "depth": self.depth()}
            self.report(doc)


class WebhookWorker:
    """One webhook target in the inbox process: its deliveries wait in its outbox; the due one
    with the oldest event goes first, and one waiting for its retry never holds up the others
    (no head-of-line blocking). What the core hands over is taken from `new/` (on the core's
    hint, at start and every RESCAN_SECONDS)."""

    def __init__(
        self,
        target: WebhookTarget,
        state_dir: Path,
        results: Results | None = None,
        named: Path | None = None,
    ) -> None:
        """`state_dir`: where the outbox is reached (the inbox's /proc/self/fd/N); `named`:
        the same directory as an operator names it, in log lines."""
        self.target, self.name = target, target.name
        self.named_dead = (named or state_dir) / DEAD_LETTER / target.key
        self.results = results if results is not None else Results()
        self.results.workers.append(self)
        self.stopping = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"deltad-notify-{self.name}", daemon=True
        )
        self.key = base64.b64decode(target.signing_key) if target.signing_key else None
        self.policy = Policy(
            target.max_attempts,
            target.max_age_seconds,
            target.backoff_seconds,
            target.backoff_max_seconds,
        )
        self.outbox = Outbox(state_dir, target.url)
        self.new_dir = self.outbox.pending_dir / NEW
        # No pooled connections: each attempt connects, so its deadline can cut it off.
        self.client = httpx.Client(
            timeout=target.timeout_seconds,
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self._cond = threading.Condition()
        self._pending: dict[str, Delivery] = {}
        self._hinted = False
        self._replay()

    def _replay(self) -> None:
        """What a previous inbox left waiting is sent again, under the same webhook-id."""
        found, bad = self.outbox.load()
        for path in bad:
            self.outbox.bury_file(path)
            log.error("notify_dead_letter", target=self.name, file=path.name, reason="unreadable")
        # A wall clock set back must not park a delivery for long: at most one backoff away.
        latest = time.time() + self.policy.backoff_max
        self._pending = {d.msg_id: replace(d, next_at=min(d.next_at, latest)) for d in found}
        if found:
            log.info("notify_replay", target=self.name, deliveries=len(found))
        self.take_new()

    # -- what the core handed over ------------------------------------------------------------
    def hint(self) -> None:
        """The core wrote into `new/` (from the thread reading the core's socket: never waits
        on a file)."""
        with self._cond:
            self._hinted = True
            self._cond.notify()

    def take_new(self) -> int:
        """Move what waits in `new/` into this target's outbox, oldest event first; how many.
        A file that is not a delivery of this target goes to the dead letter."""
        taken = 0
        try:
            names = sorted(n for n in os.listdir(self.new_dir) if n.endswith(".json"))
        except FileNotFoundError:
            return 0
        for name in names:
            path = self.outbox.pending_dir / name
            try:
                os.rename(self.new_dir / name, path)
            except FileNotFoundError:
                continue
            try:
                d = _load_capped(path)
                if d.url != self.target.url or d.file_name != name:
                    raise ValueError("not this target's")
            except (OSError, ValueError, TypeError):
                self.outbox.bury_file(path)
                log.error("notify_dead_letter", target=self.name, file=name, reason="unreadable")
                continue
            with self._cond:
                if d.msg_id not in self._pending:
                    self._make_room()
                    self._pending[d.msg_id] = d
                    taken += 1
                    self._cond.notify()
        if taken:
            self.results.changed()
        return taken

    def depth(self) -> int:
        return len(self._pending)  # a plain length: read by the metrics' report

    def _count(self, result: str) -> None:
        self.results.count(result)

    def _make_room(self) -> None:
        while len(self._pending) >= self.target.outbox_max:
            oldest = min(self._pending.values(), key=lambda d: d.event_id)
            self._bury(oldest, "outbox_full")

    # -- this target's thread -----------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while (d := self._next_due()) is not None:
            try:
                self._attempt(d)
            except Exception as err:  # a notification must never take the inbox down
                log.error("notify_failed", target=self.name, event_id=d.event_id, error=str(err))
                self._park(d)

    def _park(self, d: Delivery) -> None:
        """After an unexpected error (a full disk, say), wait the longest backoff: never a busy
        loop of attempts."""
        with self._cond:
            if (held := self._pending.get(d.msg_id)) is not None:
                later = time.time() + self.policy.backoff_max
                self._pending[d.msg_id] = replace(held, next_at=later)

    def _next_due(self) -> Delivery | None:
        """Wait for the due delivery of the oldest event; None once stopping. What the core
        handed over is taken first (on its hint, or every RESCAN_SECONDS)."""
        look_at = time.monotonic() + RESCAN_SECONDS
        while not self.stopping.is_set():
            with self._cond:
                hinted, self._hinted = self._hinted, False
            if hinted or time.monotonic() >= look_at:
                look_at = time.monotonic() + RESCAN_SECONDS
                try:
                    self.take_new()
                except OSError as err:
                    log.error("notify_failed", target=self.name, error=str(err))
            with self._cond:
                if self._hinted or self.stopping.is_set():
                    continue
                now = time.time()
                due = [d for d in self._pending.values() if d.next_at <= now]
                if due:
                    return min(due, key=lambda d: d.event_id)
                soonest = min((d.next_at for d in self._pending.values()), default=now + 60)
                wait = min(soonest - now, look_at - time.monotonic())
                self._cond.wait(max(0.01, wait))
        return None

    def _attempt(self, d: Delivery) -> None:
        if too_old(d, time.time(), self.policy):
            self._bury(d, "max_age")
            return
        body = d.body.encode()
        headers = webhooks.headers(d.msg_id, int(time.time()), body, self.key, d.event)
        status = post_within(
            self.client, self.target.url, body, headers, self.target.timeout_seconds
        )
        if isinstance(status, str):
            self._failed(d, status)
        elif 200 <= status < 300:
            self._delivered(d)
        else:
            self._failed(d, f"HTTP {status}")

    def _delivered(self, d: Delivery) -> None:
        with self._cond:
            self.outbox.remove(d)  # first: a delivery that got a 2xx is never sent again
            self._pending.pop(d.msg_id, None)
        self._count("delivered")
        log.info(
            "notify_sent",
            target=self.name,
            event_id=d.event_id,
            webhook_id=d.msg_id,
            attempt=d.attempts + 1,
        )

    def _failed(self, d: Delivery, why: str) -> None:
        d = replace(d, attempts=d.attempts + 1, last_error=why)
        step = after_failure(d, time.time(), self.policy, random.random())
        if isinstance(step, Dead):
            self._bury(d, step.reason)
            return
        d = replace(d, next_at=step.at)
        with self._cond:
            if d.msg_id not in self._pending:
                return  # pushed out meanwhile (outbox_full)
            self._pending[d.msg_id] = d  # first: a disk that fails must not mean a busy loop
            self.outbox.save(d)
        self._count("retry")
        log.warning(
            "notify_retry",
            target=self.name,
            event_id=d.event_id,
            webhook_id=d.msg_id,
            attempt=d.attempts,
            error=why,
            retry_in_s=round(step.at - time.time(), 3),
        )

    def _bury(self, d: Delivery, reason: str) -> None:
        with self._cond:
            if self._pending.pop(d.msg_id, None) is None:
                return
            self.outbox.bury(d, reason)
            pruned = self.outbox.prune_dead(self.target.outbox_max)
        self._count("dead")
        log.error(
            "notify_dead_letter",
            target=self.name,
            event_id=d.event_id,
            webhook_id=d.msg_id,
            attempts=d.attempts,
            reason=reason,
            error=d.last_error,
            file=str(self.named_dead / d.file_name),
        )
        if pruned:
            log.warning("notify_dead_letter_pruned", target=self.name, deleted=pruned)

    def stop(self) -> None:
        self.stopping.set()
        with self._cond:
            self._cond.notify()
        self.thread.join(5)
        if not self.thread.is_alive():  # else an attempt still hangs: the process exit ends it
            self.client.close()


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


class _CommandWorker(_Worker):
    """Runs its command once per event, in order (not kept across restarts: a command is a
    local action, not a delivery to wait for)."""

    target: Command

    def __init__(self, target: Command, name: str, quiet: list[Path]) -> None:
        super().__init__(target, name, quiet)
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_CAP)

    def submit(self, doc: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(doc)
        except queue.Full:
            log.error("notify_dropped", target=self.name, event_id=doc["id"], detail="queue full")

    def _run(self) -> None:
        while (doc := self.queue.get()) is not None:
            try:
                self.deliver(doc)
            except Exception as err:  # a notification must never take the daemon down
                log.error("notify_failed", target=self.name, event_id=doc["id"], error=str(err))

    def deliver(self, doc: dict[str, Any]) -> None:
        try:
            done = subprocess.run(
                self.target.argv,
                input=json.dumps(doc).encode(),
                # Its output is not wanted: never read into the daemon's memory.
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=self.target.timeout_seconds,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            log.error("notify_failed", target=self.name, event_id=doc["id"], error=str(e))
            return
        if done.returncode != 0:
            log.warning(
                "notify_command_failed", target=self.name, event_id=doc["id"], rc=done.returncode
            )
        else:
            log.info("notify_sent", target=self.name, event_id=doc["id"])

    def stop(self) -> None:
        self.stopping.set()
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)
        self.thread.join(5)


class _WebhookRoute:
    """A webhook target as the core sees it: which events it wants, and the hand-off of each
    delivery to the inbox process, which makes the attempts (deltad/privsep/handoff.py)."""

    def __init__(self, target: Webhook, quiet: list[Path], handoff: Handoff) -> None:
        self.target, self.quiet, self.handoff = target, quiet, handoff

    def wants(self, e: FeedEvent) -> bool:
        return _wanted(self.target, self.quiet, e)

    def submit(self, doc: dict[str, Any]) -> None:
        self.handoff.put(new_delivery(doc, self.target.url, time.time()))


class _CommandRoute:
    """A command as the core sees it under the daemon: which events it wants, and the hand-off
    of each event's document (a delivery's body: at most DELIVERY_MAX bytes, a tenant's
    `context` trimmed) to the inbox process, which runs the command."""

    def __init__(
        self, target: Command, name: str, quiet: list[Path], handoff: Handoff, key: str
    ) -> None:
        self.target, self.name, self.quiet = target, name, quiet
        self.handoff, self.key = handoff, key

    def wants(self, e: FeedEvent) -> bool:
        return _wanted(self.target, self.quiet, e)

    def submit(self, doc: dict[str, Any]) -> None:
        self.handoff.put(new_delivery(doc, self.name, time.time()), self.key)


class Notifier:
    """The feed's events, made into documents on one intake thread: commands run here (in the
    core), webhook deliveries are handed to the inbox process through `handoff`."""

    def __init__(
        self,
        config: NotifyConfig,
        feed: Feed,
        quiet_roots: list[Path],
        context: handlers.Context | None,
        handoff: Handoff | None,
    ) -> None:
        self.config, self.feed, self.context = config, feed, context
        self.handoff = handoff
        self.routes: list[_WebhookRoute | _CommandWorker | _CommandRoute] = []
        if handoff is not None:
            self.routes += [_WebhookRoute(w, quiet_roots, handoff) for w in config.webhooks]
        self.workers: list[_CommandWorker] = []
        for i, c in enumerate(config.commands):
            name = f"command{i}"
            handed = isinstance(handoff, Handoff) and target_key(name) in handoff.channel_of
            if handed:
                assert handoff is not None
                self.routes.append(_CommandRoute(c, name, quiet_roots, handoff, target_key(name)))
            else:
                self.workers.append(_CommandWorker(c, name, quiet_roots))
        self.routes += self.workers
        self._queue: queue.Queue[FeedEvent | None] = queue.Queue(QUEUE_CAP)
        self._intake = threading.Thread(target=self._take_all, name="deltad-notify", daemon=True)
        self._unsubscribe: Callable[[], None] | None = None

    def outbox_depth(self) -> int:
        """Deliveries waiting in the webhooks' outbox, as the inbox last told (metrics)."""
        return self.handoff.depth if self.handoff is not None else 0

    def start(self) -> None:
        for w in self.workers:
            w.thread.start()
        self._intake.start()
        self._unsubscribe = self.feed.subscribe(self._offer)

    def _offer(self, e: FeedEvent) -> None:
        """On the daemon's loop: queue, never wait."""
        if not any(w.wants(e) for w in self.routes):
            return
        try:
            self._queue.put_nowait(e)
        except queue.Full:
            log.error("notify_dropped", event_id=e.id, detail="queue full")

    def _take_all(self) -> None:
        while (e := self._queue.get()) is not None:
            try:
                self._take(e)
            except Exception as err:  # a notification must never take the daemon down
                log.error("notify_failed", event_id=e.id, error=str(err))

    def _take(self, e: FeedEvent) -> None:
        doc = self.document(e)
        for w in self.routes:
            if w.wants(e):
                w.submit(doc)

    def document(self, e: FeedEvent) -> dict[str, Any]:
        """The event, and for a new question what a person needs to answer it (read on this
        thread, from the disk, never on the daemon's loop)."""
        doc = e.document()
        if e.type not in ASKING or self.context is None:
            return doc
        from deltad.inbox import handlers

        ctx = self.context
        with contextlib.suppress(handlers.ApiError):
            p = handlers.pending_question(Path(e.workspace))
            if p is not None and p.request.request_id == doc["request_id"]:
                doc["request"] = handlers.request_document(
                    p, Workspace(Path(p.workspace)), ctx.base_url
                )
                doc["url"] = doc["request"]["url"]
                if self.config.answer_links:
                    doc["answer_link"] = handlers.link_for(ctx, doc["request_id"], e.workspace)
        return doc

    def stop(self) -> None:
        """What is queued reaches the inbox's outbox first (a SIGTERM loses no delivery)."""
        if self._unsubscribe:
            self._unsubscribe()
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=STOP_WAIT)
        if self._intake.is_alive():
            self._intake.join(STOP_WAIT)
        for w in self.workers:
            w.stop()
