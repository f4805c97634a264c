"""The run state machine, whole, in one place (after supervisor's states.py).

Every status change in both programs goes through `check_transition`; anything not in
`TRANSITIONS` is refused rather than guessed.
"""

from __future__ import annotations

from enum import StrEnum

from .errors import IllegalTransition


class RunStatus(StrEnum):
    RUNNING = "RUNNING"
    WAITING_FOR_INPUT = "WAITING_FOR_INPUT"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"
    CANCELED = "CANCELED"


S = RunStatus

TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.RUNNING: frozenset({S.WAITING_FOR_INPUT, S.COMPLETED, S.FAILED, S.INTERRUPTED, S.CANCELED}),
    # WAITING -> INTERRUPTED: the question was superseded by `delta run --new`.
    S.WAITING_FOR_INPUT: frozenset({S.RUNNING, S.INTERRUPTED, S.CANCELED}),
    S.INTERRUPTED: frozenset({S.RUNNING, S.CANCELED}),
    S.COMPLETED: frozenset(),
    # FAILED -> RUNNING only on purpose: `delta run --retry`, and only when the failure was the
    # model's (metadata.error_kind); the client checks that guard (RETRYABLE_FAILURES).
    S.FAILED: frozenset({S.RUNNING}),
    S.CANCELED: frozenset(),
}

# Finished: nothing resumes these by itself (a FAILED run only by an explicit --retry).
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELED})
RETRYABLE_FAILURES = frozenset({"model_refused", "model_unavailable", "model_output"})
# A run the client may pick up again; RUNNING only when its owner is dead (checked elsewhere).
RESUMABLE = frozenset({S.WAITING_FOR_INPUT, S.INTERRUPTED})


def check_transition(current: RunStatus, new: RunStatus) -> None:
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"run status cannot go from {current} to {new}")
