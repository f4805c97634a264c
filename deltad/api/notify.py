"""Notifications: webhooks (a JSON body signed with `X-Deltad-Signature: sha256=<HMAC>`) and
commands (argv, the event as JSON on stdin). The daemon's loop only queues an event; one thread
per target delivers in order and retries with backoff, so a dead receiver slows nobody else.

A notification carries the question (prompt, type, options — never an answer), a deep link to
it in the web page and, with `answer_links: true`, a signed single-use answer link."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import queue
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import structlog

from deltad.daemon.feed import Feed, FeedEvent
from deltad.pacing import Pacing
from deltad.protocol import Workspace

from . import handlers, scopes
from .config import Command, NotifyConfig, Target, Webhook

log = structlog.get_logger("deltad.notify")
QUEUE_CAP = 10_000
Enrich = Callable[[FeedEvent], dict[str, Any]]


def signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class _Worker:
    """One target: its own queue and thread."""

    def __init__(self, target: Target, name: str, enrich: Enrich, quiet: list[Path]) -> None:
        self.target, self.name, self.enrich, self.quiet = target, name, enrich, quiet
        self.queue: queue.Queue[FeedEvent | None] = queue.Queue(QUEUE_CAP)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"deltad-notify-{name}", daemon=True)

    def offer(self, e: FeedEvent) -> None:
        if e.type not in self.target.events or self._excluded(e.workspace):
            return
        try:
            self.queue.put_nowait(e)
        except queue.Full:
            log.error("notify_dropped", target=self.name, event_id=e.id, detail="queue full")

    def _excluded(self, ws: str) -> bool:
        if any(Path(ws).is_relative_to(root) for root in self.quiet):
            return True
        return any(scopes.matches(g, ws) for g in self.target.exclude)

    def _run(self) -> None:
        while (e := self.queue.get()) is not None:
            try:
                self.deliver(self.enrich(e))
            except Exception as err:  # a notification must never take the daemon down
                log.error("notify_failed", target=self.name, event_id=e.id, error=str(err))

    def deliver(self, doc: dict[str, Any]) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)
        self.thread.join(5)


class _WebhookWorker(_Worker):
    target: Webhook

    def __init__(self, target: Webhook, name: str, enrich: Enrich, quiet: list[Path]) -> None:
        super().__init__(target, name, enrich, quiet)
        self.secret = target.signing.read() if target.signing else None
        self.client = httpx.Client(timeout=target.timeout_seconds, follow_redirects=False)

    def deliver(self, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "deltad",
            "X-Deltad-Event": doc["type"],
            "X-Deltad-Delivery": str(doc["id"]),
        }
        if self.secret is not None:
            headers["X-Deltad-Signature"] = signature(self.secret, body)
        t = self.target
        for attempt in range(1, t.max_attempts + 1):
            try:
                r = self.client.post(t.url, content=body, headers=headers)
                if r.status_code < 300:
                    log.info("notify_sent", target=self.name, event_id=doc["id"], attempt=attempt)
                    return
                why = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                why = type(e).__name__
            if attempt == t.max_attempts:
                break
            delay = Pacing(t.backoff_seconds, 300.0).delay(attempt)
            log.warning(
                "notify_retry", target=self.name, event_id=doc["id"], error=why, retry_in_s=delay
            )
            if self.stopping.wait(delay):
                return
        log.error("notify_gave_up", target=self.name, event_id=doc["id"], attempts=t.max_attempts)


class _CommandWorker(_Worker):
    target: Command

    def deliver(self, doc: dict[str, Any]) -> None:
        try:
            done = subprocess.run(
                self.target.argv,
                input=json.dumps(doc).encode(),
                capture_output=True,
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


class Notifier:
    def __init__(
        self,
        config: NotifyConfig,
        feed: Feed,
        quiet_roots: list[Path],
        context: handlers.Context | None,
    ) -> None:
        self.config, self.feed, self.context = config, feed, context
        self.workers: list[_Worker] = [
            _WebhookWorker(w, f"webhook{i}", self.document, quiet_roots)
            for i, w in enumerate(config.webhooks)
        ]
        self.workers += [
            _CommandWorker(c, f"command{i}", self.document, quiet_roots)
            for i, c in enumerate(config.commands)
        ]
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        for w in self.workers:
            w.thread.start()
        self._unsubscribe = self.feed.subscribe(self._offer)

    def _offer(self, e: FeedEvent) -> None:
        for w in self.workers:
            w.offer(e)

    def document(self, e: FeedEvent) -> dict[str, Any]:
        """The event, and for a new question what a person needs to answer it (read on this
        thread, from the disk, never on the daemon's loop)."""
        doc = e.document()
        if e.type != "request.created" or self.context is None:
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
        if self._unsubscribe:
            self._unsubscribe()
        for w in self.workers:
            w.stop()
