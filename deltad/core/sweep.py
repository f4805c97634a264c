"""A full reconcile in bounded steps, so the main loop keeps serving events while it runs.

A full reconcile walks every root (adding watches where missing) and looks at every workspace.
At 50,000 workspaces that is seconds of work; done in one go it stops the single-threaded loop,
and an answer written meanwhile waits for all of it. A `Sweep` instead advances the backends'
stepped walks (`Backend.sync_steps`) by at most `budget` directories and workspaces per loop
turn (and no longer than `slice_s`), reconciling each workspace as it is reached: watch, then
look, as before, one workspace at a time. What the walk did not find is dropped only at the end,
once every walk is complete.

An overflow (events were lost) does not abandon the walk in progress: `overflowed` marks that
what the walk has passed may have changed unseen, so once it ends it starts again (a lap) with
watches re-added and every workspace read. A sweep therefore ends one complete walk after the
latest overflow, and every workspace is reached once per lap however often the queue
overflows (the old restart never got past the start of the walk while a storm lasted).
`after` is the rule, pure and tested from a table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from deltad.clock import Clock
from deltad.watch import Backend
from deltad.watch.discovery import Layout
from deltad.watch.tree import SyncSteps

SWEEP_BUDGET = 200  # directories and workspaces per loop turn
SWEEP_SLICE = 0.02  # seconds per loop turn, whichever comes first

Asked = Literal["start", "keep", "again"]


def after(running: bool, reason: str, force: bool) -> Asked:
    """What a full reconcile asked for `reason` does, with one in progress (`running`) or not:
    start a new one; keep the one in progress (a periodic one is left to it); or let it go on
    and walk once more after it (an overflow: a restart at every overflow never finished while
    the overflows went on). A reload starts anew: its walks belong to the new backends."""
    if not running:
        return "start"
    if reason == "periodic" and not force:
        return "keep"
    return "again" if reason == "overflow" else "start"


@dataclass
class Sweep:
    reason: str
    quiet: bool
    started: float  # monotonic
    walks: list[SyncSteps]
    glance: bool = False  # an unanswered question is known by its mailbox's names (unread.py)
    layout: Layout = field(default_factory=Layout)
    visited: int = 0  # workspaces reconciled so far
    backends: list[Backend] = field(default_factory=list)  # whose walks these are (for a lap)
    again: bool = False  # an overflow came during this lap: another one follows it
    laps: int = 1  # walks begun (more than one: overflows came during the earlier ones)

    @classmethod
    def start(
        cls,
        backends: list[Backend],
        reason: str,
        clock: Clock,
        *,
        force: bool,
        quiet: bool,
        glance: bool = False,
    ) -> Sweep:
        walks = [b.sync_steps(force=force) for b in backends]
        return cls(reason, quiet, clock.monotonic(), walks, glance, backends=list(backends))

    def overflowed(self) -> None:
        """Events were lost: the walk goes on, and once it ends another lap follows, with the
        watches re-added (IN_IGNORED may have been lost too) and every workspace read."""
        self.again = True
        self.reason = "overflow"

    def _lap(self) -> None:
        self.again, self.glance, self.laps = False, False, self.laps + 1
        self.layout = Layout()  # what is dropped at the end is what the last lap missed
        self.walks = [b.sync_steps(force=True) for b in self.backends]

    def step(
        self, found: Callable[[Path], None], clock: Clock, budget: int, slice_s: float
    ) -> bool:
        """Advance by at most `budget` steps or `slice_s` seconds; `found` is called for each
        workspace reached. True once every walk is done (`layout` is then complete) and no
        overflow came during them (else the next lap begins)."""
        until = clock.monotonic() + slice_s
        while self.walks and budget > 0 and clock.monotonic() < until:
            try:
                ws = next(self.walks[0])
            except StopIteration as stop:
                self.layout.merge(stop.value)
                self.walks.pop(0)
                if not self.walks and self.again:
                    self._lap()
                continue
            budget -= 1
            if ws is not None:
                self.visited += 1
                found(ws)
        return not self.walks

    def finish(
        self, found: Callable[[Path], None], clock: Clock, between: Callable[[], None]
    ) -> None:
        """Run to the end in one go (the startup reconcile, before READY=1), calling `between`
        after each slice (the service reads the backends' events there)."""
        while not self.step(found, clock, SWEEP_BUDGET, float("inf")):
            between()

    def abandon(self) -> None:
        """Stop the walks where they are (a newer full reconcile replaces this one)."""
        for walk in self.walks:
            walk.close()
        self.walks = []
