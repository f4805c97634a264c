"""The workspace mailbox: `request.json` (engine → human), `response.txt` (human → engine).

The engine only ever takes an answer that (a) sits next to a request of this run and action,
(b) is a regular UTF-8 file under the size cap, and (c) was written after the request.
Every file here is reached through `safefs`: no symlink is followed, nothing is read unbounded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import ValidationError

from . import safefs
from .errors import CorruptFile, UnsafeFile
from .fsio import MAX_MAILBOX_BYTES, atomic_write, lstat_or_none, read_regular
from .layout import Workspace
from .models import InteractionRequest, utcnow

MAX_ERROR_BYTES = 4096
REJECTED = "response.rejected-"
STALE = "response.stale-"


class AnswerState(StrEnum):
    MISSING = "missing"
    READY = "ready"
    STALE = "stale"  # older than the request: not its answer
    REFUSED = "refused"  # symlink, FIFO, too big, not UTF-8


@dataclass
class Answer:
    state: AnswerState
    text: str = ""
    reason: str = ""
    path: Path = Path()
    mtime_ns: int = 0
    uid: int = -1
    size: int = 0


def _stamp() -> str:
    return utcnow().strftime("%Y%m%dT%H%M%S%f")


def parse_request(raw: bytes, where: Path) -> InteractionRequest:
    """`request.json` bytes → the request, or CorruptFile with one line."""
    try:
        return InteractionRequest.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise CorruptFile(f"{where}: {loc}: {first['msg']}") from None
    except (ValueError, RecursionError):
        raise CorruptFile(f"{where}: not a valid question file") from None


class Mailbox:
    def __init__(self, workspace: Workspace) -> None:
        self.ws = workspace

    def read_request(self) -> InteractionRequest | None:
        try:
            raw = read_regular(self.ws.request_file)
        except FileNotFoundError:
            return None
        return parse_request(raw, self.ws.request_file)

    def post(self, request: InteractionRequest) -> list[Path]:
        """Publish a question. An answer file already there predates it: set it aside (never
        deleted) and return where, so the caller can say so."""
        moved = self.set_aside_answers()
        atomic_write(self.ws.request_file, (request.model_dump_json(indent=2) + "\n").encode())
        return moved

    def set_aside_answers(self, keep_ino: int | None = None) -> list[Path]:
        """Rename every answer file (but the one with inode `keep_ino`) to `response.stale-*`:
        an answer that belongs to no open question is kept and reported, never deleted."""
        moved = []
        for old in (self.ws.response_file, self.ws.response_json):
            st = lstat_or_none(old)
            if st is not None and st.st_ino != keep_ino:
                dest = self.ws.interaction_dir / f"{STALE}{_stamp()}{old.suffix}"
                safefs.rename(old, dest)
                moved.append(dest)
        return moved

    def answer_file(self) -> Path | None:
        """response.json (structured) wins over response.txt; None when neither exists."""
        for path in (self.ws.response_json, self.ws.response_file):
            if lstat_or_none(path) is not None:
                return path
        return None

    def read_answer(self, request: InteractionRequest, *, secret: bool = False) -> Answer:
        path = self.answer_file()
        if path is None:
            return Answer(AnswerState.MISSING)
        st = lstat_or_none(path)
        if st is None:
            return Answer(AnswerState.MISSING)
        try:
            raw = read_regular(path)
            text = raw.decode("utf-8")
        except UnsafeFile as e:
            return Answer(AnswerState.REFUSED, reason=str(e), path=path, size=st.st_size)
        except UnicodeDecodeError:
            reason = f"{path.name} is not valid UTF-8"
            return Answer(AnswerState.REFUSED, reason=reason, path=path, size=st.st_size)
        except FileNotFoundError:
            return Answer(AnswerState.MISSING)
        req_st = lstat_or_none(self.ws.request_file)
        # Compare file times (same kernel clock) rather than the request's own timestamp.
        if req_st is not None and st.st_mtime_ns < req_st.st_mtime_ns:
            return Answer(
                AnswerState.STALE,
                reason=f"{path} is older than the question; write it again (or touch it)",
                path=path,
            )
        text = text.rstrip("\r\n") if secret else text.strip()
        return Answer(AnswerState.READY, text, "", path, st.st_mtime_ns, st.st_uid, st.st_size)

    def refuse(self, path: Path, reason: str, *, secret: bool = False) -> Path | None:
        """Move an answer that does not fit aside, with a `.error` file saying why; the question
        stays pending. An answer to a sensitive question is not kept at all (it may be the
        secret, mistyped): it is removed and the `.error` says so. Returns where it went."""
        stamp = _stamp()
        error = self.ws.interaction_dir / f"{REJECTED}{stamp}.error"
        if secret:
            safefs.unlink(path)
            note = (
                f"{reason} (the answer was discarded: the question is sensitive, so a refused "
                "answer is not kept)"
            )
            atomic_write(error, (note + "\n").encode())
            return None
        kept = self.ws.interaction_dir / f"{REJECTED}{stamp}{path.suffix}"
        safefs.rename(path, kept)
        atomic_write(error, (reason + "\n").encode())
        return kept

    def rejected_since(self, mtime_ns: int) -> list[str]:
        """Names of answers refused at or after `mtime_ns` (their `.error` files); names only,
        never content: the daemon reports them without reading what a user wrote."""
        return self._names_since(REJECTED, mtime_ns, ".error")

    def stale_since(self, ctime_ns: int) -> list[str]:
        """Answers set aside as stale at or after `ctime_ns` (a rename keeps the mtime)."""
        return self._names_since(STALE, ctime_ns, "", ctime=True)

    def _names_since(self, prefix: str, t_ns: int, suffix: str, ctime: bool = False) -> list[str]:
        found = sorted(
            (st.st_ctime_ns if ctime else st.st_mtime_ns, name)
            for name, st in safefs.scandir_stats(self.ws.interaction_dir, prefix)
            if name.endswith(suffix) and (st.st_ctime_ns if ctime else st.st_mtime_ns) >= t_ns
        )
        return [name for _, name in found]

    def last_refusal(self) -> str | None:
        """The newest refusal reason written since the pending question was posted."""
        req_st = lstat_or_none(self.ws.request_file)
        if req_st is None:
            return None
        names = self.rejected_since(req_st.st_mtime_ns)
        if not names:
            return None
        try:
            raw = read_regular(self.ws.interaction_dir / names[-1], MAX_ERROR_BYTES)
        except (OSError, UnsafeFile) as e:
            return f"(the refusal note {names[-1]} is unreadable: {e})"
        return raw.decode("utf-8", errors="replace").strip()

    def stale_answers(self) -> list[str]:
        return sorted(n for n, _ in safefs.scandir_stats(self.ws.interaction_dir, STALE))

    def discard_answer(self) -> None:
        """Remove the answer files, not fsynced: every caller then `withdraw`s the question
        from the same directory, whose fsync makes these removals durable with its own (one
        fsync fewer on each answer's path); a crash before it leaves an answer the journal
        already holds, which the next resume removes."""
        safefs.unlink(self.ws.response_json, durable=False)
        safefs.unlink(self.ws.response_file, durable=False)

    def withdraw(self) -> None:
        """Remove the question. Callers remove the answer first: a crash in between leaves a
        question whose action the journal already answered, which the next resume removes."""
        safefs.unlink(self.ws.request_file)

    def restore_request(self, request: InteractionRequest, reason: str) -> Path:
        """Put back the journal's `request` over a `request.json` that says otherwise (edited by
        hand): the edited copy is kept as `request.refused-*.json` beside a `.error` saying
        why. The file keeps its time, so an answer written since still counts as newer than the
        question. Returns where the copy went."""
        st = lstat_or_none(self.ws.request_file)
        stamp = _stamp()
        kept = self.ws.interaction_dir / f"request.refused-{stamp}.json"
        atomic_write(kept, read_regular(self.ws.request_file))
        atomic_write(kept.with_suffix(".error"), (reason + "\n").encode())
        atomic_write(self.ws.request_file, (request.model_dump_json(indent=2) + "\n").encode())
        if st is not None:
            times = (st.st_atime_ns, st.st_mtime_ns)
            os.utime(self.ws.request_file, ns=times, follow_symlinks=False)
        return kept

    def set_aside_request(self, why: str) -> Path:
        dest = self.ws.interaction_dir / f"request.{why}-{_stamp()}.json"
        safefs.rename(self.ws.request_file, dest)
        return dest

    def write_structured(self, doc: Mapping[str, object], *, replace: bool = False) -> bool:
        """`response.json`, atomically; without `replace` only if none is there (False)."""
        return safefs.publish(self.ws.response_json, structured_bytes(doc), replace=replace)

    def write_answer(self, text: str, *, replace: bool = False) -> bool:
        """`response.txt`, atomically (no watcher sees half an answer); without `replace`
        only if none is there (False)."""
        return safefs.publish(self.ws.response_file, text.encode("utf-8"), replace=replace)


def structured_bytes(doc: Mapping[str, object]) -> bytes:
    """`response.json` as written: what a writer measures against MAX_MAILBOX_BYTES."""
    return json.dumps(doc, indent=2).encode()


__all__ = [
    "MAX_MAILBOX_BYTES",
    "Answer",
    "AnswerState",
    "Mailbox",
    "parse_request",
    "structured_bytes",
]
