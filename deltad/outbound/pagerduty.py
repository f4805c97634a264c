"""Escalations as PagerDuty alerts (Events API v2): the question nobody answered in time pages
the on-call of a PagerDuty service (docs/inbox.md, "PagerDuty").

    send(question)    an escalation only (`follow_up == "escalation"`): a `trigger` with one
                      dedup key per question (the workspace and the request id, digested),
                      its summary the prompt, a link to the question on the page when there is
                      one. A record named by the key (the channel's state dir) says it paged.
    withdraw(closed)  a question that paged closed (answered on any channel, or expired): a
                      `resolve` with the same key, once; the record goes.
    sweep(now)        at start and then at most hourly: an alert whose question is no longer
                      open on disk (its workspace removed, or a close no event told) is
                      resolved too, so no alert outlives its question.

The first asking and reminders page nobody: they are the other channels'. Nothing here touches
the network: the inbox process sends, with the integration key it was handed
(deltad/outbound/senders.py, `PagerDutySender`); no outbox file holds the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import structlog

from deltad.inbox import views
from deltad.outbound.base import Channel, Closed, Context, Question
from deltad.outbound.config import PagerDutyConfig
from deltad.outbound.courier import Handed
from deltad.protocol import atomic_write_json, iso, utcnow
from deltad.protocol.fsio import read_regular
from deltad.protocol.printable import show_path

log = structlog.get_logger("deltad.channels")

SUMMARY_MAX = 1024  # PagerDuty's limit on `payload.summary`
DETAIL_CHARS = 600  # the task, as the other channels cut it
SWEEP_EVERY = 3600.0  # seconds between looks for alerts whose question is gone
RECORD_MAX = 64 * 1024  # bytes of one alert's record


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
        self._swept: float | None = None

    def start(self) -> None:
        self.courier.start()
        self.sweep(time.time())

    def stop(self) -> None:
        self.courier.stop()

    def send(self, question: Question) -> None:
        self.sweep(time.time())
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
        paged = {
            "workspace": shown,
            "path": os.fsencode(question.workspace).hex(),  # names are bytes: the path as is
            "request_id": r.request_id,
            "at": time.time(),
        }
        atomic_write_json(record, paged)
        self.courier.put("trigger", "trigger", json.dumps(event))
        log.info("pagerduty_triggered", request_id=r.request_id, workspace=shown, dedup_key=key)

    def withdraw(self, closed: Closed) -> None:
        self.sweep(time.time())
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

    def sweep(self, now: float) -> int:
        """Resolve the alerts whose question is no longer open on disk (the disk is the truth:
        a workspace removed while paged tells no event); at most every SWEEP_EVERY. A record
        that cannot be read, or a workspace that cannot be read now, is kept: an alert is
        resolved only on a question known gone. How many were resolved."""
        if self._swept is not None and now - self._swept < SWEEP_EVERY:
            return 0
        self._swept = now
        resolved = 0
        for record in sorted(self.paged.iterdir()):
            doc = _record(record)
            if doc is None or not _gone(doc):
                continue
            shown, request_id = str(doc["workspace"]), str(doc["request_id"])
            self.courier.put("resolve", "resolve", json.dumps(resolve(shown, request_id)))
            with contextlib.suppress(FileNotFoundError):
                record.unlink()
            log.info(
                "pagerduty_resolved",
                request_id=request_id,
                workspace=shown,
                dedup_key=record.name,
                how="gone",
            )
            resolved += 1
        return resolved


def _record(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(read_regular(path, RECORD_MAX))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("path"), str):
        return None  # written before records kept the path: left to its question's close
    return doc


def _gone(doc: dict[str, Any]) -> bool:
    """The record's question is not the workspace's open question (checked on disk)."""
    try:
        ws = Path(os.fsdecode(bytes.fromhex(doc["path"])))
    except ValueError:
        return False
    if not os.path.lexists(ws):
        return True
    try:
        p = views.pending(ws)
    except Exception:  # unreadable now (a symlink, a torn file): not known gone
        return False
    return p is None or p.request.request_id != doc.get("request_id")
