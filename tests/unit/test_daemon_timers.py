"""The loop's wake-ups (deltad/core/timers.py)."""

from __future__ import annotations

from pathlib import Path

from deltad.core.timers import Timers

A, B = Path("/srv/ws/a"), Path("/srv/ws/b")


def test_a_workspace_asking_again_for_the_same_wake_up_keeps_one() -> None:
    timers = Timers()
    for _ in range(1000):  # every event on a busy mailbox asks for the same deadline
        timers.wake(A, 50.0)
    assert len(timers) == 1
    assert timers.due(49.9) == [] and timers.due(50.0) == [A] and timers.due(1e9) == []


def test_a_later_wake_up_outlives_an_earlier_one() -> None:
    """A question's deadline, then an answer settling sooner: the look at the settle time may
    be a glance that does not ask for the deadline again, so the deadline still fires."""
    timers = Timers()
    timers.wake(A, 90.0)
    timers.wake(A, 30.0)
    timers.wake(B, 60.0)
    assert timers.next_due() == 30.0
    assert timers.due(30.0) == [A]
    assert timers.due(60.0) == [B]
    assert timers.due(90.0) == [A]
    assert len(timers) == 0


def test_a_workspace_is_named_once_per_turn_in_time_order() -> None:
    timers = Timers()
    for ws, when in ((B, 5.0), (A, 3.0), (Path("/c"), 4.0), (A, 4.5)):
        timers.wake(ws, when)
    assert timers.due(10.0) == [A, Path("/c"), B]
