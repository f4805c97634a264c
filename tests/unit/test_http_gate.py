"""The connection gate's decisions from tables: which connection is refused, and how many the
descriptor limit leaves after the reserve; the counter's bookkeeping and its rate-limited log."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from deltad.http.gate import Caps, Gate, connection_cap, refusal


@pytest.mark.parametrize(
    ("total", "from_source", "caps", "why"),
    [
        (0, 0, Caps(2, 1), None),
        (1, 0, Caps(2, 1), None),  # another source
        (1, 1, Caps(2, 1), "max_connections_per_source"),
        (2, 0, Caps(2, 1), "max_connections"),  # the process's cap first
        (2, 2, Caps(2, 5), "max_connections"),
    ],
)
def test_which_connection_is_refused(total: int, from_source: int, caps: Caps, why: str) -> None:
    assert refusal(total, from_source, caps) == why


@pytest.mark.parametrize(
    ("configured", "nofile", "in_use", "reserve", "cap"),
    [
        (512, 65536, 40, 256, 512),  # the descriptor limit does not bind
        (512, 1024, 40, 256, 728),  # 728 left: the configured 512 binds
        (1000, 1024, 40, 256, 728),  # the limit less what is open and the reserve
        (1000, 300, 40, 256, 4),
        (1000, 200, 40, 256, 1),  # never none at all: the reserve stays as large as it can
    ],
)
def test_the_descriptor_reserve(
    configured: int, nofile: int, in_use: int, reserve: int, cap: int
) -> None:
    assert connection_cap(configured, nofile, in_use, reserve) == min(cap, configured)


def test_the_gate_counts_per_source_and_logs_a_flood_once() -> None:
    gate = Gate(Caps(3, 2))
    with capture_logs() as logs:
        assert gate.admit("10.0.0.1") is None
        assert gate.admit("10.0.0.1") is None
        for _ in range(1000):
            assert gate.admit("10.0.0.1") == "max_connections_per_source"
        assert gate.admit("10.0.0.2") is None
        assert gate.admit("10.0.0.3") == "max_connections"
    assert gate.open_count() == 3 and gate.open_count("10.0.0.1") == 2
    assert gate.refused == {"max_connections_per_source": 1000, "max_connections": 1}
    assert [e["event"] for e in logs] == ["http_connections_refused"]  # not 1001 lines
    gate.release("10.0.0.1")
    assert gate.admit("10.0.0.1") is None
    for source in ("10.0.0.1", "10.0.0.1", "10.0.0.2"):
        gate.release(source)
    assert gate.open_count() == 0 and gate.open_count("10.0.0.1") == 0
