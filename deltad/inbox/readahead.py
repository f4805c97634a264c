"""Question documents read before a page asks for them (`ReadAhead`), so that any page of the
list is served from the kept documents (context.py `Documents`) and costs the same at 10,000
open questions as at 100: a stat per file of each item, not a dozen safe opens.

One thread in the core, beside the loop and the inbox's calls. It starts once every workspace
found is in the index (the reads after READY are done: it never competes with them), walks the
open questions in the list's default order (newest first) a page at a time, and reads each one
not kept, or kept from files that changed since. It stops a round when the cache is nearly full
(what it read first is then what pages ask most, and nothing it reads evicts it), and starts the
next one after a pause, if the index changed or the cache let documents go meanwhile. It is
paced: after each page of reads it rests as long as they took, so it holds at most half a core;
the loop is never waiting on it (it takes no lock the loop holds longer than a list copy, and
every file read lets go of the interpreter's lock)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from itertools import islice

import structlog

from deltad.inbox.context import Context, Shown
from deltad.inbox.feed import Listed

log = structlog.get_logger("deltad.api")

BATCH = 100  # questions read between two rests (a page's worth)
FULL = 0.9  # of the cache's budget: a round stops short of it, so it evicts nothing it read
PAUSE_SECONDS = 30.0  # between rounds (what changed meanwhile is read by the page asking)
DUTY = 0.5  # at most this share of a core, while reading
WAITING_SECONDS = 1.0  # how often it looks whether the index is complete


class ReadAhead:
    """Reads the open questions' documents into `ctx.documents` ahead of the pages; `read` is
    the page's own read of one item (handlers.listed_shown), so what it keeps is exactly what
    a page would. Its rests and pauses are waits on the stop event: `stop` ends any of them."""

    def __init__(self, ctx: Context, read: Callable[[Context, Listed], Shown | None]) -> None:
        self.ctx, self.read = ctx, read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.round_done = threading.Event()  # set as each pause begins (tests wait for one)
        self.pause = PAUSE_SECONDS
        self.read_last = 0  # questions looked at in the last round

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="read-ahead", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        walked: tuple[int, int] | None = None  # what the last round saw: nothing new, no round
        while not self._stop.is_set():
            if not self._ready():
                self._stop.wait(WAITING_SECONDS)
                continue
            now = self.seen()
            if now != walked:
                try:
                    self.read_last = self.round()
                except Exception as e:  # a bug here costs pages their speed, never the daemon
                    log.error("read_ahead_failed", error=f"{type(e).__name__}: {e}")
                walked = now
            self.round_done.set()
            self._stop.wait(self.pause)

    def seen(self) -> tuple[int, int]:
        """The index's changes and the cache's evictions so far: while neither moves, a round
        would find everything kept, so an idle daemon makes none (its stats are not free)."""
        return self.ctx.feed.index.generation, self.ctx.documents.evicted

    def _ready(self) -> bool:
        try:
            return self.ctx.vitals.health().index_complete
        except Exception:  # the loop's health not there yet (starting)
            return False

    def round(self) -> int:
        """One walk of the open questions, newest first, until the cache is nearly full: how
        many were looked at."""
        docs, looked, after, biggest = self.ctx.documents, 0, None, 0
        while not self._stop.is_set():
            page = list(islice(self.ctx.feed.index.questions(after), BATCH))
            if not page:
                break
            t0 = time.monotonic()
            for e in page:
                if docs.held + biggest > FULL * docs.budget:  # the next one could evict
                    return looked
                shown = self.read(self.ctx, e)
                if shown is not None:
                    biggest = max(biggest, shown.size)
                looked += 1
            after = page[-1].key
            took = time.monotonic() - t0
            self._stop.wait(took * (1 - DUTY) / DUTY)
        return looked
