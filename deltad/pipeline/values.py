"""Typed attribute values: durations, counts, booleans. Each raises ValueError with a reason."""

from __future__ import annotations

import re

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
MAX_SECONDS = 3650 * 86400.0  # ten years: beyond that a deadline is a typo (and overflows dates)
MAX_RETRIES = 1000
MAX_STEPS = 1_000_000  # node visits; a run that needs more is better split
DEFAULT_MAX_STEPS = 1000  # a graph's `max_steps` when it sets none


def duration(text: str) -> float:
    """`30s`, `5m`, `1h`, `1d`, `250ms`, or bare seconds (`900`) → seconds, above zero."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text[:30]!r} is not a duration (e.g. 30s, 5m, 1h, 900)")
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{text[:30]!r} is longer than ten years")
    return seconds


def integer(text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]{1,18}", text.strip()):
        raise ValueError(f"{text[:30]!r} is not a whole number")
    return int(text)


def count(text: str, limit: int = MAX_RETRIES) -> int:
    """A whole number from 0 to `limit`."""
    n = integer(text)
    if not 0 <= n <= limit:
        raise ValueError(f"{text.strip()!r} must be from 0 to {limit}")
    return n


def boolean(text: str) -> bool:
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise ValueError(f"{text[:30]!r} is not true or false")
    return word == "true"


def steps(text: str) -> int:
    """A graph's `max_steps`: a whole number from 1 to MAX_STEPS."""
    n = integer(text)
    if not 1 <= n <= MAX_STEPS:
        raise ValueError(f"{text.strip()!r} must be from 1 to {MAX_STEPS}")
    return n
