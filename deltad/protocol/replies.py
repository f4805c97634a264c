"""What a human said, normalised: a `Reply` (with per-call `CallDecision`s for approvals), the
structured answer file, and `AnswerRejected` for an answer that does not fit its question."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .models import Timestamp


class AnswerRejected(ValueError):
    """The answer does not fit the question; the message says why (never quoting a secret)."""


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"
    CANCEL = "cancel"


class CallDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action_id: str
    decision: Decision
    arguments: dict[str, Any] | None = None
    reason: str | None = None
    # For approve and edit: the digest of the exact call approved (protocol/calldigest.py),
    # written by the answering path and checked by the engine before the call runs.
    digest: str | None = Field(
        default=None,
        description="approve/edit: `sha256:` + hex SHA-256 of the call's canonical JSON "
        '`{"arguments", "tool_name"}` (sorted keys, no whitespace, ASCII), after an edit its '
        "arguments. Filled in by the server; one sent must be the shown call's (else 422), "
        "and the run refuses a call that no longer matches it.",
    )


class StructuredAnswer(BaseModel):
    """`response.json`."""

    model_config = ConfigDict(extra="forbid")
    request_id: str
    answer: str | None = None
    decisions: list[CallDecision] | None = None
    answered_by: str | None = None
    comment: str | None = None
    channel: str | None = None  # who wrote the file: cli, http, link, pipeline...
    # The hand-overs the question went through before this answer (deltad/inbox/delegation.py):
    # [{"by", "to", "note", "at"}], kept so the journal (and the history) says who handed it on.
    delegations: list[dict[str, str]] | None = None
    # Four eyes (deltad/inbox/quorum.py): every vote that made this answer, [{"by", "channel",
    # "at"}], when the question needed more than one.
    approvals: list[dict[str, str]] | None = None
    # The daemon's signature (protocol/seal.py): {"key": its id, "sig": base64 Ed25519 over
    # the document without this field}. Written by the root core's answering path only.
    seal: dict[str, str] | None = None


Outcome = Literal["answered", "timeout", "skipped"]


class Reply(BaseModel):
    """What a human (or a stand-in) said, normalised for the engine."""

    outcome: Outcome = "answered"
    value: str | None = None  # text, "yes"/"no", or the chosen option's label
    key: str | None = None  # the chosen option's key
    decisions: list[CallDecision] = Field(default_factory=list)
    answered_by: str | None = None
    source: str = "human"
    at: Timestamp | None = None
    comment: str | None = None
    channel: str | None = None  # for mailbox answers: the channel that wrote the file
    delegations: list[dict[str, str]] | None = None  # the hand-overs before this answer
    approvals: list[dict[str, str]] | None = None  # four eyes: the votes that made it
    # Reminders and escalation before this reply (followup.json, copied in by the engine).
    follow_up: dict[str, Any] | None = None
    # A signed answer's seal, kept in the journal so a resume checks it again (protocol/seal.py):
    # {"statement": what was signed, "key", "sig"}.
    seal: dict[str, Any] | None = None
