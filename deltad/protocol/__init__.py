"""The workspace protocol shared by `delta` and `deltad`: layout, metadata, journal, mailbox."""

from .errors import Busy, CorruptFile, IllegalTransition, ProtocolError, UnsafeFile
from .fsio import atomic_write, atomic_write_json, atomic_write_text, read_regular_text
from .journal import Journal, JournalRead, read_journal
from .layout import RUN_ID_RE, RunPaths, Workspace, new_run_id
from .lock import WorkspaceLock
from .mailbox import Answer, AnswerState, Mailbox
from .metadata import load_metadata, new_metadata, save_metadata, transition
from .models import (
    ActionStatus,
    EventType,
    InputType,
    InteractionRequest,
    JournalEvent,
    RunMetadata,
    iso,
    utcnow,
)
from .process import OwnerProcess, current_owner, owner_alive
from .states import (
    RESUMABLE,
    RETRYABLE_FAILURES,
    TERMINAL,
    TRANSITIONS,
    RunStatus,
    check_transition,
)

__all__ = [
    "RESUMABLE",
    "RETRYABLE_FAILURES",
    "RUN_ID_RE",
    "TERMINAL",
    "TRANSITIONS",
    "ActionStatus",
    "Answer",
    "AnswerState",
    "Busy",
    "CorruptFile",
    "EventType",
    "IllegalTransition",
    "InputType",
    "InteractionRequest",
    "Journal",
    "JournalEvent",
    "JournalRead",
    "Mailbox",
    "OwnerProcess",
    "ProtocolError",
    "RunMetadata",
    "RunPaths",
    "RunStatus",
    "UnsafeFile",
    "Workspace",
    "WorkspaceLock",
    "atomic_write",
    "atomic_write_json",
    "atomic_write_text",
    "check_transition",
    "current_owner",
    "iso",
    "load_metadata",
    "new_metadata",
    "new_run_id",
    "owner_alive",
    "read_journal",
    "read_regular_text",
    "save_metadata",
    "transition",
    "utcnow",
]
