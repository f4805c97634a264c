"""Full reconciles and the reads after READY (`Walker`), for the loop (`service.py`): a full
reconcile walks the roots a bounded slice per loop turn (`sweep.py`) so that events are served
meanwhile; a paused workspace with no answer is only glanced at (its mailbox's names) and read
later, a slice at a time (`unread.py`). An overflow (events were lost) neither abandons the
walk in progress (it walks once more after it: `sweep.after`) nor waits for it: first every
workspace is glanced at again, those waiting for an answer first, a slice per turn
(`recheck`), so an answer whose event was lost is found in a few turns, not behind a walk of a
storming tenant's directories.

The walker owns what a walk is in the middle of (the sweep, the workspaces left to read) and is
handed, when it is made, the little it needs of the loop: the index, the feed, the clock, the
watch backends, and callbacks to look at a workspace, drop one, read the backends' events
between slices, and hear that a walk ended. It imports nothing of the daemon's loop.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import structlog

from deltad.clock import Clock
from deltad.core.facts import State
from deltad.core.registry import Registry
from deltad.core.sweep import SWEEP_BUDGET, SWEEP_SLICE, Sweep, after
from deltad.core.unread import Unread
from deltad.inbox.feed import Feed
from deltad.protocol.layout import ANSWER_FILES, REQUEST_FILE
from deltad.watch import Backend
from deltad.watch.discovery import mailbox_names, unanswered

log = structlog.get_logger("deltad.service")

_ASKED_OR_ANSWERED = frozenset({REQUEST_FILE, *ANSWER_FILES})

# A recheck's glance is one listing: more per turn than a sweep's steps, in the same 20 ms.
RECHECK_BUDGET = 2000


def recheck_reads(names: frozenset[str] | None, known: bool) -> bool:
    """After an overflow, must a workspace whose mailbox now holds `names` be read now? Yes if
    an answer file is there (its event may have been lost), or a question the daemon does not
    know to be waiting (`known`: read, or glanced at, waiting for it): its event may have been
    lost, and an answer to it with it. Anything else (no question, or the known one still
    unanswered) waits for the walk, which reads every workspace again."""
    if names is None or names.isdisjoint(_ASKED_OR_ANSWERED):
        return False
    return not (unanswered(names) and known)


class Walker:
    """The bounded full reconcile and the reads after READY.

    Clock: `clock.monotonic()` for the slices' time budget (the sweep's and the reads'). The
    callbacks run on the loop's thread: `look(ws, quiet)` looks at one workspace (decide and
    act), `drop(ws)` forgets one that was not found again, `between()` reads the backends'
    events between the slices of a walk run to its end (at startup), `ended(sweep)` hears
    that a full reconcile ended (after the drops)."""

    def __init__(
        self,
        registry: Registry,
        feed: Feed,
        clock: Clock,
        backends: Callable[[], list[Backend]],
        look: Callable[[Path, bool], None],
        drop: Callable[[Path], None],
        between: Callable[[], None],
        ended: Callable[[Sweep], None],
    ) -> None:
        self.sweep: Sweep | None = None  # a full reconcile in progress (sweep.py)
        self.unread = Unread()  # found by a glance, read after READY (unread.py)
        # Waiting for an answer when events were lost: glanced at again, first (same queue)
        self.recheck = Unread()
        self._recheck_started = 0.0
        self._registry, self._feed, self._clock = registry, feed, clock
        self._backends, self._look, self._drop = backends, look, drop
        self._between, self._ended = between, ended

    def full_reconcile(
        self, reason: str, *, force: bool = False, quiet: bool = False, at_once: bool = False
    ) -> None:
        """Start a full reconcile, done a bounded slice per loop turn (`sweep_step`) so that
        events are served meanwhile; `at_once` runs it to the end now (at startup). A periodic
        one while another runs is left to that one; any other replaces it."""
        if reason == "overflow":
            self._overflowed()
        match after(self.sweep is not None, reason, force):
            case "keep":
                return
            case "again":
                assert self.sweep is not None
                self.sweep.overflowed()
                return
        if self.sweep is not None:
            self.sweep.abandon()
        glance = reason in ("startup", "periodic")  # a reload or an overflow reads everything
        self.sweep = Sweep.start(
            self._backends(), reason, self._clock, force=force, quiet=quiet, glance=glance
        )
        log.info("reconcile_full_started", reason=reason)
        if at_once:
            self.sweep.finish(self._swept, self._clock, self._read_events)
            self._sweep_done(self.sweep)

    def _overflowed(self) -> None:
        """Every workspace is glanced at again, in the turns that follow, before the walk's
        slices, those waiting for an answer first: one already queued keeps its place, one
        glanced at since the last overflow goes to the end (each once after the latest
        overflow, however often it comes)."""
        if not self.recheck:
            self._recheck_started = self._clock.monotonic()
        add = self.recheck.add
        for ws in self._registry.in_state(State.WAITING):
            add(ws)
        for ws in list(self.unread):
            add(ws)
        for ws in self._registry.workspaces:  # a question posted while events were lost
            add(ws)

    def recheck_step(self) -> None:
        if self.recheck:
            self.recheck.step(self._rechecked, self._clock, RECHECK_BUDGET, SWEEP_SLICE)
        if read := self.recheck.emptied():
            took = self._clock.monotonic() - self._recheck_started
            log.info("overflow_rechecked", workspaces=read, duration_ms=int(took * 1000))

    def _rechecked(self, ws: Path) -> None:
        if ws not in self._registry:
            return
        known = ws in self.unread or self._registry.settled_waiting(ws)
        if recheck_reads(mailbox_names(ws), known):
            self._look(ws, False)

    def abandon(self) -> None:
        """Stop the walk in progress (its walks belong to backends about to be closed)."""
        if self.sweep is not None:
            self.sweep.abandon()
            self.sweep = None

    def _read_events(self) -> None:
        """Between slices of a walk that runs to its end (at startup): the kernel's event
        queue holds 16,384 events, and a fanotify mark fills it with every write on the
        filesystem; a walk of 100,000 workspaces (30 s) let it overflow on a busy one, and the
        overflow started a second full reconcile, reading every workspace, right after READY.
        What the events say is queued as hints, served after READY. A slice counts as a turn
        of the loop for /livez: a walk of 1,000,000 workspaces takes minutes."""
        self._between()

    def sweep_step(self) -> None:
        sweep = self.sweep
        if sweep is None:
            return
        laps = sweep.laps
        done = sweep.step(self._swept, self._clock, SWEEP_BUDGET, SWEEP_SLICE)
        if sweep.laps != laps:
            log.info("reconcile_full_lap", reason=sweep.reason, lap=sweep.laps)
        if done:
            self._sweep_done(sweep)

    def _swept(self, ws: Path) -> None:
        sweep = self.sweep
        quiet = sweep is not None and sweep.quiet
        new = ws not in self._registry
        self._registry.add(ws, quiet=quiet)
        if sweep is not None and sweep.glance and self._glanced(ws, new):
            return
        self._look(ws, quiet)

    def _glanced(self, ws: Path, new: bool) -> bool:
        """Is a glance at the mailbox's names enough for now (`discovery.unanswered`)? A new
        workspace is then read later (`read_step`); one already read waiting for this same
        question keeps its timer for the deadline."""
        if not unanswered(mailbox_names(ws)):
            return False
        if new or ws in self.unread:
            self.unread.add(ws)
            return True
        return self._registry.settled_waiting(ws)

    def read_step(self) -> None:
        """Read a slice of the workspaces known only by a glance (not announced as new
        questions: they were there before the daemon started)."""
        if self.unread:
            self._feed.priming = True
            try:
                self.unread.step(self._read, self._clock, SWEEP_BUDGET, SWEEP_SLICE)
            finally:
                self._feed.priming = False
        # Also when other looks emptied the list (an overflow's or a reload's full reconcile)
        if read := self.unread.emptied():
            log.info("questions_read", workspaces=read)  # every deadline is now timed
            settle_heap()  # what the reads added lives on too

    def _read(self, ws: Path) -> None:
        if ws in self._registry:
            self._look(ws, True)

    def _sweep_done(self, sweep: Sweep) -> None:
        self.sweep = None
        for ws in [w for w in self._registry.workspaces if w not in sweep.layout.workspaces]:
            self._drop(ws)
        self._ended(sweep)


def settle_heap() -> None:
    """After a full reconcile, what it built (an entry and watches per workspace) lives until
    the workspace goes. A full pass of the cyclic collector walks every tracked object, so with
    50,000 workspaces it would stop the loop for a time that grows with them, whenever it came;
    frozen objects are skipped by it (and still freed by reference counting). The young
    generations are collected first so that what is frozen is what lives on."""
    gc.collect(1)
    gc.freeze()
