"""Receipts: every decision the daemon resumes a run for goes into one append-only,
hash-chained audit log in the state dir (`audit.jsonl`), written by the root core only.

An entry is one line of canonical JSON (keys sorted, no spaces, ASCII with \\u escapes):
`seq` (1, 2, ...), `prev` (the previous entry's `hash`; GENESIS for the first), the
decision's fields, and `hash` = sha256 over the entry's canonical bytes without `hash`.
Editing an entry breaks its hash (or, if the hash is recomputed, the next entry's `prev`);
dropping or moving one breaks `seq` and `prev`. Dropping entries off the end is only seen
against a head hash recorded elsewhere: `deltad audit verify` prints it for that.

"Per fleet": the log lives in the state dir (or `audit.path`), which the daemons of an HA
fleet share (docs/daemon.md: a fleet may also give each daemon its own: one chain each); only
the lease holder resumes, and every append takes an exclusive `flock` and reads the chain's
head from the file itself, so a handover (or two writers) never forks the chain.

Never a secret's value: a secret question's entry says that it was answered, not what. Each
entry is bounded (MAX_ENTRY_BYTES): long values are cut, long lists shortened, and the entry
says so.

Rotation (`audit.rotate_bytes`): a log that has grown past it is moved aside whole as
`audit.jsonl.<its last seq, 12 digits>` and the next file begins with a `log_rotated` entry
that chains on from the last one, so the chain runs on across files (`chain_lines` reads them in
order). Retention (`audit.keep_files`): the oldest files moved aside beyond that many are
removed, named in the `log_rotated` entry; what is kept then verifies as a piece of the chain."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

AUDIT_FILE = "audit.jsonl"
LOCK_SUFFIX = ".lock"
GENESIS = "sha256:" + "0" * 64
MAX_ENTRY_BYTES = 16 * 1024
MAX_VALUE_CHARS = 1024
MAX_DECISIONS = 50
_HEAD_READ = 4 * MAX_ENTRY_BYTES  # the tail read to find the last entry
_SEQ_DIGITS = 12  # a file moved aside is named by its last seq, zero-padded: names sort by age


class AuditError(Exception):
    """The log cannot be read or appended to (one line)."""


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def entry_hash(doc: dict[str, Any]) -> str:
    """The hash of an entry: over its canonical bytes without `hash`."""
    body = {k: v for k, v in doc.items() if k != "hash"}
    return "sha256:" + hashlib.sha256(canonical(body)).hexdigest()


def chained(fields: dict[str, Any], seq: int, prev: str) -> dict[str, Any]:
    """An entry of `fields` following `prev` as number `seq`, with its hash. Pure."""
    doc = {**bounded(fields), "seq": seq, "prev": prev}
    return {**doc, "hash": entry_hash(doc)}


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        return value[:MAX_VALUE_CHARS] + f"… ({len(value)} chars)"
    if isinstance(value, dict):
        return {str(k)[:MAX_VALUE_CHARS]: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def bounded(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` cut to fit MAX_ENTRY_BYTES: strings cut, decisions shortened, and at worst the
    decision's `what` replaced by a note. Pure."""
    out = _cut(fields)
    what = out.get("what")
    if isinstance(what, dict) and isinstance(what.get("decisions"), list):
        calls = what["decisions"]
        if len(calls) > MAX_DECISIONS:
            what = {**what, "decisions": calls[:MAX_DECISIONS], "more_decisions": len(calls)}
            out["what"] = what
    if len(canonical(out)) > MAX_ENTRY_BYTES - 512:  # room for seq, prev and hash
        out["what"] = {"truncated": f"over {MAX_ENTRY_BYTES} bytes"}
    return dict(out)


# -- verification (pure) --------------------------------------------------------------------
@dataclass(frozen=True)
class Verified:
    entries: int
    first_seq: int | None
    head: str  # the last entry's hash (GENESIS: an empty log)


class Broken(ValueError):
    """The first entry that does not verify: `line` (1-based), its `seq` if it has one, why,
    and `found`, what that reads as: `unreadable` (not an entry), `edited` (its hash, or the
    next entry's `prev`), `rewritten` (not canonical), `dropped`, `repeated`, `moved`,
    `inserted` (an entry no chain position accounts for), `head` (the recorded head is not in
    the chain)."""

    def __init__(self, line: int, seq: int | None, why: str, found: str = "unreadable") -> None:
        self.line, self.seq, self.why, self.found = line, seq, why, found
        where = f"entry seq {seq} (line {line})" if seq is not None else f"line {line}"
        super().__init__(f"{where}: {why}")


