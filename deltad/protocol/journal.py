"""The append-only journal: the run's source of truth.

Appends are single fsynced writes. A crash mid-append can leave a torn last line; readers skip
it, and the next writer (holding the workspace lock) sets it aside and records that it did.
A journal rewritten into another format (an editor's pretty-printed JSON array) is refused
with a message saying so, rather than half-read.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import stat
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import safefs, snapshot
from .errors import CorruptFile, UnsafeFile
from .events import SystemMessage, check_payload, typed
from .fsio import append_durable, atomic_write, fsync_dir, read_regular
from .history import History
from .models import EventType, InteractionRequest, JournalEvent, iso, utcnow
from .snapshot import Snapshot


@dataclass
class JournalRead:
    events: list[JournalEvent]
    good_bytes: int  # length of the valid prefix
    torn: bytes  # bytes after it (a crash mid-append), usually empty
    last_seq: int = 0  # of the last valid event, kept in `events` or not
    offsets: list[int] = field(default_factory=list)  # where each of `events` begins


def _reformatted(path: Path, data: bytes) -> CorruptFile | None:
    head = data.lstrip()[:1]
    first_line = data.split(b"\n", 1)[0].strip()
    if head == b"[" or first_line == b"{" or data.startswith((b" ", b"\t")):
        return CorruptFile(
            f"{path} is not JSON Lines any more: it looks rewritten as pretty-printed JSON "
            "(an editor or JSON viewer may have reformatted it). Restore it from a backup "
            "with one compact JSON object per line."
        )
    return None


# A journal is read whole; far above any real run (100,000 events is ~50 MB), and a bound on
# what a hand-made file can make `delta` or `delta status` allocate.
MAX_JOURNAL_BYTES = 1 << 30


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off while a journal is turned into objects: it allocates hundreds
    of thousands of containers and frees none, so every collection in between is wasted work
    that grows with what was read so far (half the CPU of reading 100,000 events)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


Seen = Callable[[JournalEvent], None]


def read_journal(path: Path, seen: Seen | None = None, *, tail_only: bool = False) -> JournalRead:
    """Every event, checked. `seen` is called with each in order; with `tail_only`, `events`
    holds only those after the latest context cut (`horizon`): the ones a model call can still
    send, so a long run does not keep 100,000 events in memory to use the last few hundred."""
    with gc_paused():
        return _scan(path, _load(path), seen, tail_only)


# A pipeline's steps are replayed from the journal on every turn (pipeline/state.py): a
# context cut drops old conversation, never where the pipeline stands. They are a few per node.
ALWAYS_KEPT = frozenset({EventType.NODE_START, EventType.NODE_OUTCOME, EventType.EDGE_TAKEN})
KNOWN_TYPES: frozenset[str] = frozenset(EventType)


def horizon(data: bytes) -> tuple[int, int]:
    """`through_seq` of the latest context cut in a journal's bytes and the offset of its
    record's line ((0, 0) if none). A key can only appear unescaped as a key, so the search
    finds cut records and, at worst, a tool's arguments object using that name (skipped)."""
    end = len(data)
    while (at := data.rfind(b'"context_cut"', 0, end)) != -1:
        start, stop = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
        end = start
        try:
            obj = json.loads(data[start : stop if stop != -1 else len(data)])
            cut = obj["payload"]["context_cut"] if obj["type"] == EventType.SYSTEM_MESSAGE else None
            if isinstance(cut, dict):
                return int(cut["through_seq"]), start
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    return 0, 0


