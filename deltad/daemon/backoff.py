"""Capped exponential backoff per workspace, for resumes that keep failing.

A resume "fails" when the child could not do its job (crash, timeout, usage error) or when it
exited and the very same answer is still waiting (the client did not take it). A different
answer, or a run that moved on, starts from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AnswerSig = tuple[int, int, int]  # the answer file's (inode, size, mtime_ns)


def exponential(initial: float, cap: float, failures: int) -> float:
    """The wait after `failures` failures in a row: `initial`, doubled each time, at most `cap`."""
    return float(min(initial * 2 ** (failures - 1), cap))


def jittered(delay: float, r: float) -> float:
    """`delay` spread over [delay/2, delay) by `r` in [0, 1), so many senders that failed
    together do not all try again at the same instant ("equal jitter")."""
    return delay / 2 + delay / 2 * r


# What a resume was for; a different key starts the backoff afresh.
@dataclass(frozen=True)
class AnswerKey:
    sig: AnswerSig | None


@dataclass(frozen=True)
class ExpiredKey:
    request_id: str | None


@dataclass(frozen=True)
class InterruptedKey:
    run_id: str | None


@dataclass(frozen=True)
class ModelRetryKey:
    run_id: str | None
    attempt: int


ResumeKey = AnswerKey | ExpiredKey | InterruptedKey | ModelRetryKey


@dataclass
class Attempt:
    key: ResumeKey | None
    failures: int = 0
    not_before: float = 0.0


class Backoff:
    def __init__(self, initial: float, cap: float) -> None:
        self.initial = initial
        self.cap = cap
        self._attempts: dict[Path, Attempt] = {}

    def allowed(self, ws: Path, key: ResumeKey, now: float) -> float | None:
        """None if `key` may be resumed now, else the time from which it may."""
        a = self._attempts.get(ws)
        if a is None or a.key != key or now >= a.not_before:
            return None
        return a.not_before

    def started(self, ws: Path, key: ResumeKey) -> None:
        a = self._attempts.get(ws)
        if a is None or a.key != key:
            self._attempts[ws] = Attempt(key)

    def failed(self, ws: Path, now: float) -> tuple[int, float]:
        a = self._attempts.setdefault(ws, Attempt(None))
        a.failures += 1
        delay = exponential(self.initial, self.cap, a.failures)
        a.not_before = now + delay
        return a.failures, delay

    def last_key(self, ws: Path) -> ResumeKey | None:
        a = self._attempts.get(ws)
        return a.key if a else None

    def failures(self, ws: Path) -> int:
        a = self._attempts.get(ws)
        return a.failures if a else 0

    def forget(self, ws: Path) -> None:
        self._attempts.pop(ws, None)
