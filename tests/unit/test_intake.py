"""The one intake (deltad/outbound/intake.py): the loop's offer never waits; each consumer gets
what it wants, in order, and one that fails keeps no other from it; a full queue is said by
each consumer that wanted the event; a stop hands on what was queued first."""

from __future__ import annotations

import pytest

from deltad.inbox.feed import Feed, FeedEvent
from deltad.outbound import intake
from deltad.outbound.intake import Intake


class Taker:
    def __init__(self, kinds: set[str], fail: bool = False) -> None:
        self.kinds, self.fail = kinds, fail
        self.took: list[str] = []
        self.dropped_ids: list[int] = []
        self.failures: list[str] = []

    def wants(self, e: FeedEvent) -> bool:
        return e.type in self.kinds

    def take(self, e: FeedEvent) -> None:
        self.took.append(e.type)
        if self.fail:
            raise RuntimeError("down")

    def dropped(self, e: FeedEvent) -> None:
        self.dropped_ids.append(e.id)

    def failed(self, e: FeedEvent, err: Exception) -> None:
        self.failures.append(str(err))


def test_each_consumer_gets_what_it_wants_and_a_failing_one_stops_no_other() -> None:
    feed = Feed()
    broken, asks = (
        Taker({"request.created", "request.answered"}, fail=True),
        Taker({"request.created"}),
    )
    line = Intake(feed, [broken, asks])
    line.start()
    for kind in ("request.created", "run.status", "request.answered", "request.created"):
        feed.publish(kind, {"workspace": "/srv/ws/a", "request_id": "q"})
    line.stop()  # what was queued is handed on before it returns
    assert broken.took == ["request.created", "request.answered", "request.created"]
    assert broken.failures == ["down"] * 3
    assert asks.took == ["request.created", "request.created"] and not asks.failures


def test_a_full_queue_is_said_by_each_consumer_that_wanted_the_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake, "QUEUE_CAP", 2)
    feed = Feed()
    both, created = Taker({"request.created", "request.expired"}), Taker({"request.created"})
    line = Intake(feed, [both, created])
    line._unsubscribe = feed.subscribe(line._offer)  # offered, never taken: no thread
    for kind in ("request.created", "request.expired", "request.created", "request.expired"):
        feed.publish(kind, {"workspace": "/srv/ws/a", "request_id": "q"})
    assert len(both.dropped_ids) == 2 and len(created.dropped_ids) == 1
    assert created.dropped_ids[0] == both.dropped_ids[0]  # the third event: both wanted it
    assert not both.took and not created.took
