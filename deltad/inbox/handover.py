"""A question's hand-overs as kept on disk: `.delta/interaction/delegation.json`, beside
`request.json` and bound to its `request_id` (delegation.py decides who may write one). Read by
the answering path, `delta status`, the API and the page."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deltad.protocol import Workspace
from deltad.protocol.errors import UnsafeFile
from deltad.protocol.fsio import read_regular

FILE = "delegation.json"
MAX_DELEGATIONS = 20  # hand-overs kept per question: a chain longer than this is refused
MAX_BYTES = 64 * 1024


class Delegation(BaseModel):
    """One hand-over: who (`by`), to whom (`to`: a token name or `group:NAME`), why, when."""

    model_config = ConfigDict(extra="forbid")
    by: str
    to: str
    note: str = ""
    at: str


class Record(BaseModel):
    """`delegation.json`: the hand-overs of question `request_id`, oldest first."""

    model_config = ConfigDict(extra="forbid")
    request_id: str
    delegations: list[Delegation] = Field(default_factory=list)


def path_of(ws: Workspace) -> Path:
    return ws.interaction_dir / FILE


def read(ws: Workspace, request_id: str) -> list[Delegation]:
    """The hand-overs of question `request_id` (none when the file is about another question,
    missing or damaged: a damaged record never blocks an answer, it only widens nothing)."""
    try:
        raw = read_regular(path_of(ws), MAX_BYTES)
        rec = Record.model_validate(json.loads(raw))
    except (FileNotFoundError, UnsafeFile, ValueError, ValidationError, RecursionError):
        return []
    return rec.delegations if rec.request_id == request_id else []


def delegates(delegations: Sequence[Delegation]) -> list[str]:
    return list(dict.fromkeys(d.to for d in delegations))


def answerers(respondents: Sequence[str], delegations: Sequence[Delegation]) -> list[str]:
    """Who may answer: the respondents plus the delegates; [] (anyone) stays anyone."""
    if not respondents:
        return []
    return list(dict.fromkeys([*respondents, *delegates(delegations)]))


def shown(delegations: Sequence[Delegation]) -> list[dict[str, str]]:
    return [d.model_dump() for d in delegations]
