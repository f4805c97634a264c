"""Which owner's queued resume starts next: fair resume slots, a pure decision.

An owner is the workspace owner's uid. At most `total` resumes run at once, and at most
`per_owner` of one owner's. Among the owners with a resume waiting and a slot of their own
free, the one with the fewest running goes first, then the one whose oldest resume has waited
longest: owners take turns (round-robin), so one owner's backlog never delays another owner's
first resume. With one owner and `per_owner == total` this is the plain FIFO it replaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Slots:
    total: int  # max_parallel_resumes
    per_owner: int  # max_parallel_resumes_per_owner, at most `total`

    @classmethod
    def of(cls, total: int, per_owner: int | None) -> Slots:
        """`per_owner` above `total` would never bind: it is `total` (None: `total` too)."""
        return cls(total, total if per_owner is None else min(per_owner, total))


def pick_next(waiting: Mapping[int, int], running: Mapping[int, int], slots: Slots) -> int | None:
    """The owner whose oldest waiting resume starts now, or None (no slot may be used).

    `waiting`: owner -> arrival number of its oldest waiting resume (smaller waited longer).
    `running`: owner -> resumes of that owner running now (every running resume counted).
    """
    if sum(running.values()) >= slots.total:
        return None
    free = [owner for owner in waiting if running.get(owner, 0) < slots.per_owner]
    return min(free, key=lambda owner: (running.get(owner, 0), waiting[owner]), default=None)


def held_by_owner_cap(
    waiting: Mapping[int, int], running: Mapping[int, int], slots: Slots
) -> list[int]:
    """The owners whose resumes wait only for a slot of their own: a slot is free overall."""
    if sum(running.values()) >= slots.total:
        return []
    return [owner for owner in waiting if running.get(owner, 0) >= slots.per_owner]
