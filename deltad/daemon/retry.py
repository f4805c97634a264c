"""Resuming runs the model endpoint left INTERRUPTED (error_kind model_unavailable).

An outage is not the run's fault: deltad tries again by itself, with capped exponential
backoff, until the model has been failing for `give_up_after_seconds`. That clock is the run's
own `model_failing_since` (set by the client at the first failure, cleared by the next good
call), so it survives daemon restarts; only the attempt count lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path


class Step(Enum):
    RESUME = "resume"
    WAIT = "wait"
    GIVE_UP = "give_up"  # just now: say it once
    GAVE_UP = "gave_up"  # already said


@dataclass(frozen=True)
class Decision:
    step: Step
    attempt: int = 0
    at: float = 0.0  # monotonic time of the next attempt (WAIT)


@dataclass
class ModelRetries:
    initial: float
    cap: float
    give_up_after: float
    _attempts: dict[Path, tuple[int, float]] = field(default_factory=dict)  # (done, not_before)
    _gave_up: set[Path] = field(default_factory=set)

    def delay(self, attempt: int) -> float:
        return float(min(self.initial * 2.0 ** (attempt - 1), self.cap))

    def decide(self, ws: Path, failing_since: float | None, wall: float, now: float) -> Decision:
        if failing_since is not None and wall - failing_since >= self.give_up_after:
            if ws in self._gave_up:
                return Decision(Step.GAVE_UP)
            self._gave_up.add(ws)
            return Decision(Step.GIVE_UP)
        done, not_before = self._attempts.get(ws, (0, now + self.delay(1)))
        if now < not_before:
            self._attempts[ws] = (done, not_before)
            return Decision(Step.WAIT, done + 1, not_before)
        self._attempts[ws] = (done + 1, now + self.delay(done + 2))
        return Decision(Step.RESUME, done + 1)

    def forget(self, ws: Path) -> None:
        """The run moved on (or a person took it): the next outage starts afresh."""
        self._attempts.pop(ws, None)
        self._gave_up.discard(ws)
