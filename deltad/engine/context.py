"""What every part of the loop shares about the run being driven, and its journal writes.

The engine keeps no loop state of its own: everything it decides comes from the journal's read
model (`history`), so the process that paused and the one that resumes decide alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltad.agent import Agent
from deltad.protocol import (
    ActionStatus,
    EventType,
    Journal,
    Mailbox,
    RunMetadata,
    RunPaths,
    RunStatus,
    Workspace,
    current_owner,
    safefs,
    transition,
)
from deltad.protocol.history import Call, History

from .hooks import Checkpoints, NoCheckpoints
from .llm import ChatModel
from .secrets import SecretStore
from .signals import InterruptGuard

_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")
ASK_HUMAN = "ask_human"  # the built-in tool (engine/ask_human.py)


def parse_args(raw: str) -> Any:
    """The model's JSON arguments, or the raw text when they do not parse."""
    try:
        return json.loads(raw or "{}")
    except ValueError:
        return raw


@dataclass
class RunContext:
    ws: Workspace
    paths: RunPaths
    meta: RunMetadata
    journal: Journal
    agent: Agent
    model: ChatModel
    guard: InterruptGuard
    warn: Callable[[str], None]
    hooks: Checkpoints = field(default_factory=NoCheckpoints)

    def __post_init__(self) -> None:
        self.mailbox = Mailbox(self.ws)
        self.secrets = SecretStore(self.paths.secrets)

    @property
    def history(self) -> History:
        return self.journal.history

    # -- status ----------------------------------------------------------------------------
    def set_status(self, to: RunStatus, **changes: Any) -> None:
        transition(self.paths.metadata, self.meta, to, workspace=str(self.ws.root), **changes)

    def ensure_running(self) -> None:
        if self.meta.status != RunStatus.RUNNING:
            self.set_status(
                RunStatus.RUNNING, owner=current_owner(), end_time=None, error=None, error_kind=None
            )

    # -- journal ---------------------------------------------------------------------------
    def note(self, content: str, level: str = "INFO") -> None:
        self.journal.append(EventType.SYSTEM_MESSAGE, {"level": level, "content": content})

    def request(self, call: Call, args: Any, command: str) -> None:
        self.journal.append(
            EventType.ACTION_REQUEST,
            {
                "action_id": call.id,
                "tool_name": call.name,
                "tool_args": args,
                "resolved_command": command,
            },
        )

    def result(self, call: Call, status: ActionStatus, observation: str) -> None:
        self.journal.append(
            EventType.ACTION_RESULT,
            {
                "action_id": call.id,
                "status": str(status),
                "observation_content": observation,
                "execution_ref": call.id,
            },
        )

    def record_dir(self, call: Call) -> Path:
        d = self.paths.tool_executions / _SAFE_ID.sub("_", call.id)
        safefs.mkdirs(d)
        return d
