"""Pydantic models, one per on-disk file of the workspace protocol."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .process import OwnerProcess
from .states import RunStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


class _Model(BaseModel):
    # Files written by newer versions may carry fields we do not know: keep them.
    model_config = ConfigDict(extra="allow")


class RunMetadata(_Model):
    run_id: str
    status: RunStatus
    task: str
    agent_ref: str
    start_time: datetime
    updated_at: datetime
    end_time: datetime | None = None
    iterations_completed: int = 0
    max_iterations: int | None = None
    owner: OwnerProcess | None = None
    error: str | None = None


class InputType(StrEnum):
    TEXT = "text"
    PASSWORD = "password"
    CONFIRMATION = "confirmation"


class InteractionRequest(_Model):
    """`.delta/interaction/request.json`: one pending question."""

    request_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    timestamp: datetime = Field(default_factory=utcnow)
    prompt: str
    input_type: InputType = InputType.TEXT
    sensitive: bool = False
    run_id: str
    action_id: str

    @property
    def is_secret(self) -> bool:
        return self.sensitive or self.input_type == InputType.PASSWORD


class EventType(StrEnum):
    RUN_START = "RUN_START"
    THOUGHT = "THOUGHT"
    ACTION_REQUEST = "ACTION_REQUEST"
    ACTION_RESULT = "ACTION_RESULT"
    SYSTEM_MESSAGE = "SYSTEM_MESSAGE"
    RUN_END = "RUN_END"


class ActionStatus(StrEnum):
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    ERROR = "ERROR"


class JournalEvent(_Model):
    seq: int
    timestamp: datetime
    type: EventType | str  # unknown types from newer writers are kept, not fatal
    payload: dict[str, Any] = Field(default_factory=dict)
