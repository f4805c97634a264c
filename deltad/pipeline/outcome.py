"""What a node's handler returns (attractor spec §5.2): it drives edge selection and the context."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    SUCCESS = "success"
    PARTIAL_SUCCESS = "partial_success"
    RETRY = "retry"
    FAIL = "fail"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Outcome:
    status: Status
    preferred_label: str = ""
    suggested_next_ids: tuple[str, ...] = ()
    context_updates: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""
    failure_reason: str = ""
