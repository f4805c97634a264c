"""The outage bench's reading of the loop-turn histogram (tests.support.slurmoutage): the share
within an edge is exact, the quantile is the edge it falls under, two reads subtract."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from deltad.metrics import TURN_BUCKETS
from tests.support.slurmoutage import TURN_CPU_METRIC, TURN_METRIC, grown, turns


def exposition(wall: list[float], cpu: list[float]) -> str:
    r = CollectorRegistry()
    h = Histogram(TURN_METRIC, "wall", buckets=TURN_BUCKETS, registry=r)
    c = Histogram(TURN_CPU_METRIC, "cpu", buckets=TURN_BUCKETS, registry=r)
    for x in wall:
        h.observe(x)
    for x in cpu:
        c.observe(x)
    return generate_latest(r).decode()


def test_the_share_within_50ms_and_the_p99_edge_are_read_from_the_buckets() -> None:
    t = turns(exposition([0.0005] * 98 + [0.07, 0.3], [0.001] * 100))
    assert t.count == 100
    assert t.within(0.05) == 0.98
    assert t.quantile_le(0.99) == 0.1 and t.quantile_le(1.0) == 0.5
    cpu = turns(exposition([], [0.001] * 100), TURN_CPU_METRIC)
    assert cpu.within(0.05) == 1.0 and cpu.quantile_le(0.99) == 0.001


def test_a_span_is_the_difference_of_two_reads() -> None:
    before = turns(exposition([0.2] * 10, []))
    after = turns(exposition([0.2] * 10 + [0.001] * 990, []))
    span = grown(before, after)
    assert span.count == 990 and span.within(0.05) == 1.0
    assert span.quantile_le(0.99) == 0.001


def test_no_turns_read_as_none() -> None:
    empty = turns(exposition([], []))
    assert empty.count == 0 and empty.within(0.05) is None and empty.quantile_le(0.99) is None