def _entry(n: int, raw: bytes) -> tuple[dict[str, Any], bytes]:
    line = raw.rstrip(b"\n")
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise Broken(n, None, "not a JSON entry") from None
    if not isinstance(doc, dict):
        raise Broken(n, None, "not a JSON object")
    if type(doc.get("seq")) is not int:
        raise Broken(n, None, "no seq")
    return doc, line


def _seq_of(raw: bytes) -> int | None:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    seq = doc.get("seq") if isinstance(doc, dict) else None
    return seq if type(seq) is int else None


def _out_of_place(
    n: int,
    seq: int,
    want: int,
    first: int | None,
    seen: dict[str, int],
    digest: str,
    rest: Iterator[bytes],
) -> Broken:
    """What entry `seq`, found at line `n` where `want` was due, reads as: the entry due is
    further on (moved), nowhere (dropped), or this one was seen before (repeated). `seen`:
    each hash checked so far and its line; `rest`: the lines after this one."""
    head = f"seq {seq} where {want} was expected"
    if seq < want:
        if digest in seen:
            why = f"{head} (an entry was repeated: the same entry is at line {seen[digest]})"
            return Broken(n, seq, why, "repeated")
        if first is not None and seq < first:  # before a piece's anchor: it was further up
            return Broken(n, seq, f"{head} (an entry was moved: it belongs before line 1)", "moved")
        why = f"{head} (an entry was inserted: seq {seq} is another entry at an earlier line)"
        return Broken(n, seq, why, "inserted")
    for m, raw in enumerate(rest, n + 1):
        if _seq_of(raw) == want:
            why = f"{head} (an entry was moved: seq {want} is at line {m})"
            return Broken(n, seq, why, "moved")
    missing = f"seq {want}" if seq == want + 1 else f"seq {want} to {seq - 1}"
    how = "an entry was dropped" if seq == want + 1 else "entries were dropped"
    return Broken(n, seq, f"{head} ({how}: {missing} is nowhere in the log)", "dropped")


def verify(lines: Iterable[bytes], *, from_start: bool = True, head: str | None = None) -> Verified:
    """Recompute the chain. `from_start`: the first entry must be seq 1 after GENESIS (a whole
    log); else (an export `--since`) the first entry anchors the rest: its `prev` is taken as
    the start. `head`: a head hash recorded earlier, which must be this chain's head or an
    entry's hash in it (entries dropped off the end). Broken names the first entry that does
    not verify and what it found (`Broken.found`): an edited entry, one rewritten, dropped,
    repeated, moved (looking on through the rest of the log for the entry that was due) or
    inserted. Pure: the lines in, the verdict out."""
    count, first, prev, want_seq = 0, None, GENESIS, 1
    seen_head = head is None or head == GENESIS
    seen: dict[str, int] = {}  # each entry's hash -> its line: a repeated one is named as such
    rest = iter(lines)
    n = 0
    for n, raw in enumerate(rest, 1):
        doc, line = _entry(n, raw)
        seq = doc["seq"]
        digest = entry_hash(doc)
        if doc.get("hash") != digest:
            why = "its hash does not match its content (the entry was edited)"
            raise Broken(n, seq, why, "edited")
        if line != canonical(doc):
            raise Broken(n, seq, "not in canonical form (the line was rewritten)", "rewritten")
        if count == 0 and not from_start:
            want_seq, prev = seq, str(doc.get("prev"))
        if seq != want_seq:
            broken = _out_of_place(n, seq, want_seq, first, seen, digest, rest)
            if count == 0 and broken.found == "dropped":
                why = (
                    f"seq {seq} where 1 was expected (the log starts mid-chain: the entries "
                    "before it were dropped, or it is a piece of the chain, an export --since: "
                    "verify it with --partial)"
                )
                raise Broken(n, seq, why, "dropped")
            raise broken
        if doc.get("prev") != prev:
            raise Broken(
                n,
                seq,
                "prev is not the previous entry's hash (an entry before it was edited, "
                "dropped or moved)",
                "edited",
            )
        seen[digest] = n
        count, first = count + 1, first if first is not None else seq
        prev, want_seq = digest, seq + 1
        seen_head = seen_head or prev == head
    if not seen_head:
        raise Broken(
            n + 1,
            None,
            f"the recorded head {head} is not in the log (entries were "
            "dropped off its end, or it is another log)",
            "head",
        )
    return Verified(count, first, prev)


