"""The one intake beside the daemon's loop for all that goes out (Postfix's queue manager takes
mail in once, however many delivery agents there are): the loop offers each feed event and
never waits; one thread hands it to each consumer that wants it, in order: the notifications
(deltad/outbound/notify.py) and the channels (deltad/outbound/hub.py). They read what they need
from the disk on this thread and write deliveries into the inbox process's outboxes."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from deltad.inbox.feed import Feed, FeedEvent

QUEUE_CAP = 10_000
STOP_WAIT = 10.0  # seconds a stop waits for queued events to be handed on


class Consumer(Protocol):
    def wants(self, e: FeedEvent) -> bool:
        """On the daemon's loop: whether the event is for this consumer (no I/O)."""
        ...

    def take(self, e: FeedEvent) -> None:
        """On the intake thread: the event handed on."""
        ...

    def dropped(self, e: FeedEvent) -> None:
        """The queue was full: the event, which it wanted, will not come (it says so)."""
        ...

    def failed(self, e: FeedEvent, err: Exception) -> None:
        """`take` raised (a bug or an outage): said; the intake goes on."""
        ...


class Intake:
    def __init__(self, feed: Feed, consumers: Sequence[Consumer]) -> None:
        self.feed, self.consumers = feed, list(consumers)
        self._queue: queue.Queue[FeedEvent | None] = queue.Queue(QUEUE_CAP)
        self._thread = threading.Thread(target=self._take_all, name="deltad-outbound", daemon=True)
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        self._thread.start()
        self._unsubscribe = self.feed.subscribe(self._offer)

    def _offer(self, e: FeedEvent) -> None:
        """On the daemon's loop: queue, never wait."""
        wanted = [c for c in self.consumers if c.wants(e)]
        if not wanted:
            return
        try:
            self._queue.put_nowait(e)
        except queue.Full:
            for c in wanted:
                c.dropped(e)

    def _take_all(self) -> None:
        while (e := self._queue.get()) is not None:
            for c in self.consumers:
                try:
                    if c.wants(e):
                        c.take(e)
                except Exception as err:  # what goes out must never take the daemon down
                    c.failed(e, err)

    def stop(self) -> None:
        """What is queued is handed on first (a SIGTERM loses no delivery)."""
        if self._unsubscribe:
            self._unsubscribe()
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=STOP_WAIT)
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT)
