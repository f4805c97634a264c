"""The one pacing policy (deltad/pacing.py), from a table."""

from __future__ import annotations

import pytest

from deltad.pacing import Pacing


@pytest.mark.parametrize(
    ("pacing", "attempt", "rand", "delay"),
    [
        (Pacing(1.0, 60.0), 1, 0.5, 1.0),
        (Pacing(1.0, 60.0), 2, 0.5, 2.0),
        (Pacing(1.0, 60.0), 6, 0.5, 32.0),
        (Pacing(1.0, 60.0), 7, 0.5, 60.0),  # capped
        (Pacing(1.0, 60.0), 500, 0.5, 60.0),  # no overflow far out
        (Pacing(5.0, 600.0), 0, 0.5, 5.0),  # "before the first" is the first
        (Pacing(0.5, 20.0, jitter=0.2), 1, 0.0, 0.4),  # jitter spreads ±20 %
        (Pacing(0.5, 20.0, jitter=0.2), 1, 1.0, 0.6),
        (Pacing(0.5, 20.0, jitter=0.2), 10, 0.5, 20.0),
        (Pacing(0.5, 20.0, jitter=0.2), 10, 1.0, 24.0),  # jitter applies after the cap
    ],
)
def test_delay(pacing: Pacing, attempt: int, rand: float, delay: float) -> None:
    assert pacing.delay(attempt, rand=lambda: rand) == pytest.approx(delay)


def test_every_backoff_in_the_product_is_this_one() -> None:
    """The formula exists once: no other module raises 2 to an attempt count."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2] / "deltad"
    formula = re.compile(r"\b2(\.0)?\s*\*\*\s*\(?\s*[\w.]*(attempt|failures|done)")
    found = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "pacing.py" and formula.search(p.read_text())
    ]
    assert found == []