# -- the file (I/O) -------------------------------------------------------------------------
class _AuditSettings(Protocol):
    @property
    def path(self) -> Path | None: ...


class _Configured(Protocol):
    """What `audit_path` reads of the daemon's configuration (core/config.py's DaemonConfig)."""

    @property
    def audit(self) -> _AuditSettings: ...
    @property
    def state_dir(self) -> Path: ...


def audit_path(config: _Configured) -> Path:
    """The fleet's log: `audit.path`, else `<state_dir>/audit.jsonl`."""
    return config.audit.path or config.state_dir / AUDIT_FILE


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(
        path.with_name(path.name + LOCK_SUFFIX), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _head(f: IO[bytes]) -> tuple[int, str]:
    """(seq, hash) of the file's last entry ((0, GENESIS) if empty)."""
    end = f.seek(0, os.SEEK_END)
    if end == 0:
        return 0, GENESIS
    f.seek(max(0, end - _HEAD_READ))
    tail = f.read()
    if not tail.endswith(b"\n"):
        raise AuditError(f"the audit log's last line is torn (at byte {end}); verify it")
    last = tail[:-1].rsplit(b"\n", 1)[-1]
    try:
        doc = json.loads(last)
        return int(doc["seq"]), str(doc["hash"])
    except (ValueError, KeyError, TypeError) as e:
        raise AuditError(f"the audit log's last entry cannot be read ({e}); verify it") from None


def _chain_head(path: Path, f: IO[bytes]) -> tuple[int, str]:
    """Where the chain goes on: the file's last entry, else (a file just begun, or a rotation
    cut short between moving the file aside and beginning the next) the newest file moved
    aside's. From the files, not from memory, so another writer's appends are seen."""
    seq, prev = _head(f)
    if seq == 0 and (aside := rotated(path)):
        with open(aside[-1], "rb") as old:
            seq, prev = _head(old)
    return seq, prev


def last_entry(path: Path) -> dict[str, Any] | None:
    """The chain's last entry (in the log, else the newest file moved aside), or None (empty).
    AuditError if it cannot be read."""
    for f in [path, *reversed(rotated(path))]:
        try:
            with open(f, "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - _HEAD_READ))
                data = fh.read()
        except FileNotFoundError:
            continue
        if not data:
            continue
        if not data.endswith(b"\n"):
            raise AuditError(f"the audit log's last line is torn ({f.name}); verify it")
        try:
            doc = json.loads(data[:-1].rsplit(b"\n", 1)[-1])
        except ValueError as e:
            raise AuditError(f"the audit log's last entry cannot be read ({e})") from None
        return doc if isinstance(doc, dict) else None
    return None


def rotated(path: Path) -> list[Path]:
    """The files the log was moved aside as, oldest first."""
    prefix = path.name + "."
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return []
    tails = [n[len(prefix) :] for n in names if n.startswith(prefix)]
    return [
        path.with_name(prefix + t) for t in sorted(tails) if len(t) == _SEQ_DIGITS and t.isdigit()
    ]


def append(path: Path, fields: dict[str, Any], unsynced: list[int] | None = None) -> dict[str, Any]:
    """Append one entry (fsync'd, under the lock); the entry as written. AuditError if the log
    cannot continue (its tail is damaged): nothing is written then. With `unsynced`, the fsync
    is the caller's, later (`sync`): a descriptor of the file is added to it instead (the
    file's, not the path's: a rotation meanwhile does not change what is synced)."""
    with _locked(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "r+b") as f:
            seq, prev = _chain_head(path, f)
            entry = chained(fields, seq + 1, prev)
            f.write(canonical(entry) + b"\n")
            f.flush()
            if unsynced is None:
                os.fsync(f.fileno())
            else:
                unsynced.append(os.dup(f.fileno()))
    return entry


def sync(unsynced: list[int]) -> None:
    """fsync what `append` left unsynced, and close those descriptors (all of them, even when
    one fsync fails: OSError then, after)."""
    failed: OSError | None = None
    while unsynced:
        fd = unsynced.pop()
        try:
            os.fsync(fd)
        except OSError as e:
            failed = e
        finally:
            os.close(fd)
    if failed is not None:
        raise failed


def rotate(path: Path, max_bytes: int, keep: int, at: str) -> str | None:
    """Move the log aside if it holds `max_bytes` or more, begin the next file with a
    `log_rotated` entry chained on from its last, and remove the oldest files moved aside
    beyond `keep` (0: none is removed). The name it was moved aside as, or None."""
    with _locked(path):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_size < max_bytes:
                return None
            seq, prev = _head(f)  # a torn tail is not moved aside: AuditError, said as such
        aside = path.with_name(f"{path.name}.{seq:0{_SEQ_DIGITS}d}")
        os.rename(path, aside)
        older = rotated(path)
        removed = older[: max(0, len(older) - keep)] if keep else []
        for old in removed:
            old.unlink()
        entry = chained(
            {
                "kind": "log_rotated",
                "at": at,
                "moved_aside": aside.name,
                "removed": [p.name for p in removed],
            },
            seq + 1,
            prev,
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(canonical(entry) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)  # the rename and the new file, on disk before the next append
        finally:
            os.close(dfd)
    return aside.name


def chain_lines(path: Path) -> Iterator[bytes]:
    """The whole chain as kept: the files moved aside, oldest first, then the log."""
    for older in rotated(path):
        yield from read_lines(older)
    yield from read_lines(path)


def read_lines(path: Path) -> Iterator[bytes]:
    """The log's lines, as bytes (an absent log: none)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - a generator closes it below
    except FileNotFoundError:
        return
    except OSError as e:
        raise AuditError(f"{path}: {e.strerror}") from None
    with f:
        yield from f


# -- anchors: the chain's head kept where a tenant cannot reach ----------------------------
@dataclass(frozen=True)
class Anchor:
    """The chain's head as it was at `at`: entry `seq` had hash `head`."""

    at: str
    seq: int
    head: str

    def line(self) -> bytes:
        return canonical({"at": self.at, "seq": self.seq, "head": self.head}) + b"\n"


def read_anchor(raw: bytes, n: int) -> Anchor:
    try:
        doc = json.loads(raw)
        return Anchor(str(doc["at"]), int(doc["seq"]), str(doc["head"]))
    except (ValueError, KeyError, TypeError):
        raise Broken(n, None, "not an anchor (a JSON line with at, seq and head)") from None


@dataclass(frozen=True)
class Anchored:
    checked: int  # anchors found in the chain as recorded
    before: int  # anchors older than the chain's first entry (a piece): not checked


def check_anchors(lines: Iterable[bytes], anchors: Iterable[Anchor]) -> Anchored:
    """Each anchor against the chain (already verified): the entry it names must still be there
    with the hash it had. Broken (found `head`) names the first that is not: entries cut off
    the end after it, or the chain rewritten (every hash recomputed) before it. Pure."""
    hashes: dict[int, str] = {}
    for raw in lines:
        doc = json.loads(raw)
        hashes[int(doc["seq"])] = str(doc["hash"])
    first = min(hashes, default=1)
    last = max(hashes, default=0)
    checked = before = 0
    for n, a in enumerate(anchors, 1):
        if a.seq == 0 and a.head == GENESIS:
            checked += 1
        elif a.seq < first:
            before += 1
        elif a.seq > last:
            why = (
                f"anchor {n} ({a.at}) names seq {a.seq}, but the log ends at seq {last} "
                "(entries were cut off its end)"
            )
            raise Broken(n, a.seq, why, "head")
        elif hashes[a.seq] != a.head:
            why = (
                f"anchor {n} ({a.at}): entry seq {a.seq} is not the one anchored then "
                "(the chain was rewritten)"
            )
            raise Broken(n, a.seq, why, "head")
        else:
            checked += 1
    return Anchored(checked, before)


def chain_head(path: Path) -> tuple[int, str]:
    """(seq, hash) where the chain stands now ((0, GENESIS): nothing recorded yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = -1
    if fd < 0:
        aside = rotated(path)
        if not aside:
            return 0, GENESIS
        fd = os.open(aside[-1], os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return _chain_head(path, f)
