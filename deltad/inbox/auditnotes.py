"""Audit entries besides a decision's and a vote's receipts (inbox/receipts.py): an answer the
answering path refused (`kind: refused`), a hand-over (`handover`), a reminder or an
escalation sent (`reminder`, `escalation`). Each is appended by the root core (never the inbox
process), with `kind`, `at`, `workspace`, `run_id`, `request_id` and `channel`, and who and
where from when known; never a secret's value.

An entry the log will not take changes nothing of what it records (the refusal stands, the
hand-over is made, the reminder is sent): `audit_failed` says the log has a gap.

**Refused answers are bounded**: a flood of them must not fill the disk. At most one entry per
(workspace, request, person, code) is written by a daemon (the same person refused again for
the same reason on the same question adds nothing; remembered for the last `SEEN_MAX` keys, so
after a restart, or past that many, one more), and at most `REFUSED_PER_MINUTE` refused entries
in any minute: those past the cap are counted, and the next one written says how many were not
(`suppressed`)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from deltad.protocol import Mailbox, Workspace, iso, utcnow
from deltad.protocol.printable import show_path

from . import audit as auditlog

log = structlog.get_logger("deltad.audit")

SEEN_MAX = 4096  # refused keys remembered (the oldest forgotten first)
REFUSED_PER_MINUTE = 60


def append(audit: Path | None, fields: dict[str, Any]) -> dict[str, Any] | None:
    """Append `fields` to `audit` (None: receipts are off); the entry, or None when it was not
    written (`audit_failed` logged: the log has a gap to look at)."""
    if audit is None:
        return None
    try:
        entry = auditlog.append(audit, fields)
    except Exception as e:  # what it records stands; a log that cannot continue says so
        log.error("audit_failed", workspace=fields.get("workspace"), error=str(e))
        return None
    log.info(
        "audit_appended", workspace=fields.get("workspace"), seq=entry["seq"], kind=fields["kind"]
    )
    return entry


def about(ws: Path, request_id: str | None) -> dict[str, Any]:
    """The fields naming the question `request_id` in `ws` (its run and kind, when it is still
    the workspace's question)."""
    fields: dict[str, Any] = {"at": iso(utcnow()), "workspace": show_path(ws)}
    try:
        req = Mailbox(Workspace.at(ws)).read_request()
    except Exception:  # a damaged workspace: what is known
        req = None
    if req is not None and (request_id is None or req.request_id == request_id):
        fields |= {
            "run_id": req.run_id,
            "request_id": req.request_id,
            "input_type": str(req.input_type),
        }
    elif request_id is not None:
        fields["request_id"] = request_id
    return fields


class _Bound:
    """Which refusals to record (see the module): once per key, at most a rate per minute."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
        self._clock = clock
        self._window = 0.0
        self._in_window = 0
        self.suppressed = 0

    def admit(self, key: tuple[str, str, str, str]) -> int | None:
        """None: do not record; else how many were suppressed by the cap before this one."""
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return None
            now = self._clock()
            if now - self._window >= 60:
                self._window, self._in_window = now, 0
            if self._in_window >= REFUSED_PER_MINUTE:
                self.suppressed += 1
                return None
            self._in_window += 1
            self._seen[key] = None
            while len(self._seen) > SEEN_MAX:
                self._seen.popitem(last=False)
            skipped, self.suppressed = self.suppressed, 0
            return skipped


bound = _Bound()


def refused(
    audit: Path | None,
    ws: Path,
    request_id: str | None,
    code: str,
    reason: str,
    *,
    channel: str,
    by: str | None,
    voter: str | None = None,
    origin: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """An answer refused by the answering path (`code`: the refusal's stable code), recorded
    within the bounds above; the reason is left out for a secret question (it might echo)."""
    if audit is None:
        return None
    person = voter or by or ""
    skipped = bound.admit((show_path(ws), request_id or "", person, code))
    if skipped is None:
        return None
    fields = about(ws, request_id)
    secret = False
    try:
        req = Mailbox(Workspace.at(ws)).read_request()
        secret = req is not None and req.is_secret
    except Exception:
        secret = True  # unknown: say less
    fields |= {"kind": "refused", "channel": channel, "code": code}
    if by:
        fields["answered_by"] = by
    if voter and voter != by:
        fields["voter"] = voter
    if origin:
        fields["origin"] = dict(origin)
    if not secret:
        fields["reason"] = reason
    if skipped:
        fields["suppressed"] = skipped
    return append(audit, fields)


def handover(
    audit: Path | None,
    ws: Path,
    request_id: str,
    *,
    by: str,
    to: str,
    note: str,
    channel: str,
    origin: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """A question handed over (inbox/delegation.py): `from` and `to`, and the note."""
    fields = about(ws, request_id) | {"kind": "handover", "channel": channel}
    fields |= {"from": by, "to": to, "answered_by": by}
    if note:
        fields["note"] = note
    if origin:
        fields["origin"] = dict(origin)
    return append(audit, fields)


def followup_sent(
    audit: Path | None,
    ws: Path,
    request_id: str,
    kind: str,
    *,
    via: list[str],
    number: int | None = None,
    escalated_to: list[str] | None = None,
) -> dict[str, Any] | None:
    """A reminder (`kind: reminder`, its `number`) or an escalation (`escalation`,
    `escalated_to`) sent by the daemon's timers (core/service.py): `channel: daemon`, `via`
    what carried it ([]: nobody was told), `to` who it was sent to (the question's respondents,
    delegates and people escalated to; [] anyone whose scope allows)."""
    from deltad.protocol import followup

    from .handover import answerers, read

    fields = about(ws, request_id) | {"kind": kind, "channel": "daemon", "via": list(via)}
    try:
        w = Workspace.at(ws)
        req = Mailbox(w).read_request()
        if req is not None and req.request_id == request_id:
            asked = followup.respondents_with(
                req.respondents, followup.read(w.interaction_dir, request_id)
            )
            fields["to"] = answerers(asked, read(w, request_id))
    except Exception:  # a damaged workspace: the entry without `to`
        pass
    if number is not None:
        fields["reminder"] = number
    if escalated_to is not None:
        fields["escalated_to"] = list(escalated_to)
        fields["to"] = list(escalated_to)
    return append(audit, fields)


def switched(path: Path, enabled: bool) -> dict[str, Any] | None:
    """At the daemon's start: with auditing off (`audit.enabled: false`) and a log there, one
    `audit_disabled` entry, so the gap shows in the chain; on again after that, one
    `audit_enabled`. Said once: the log's last entry says whether it was (a restart while off
    adds nothing). None when nothing was appended."""
    if not (path.exists() or auditlog.rotated(path)):
        return None  # no log: no gap to show (a daemon that never audited)
    try:
        last = auditlog.last_entry(path)
    except auditlog.AuditError as e:
        log.error("audit_failed", error=str(e))
        return None
    was_off = last is not None and last.get("kind") == "audit_disabled"
    if enabled == (not was_off):
        return None
    kind = "audit_enabled" if enabled else "audit_disabled"
    fields = {
        "kind": kind,
        "at": iso(utcnow()),
        "channel": "daemon",
        "what": {"audit.enabled": enabled},
    }
    return append(path, fields)
