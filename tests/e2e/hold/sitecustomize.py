"""Loaded by a `deltad serve` a test starts with this directory on PYTHONPATH and
DELTAD_TEST_HOLD set to a directory: while `DIR/walk` exists the startup walk stays between two
slices (reading events and counting as turns, as a long walk does), and while `DIR/reads`
exists the reads after READY wait. So a test sees the daemon not ready for as long as it
likes, without racing it (tests/e2e/test_operating.py). Only the pace changes: every step runs
as it would."""

from __future__ import annotations

import os
import sys
import time

HOLD = os.environ.get("DELTAD_TEST_HOLD")
ROLE = sys.argv[1:2] == ["serve"] and os.path.basename(sys.argv[0]) == "deltad"


def _install(hold: str) -> None:
    from deltad.core import unread, walking

    read_events = walking.Walker._read_events
    step = unread.Unread.step

    def held_walk(self):  # type: ignore[no-untyped-def]
        while os.path.exists(os.path.join(hold, "walk")):
            read_events(self)
            time.sleep(0.05)
        read_events(self)

    def held_step(self, read, clock, budget, slice_s):  # type: ignore[no-untyped-def]
        if os.path.exists(os.path.join(hold, "reads")):
            time.sleep(0.05)  # the loop turns on (it has reads left: it does not nap)
            return 0
        return step(self, read, clock, budget, slice_s)

    walking.Walker._read_events = held_walk  # type: ignore[method-assign]
    unread.Unread.step = held_step  # type: ignore[method-assign]


if HOLD and ROLE:
    _install(HOLD)
