"""Hints: "look at workspace X again". Events only ever produce hints; reconcile decides from disk.

`HintQueue` is de-duplicating (a workspace is queued at most once; flags of repeated hints are
merged) and thread-safe, and wakes the main loop through a pipe so that the loop can `select`
on it together with the inotify fd and child pidfds.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from dataclasses import dataclass
from enum import Flag, auto
from pathlib import Path

from deltad import platform


class Why(Flag):
    CHECK = 0  # something changed (or a sweep): just look
    ANSWER_CLOSED = auto()  # response.txt was closed after writing or renamed in: complete
    ANSWER_CREATED = auto()  # response.txt appeared; may still be open for writing
    DISCOVERED = auto()  # a new workspace
    RESUME_DONE = auto()  # a resume child exited


@dataclass
class Hint:
    workspace: Path
    why: Why = Why.CHECK


class Waker:
    """A self-pipe that wakes the main loop's `select` from any thread; wake-ups between two
    `clear()`s collapse into one byte. Wake after publishing, clear before consuming: then no
    wake-up is lost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._r, self._w = platform.nonblocking_pipe()
        self._woken = False

    def fileno(self) -> int:
        return self._r

    def wake(self) -> None:
        with self._lock:
            if not self._woken:
                self._woken = True
                with contextlib.suppress(BlockingIOError):  # already full of wake-ups
                    os.write(self._w, b"x")

    def clear(self) -> None:
        with self._lock:
            self._woken = False
            try:
                while os.read(self._r, 4096):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


class HintQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._order: deque[Path] = deque()
        self._pending: dict[Path, Why] = {}
        self._rescan = False
        self._waker = Waker()

    def fileno(self) -> int:
        return self._waker.fileno()

    def put(self, workspace: Path, why: Why = Why.CHECK) -> None:
        with self._lock:
            if workspace in self._pending:
                self._pending[workspace] |= why
            else:
                self._pending[workspace] = why
                self._order.append(workspace)
        self._waker.wake()

    def request_rescan(self) -> None:
        """Events were lost (queue overflow): everything must be looked at again."""
        with self._lock:
            self._rescan = True
        self._waker.wake()

    def take_rescan(self) -> bool:
        with self._lock:
            wanted, self._rescan = self._rescan, False
            return wanted

    def pop(self) -> Hint | None:
        with self._lock:
            if not self._order:
                return None
            ws = self._order.popleft()
            return Hint(ws, self._pending.pop(ws))

    def __len__(self) -> int:
        return len(self._order)

    def wake(self) -> None:
        self._waker.wake()

    def clear_wakeup(self) -> None:
        self._waker.clear()

    def close(self) -> None:
        self._waker.close()
