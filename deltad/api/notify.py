"""Notifications: webhooks (Standard Webhooks: `webhook-id`, `webhook-timestamp`,
`webhook-signature`; deltad/api/webhooks.py) and commands (argv, the event as JSON on stdin).

The daemon's loop only queues an event. One intake thread turns it into a document (read from
the disk, never on the loop) and hands it to each target: a webhook delivery is first written to
the target's outbox in the state dir (deltad/api/outbox.py), then its own thread attempts it, so
a stop, a crash or a dead receiver loses nothing and a slow target slows nobody else.

A notification carries the question (prompt, type, options — never an answer), a deep link to
it in the web page and, with `answer_links: true`, a signed single-use answer link."""

from __future__ import annotations

import contextlib
import json
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
from typing import Any

import httpx
import structlog
from prometheus_client import Counter

from deltad.inbox.feed import Feed, FeedEvent
from deltad.protocol import Workspace

from . import handlers, scopes, webhooks
from .config import Command, NotifyConfig, Target, Webhook
from .outbox import Dead, Delivery, Outbox, Policy, after_failure, bury_orphans, too_old

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


class _Worker:
    """One target and its thread."""

    def __init__(self, target: Target, name: str, quiet: list[Path]) -> None:
        self.target, self.name, self.quiet = target, name, quiet
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"deltad-notify-{name}", daemon=True)

    def wants(self, e: FeedEvent) -> bool:
        return e.type in self.target.events and not self._excluded(e.workspace)

    def _excluded(self, ws: str) -> bool:
        if any(Path(ws).is_relative_to(root) for root in self.quiet):
            return True
        return any(scopes.matches(g, ws) for g in self.target.exclude)

    def submit(self, doc: dict[str, Any]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)


class _WebhookWorker(_Worker):
    """Deliveries wait in the outbox; the due one with the oldest event goes first, and one
    waiting for its retry never holds up the others (no head-of-line blocking)."""

    target: Webhook

    def __init__(
        self,
        target: Webhook,
        name: str,
        quiet: list[Path],
        state_dir: Path,
        counted: Counter | None = None,
    ) -> None:
        super().__init__(target, name, quiet)
        self.counted = counted  # deliveries by result (deltad/metrics.py)
        try:
            self.key = webhooks.signing_key(target.signing.read()) if target.signing else None
        except webhooks.SecretError as e:
            raise webhooks.SecretError(f"{name}: {e}") from None
        self.policy = Policy(
            target.max_attempts,
            target.max_age_seconds,
            target.backoff_seconds,
            target.backoff_max_seconds,
        )
        self.outbox = Outbox(state_dir, target.url)
        # No pooled connections: each attempt connects, so its deadline can cut it off.
        self.client = httpx.Client(
            timeout=target.timeout_seconds,
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self._cond = threading.Condition()
        self._pending: dict[str, Delivery] = {}
        self._replay()

    def _replay(self) -> None:
        """What a previous daemon left waiting is sent again, under the same webhook-id."""
        found, bad = self.outbox.load()
        for path in bad:
            self.outbox.bury_file(path)
            log.error("notify_dead_letter", target=self.name, file=path.name, reason="unreadable")
        # A wall clock set back must not park a delivery for long: at most one backoff away.
        latest = time.time() + self.policy.backoff_max
        self._pending = {d.msg_id: replace(d, next_at=min(d.next_at, latest)) for d in found}
        if found:
            log.info("notify_replay", target=self.name, deliveries=len(found))

    # -- the intake thread --------------------------------------------------------------------
    def submit(self, doc: dict[str, Any]) -> None:
        now = time.time()
        d = Delivery(
            msg_id=f"msg_{uuid.uuid4().hex}",
            event_id=int(doc["id"]),
            event=str(doc["type"]),
            url=self.target.url,
            body=delivery_body(doc),
            created_at=now,
            next_at=now,
        )
        with self._cond:
            self._make_room()
            self.outbox.save(d)  # on disk before the first attempt
            self._pending[d.msg_id] = d
            self._cond.notify()

    def depth(self) -> int:
        return len(self._pending)  # a plain length: read by the metrics' scrape

    def _count(self, result: str) -> None:
        if self.counted is not None:
            self.counted.labels(result).inc()

    def _make_room(self) -> None:
        while len(self._pending) >= self.target.outbox_max:
            oldest = min(self._pending.values(), key=lambda d: d.event_id)
            self._bury(oldest, "outbox_full")

    # -- this target's thread -----------------------------------------------------------------
    def _run(self) -> None:
        while (d := self._next_due()) is not None:
            try:
                self._attempt(d)
            except Exception as err:  # a notification must never take the daemon down
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
        """Wait for the due delivery of the oldest event; None once stopping."""
        with self._cond:
            while not self.stopping.is_set():
                now = time.time()
                due = [d for d in self._pending.values() if d.next_at <= now]
                if due:
                    return min(due, key=lambda d: d.event_id)
                soonest = min((d.next_at for d in self._pending.values()), default=now + 60)
                self._cond.wait(max(0.01, soonest - now))
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
            file=str(self.outbox.dead_dir / d.file_name),
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


class Notifier:
    def __init__(
        self,
        config: NotifyConfig,
        feed: Feed,
        quiet_roots: list[Path],
        context: handlers.Context | None,
        state_dir: Path,
        deliveries: Counter | None = None,
    ) -> None:
        self.config, self.feed, self.context = config, feed, context
        moved = bury_orphans(state_dir, [w.url for w in config.webhooks])
        if moved:
            log.warning("notify_dead_letter", reason="target_removed", deliveries=moved)
        self.workers: list[_Worker] = [
            _WebhookWorker(w, f"webhook{i}", quiet_roots, state_dir, deliveries)
            for i, w in enumerate(config.webhooks)
        ]
        self.workers += [
            _CommandWorker(c, f"command{i}", quiet_roots) for i, c in enumerate(config.commands)
        ]
        self._queue: queue.Queue[FeedEvent | None] = queue.Queue(QUEUE_CAP)
        self._intake = threading.Thread(target=self._take_all, name="deltad-notify", daemon=True)
        self._unsubscribe: Callable[[], None] | None = None

    def outbox_depth(self) -> int:
        """Deliveries waiting in every webhook's outbox (metrics)."""
        return sum(w.depth() for w in self.workers if isinstance(w, _WebhookWorker))

    def start(self) -> None:
        for w in self.workers:
            w.thread.start()
        self._intake.start()
        self._unsubscribe = self.feed.subscribe(self._offer)

    def _offer(self, e: FeedEvent) -> None:
        """On the daemon's loop: queue, never wait."""
        if not any(w.wants(e) for w in self.workers):
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
        for w in self.workers:
            if w.wants(e):
                w.submit(doc)

    def document(self, e: FeedEvent) -> dict[str, Any]:
        """The event, and for a new question what a person needs to answer it (read on this
        thread, from the disk, never on the daemon's loop)."""
        doc = e.document()
        if e.type not in ASKING or self.context is None:
            return doc
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
        """What is queued reaches the outbox first (a SIGTERM loses no delivery)."""
        if self._unsubscribe:
            self._unsubscribe()
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=STOP_WAIT)
        if self._intake.is_alive():
            self._intake.join(STOP_WAIT)
        for w in self.workers:
            w.stop()
