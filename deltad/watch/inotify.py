"""The Linux default backend: one inotify fd for every watch, read by the main loop.

The only module of deltad that imports `inotify_simple` (Linux only); the rest speak the
same bit values through `events`."""

from __future__ import annotations

from typing import ClassVar

import structlog
from inotify_simple import INotify

from . import events as F
from .hints import HintQueue
from .tree import (
    DELTA_MASK,
    DIR_MASK,
    INTERACTION_MASK,
    RUNS_MASK,
    Kind,
    PollingLike,
    WatchTree,
)

log = structlog.get_logger("deltad.watch")


class InotifyBackend(WatchTree):
    """One inotify fd for every watch, read by the main loop between selects."""

    name = "inotify"
    REFUSES_LINKS = True  # IN_DONT_FOLLOW | IN_ONLYDIR (a root's own link is the exception)
    MASKS: ClassVar[dict[Kind, int]] = {
        Kind.DIR: DIR_MASK,
        Kind.DELTA: DELTA_MASK,
        Kind.INTERACTION: INTERACTION_MASK,
        Kind.RUNS: RUNS_MASK,
    }

    def __init__(
        self,
        queue: HintQueue,
        fallback: PollingLike,
        max_watches: int | None = None,
        max_per_owner: int | None = None,
    ) -> None:
        super().__init__(queue, fallback, max_watches, max_per_owner)
        self._ino = INotify()

    def fileno(self) -> int | None:
        return int(self._ino.fileno())

    def process(self) -> None:
        """Read every event queued (the kernel's queue is emptied at each turn, so a mailbox's
        event is seen at once), then handle a slice of those waiting (`WatchTree.take`,
        `handle`). Called at each turn while some wait, readable or not."""
        try:
            events = self._ino.read(timeout=0)
        except OSError as e:
            self._failed = True
            log.error("inotify_read_failed", error=e.strerror)
            return
        self.take((ev.wd, ev.mask, ev.name) for ev in events)
        self.handle()

    def healthy(self) -> bool:
        return not self._failed

    def close(self) -> None:
        self._ino.close()

    def _add_watch(self, path: str, kind: Kind) -> int:
        # IN_MASK_ADD: a second path on the same directory adds to its events, never narrows
        # what the first path's watch reports.
        mask = self.MASKS[kind] | F.MASK_ADD
        if kind is Kind.DIR and self._is_root(path):
            mask &= ~F.DONT_FOLLOW
        return int(self._ino.add_watch(path, mask))

    def _rm_watch(self, wd: int) -> None:
        self._ino.rm_watch(wd)
