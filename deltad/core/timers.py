"""When to look at a workspace again without an event (an answer settling, a deadline): a heap
of wake-ups. Every distinct one is kept — a glance that finds a question still unanswered does
not ask for its deadline again, so that deadline's wake-up must outlive earlier ones — but a
workspace asking again for the wake-up it asked for last (every event on a busy mailbox asks
for the same deadline) does not grow the heap."""

from __future__ import annotations

import heapq
from pathlib import Path


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, Path]] = []
        self._last: dict[Path, float] = {}  # workspace -> the wake-up it asked for last

    def __len__(self) -> int:
        return len(self._heap)

    def wake(self, ws: Path, when: float) -> None:
        if self._last.get(ws) == when:
            return  # already in the heap
        self._last[ws] = when
        heapq.heappush(self._heap, (when, ws))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[Path]:
        """The workspaces with a wake-up that has come (each once), taken off."""
        out: dict[Path, None] = {}
        while self._heap and self._heap[0][0] <= now:
            when, ws = heapq.heappop(self._heap)
            if self._last.get(ws) == when:
                del self._last[ws]
            out[ws] = None
        return list(out)
