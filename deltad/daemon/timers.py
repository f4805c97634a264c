"""When to look at a workspace again without an event (an answer settling, a deadline): a heap
with at most one live wake-up per workspace, its earliest. Each look asks again for what it
still needs, so a later wake-up asked for before an earlier one fires is dropped when it comes
up; a workspace looked at again and again (a busy mailbox) does not grow the heap."""

from __future__ import annotations

import heapq
from pathlib import Path


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, Path]] = []
        self._due: dict[Path, float] = {}  # workspace -> its live (earliest) wake-up

    def __len__(self) -> int:
        return len(self._due)

    def wake(self, ws: Path, when: float) -> None:
        pending = self._due.get(ws)
        if pending is not None and pending <= when:
            return  # that look will ask again for whatever it still needs
        self._due[ws] = when
        heapq.heappush(self._heap, (when, ws))

    def next_due(self) -> float | None:
        """The earliest entry (maybe a dropped one: an early wake-up only costs a turn)."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[Path]:
        """The workspaces whose live wake-up has come, taken off."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            when, ws = heapq.heappop(self._heap)
            if self._due.get(ws) == when:
                del self._due[ws]
                out.append(ws)
        return out
