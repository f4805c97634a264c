"""Accelerator keys: `[A] Approve`, `A) Approve`, `A - Approve`, else the first free character.
Used by choice questions and by pipeline gates."""

from __future__ import annotations

import re

from .models import Option

_ACCEL = (
    re.compile(r"^\s*\[(\w)\]\s*(.+)$"),  # [A] Approve
    re.compile(r"^\s*(\w)\)\s*(.+)$"),  # A) Approve
    re.compile(r"^\s*(\w)\s+-\s+(.+)$"),  # A - Approve
)
FALLBACK_KEYS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def parse_accelerator(text: str) -> tuple[str | None, str]:
    """`[A] Approve` / `A) Approve` / `A - Approve` → ("A", "Approve"); else (None, text)."""
    for pattern in _ACCEL:
        if m := pattern.match(text):
            return m.group(1).upper(), m.group(2).strip()
    return None, text.strip()


def build_options(labels: list[str]) -> list[Option]:
    """Keys are unique and case-insensitive: a clash takes the label's next free character."""
    used: set[str] = set()
    options = []
    for raw in labels:
        key, label = parse_accelerator(raw)
        candidates = ([key] if key else []) + [c.upper() for c in label if c.isalnum()]
        candidates += list(FALLBACK_KEYS)
        chosen = next(c for c in candidates if c not in used)
        used.add(chosen)
        options.append(Option(key=chosen, label=label))
    return options
