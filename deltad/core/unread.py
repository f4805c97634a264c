"""Workspaces known only by a glance at their mailbox's names, read after READY.

At start (and in a periodic full reconcile) a workspace whose `.delta/interaction/` holds
`request.json` and no answer file is not read: nothing in it needs the daemon before an answer
arrives, and its watch (in place before the glance) reports that answer. What a read would
still find — the question's deadline, a run that died after posting — is found by reading
these workspaces in the background, a bounded slice per loop turn, oldest first, once READY=1
is sent. A workspace looked at for any other reason (an event) leaves this list.

The same queue-and-set holds the workspaces to glance at again after an overflow
(`walking.Walker.recheck`): adding one already there keeps its place, so each is taken once
after the latest overflow however often they come.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from deltad.clock import Clock


class Unread:
    """Insertion-ordered: the background pass reads in the order the walk found them. A queue
    to read from and a set of who is still unread: a discarded workspace stays in the queue
    and is skipped when reached (popping the front of a dict scans past every slot emptied
    before it: quadratic over 100,000)."""

    def __init__(self) -> None:
        self._queue: deque[Path] = deque()
        self._paths: set[Path] = set()
        self.added = 0  # since the list was last empty (for the log line when it empties)

    def __len__(self) -> int:
        return len(self._paths)

    def __contains__(self, ws: Path) -> bool:
        return ws in self._paths

    def __iter__(self) -> Iterator[Path]:
        """Those still in the list, in its order."""
        return (ws for ws in self._queue if ws in self._paths)

    def add(self, ws: Path) -> None:
        if ws not in self._paths:
            self.added += 1
            self._paths.add(ws)
            self._queue.append(ws)

    def discard(self, ws: Path) -> None:
        self._paths.discard(ws)
        if not self._paths:
            self._queue.clear()

    def step(self, read: Callable[[Path], None], clock: Clock, budget: int, slice_s: float) -> int:
        """Read at most `budget` workspaces or for `slice_s` seconds; returns how many.
        `read` is expected to discard what it reads (a look always does)."""
        until = clock.monotonic() + slice_s
        done = 0
        while self._paths and done < budget and clock.monotonic() < until:
            ws = self._queue.popleft()
            if ws not in self._paths:  # discarded since: read already
                continue
            self._paths.discard(ws)
            read(ws)
            done += 1
        return done

    def emptied(self) -> int:
        """How many were read since the list was last empty, once it is empty again (else 0);
        the drained tables are let go (a set keeps its 100,000 slots after its removals)."""
        if self._paths or not self.added:
            return 0
        added, self.added = self.added, 0
        self._paths, self._queue = set(), deque()
        return added
