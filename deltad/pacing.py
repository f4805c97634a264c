"""One pacing policy: capped, optionally jittered, exponential backoff.

Every place that waits longer after each failure (resume backoff, quarantine, model-outage
retries, the fork server's restarts, the model client's retries, webhook deliveries) asks a
`Pacing` for the delay, so the formula lives here only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pacing:
    """`delay(n)`: base · 2^(n−1), capped, then spread by ±jitter (a fraction) so that
    many clients failing together do not retry together."""

    base: float
    cap: float
    jitter: float = 0.0

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The wait after failed attempt number `attempt` (1 for the first)."""
        raw = min(self.base * 2.0 ** max(0, attempt - 1), self.cap)
        if not self.jitter:
            return float(raw)
        return float(raw * (1.0 - self.jitter + 2.0 * self.jitter * rand()))


def equal_jitter(delay: float, r: float) -> float:
    """`delay` spread over [delay/2, delay) by `r` in [0, 1) ("equal jitter"): never shorter
    than half the backoff, for senders whose receiver should see at most one retry per step."""
    return delay / 2 + delay / 2 * r
