"""Property-based fuzzing. Each test's example budget is scaled up by the `fuzz` profile."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# `HYPOTHESIS_PROFILE=fuzz`: this many times each test's usual number of cases.
LONGER = 25


def fuzz_settings(examples: int) -> settings:
    """`examples` cases per test (times LONGER when fuzzing on purpose), never a deadline:
    the machine is shared and a slow case is not a failure."""
    scale = LONGER if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz" else 1
    return settings(
        max_examples=examples * scale,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
