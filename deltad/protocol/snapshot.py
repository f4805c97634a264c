"""A snapshot of what reading the journal derives, so that a long run's resume reads what is new.

The journal stays the only source of truth. A snapshot (`execution/snapshot.json`, written
by the journal's writer when a process lets go of the run) is a cache of one read of it: the
read model (`History`) after its first `journal_bytes` bytes, where the events a model call can
still send begin (after the latest context cut), and which older pipeline steps are kept. It is
used only if those bytes are still exactly the journal's prefix (SHA-256), so a journal restored
from a backup, truncated or edited by hand makes it a miss, never a wrong answer; a missing,
damaged, oversized or foreign snapshot is a miss too, and the next read is a full one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UnsafeFile
from .fsio import atomic_write, compact_json, read_regular

# 2: written only by readers that refuse unknown event types; a version 1 snapshot may cover
# a line of an unknown type that its writer skipped, so it is a miss and the journal is read.
VERSION = 2
NAME = "snapshot.json"
# Far above a real run's (100,000 events: ~1 MB of ids); a bound on what a hand-made file costs.
MAX_SNAPSHOT_BYTES = 64 << 20


@dataclass(frozen=True)
class Snapshot:
    journal_bytes: int  # the prefix it was taken at (ends with a newline)
    sha256: str  # of that prefix
    last_seq: int  # of the prefix's last event
    tail_offset: int  # where the events after the latest context cut begin
    kept_offsets: list[int]  # pipeline steps before `tail_offset`, kept in memory anyway
    history: dict[str, Any]  # History.state() after the prefix

    def fits(self, data: bytes) -> bool:
        """Whether its offsets are line starts inside `data` (the digest is checked apart)."""
        end = self.journal_bytes
        if not 0 < end <= len(data) or data[end - 1 : end] != b"\n":
            return False
        starts = [*self.kept_offsets, self.tail_offset]
        if any(not 0 <= o <= end or (o and data[o - 1 : o] != b"\n") for o in starts):
            return False
        return all(o < self.tail_offset for o in self.kept_offsets)


def path_of(journal: Path) -> Path:
    return journal.with_name(NAME)


def load(journal: Path) -> Snapshot | None:
    """The journal's snapshot as written, or None if there is none usable."""
    try:
        obj = json.loads(read_regular(path_of(journal), MAX_SNAPSHOT_BYTES))
    except (FileNotFoundError, NotADirectoryError, UnsafeFile, OSError):
        return None
    except (ValueError, RecursionError):
        return None
    try:
        if obj["version"] != VERSION:
            return None
        kept = obj["kept_offsets"]
        if not isinstance(kept, list) or not isinstance(obj["history"], dict):
            return None
        return Snapshot(
            journal_bytes=int(obj["journal_bytes"]),
            sha256=str(obj["sha256"]),
            last_seq=int(obj["last_seq"]),
            tail_offset=int(obj["tail_offset"]),
            kept_offsets=[int(o) for o in kept],
            history=obj["history"],
        )
    except (KeyError, TypeError, ValueError):
        return None


def save(journal: Path, snapshot: Snapshot) -> None:
    """Replace the snapshot atomically. Not fsynced: losing it in a power cut costs one full
    read of the journal, and a torn or stale file fails its digest."""
    s = snapshot  # not dataclasses.asdict: it deep-copies every id list, a third of a second
    fields = {
        "journal_bytes": s.journal_bytes,
        "sha256": s.sha256,
        "last_seq": s.last_seq,
        "tail_offset": s.tail_offset,
        "kept_offsets": s.kept_offsets,
        "history": s.history,
    }
    data = compact_json({"version": VERSION, **fields})
    atomic_write(path_of(journal), data, durable=False)
