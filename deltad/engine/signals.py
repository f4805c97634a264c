"""SIGINT/SIGTERM handling: interrupt only where it is safe to stop."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Interrupted(BaseException):
    """SIGINT/SIGTERM. A BaseException so that no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class InterruptGuard:
    """Signals interrupt only inside `window()` (a tool, the model call, a terminal read);
    elsewhere they are held until the next `checkpoint()`, so no state write is torn."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self._open = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.pending = signum
        if self._open:
            self._open = False
            raise Interrupted(signum)

    def checkpoint(self) -> None:
        if self.pending is not None:
            raise Interrupted(self.pending)

    @contextmanager
    def window(self) -> Iterator[None]:
        self.checkpoint()
        self._open = True
        try:
            yield
        finally:
            self._open = False