def _settled(line: bytes) -> JournalEvent | None:
    """An event before the latest context cut, for the read model only: parsed, not checked
    against its type's model again (it was when it was written and at every read before the
    cut); None if it does not even parse or its type is unknown, and then the full check says
    what is wrong."""
    try:
        obj = json.loads(line)
        payload, kind = obj["payload"], obj["type"]
        if not isinstance(payload, dict) or kind not in KNOWN_TYPES:
            return None
        return JournalEvent.model_construct(
            seq=int(obj["seq"]),
            timestamp=datetime.fromisoformat(obj["timestamp"]),
            type=EventType(kind),
            payload=payload,
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def _load(path: Path) -> bytes:
    try:
        data = read_regular(path, MAX_JOURNAL_BYTES)
    except FileNotFoundError:
        return b""
    except UnsafeFile as e:
        raise CorruptFile(str(e)) from None
    if err := _reformatted(path, data):
        raise err
    return data


class _Miss(Exception):
    """A snapshot whose lines do not read back: the journal is read in full instead."""


def _from_snapshot(
    data: bytes, snap: Snapshot, keep_after: int
) -> tuple[list[JournalEvent], list[int]]:
    """The events a snapshot says are kept from its prefix, with their offsets; read without
    the per-type checks (they passed when the prefix was read before). Its last event must be
    `last_seq` and the tail must begin after the cut: a snapshot that says otherwise is a miss."""
    end = snap.journal_bytes
    last = _settled(data[data.rfind(b"\n", 0, end - 1) + 1 : end - 1])
    if last is None or last.seq != snap.last_seq:
        raise _Miss
    if snap.tail_offset > 0:
        before = _settled(
            data[data.rfind(b"\n", 0, snap.tail_offset - 1) + 1 : snap.tail_offset - 1]
        )
        if before is None or before.seq > keep_after:
            raise _Miss
    events, offsets = [], []
    starts = [*snap.kept_offsets]
    offset = snap.tail_offset
    while offset < end:
        starts.append(offset)
        offset = data.index(b"\n", offset) + 1
    for start in starts:
        event = _settled(data[start : data.index(b"\n", start)])
        if event is None:
            raise _Miss
        events.append(event)
        offsets.append(start)
    return events, offsets


def _scan(
    path: Path, data: bytes, seen: Seen | None, tail_only: bool, snap: Snapshot | None = None
) -> JournalRead:
    """Read `data` (the journal's bytes). With a snapshot that fits them, its prefix is not
    read again: `seen` gets only the events after it (the caller restored the rest)."""
    if not data:
        return JournalRead([], 0, b"")
    events: list[JournalEvent] = []
    offsets: list[int] = []
    keep_after, settled_end = horizon(data) if tail_only else (0, 0)
    last_seq, offset, n = 0, 0, 0
    if snap is not None:
        events, offsets = _from_snapshot(data, snap, keep_after)
        kept = [i for i, e in enumerate(events) if e.seq > keep_after or e.type in ALWAYS_KEPT]
        events, offsets = [events[i] for i in kept], [offsets[i] for i in kept]
        last_seq, offset, n = (
            snap.last_seq,
            snap.journal_bytes,
            data.count(b"\n", 0, snap.journal_bytes),
        )
    end = len(data)
    while (stop := data.find(b"\n", offset)) != -1:  # no list of 100,000 lines held at once
        n += 1
        line = data[offset:stop]
        settled = _settled(line) if stop < settled_end else None
        if settled is not None:
            event = settled
        else:
            try:  # the common case in one step: pydantic parses and checks the JSON itself
                event = JournalEvent.model_validate_json(line)
                event.typed_payload = check_payload(str(event.type), event.payload)
            except (ValidationError, RecursionError):
                if data.find(b"\n", stop + 1) == -1 and stop + 1 == end and _unparsable(line):
                    return JournalRead(events, offset, data[offset:], last_seq, offsets)
                event = _event(path, n, _parsed(path, n, line))
            _known(path, n, event)
        try:
            _seen(seen, event)
        except (KeyError, TypeError, ValueError):
            if settled is not None:  # an unchecked line the read model cannot take: say why
                _event(path, n, _parsed(path, n, line))
            raise
        if event.seq > keep_after or event.type in ALWAYS_KEPT:
            events.append(event)
            offsets.append(offset)
        last_seq = event.seq
        offset = stop + 1
    return JournalRead(events, offset, data[offset:], last_seq, offsets)


def _seen(seen: Seen | None, event: JournalEvent) -> None:
    if seen is not None:
        seen(event)


def _unparsable(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return True
    return False


def _parsed(path: Path, n: int, line: bytes) -> object:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        raise CorruptFile(
            f"{path} line {n} is not JSON; the journal is damaged (restore it from a backup)"
        ) from None


def _known(path: Path, n: int, event: JournalEvent) -> None:
    """An event type this version does not know (a newer writer's, or a typo made by hand) is
    one error naming the line: skipping it could skip an answer or the end of the run, and the
    run would go on from a history that is not its own."""
    if event.type not in KNOWN_TYPES:  # a plain str after model_validate_json: by value
        raise CorruptFile(
            f"{path}:{n}: unknown event type {event.type!r}; the run is left as it is (a newer "
            "delta wrote it, or it was edited by hand)"
        )


def _event(path: Path, n: int, obj: object) -> JournalEvent:
    """A parsed line as an event whose payload fits its type, or one line saying what is wrong:
    valid JSON that is not a valid event was edited by hand, not torn by a crash."""
    try:
        event = JournalEvent.model_validate(obj)
        event.typed_payload = check_payload(str(event.type), event.payload)
        _known(path, n, event)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        kind = obj.get("type", "?") if isinstance(obj, dict) else "?"
        raise CorruptFile(
            f"{path} line {n} ({kind}): {where}: {first['msg']}; the journal was edited or "
            "damaged (restore it from a backup)"
        ) from None
    return event


class Journal:
    """Writer side. Only the lock holder may construct one.

    Opening reads the journal once into the read model (`history`) and the events after the
    latest context cut (`events`); a snapshot left by the previous writer (`snapshot`)
    spares reading its prefix again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with gc_paused():
            data = _load(path)
            self.history, read, digest, saved = self._read(data)
        self.events = read.events  # those after the latest context cut (engine/budget.py)
        self._offsets = read.offsets
        self._last_seq = read.last_seq
        self._size = read.good_bytes
        self._digest = digest  # of the journal's first `_size` bytes
        self.restored_bytes = max(saved, 0)  # of the journal, known from a snapshot, not read
        self._saved = saved  # the prefix the snapshot on disk covers (-1: none usable)
        if read.torn:
            self._set_aside_torn_tail(read)

    def _read(self, data: bytes) -> tuple[History, JournalRead, hashlib._Hash, int]:
        view = memoryview(data)
        snap = snapshot.load(self.path) if data else None
        if snap is not None and snap.fits(data):
            digest = hashlib.sha256(view[: snap.journal_bytes])
            if digest.hexdigest() == snap.sha256:
                try:
                    history = History.restored(snap.history)
                    read = _scan(self.path, data, history.add, True, snap)
                except (_Miss, KeyError, TypeError, ValueError):
                    pass  # a snapshot that does not read back: the journal decides alone
                else:
                    digest.update(view[snap.journal_bytes : read.good_bytes])
                    return history, read, digest, snap.journal_bytes
        history = History()
        read = _scan(self.path, data, history.add, True)
        return history, read, hashlib.sha256(view[: read.good_bytes]), -1

    @property
    def next_seq(self) -> int:
        return self._last_seq + 1

    def _set_aside_torn_tail(self, read: JournalRead) -> None:
        stamp = utcnow().strftime("%Y%m%dT%H%M%S%f")  # a later tear at the same offset: new file
        kept = self.path.with_name(f"{self.path.name}.torn-{read.good_bytes}-{stamp}")
        atomic_write(kept, read.torn)
        fd = safefs.open_file(self.path, os.O_WRONLY)
        try:
            os.ftruncate(fd, read.good_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.append(
            EventType.SYSTEM_MESSAGE,
            {
                "level": "WARN",
                "content": f"skipped a torn journal line ({len(read.torn)} bytes, from a crash "
                f"mid-write); its bytes are kept in {kept.name}",
            },
        )

    def append(self, type_: EventType, payload: dict[str, Any]) -> JournalEvent:
        event = JournalEvent(seq=self.next_seq, timestamp=utcnow(), type=type_, payload=payload)
        line = json.dumps(
            {
                "seq": event.seq,
                "timestamp": iso(event.timestamp),
                "type": str(type_),
                "payload": payload,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        new_file = not safefs.exists(self.path)
        data = line.encode() + b"\n"
        append_durable(self.path, data)
        if new_file:
            fsync_dir(self.path.parent)
        self.events.append(event)
        self._offsets.append(self._size)
        self._size += len(data)
        self._digest.update(data)
        self._last_seq = event.seq
        self.history.add(event)
        return event

    def snapshot(self) -> None:
        """Leave a snapshot of this read for the next writer (when letting go of the run).
        A cache: failing to write one costs the next open a full read, nothing else."""
        if self._saved == self._size or not self.events:
            return
        through = _cut_through(self.events)
        placed = list(zip(self.events, self._offsets, strict=True))
        tail = next((o for e, o in placed if e.seq > through), self._size)
        kept = [o for e, o in placed if e.seq <= through and e.type in ALWAYS_KEPT]
        snap = Snapshot(
            journal_bytes=self._size,
            sha256=self._digest.hexdigest(),
            last_seq=self._last_seq,
            tail_offset=tail,
            kept_offsets=kept,
            history=self.history.state(),
        )
        snapshot.save(self.path, snap)
        self._saved = self._size


def _cut_through(events: list[JournalEvent]) -> int:
    """`through_seq` of the latest context cut among `events` (0 if none)."""
    for e in reversed(events):
        if e.type == EventType.SYSTEM_MESSAGE and (cut := typed(e, SystemMessage).context_cut):
            return int(cut["through_seq"])
    return 0


Records = Generator[dict[str, Any], None, None]


def _human_records(path: Path, request_id: str, block: int) -> Records:
    """The payloads of HUMAN_INTERACTION records that mention `request_id`, newest first, read
    backwards from the end: a caller stops at the question's own `asked` record (a reply can
    only follow it), so the cost is the tail since the question, not the whole journal."""
    needle = request_id.encode()
    try:
        fd = safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CorruptFile(f"{path} is not a regular file")
        end = os.fstat(fd).st_size
        carry = b""
        while end > 0:
            start = max(0, end - block)
            chunk = os.pread(fd, end - start, start) + carry
            lines = chunk.split(b"\n")
            carry = lines.pop(0) if start > 0 else b""
            for line in reversed(lines):
                if needle not in line:
                    continue
                try:
                    obj = json.loads(line)
                    payload = obj.get("payload") or {}
                except (ValueError, AttributeError, RecursionError):
                    continue
                if obj.get("type") == EventType.HUMAN_INTERACTION and isinstance(payload, dict):
                    yield payload
            end = start
    finally:
        os.close(fd)


def _asks(payload: dict[str, Any], request_id: str) -> bool:
    request = payload.get("request")
    return (
        payload.get("phase") == "asked"
        and isinstance(request, dict)
        and request.get("request_id") == request_id
    )


def replied(
    path: Path,
    request_id: str,
    block: int = 1 << 16,
    counts: Callable[[dict[str, Any]], bool] | None = None,
) -> bool:
    """Whether the journal records a reply to `request_id` (`delta respond`, the HTTP API);
    `counts` (a gated question: protocol/seal.py) says which `answered` records count."""
    with contextlib.closing(_human_records(path, request_id, block)) as records:
        for payload in records:
            if (
                payload.get("phase") == "answered"
                and payload.get("request_id") == request_id
                and (counts is None or counts(payload))
            ):
                return True
            if _asks(payload, request_id):
                return False
    return False


def asked_request(path: Path, request_id: str, block: int = 1 << 16) -> InteractionRequest | None:
    """The question `request_id` as the journal's `asked` record holds it (the fact its deadline
    is judged by: protocol/deadline.py), or None if the journal never asked it."""
    with contextlib.closing(_human_records(path, request_id, block)) as records:
        for payload in records:
            if _asks(payload, request_id):
                try:
                    return InteractionRequest.model_validate(payload["request"])
                except ValidationError:
                    raise CorruptFile(
                        f"{path}: the asked record of request {request_id!r} is not a valid "
                        "question; the journal was edited or damaged"
                    ) from None
    return None
