"""Escalations as PagerDuty alerts (Events API v2): the question nobody answered in time pages
the on-call of a PagerDuty service (docs/inbox.md, "PagerDuty").

    send(question)    an escalation only (`follow_up == "escalation"`): a `trigger` with one
                      dedup key per question (the workspace and the request id, digested),
                      its summary the prompt, a link to the question on the page when there is
                      one. A record named by the key (the channel's state dir) says it paged.
    withdraw(closed)  a question that paged closed (answered on any channel, or expired): a
                      `resolve` with the same key, once; the record goes.

The first asking and reminders page nobody: they are the other channels'. Nothing here touches
the network: the inbox process sends, with the integration key it was handed
(deltad/outbound/senders.py, `PagerDutySender`); no outbox file holds the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import time
from typing import Any

import structlog

from deltad.outbound.base import Channel, Closed, Context, Question
from deltad.outbound.config import PagerDutyConfig
from deltad.outbound.courier import Handed
from deltad.protocol import atomic_write_json, iso, utcnow
from deltad.protocol.printable import show_path

log = structlog.get_logger("deltad.channels")

SUMMARY_MAX = 1024  # PagerDuty's limit on `payload.summary`
DETAIL_CHARS = 600  # the task, as the other channels cut it


def dedup_key(workspace: str, request_id: str) -> str:
    """One alert per question: keyed by the workspace too (a request id copied into another
    workspace is that workspace's own question). 47 characters; PagerDuty allows 255."""
    digest = hashlib.sha256(f"{workspace}\0{request_id}".encode(errors="surrogateescape"))
    return f"deltad-{digest.hexdigest()[:40]}"


def trigger(question: Question, source: str, severity: str, page: str | None) -> dict[str, Any]:
    """The Events API v2 `trigger` for an escalated question, without its `routing_key`."""
    r = question.request
    shown = show_path(str(question.workspace))
    details: dict[str, Any] = {
        "workspace": shown,
        "request_id": r.request_id,
        "input_type": str(r.input_type),
        "asked_at": iso(r.timestamp),
        "escalated_to": list(question.only),
    }
    if r.expires_at is not None:
        details["expires_at"] = iso(r.expires_at)
    if question.task:
        details["task"] = question.task[:DETAIL_CHARS]
    event: dict[str, Any] = {
        "event_action": "trigger",
        "dedup_key": dedup_key(shown, r.request_id),
        "payload": {
            "summary": f"Unanswered: {r.prompt}"[:SUMMARY_MAX],
            "source": source,
            "severity": severity,
            "timestamp": iso(utcnow()),
            "component": "deltad",
            "class": "question unanswered",
            "custom_details": details,
        },
        "client": "deltad",
    }
    if page is not None:
        event["links"] = [{"href": page, "text": "Answer it on the inbox page"}]
    return event


def resolve(workspace: str, request_id: str) -> dict[str, Any]:
    return {"event_action": "resolve", "dedup_key": dedup_key(workspace, request_id)}


class PagerDutyChannel(Channel):
    name = "pagerduty"

    def __init__(self, config: PagerDutyConfig, ctx: Context) -> None:
        self.config, self.ctx = config, ctx
        self.paged = ctx.state_dir / "paged"
        self.paged.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.source = config.source or socket.gethostname()
        self.courier = Handed(self.name, ctx.hand)

    def start(self) -> None:
        self.courier.start()

    def stop(self) -> None:
        self.courier.stop()

    def send(self, question: Question) -> None:
        if question.follow_up != "escalation":
            return
        r = question.request
        shown = show_path(str(question.workspace))
        key = dedup_key(shown, r.request_id)
        record = self.paged / key
        if record.exists():
            return  # told again (a restart): paged once
        page = self.ctx.page(r.request_id) if self.ctx.page is not None else None
        event = trigger(question, self.source, self.config.severity, page)
        # The record first: a resolve is never missed for an alert that went out.
        paged = {"workspace": shown, "request_id": r.request_id, "at": time.time()}
        atomic_write_json(record, paged)
        self.courier.put("trigger", "trigger", json.dumps(event))
        log.info("pagerduty_triggered", request_id=r.request_id, workspace=shown, dedup_key=key)

    def withdraw(self, closed: Closed) -> None:
        shown = show_path(str(closed.workspace))
        key = dedup_key(shown, closed.request_id)
        record = self.paged / key
        if not record.exists():
            return  # never paged
        self.courier.put("resolve", "resolve", json.dumps(resolve(shown, closed.request_id)))
        with contextlib.suppress(FileNotFoundError):
            record.unlink()
        log.info(
            "pagerduty_resolved",
            request_id=closed.request_id,
            workspace=shown,
            dedup_key=key,
            how=closed.how,
        )
