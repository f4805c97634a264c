"""The daemon bench's per-workspace costs: slopes between two sizes of one run, projected."""

from __future__ import annotations

from typing import Any

import pytest

from bench.daemon_bench import slope

MB = 2**20


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # RSS 100 MB at 100,000 and 190 MB at 1,000,000: 104.9 bytes per workspace, what both
        # share (the interpreter) cancels out; READY 2 s and 20 s: 20 µs per workspace.
        (
            {"n": 100_000, "ready_rss_mb": 100.0, "ready_s": 2.0},
            {"n": 1_000_000, "ready_rss_mb": 190.0, "ready_s": 20.0},
            {
                "from_n": 100_000,
                "to_n": 1_000_000,
                "rss_at_ready_bytes_per_ws": round(90 * MB / 900_000, 3),
                "projected_ready_rss_mb": 190.0,
                "ready_us_per_ws": 20.0,
                "projected_ready_s": 20.0,
            },
        ),
        # Measured at 10,000 and 20,000, in either order, projected to 1,000,000.
        (
            {"n": 20_000, "rss_mb": 60.0, "ready_cpu_s": 0.4},
            {"n": 10_000, "rss_mb": 50.0, "ready_cpu_s": 0.2},
            {
                "from_n": 10_000,
                "to_n": 20_000,
                "rss_idle_bytes_per_ws": round(10 * MB / 10_000, 3),
                "projected_rss_mb": 60.0 + 980_000 * 10 / 10_000,
                "ready_cpu_us_per_ws": 20.0,
                "projected_ready_cpu_s": 20.0,
            },
        ),
        # A value measured at one size only has no slope.
        ({"n": 1, "read_rss_mb": 1.0}, {"n": 2}, {"from_n": 1, "to_n": 2}),
    ],
)
def test_slopes_between_two_sizes(
    a: dict[str, Any], b: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert slope(a, b, project_to=1_000_000) == {"project_to": 1_000_000, **expected}


def test_one_size_twice_has_no_slope() -> None:
    with pytest.raises(ValueError, match="two different sizes"):
        slope({"n": 5, "ready_s": 1.0}, {"n": 5, "ready_s": 2.0}, project_to=10)
