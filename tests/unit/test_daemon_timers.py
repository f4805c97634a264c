"""The loop's wake-ups (deltad/daemon/timers.py): one live wake-up per workspace, its earliest."""

from __future__ import annotations

from pathlib import Path

from deltad.daemon.timers import Timers

A, B = Path("/srv/ws/a"), Path("/srv/ws/b")


def test_a_workspace_looked_at_again_and_again_keeps_one_wake_up() -> None:
    timers = Timers()
    for _ in range(1000):  # every event on a busy mailbox asks for the same deadline
        timers.wake(A, 50.0)
    assert len(timers) == 1 and len(timers._heap) == 1
    assert timers.due(49.9) == [] and timers.due(50.0) == [A] and timers.due(1e9) == []


def test_the_earliest_wins_and_a_later_one_asked_before_it_is_dropped() -> None:
    timers = Timers()
    timers.wake(A, 90.0)
    timers.wake(A, 30.0)  # an answer settling, sooner than the deadline
    timers.wake(A, 60.0)  # not live: the look at 30 asks again for what it still needs
    timers.wake(B, 60.0)
    assert timers.next_due() == 30.0
    assert timers.due(30.0) == [A]
    assert timers.due(100.0) == [B]  # A's 90 was dropped with its look at 30
    timers.wake(A, 120.0)  # asked again by that look
    assert timers.due(120.0) == [A] and len(timers) == 0


def test_due_in_time_order() -> None:
    timers = Timers()
    for ws, when in ((B, 5.0), (A, 3.0), (Path("/c"), 4.0)):
        timers.wake(ws, when)
    assert timers.due(10.0) == [A, Path("/c"), B]
