"""The daemon's sense of time, as a seam (after trio's Clock and supervisor's tick(now)):
reconcile, backoff, retries and timers take it, so tests can move time instead of sleeping.

`monotonic()` orders events and deadlines inside the daemon; `time()` is the wall clock, the
one file times and `expires_at` are measured on."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def time(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


@dataclass
class ManualClock:
    """A clock a test moves by hand (`advance`); both readings move together."""

    mono: float = 1000.0
    wall: float = 1_800_000_000.0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


SYSTEM = SystemClock()
