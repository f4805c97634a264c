"""Checkpoints: named points in the answer-ingestion sequence where something durable was just
written (after trio's instruments). The engine calls `hooks.reached(point)`; production code
passes `NoCheckpoints`. Tests reach the points of a real `delta` process through the CLI's
`EnvCheckpoints` (DELTA_FAULT kills the process there, DELTA_HOLD sleeps), the only place that
reads those variables."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Point(StrEnum):
    AFTER_SECRET = "after_secret"  # the secret answer is in the 0600 store
    BEFORE_JOURNAL = "before_journal"  # about to write the `answered` record
    AFTER_JOURNAL = "after_journal"  # the commit point is on disk
    AFTER_STATUS = "after_status"  # the run is RUNNING again
    AFTER_DISCARD_ANSWER = "after_discard_answer"  # the answer file is gone, the question not
    AFTER_RESULT = "after_result"  # the ACTION_RESULT is journaled
    AFTER_POST = "after_post"  # request.json is posted, the status not yet WAITING
    AFTER_OUTCOME = "after_outcome"  # a pipeline node's NODE_OUTCOME is journaled, not routed


class Checkpoints(Protocol):
    def reached(self, point: Point) -> None: ...


class NoCheckpoints:
    def reached(self, point: Point) -> None:
        return None


@dataclass(frozen=True)
class EnvCheckpoints:
    """DELTA_FAULT=<point> SIGKILLs the process there; DELTA_HOLD=<point> sleeps
    DELTA_HOLD_SECONDS there (to widen a race on purpose). For tests of real processes."""

    fault: str | None = None
    hold: str | None = None
    hold_seconds: float = 1.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Checkpoints:
        fault, hold = env.get("DELTA_FAULT"), env.get("DELTA_HOLD")
        if not fault and not hold:
            return NoCheckpoints()
        return cls(fault, hold, float(env.get("DELTA_HOLD_SECONDS", "1")))

    def reached(self, point: Point) -> None:
        if point == self.fault:
            os.kill(os.getpid(), signal.SIGKILL)
        if point == self.hold:
            time.sleep(self.hold_seconds)
