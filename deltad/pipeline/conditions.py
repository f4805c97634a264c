"""Edge conditions (attractor spec §10): `key = value` or `key != value` clauses joined by `&&`.

Keys are `outcome`, `preferred_label` or `context.<path>`; a missing context key is the empty
string; comparison is exact and case-sensitive. Parsing is strict (the grammar of §10.2): a bare
key, `==`, `||` or an unknown key is an error that says what to write instead, so a typo is
refused before the pipeline runs rather than silently never matching.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .outcome import Status

OUTCOMES = tuple(s.value for s in Status)
_KEY = re.compile(r"outcome|preferred_label|context(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_BARE = re.compile(r"-?[0-9]+|[A-Za-z_][A-Za-z0-9_.:-]*")
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}


class ConditionError(ValueError):
    """The condition does not parse; the message says why, in one line."""


@dataclass(frozen=True)
class Clause:
    key: str
    negated: bool  # != rather than =
    value: str

    def holds(self, outcome: str, preferred_label: str, context: Mapping[str, Any]) -> bool:
        return (resolve(self.key, outcome, preferred_label, context) == self.value) != self.negated


@dataclass(frozen=True)
class Condition:
    text: str
    clauses: tuple[Clause, ...]

    def holds(self, outcome: str, preferred_label: str, context: Mapping[str, Any]) -> bool:
        """Every clause, left to right (an empty condition holds)."""
        return all(c.holds(outcome, preferred_label, context) for c in self.clauses)


def as_text(value: Any) -> str:
    """How a context value compares: JSON spelling for booleans and null, else str()."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str)


def resolve(key: str, outcome: str, preferred_label: str, context: Mapping[str, Any]) -> str:
    if key == "outcome":
        return outcome
    if key == "preferred_label":
        return preferred_label
    for name in (key, key.removeprefix("context.")):  # `context.x` also finds a plain `x`
        if name in context and context[name] is not None:
            return as_text(context[name])
    return ""


def _split_outside_quotes(text: str, sep: str) -> list[str]:
    parts, quoted, start, i = [], False, 0, 0
    while i < len(text):
        if text[i] == "\\" and quoted:
            i += 2
            continue
        if text[i] == '"':
            quoted = not quoted
        elif not quoted and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _unquote(raw: str) -> str:
    body, out, i = raw[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c == '"':
            raise ConditionError(f"stray quote in {raw}")
        if c == "\\":
            if i + 1 >= len(body):
                raise ConditionError(f"{raw} ends in a lone backslash")
            out.append(_ESCAPES.get(body[i + 1], "\\" + body[i + 1]))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _literal(key: str, raw: str) -> str:
    if raw.startswith("="):
        raise ConditionError("write '=' for equals, not '=='")
    if not raw:
        raise ConditionError(f"{key!r} needs a value after the operator")
    if raw.startswith('"'):
        if len(raw) < 2 or not raw.endswith('"'):
            raise ConditionError(f"the quoted value {raw[:30]!r} is never closed")
        value = _unquote(raw)
    elif _BARE.fullmatch(raw):
        value = raw
    else:
        raise ConditionError(
            f"value {raw[:30]!r}: put quotes around a value with spaces or symbols"
        )
    if key == "outcome" and value not in OUTCOMES:
        raise ConditionError(f"outcome {value!r} is never set: use one of {', '.join(OUTCOMES)}")
    return value


def _clause(text: str) -> Clause:
    body = text.strip()
    if not body:
        raise ConditionError("an empty clause: '&&' needs a comparison on each side")
    parts = _split_outside_quotes(body, "!=")
    negated = len(parts) > 1
    if not negated:
        parts = _split_outside_quotes(body, "=")
    if len(parts) == 1:
        raise ConditionError(f"{body[:30]!r} needs '=' or '!=' and a value")
    key, raw = parts[0].strip(), (("!=" if negated else "=").join(parts[1:])).strip()
    if not _KEY.fullmatch(key):
        raise ConditionError(
            f"unknown key {key[:30]!r}: use outcome, preferred_label or context.<key>"
        )
    return Clause(key, negated, _literal(key, raw))


def parse_condition(text: str) -> Condition:
    """Parse `outcome=success && context.tests=passed`; raises ConditionError."""
    if len(_split_outside_quotes(text, "||")) > 1:
        raise ConditionError("'||' is not part of the language: use one edge per alternative")
    if not text.strip():
        return Condition(text, ())
    return Condition(text, tuple(_clause(c) for c in _split_outside_quotes(text, "&&")))
