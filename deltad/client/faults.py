"""Crash injection for tests: `DELTA_FAULT=<point>` kills the process with SIGKILL there.

Points are named where the answer-ingestion sequence writes something durable, so a test can
prove that a crash between any two writes neither loses nor duplicates the answer.
"""

from __future__ import annotations

import os
import signal


def fault(point: str) -> None:
    if os.environ.get("DELTA_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def hold(point: str) -> None:
    """`DELTA_HOLD=<point>` sleeps `DELTA_HOLD_SECONDS` there: widens a race window on demand."""
    if os.environ.get("DELTA_HOLD") == point:
        import time

        time.sleep(float(os.environ.get("DELTA_HOLD_SECONDS", "1")))
