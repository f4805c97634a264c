"""Notifications: webhooks (Standard Webhooks: `webhook-id`, `webhook-timestamp`,
`webhook-signature`; deltad/outbound/webhooks.py) and commands (argv, the event as JSON on stdin).

The daemon's loop only queues an event. The one intake thread in the core
(deltad/outbound/intake.py) turns it into a document (read from the disk, never on the loop)
and hands it to each target: a webhook delivery is written into the target's outbox, which
belongs to the inbox process (deltad/outbound/handoff.py), and the inbox process
(unprivileged: a `Courier` per target, deltad/outbound/courier.py, with the HTTP POST
transport of deltad/outbound/senders.py) attempts it, so the core never speaks to
a receiver, and a stop, a crash of either process or a dead receiver loses nothing and a slow
target slows nobody else. A command's event is handed over the same way and
the inbox process runs the command, as its own user (deltad/outbound/senders.py): no command
runs as root.

A notification carries the question (prompt, type, options — never an answer), a deep link to
it in the web page and, with `answer_links: true`, a signed single-use answer link."""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from deltad.inbox import scopes
from deltad.inbox.config import Command, NotifyConfig, Target, Webhook
from deltad.inbox.feed import FeedEvent
from deltad.outbound import webhooks
from deltad.outbound.handoff import Handoff
from deltad.outbound.outbox import (
    Delivery,
    target_key,
)
from deltad.protocol import Workspace
from deltad.wire import WebhookTarget

if TYPE_CHECKING:  # the core's side: the inbox process loads this module for its worker only
    from deltad.inbox import handlers

log = structlog.get_logger("deltad.notify")
# A delivery's body at most: with `outbox_max` it bounds what one target holds on disk.
DELIVERY_MAX = 64 * 1024
CONTEXT_TEXT_MAX = 2048  # characters of each text in a question's `context`, in a delivery
CONTEXT_CALLS_MAX = 5  # the latest tool calls of a `context`, in a delivery
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


class _WebhookRoute:
    """A webhook target as the core sees it: which events it wants, and the hand-off of each
    delivery to the inbox process, which makes the attempts (deltad/outbound/handoff.py)."""

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
    """The feed's events, made into documents on the intake's thread, each handed to the inbox
    process through `handoff` (which POSTs the webhooks and runs the commands)."""

    def __init__(
        self,
        config: NotifyConfig,
        quiet_roots: list[Path],
        context: handlers.Context | None,
        handoff: Handoff,
    ) -> None:
        self.config, self.context = config, context
        self.handoff = handoff
        self.routes: list[_WebhookRoute | _CommandRoute] = [
            _WebhookRoute(w, quiet_roots, handoff) for w in config.webhooks
        ]
        for i, c in enumerate(config.commands):
            name = f"command{i}"
            if target_key(name) not in handoff.channel_of:
                raise ValueError(f"notify.commands: {name}: the inbox process was not given it")
            self.routes.append(_CommandRoute(c, name, quiet_roots, handoff, target_key(name)))

    def outbox_depth(self) -> int:
        """Deliveries waiting in the webhooks' outbox, as the inbox last told (metrics)."""
        return self.handoff.depth

    # -- a consumer of the intake (deltad/outbound/intake.py) ----------------------------------
    def wants(self, e: FeedEvent) -> bool:
        return any(w.wants(e) for w in self.routes)

    def take(self, e: FeedEvent) -> None:
        doc = self.document(e)
        for w in self.routes:
            if w.wants(e):
                w.submit(doc)

    def dropped(self, e: FeedEvent) -> None:
        log.error("notify_dropped", event_id=e.id, detail="queue full")

    def failed(self, e: FeedEvent, err: Exception) -> None:
        log.error("notify_failed", event_id=e.id, error=str(err))

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
