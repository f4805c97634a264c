"""The journal as the views read it: bounded, tolerant, typed.

The run's own reader (journal.py) reads every line and refuses one it cannot take. A view —
the API's run view and history, a finished run's outcome — reads part of a journal that a
run may be writing at that moment, and shows what it can: one line at a time through
`event_of`, each event with its typed payload (events.py), or None for what is not an event
(a torn or partial line, JSON that is not an event). An event of a type this version does not
know, or whose payload does not fit its model, is kept with no typed payload: `payload_of`
gives None for it, so a consumer skips what it cannot read, as before.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from . import safefs
from .errors import ProtocolError
from .events import check_payload
from .models import JournalEvent

BLOCK = 1 << 20
P = TypeVar("P", bound=BaseModel)


def event_of(line: bytes) -> JournalEvent | None:
    """One journal line as an event (its payload typed when it fits), or None."""
    try:
        event = JournalEvent.model_validate_json(line)
    except (ValidationError, RecursionError):
        return None
    # One that does not fit is kept as it is: shown in a journal view, skipped by `payload_of`.
    with contextlib.suppress(ValidationError, RecursionError):
        event.typed_payload = check_payload(str(event.type), event.payload)
    return event


def payload_of(event: JournalEvent, model: type[P]) -> P | None:
    """`event`'s payload as `model`, if the reader could make it one."""
    kept = event.typed_payload
    return kept if isinstance(kept, model) else None


def tail(path: Path, max_bytes: int, max_events: int) -> list[JournalEvent]:
    """The last events of a journal, read from its end within `max_bytes` (no symlink, a
    regular file; [] when it cannot be read)."""
    try:
        fd = safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ProtocolError):
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return []
        start = max(0, st.st_size - max_bytes)
        data = os.pread(fd, st.st_size - start, start)
    finally:
        os.close(fd)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first is a part line
    return [e for e in map(event_of, lines[-max_events:]) if e is not None]


def naming(path: Path, types: tuple[bytes, ...]) -> Iterator[JournalEvent]:
    """The journal's events of `types` (as they are spelled in a line: b'"RUN_END"'), read
    in blocks; only the lines that name one are parsed, so a long run costs a scan."""
    fd = safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        rest = b""
        while block := os.read(fd, BLOCK):
            *whole, rest = (rest + block).split(b"\n")
            yield from _events(line for line in whole if any(t in line for t in types))
        if any(t in rest for t in types):
            yield from _events([rest])
    finally:
        os.close(fd)


def _events(lines: Iterator[bytes] | list[bytes]) -> Iterator[JournalEvent]:
    for line in lines:
        if (event := event_of(line)) is not None:
            yield event
