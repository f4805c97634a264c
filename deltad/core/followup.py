"""Reminders and escalation: the durable record of what the daemon did about an open question
(the rule itself, pure, is `followplan.next_step`).

`Store` keeps what was done in the state dir, one file per (workspace, request id), written
(fsync'd, atomically replaced) before the event that tells anyone, so a restart neither repeats
a reminder nor loses one that was due: a reminder due while the daemon was down is sent once
when it is back (not once per missed period).

Clock: wall time (`time.time()`), as `request.json`'s `timestamp` and `expires_at` are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from deltad.core.facts import Done
from deltad.core.followplan import Action, Plan
from deltad.protocol import followup as proto
from deltad.protocol.followup import Escalation, Record

if TYPE_CHECKING:
    from deltad.core.config import DaemonConfig

log = structlog.get_logger("deltad.followup")

DIR = "followup"
MAX_FILE = 64 * 1024


# -- what carries a follow-up to people ------------------------------------------------------------
# The feed's event for each action; the channels (email, Slack, Teams) carry the first two only.
EVENT: dict[Action, str] = {
    "remind": "request.reminder",
    "escalate": "request.escalated",
    "overdue": "request.overdue",
}
TOLD: tuple[Action, ...] = ("remind", "escalate")  # what is meant to reach a person
NO_CHANNEL = "no notify webhook or command, no email, no Slack, no Teams"


def carriers(config: DaemonConfig, ws: Path | None, action: Action) -> list[str]:
    """What the configuration sends `action`'s event of workspace `ws` through ("webhook",
    "command", "email", "slack", "teams", "pagerduty"; [] none: it is recorded and shown on
    the page, and nobody is told). `ws` None: any workspace not under a `notify: false` root.
    Pure: the config decides as the notifier and the channels' hub do (a target's `events`
    and `exclude`, a quiet root)."""
    from deltad.inbox import scopes

    roots = [r for r in config.roots if ws is not None and ws.is_relative_to(r.path)]
    if ws is not None and any(not r.notify for r in roots):
        return []
    event, out = EVENT[action], []
    notify = config.notify
    for kind, targets in (
        ("webhook", notify.webhooks if notify else []),
        ("command", notify.commands if notify else []),
    ):
        for t in targets:
            excluded = ws is not None and any(scopes.matches(g, str(ws)) for g in t.exclude)
            if event in t.events and not excluded and kind not in out:
                out.append(kind)
    channels = config.channels
    if action in TOLD and channels is not None:
        told = (("email", channels.email), ("slack", channels.slack), ("teams", channels.teams))
        out += [name for name, c in told if c]
        if action == "escalate" and channels.pagerduty is not None:
            out.append("pagerduty")  # pages for an escalation; reminders are for people
    return out


def wanted(plan: Plan | None) -> list[Action]:
    """The follow-ups meant to reach a person that `plan` can fire."""
    out: list[Action] = []
    if plan is not None and plan.remind_after is not None and plan.max_reminders > 0:
        out.append("remind")
    if plan is not None and plan.escalates:
        out.append("escalate")
    return out


def unsent(config: DaemonConfig) -> tuple[Literal["warning", "note"], str] | None:
    """One line when a reminder or an escalation can come due with nothing to carry it: a
    warning when the daemon's `follow_up:` asks for it, a note when only an agent's
    `follow_up:` or a question's own arguments could (nothing here knows whether one will).
    None: every follow-up has a channel."""
    asked = wanted(Plan.of(None, config.follow_up))
    quiet = [str(r.path) for r in config.roots if not r.notify]
    nowhere = [a for a in TOLD if not carriers(config, None, a)]
    words = {"remind": "reminders", "escalate": "escalations"}
    shown = "they are recorded and shown on the page and in `delta status`, and nobody is told"
    if mine := [a for a in asked if a in nowhere]:
        said = " and ".join(words[a] for a in mine)
        return "warning", (
            f"follow_up: its {said} have no channel to carry them ({NO_CHANNEL}): {shown} "
            "(the same goes for those an agent or a question asks for)"
        )
    if asked and quiet:
        return "warning", (
            f"follow_up: the reminders and escalations of workspaces under "
            f"{', '.join(quiet)} (notify: false) have no channel to carry them: {shown}"
        )
    if nowhere:
        said = " and ".join(words[a] for a in nowhere)
        return "note", (
            f"{said} that an agent or a question asks for have no channel to carry them "
            f"({NO_CHANNEL}): {shown}"
        )
    return None


# -- the durable record (the state dir) ----------------------------------------------------------
class Kept(BaseModel):
    """One file of the store: the record shown beside the question, and its workspace (the
    path's bytes in hex: names are bytes, and JSON holds only valid text)."""

    model_config = ConfigDict(extra="forbid")
    workspace: str
    record: Record


def _hex(ws: str) -> str:
    return os.fsencode(ws).hex()


def _unhex(text: str) -> str:
    return os.fsdecode(bytes.fromhex(text))


def _ts(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def done_of(rec: Record) -> Done:
    return Done(
        tuple(t.timestamp() for t in rec.reminders),
        rec.escalated.at.timestamp() if rec.escalated else None,
        rec.overdue_at.timestamp() if rec.overdue_at else None,
    )


@dataclass
class Store:
    """`<state_dir>/followup/<digest>.json`, one per (workspace, request id) with something
    done, loaded whole at start (one per open question that was reminded: few) and written
    through. A question's file goes when its workspace shows another question or none."""

    root: Path
    _by_ws: dict[str, dict[str, Record]] = field(default_factory=dict)

    def load(self) -> int:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        n = 0
        for name in sorted(os.listdir(self.root)):
            path = self.root / name
            if name.startswith(".") and name.endswith(".tmp"):  # a write a crash cut short
                with contextlib.suppress(OSError):
                    os.unlink(path)
                continue
            if not name.endswith(".json"):
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    kept = Kept.model_validate(json.loads(f.read(MAX_FILE + 1)))
            except (OSError, ValueError, ValidationError) as e:
                log.warning("followup_record_unreadable", file=str(path), error=str(e)[:200])
                continue
            ws = _unhex(kept.workspace)
            self._by_ws.setdefault(ws, {})[kept.record.request_id] = kept.record
            n += 1
        return n

    def _path(self, ws: str, request_id: str) -> Path:
        digest = hashlib.sha256(f"{ws}\0{request_id}".encode("utf-8", "surrogateescape"))
        return self.root / f"{digest.hexdigest()[:40]}.json"

    def get(self, ws: Path, request_id: str) -> Record | None:
        return self._by_ws.get(str(ws), {}).get(request_id)

    def done(self, ws: Path, request_id: str | None) -> Done:
        rec = self.get(ws, request_id) if request_id else None
        return done_of(rec) if rec is not None else Done()

    def record(
        self,
        ws: Path,
        request_id: str,
        action: Action,
        now: float,
        plan: Plan,
        asked: float,
        via: list[str] | None = None,
    ) -> Record:
        """Write down that `action` was done (durably, before anyone is told), and what is to
        carry it to people (`via`: see `carriers`)."""
        rec = self.get(ws, request_id) or _beside(ws, request_id) or Record(request_id=request_id)
        if plan.sla is not None:
            rec.sla_due_at = _ts(asked + plan.sla)
        if action == "remind":
            rec = rec.model_copy(
                update={"reminders": [*rec.reminders, _ts(now)], "reminders_via": via}
            )
        elif action == "overdue":
            rec = rec.model_copy(update={"overdue_at": _ts(now)})
        else:
            escalation = Escalation(at=_ts(now), to=list(plan.escalate_to), via=via)
            rec = rec.model_copy(update={"escalated": escalation})
        data = Kept(workspace=_hex(str(ws)), record=rec).model_dump_json().encode()
        path = self._path(str(ws), request_id)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._by_ws.setdefault(str(ws), {})[request_id] = rec
        return rec

    def settle(self, ws: Path, open_request: str | None) -> None:
        """Forget the records of `ws`'s questions other than `open_request` (closed ones)."""
        held = self._by_ws.get(str(ws))
        if not held:
            return
        for rid in [r for r in held if r != open_request]:
            del held[rid]
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(str(ws), rid))
        if not held:
            del self._by_ws[str(ws)]

    def __iter__(self) -> Iterator[tuple[str, Record]]:
        for ws, held in self._by_ws.items():
            for rec in held.values():
                yield ws, rec


def _beside(ws: Path, request_id: str) -> Record | None:
    """The record beside the question (another daemon's: see Service._followed)."""
    from deltad.protocol import Workspace

    return proto.read(Workspace(ws).interaction_dir, request_id)


def beside_question(interaction_dir: Path, rec: Record) -> None:
    """The copy beside the question (`followup.json`), written as the workspace's owner
    (safefs.publish hands a file root makes to the directory's owner)."""
    from deltad.protocol.safefs import publish

    publish(
        proto.path_of(interaction_dir),
        (rec.model_dump_json(indent=2) + "\n").encode(),
        replace=True,
    )
