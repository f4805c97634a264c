"""The workspace mailbox: `request.json` (engine → human), `response.txt` (human → engine).

The engine only ever takes an answer that (a) sits next to a request of this run and action,
(b) is a regular UTF-8 file under the size cap, and (c) was written after the request.
"""

from __future__ import annotations

import contextlib
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
        """Publish a question. A response.txt already there predates it: set it aside."""
        self.ws.interaction_dir.mkdir(parents=True, exist_ok=True)
        if lstat_or_none(self.ws.response_file) is not None:
            stamp = utcnow().strftime("%Y%m%dT%H%M%S%f")
            os.replace(
                self.ws.response_file, self.ws.interaction_dir / f"response.stale-{stamp}.txt"
            )
        atomic_write(
            self.ws.request_file, (request.model_dump_json(indent=2) + "\n").encode(), 0o644
        )

    def read_answer(self, request: InteractionRequest, *, secret: bool = False) -> Answer:
        path = self.ws.response_file
        st = lstat_or_none(path)
        if st is None:
            return Answer(AnswerState.MISSING)
        try:
            raw = read_regular(path)
            text = raw.decode("utf-8")
        except UnsafeFile as e:
            return Answer(AnswerState.REFUSED, reason=str(e))
        except UnicodeDecodeError:
            return Answer(AnswerState.REFUSED, reason=f"{path} is not valid UTF-8")
        except FileNotFoundError:
            return Answer(AnswerState.MISSING)
        req_st = lstat_or_none(self.ws.request_file)
        # Compare file times (same kernel clock) rather than the request's own timestamp.
        if req_st is not None and st.st_mtime_ns < req_st.st_mtime_ns:
            return Answer(
                AnswerState.STALE,
                reason=f"{path} is older than the question; write it again (or touch it)",
            )
        text = text.rstrip("\r\n") if secret else text.strip()
        return Answer(AnswerState.READY, text=text)

    def discard_answer(self) -> None:
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

    def write_answer(self, text: str, *, secret: bool = False) -> None:
        """Used by `delta respond`: an atomic rename, so no watcher sees half an answer."""
        atomic_write(self.ws.response_file, text.encode("utf-8"), 0o600 if secret else 0o644)


def _unlink_durably(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        fsync_dir(path.parent)
