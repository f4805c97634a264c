"""Four eyes' votes as kept on disk: `.delta/interaction/approvals.json`, beside
`request.json` and bound to its `request_id` (quorum.py decides what a vote does). Written by
the core only; read by the answering path, `delta status`, the API and the page."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deltad.protocol import InteractionRequest, Workspace
from deltad.protocol.errors import UnsafeFile
from deltad.protocol.fsio import read_regular
from deltad.protocol.safefs import publish
from deltad.protocol.seal import votes_sealed

FILE = "approvals.json"
MAX_BYTES = 2 * 1024 * 1024  # two votes of the largest answer (1 MiB) fit; more is refused
MAX_VOTES = 50  # votes kept per question: more is refused (a quorum is at most 10)

Verdict = Literal["approve", "reject", "answer"]


class Vote(BaseModel):
    """One person's vote: who, through what, when, what they said (`answer`: the answer
    document as cast, digests bound) and `agree`, what another vote must say to agree."""

    model_config = ConfigDict(extra="forbid")
    by: str
    channel: str
    at: str
    verdict: Verdict
    agree: str
    answer: dict[str, Any]


class Record(BaseModel):
    """`approvals.json`: the votes on question `request_id`, oldest first."""

    model_config = ConfigDict(extra="forbid")
    request_id: str
    required: int
    votes: list[Vote] = Field(default_factory=list)
    decided: bool = False
    # The core's signature over the rest (protocol/seal.py `votes_message`): the core counts
    # no vote of a record it did not sign, so a vote written into the file counts for nobody.
    seal: dict[str, str] | None = None


def required_of(req: InteractionRequest) -> int:
    """Votes the question needs: a secret is never voted on (a vote would keep its value)."""
    return 1 if req.is_secret else req.approvals_required


# -- the record on disk -----------------------------------------------------------------------
def path_of(ws: Workspace) -> Path:
    return ws.interaction_dir / FILE


def read(ws: Workspace, request_id: str, keys: list[bytes] | None = None) -> Record | None:
    """The votes on question `request_id` (None when the file is about another question,
    missing or damaged: a damaged record counts no vote; with `keys`, the core's, nor does one
    whose seal does not verify)."""
    try:
        raw = read_regular(path_of(ws), MAX_BYTES)
        doc = json.loads(raw)
        rec = Record.model_validate(doc)
    except (FileNotFoundError, UnsafeFile, ValueError, ValidationError, RecursionError):
        return None
    if keys is not None and not votes_sealed(doc, keys):
        return None
    return rec if rec.request_id == request_id else None


def shown(req: InteractionRequest, rec: Record | None) -> dict[str, Any] | None:
    """What the API, `delta status` and the page show: `{required, given: [{by, channel, at,
    verdict}]}`; None for a question that needs one answer only."""
    need = required_of(req)
    if need <= 1:
        return None
    given = [] if rec is None else rec.votes
    return {
        "required": need,
        "owner_may_approve": req.owner_may_approve,
        "given": [
            {"by": v.by, "channel": v.channel, "at": v.at, "verdict": v.verdict} for v in given
        ],
    }


def owner_of(ws: Workspace) -> str | None:
    """The workspace owner's identity for `owner_may_approve`: the user name of the uid that
    owns the workspace directory (a token of that name is the owner's), or the uid as text."""
    try:
        uid = os.stat(ws.root).st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def encoded(rec: Record, seal: Callable[[dict[str, Any]], dict[str, str]] | None = None) -> bytes:
    """The file's bytes; with `seal` (the core's key: sealing.py), signed."""
    doc = rec.model_dump(mode="json", exclude={"seal"})
    if seal is not None:
        doc["seal"] = seal(doc)
    return (json.dumps(doc, indent=2) + "\n").encode()


def write(ws: Workspace, data: bytes) -> None:
    """Put the record in place atomically (a reader sees the old one or the new one)."""
    publish(path_of(ws), data, replace=True)
