"""The workspace mailbox: `request.json` (engine → human), `response.txt` (human → engine).

The engine only ever takes an answer that (a) sits next to a request of this run and action,
(b) is a regular UTF-8 file under the size cap, and (c) was written after the request.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import ValidationError

from .errors import CorruptFile, UnsafeFile
from .fsio import atomic_write, fsync_dir, lstat_or_none, read_regular
from .layout import Workspace
from .models import InteractionRequest, utcnow


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


class Mailbox:
    def __init__(self, workspace: Workspace) -> None:
        self.ws = workspace

    def read_request(self) -> InteractionRequest | None:
        try:
            raw = read_regular(self.ws.request_file)
        except FileNotFoundError:
            return None
        try:
            return InteractionRequest.model_validate_json(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            raise CorruptFile(f"{self.ws.request_file}: {where}: {first['msg']}") from None

    def post(self, request: InteractionRequest) -> None:
        """Publish a question. An answer file already there predates it: set it aside."""
        self.ws.interaction_dir.mkdir(parents=True, exist_ok=True)
        for old in (self.ws.response_file, self.ws.response_json):
            if lstat_or_none(old) is not None:
                stamp = utcnow().strftime("%Y%m%dT%H%M%S%f")
                os.replace(old, self.ws.interaction_dir / f"response.stale-{stamp}{old.suffix}")
        atomic_write(
            self.ws.request_file, (request.model_dump_json(indent=2) + "\n").encode(), 0o644
        )

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
        try:
            raw = read_regular(path)
            st = os.stat(path, follow_symlinks=False)
            text = raw.decode("utf-8")
        except UnsafeFile as e:
            return Answer(AnswerState.REFUSED, reason=str(e), path=path)
        except UnicodeDecodeError:
            return Answer(AnswerState.REFUSED, reason=f"{path} is not valid UTF-8", path=path)
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
        return Answer(AnswerState.READY, text, "", path, st.st_mtime_ns, st.st_uid)

    def refuse(self, path: Path, reason: str) -> Path:
        """Move an answer that does not fit aside, with a `.error` file saying why. The
        question stays pending; nothing the human wrote is lost."""
        stamp = utcnow().strftime("%Y%m%dT%H%M%S%f")
        kept = self.ws.interaction_dir / f"response.rejected-{stamp}{path.suffix}"
        os.replace(path, kept)
        atomic_write(kept.with_suffix(".error"), (reason + "\n").encode())
        return kept

    def refusals_since(self, wall_time: float) -> list[str]:
        """Reasons for answers refused at or after `wall_time` (for the daemon's log)."""
        if not self.ws.interaction_dir.is_dir():
            return []
        found = sorted(
            (st.st_mtime, p)
            for p in self.ws.interaction_dir.glob("response.rejected-*.error")
            if (st := p.stat()).st_mtime >= wall_time
        )
        return [p.read_text(errors="replace").strip() for _, p in found]

    def last_refusal(self) -> str | None:
        """The newest refusal reason written since the pending question was posted."""
        req_st = lstat_or_none(self.ws.request_file)
        if req_st is None or not self.ws.interaction_dir.is_dir():
            return None
        errors = [
            (st.st_mtime_ns, p)
            for p in self.ws.interaction_dir.glob("response.rejected-*.error")
            if (st := p.stat()).st_mtime_ns >= req_st.st_mtime_ns
        ]
        if not errors:
            return None
        return max(errors)[1].read_text(errors="replace").strip()

    def discard_answer(self) -> None:
        _unlink_durably(self.ws.response_json)
        _unlink_durably(self.ws.response_file)

    def withdraw(self) -> None:
        """Remove the question. Callers remove the answer first: a crash in between leaves a
        question whose action the journal already answered, which the next resume removes."""
        _unlink_durably(self.ws.request_file)

    def set_aside_request(self, why: str) -> Path:
        stamp = utcnow().strftime("%Y%m%dT%H%M%S%f")
        dest = self.ws.interaction_dir / f"request.{why}-{stamp}.json"
        os.replace(self.ws.request_file, dest)
        return dest

    def write_structured(self, doc: dict[str, object], *, secret: bool = False) -> None:
        atomic_write(
            self.ws.response_json, json.dumps(doc, indent=2).encode(), 0o600 if secret else 0o644
        )

    def write_answer(self, text: str, *, secret: bool = False) -> None:
        """Used by `delta respond`: an atomic rename, so no watcher sees half an answer."""
        atomic_write(self.ws.response_file, text.encode("utf-8"), 0o600 if secret else 0o644)


def _unlink_durably(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        fsync_dir(path.parent)
