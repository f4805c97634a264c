"""Full reconciles and the reads after READY, carried out for the service (`service.py`): a
full reconcile walks the roots a bounded slice per loop turn (`sweep.py`) so that events are
served meanwhile; a paused workspace with no answer is only glanced at (its mailbox's names)
and read later, a slice at a time (`unread.py`)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from deltad.watch.discovery import mailbox_names, unanswered
from deltad.watch.hints import Why

from . import lifecycle
from .sweep import SWEEP_BUDGET, SWEEP_SLICE, Sweep

if TYPE_CHECKING:
    from .service import Service

log = structlog.get_logger("deltad.service")


def full_reconcile(
    svc: Service, reason: str, *, force: bool = False, quiet: bool = False, at_once: bool = False
) -> None:
    """Start a full reconcile, done a bounded slice per loop turn (`sweep_step`) so that
    events are served meanwhile; `at_once` runs it to the end now (at startup). A periodic
    one while another runs is left to that one; any other replaces it."""
    if svc.sweep is not None:
        if reason == "periodic" and not force:
            return
        svc.sweep.abandon()
    glance = reason in ("startup", "periodic")  # a reload or an overflow reads everything
    svc.sweep = Sweep.start(
        svc.backends, reason, svc.clock, force=force, quiet=quiet, glance=glance
    )
    log.info("reconcile_full_started", reason=reason)
    if at_once:
        svc.sweep.finish(
            functools.partial(_swept, svc), svc.clock, functools.partial(_read_events, svc)
        )
        _sweep_done(svc, svc.sweep)


def _read_events(svc: Service) -> None:
    """Between slices of a walk that runs to its end (at startup): the kernel's event
    queue holds 16,384 events, and a fanotify mark fills it with every write on the
    filesystem; a walk of 100,000 workspaces (30 s) let it overflow on a busy one, and the
    overflow started a second full reconcile, reading every workspace, right after READY.
    What the events say is queued as hints, served after READY. A slice counts as a turn of
    the loop for /livez: a walk of 1,000,000 workspaces takes minutes."""
    svc.ticks.last_turn = svc.clock.monotonic()
    for b in svc.backends:
        lifecycle.process(svc, b)


def sweep_step(svc: Service) -> None:
    sweep = svc.sweep
    if sweep is not None and sweep.step(
        functools.partial(_swept, svc), svc.clock, SWEEP_BUDGET, SWEEP_SLICE
    ):
        _sweep_done(svc, sweep)


def _swept(svc: Service, ws: Path) -> None:
    sweep = svc.sweep
    quiet = sweep is not None and sweep.quiet
    new = ws not in svc.registry
    svc.registry.add(ws, quiet=quiet)
    if sweep is not None and sweep.glance and _glanced(svc, ws, new):
        return
    svc.reconcile(ws, Why.CHECK, quiet=quiet)


def _glanced(svc: Service, ws: Path, new: bool) -> bool:
    """Is a glance at the mailbox's names enough for now (`discovery.unanswered`)? A new
    workspace is then read later (`read_step`); one already read waiting for this same
    question keeps its timer for the deadline."""
    if not unanswered(mailbox_names(ws)):
        return False
    if new or ws in svc.unread:
        svc.unread.add(ws)
        return True
    return svc.registry.settled_waiting(ws)


def read_step(svc: Service) -> None:
    """Read a slice of the workspaces known only by a glance (not announced as new
    questions: they were there before the daemon started)."""
    if svc.unread:
        svc.feed.priming = True
        try:
            svc.unread.step(functools.partial(_read, svc), svc.clock, SWEEP_BUDGET, SWEEP_SLICE)
        finally:
            svc.feed.priming = False
    # Also when other looks emptied the list (an overflow's or a reload's full reconcile)
    if read := svc.unread.emptied():
        log.info("questions_read", workspaces=read)  # every deadline is now timed
        lifecycle.settle_heap()  # what the reads added lives on too


def _read(svc: Service, ws: Path) -> None:
    if ws in svc.registry:
        svc.reconcile(ws, Why.CHECK, quiet=True)


def _sweep_done(svc: Service, sweep: Sweep) -> None:
    svc.sweep = None
    for ws in [w for w in svc.registry.workspaces if w not in sweep.layout.workspaces]:
        svc.drop(ws)
    lifecycle.swept(svc, sweep)
