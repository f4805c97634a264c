"""Property-based fuzzing. Each test's example budget is scaled up by the `fuzz` profile.

Hypothesis's profiles are registered and loaded here, where the property tests are, rather than
in tests/conftest.py: importing hypothesis costs ~0.5 s of CPU, which every pytest process (the
unit layer's included) would pay for nothing."""

from __future__ import annotations

import os

os.environ.setdefault("HYPOTHESIS_NO_PLUGINS", "1")  # before hypothesis: tests/conftest.py
from hypothesis import HealthCheck, settings

# Fuzzing: CI draws the same cases every run (a red build is a real regression, never a new
# draw); `HYPOTHESIS_PROFILE=fuzz` searches longer with fresh seeds (README, "Fuzzing"). A case
# either finds is kept as an explicit `@example` in its test.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, print_blob=True)
_default_profile = "ci" if os.environ.get("CI") else "default"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or _default_profile)

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
