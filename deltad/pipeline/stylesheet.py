"""The model stylesheet (attractor spec §8) and the model settings each node runs with.

    * { llm_model: m1; }   .code { reasoning_effort: high; }   #review { llm_provider: p; }

A rule is a selector and declarations. Selectors and their specificity: `*` 0, a shape name
(`box`) 1, `.class` 2, `#id` 3. For each property a node takes, in order: its own attribute
(highest), then the matching rule of highest specificity (a later rule wins a tie), then the
graph's attribute of that name, then the agent's setting. Pure: parsed once per graph, applied
per node; a stylesheet that does not parse is an error with the offset of the fault.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

# The spec's properties, and `temperature` (this runner's: the agent config has it too).
PROPERTIES = ("llm_model", "llm_provider", "reasoning_effort", "temperature")
REASONING_EFFORTS = ("low", "medium", "high")
_SELECTOR = re.compile(r"\*|#[A-Za-z_][A-Za-z0-9_]*|\.[a-z0-9_-]+|[A-Za-z_][A-Za-z0-9_]*")
_PROPERTY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_SPACE = re.compile(r"\s*")
_BARE = re.compile(r"[^;}\s\"]+")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


class StylesheetError(ValueError):
    """Where (an offset into the stylesheet's text) and what."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.message, self.offset = message, offset


@dataclass(frozen=True)
class Rule:
    selector: str  # as written: "*", "box", ".code", "#review"
    declarations: Mapping[str, str]
    order: int  # rules later in the text win ties

    @property
    def specificity(self) -> int:
        return {"*": 0, ".": 2, "#": 3}.get(self.selector[0], 1)

    def matches(self, node_id: str, shape: str, classes: Sequence[str]) -> bool:
        s = self.selector
        if s == "*":
            return True
        if s[0] == "#":
            return s[1:] == node_id
        if s[0] == ".":
            return s[1:] in classes
        return s == shape


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def skip(self) -> int:
        """Past spaces and comments; the offset reached."""
        while True:
            m = _SPACE.match(self.text, self.i)
            self.i = m.end() if m else self.i
            if not self.text.startswith("/*", self.i):
                return self.i
            end = self.text.find("*/", self.i + 2)
            if end < 0:
                raise StylesheetError("a comment is never closed", self.i)
            self.i = end + 2

    def expect(self, char: str, what: str) -> None:
        self.skip()
        if not self.text.startswith(char, self.i):
            found = repr(self.text[self.i]) if self.i < len(self.text) else "the end"
            raise StylesheetError(f"expected {char!r} {what}, found {found}", self.i)
        self.i += 1

    def take(self, pattern: re.Pattern[str], what: str) -> str:
        self.skip()
        m = pattern.match(self.text, self.i)
        if m is None or not m.group(0):
            found = repr(self.text[self.i]) if self.i < len(self.text) else "the end"
            raise StylesheetError(f"expected {what}, found {found}", self.i)
        self.i = m.end()
        return m.group(1) if m.lastindex else m.group(0)

    def value(self) -> str:
        self.skip()
        if self.text.startswith('"', self.i):
            return re.sub(r"\\(.)", r"\1", self.take(_QUOTED, "a closing quote"))
        return self.take(_BARE, "a value")

    def declaration(self) -> tuple[str, str]:
        at = self.skip()
        prop = self.take(_PROPERTY, "a property")
        if prop not in PROPERTIES:
            raise StylesheetError(f"unknown property {prop!r}: use {', '.join(PROPERTIES)}", at)
        self.expect(":", f"after {prop}")
        at = self.skip()
        value = self.value()
        if (why := property_problem(prop, value)) is not None:
            raise StylesheetError(why, at)
        return prop, value

    def rule(self, order: int) -> Rule:
        selector = self.take(_SELECTOR, "a selector (*, a shape, .class or #id)")
        self.expect("{", f"after the selector {selector}")
        found: dict[str, str] = {}
        while True:
            self.skip()
            if self.text.startswith("}", self.i):
                self.i += 1
                return Rule(selector, found, order)
            prop, value = self.declaration()
            found[prop] = value
            self.skip()
            if self.text.startswith(";", self.i):
                self.i += 1
            elif not self.text.startswith("}", self.i):
                self.expect(";", f"or '}}' after {prop}")

    def rules(self) -> tuple[Rule, ...]:
        out: list[Rule] = []
        self.skip()
        while self.i < len(self.text):
            out.append(self.rule(len(out)))
            self.skip()
        if not out:
            raise StylesheetError("the stylesheet has no rules", 0)
        return tuple(out)


def property_problem(prop: str, value: str) -> str | None:
    """Why a property's value cannot be used (None: it can)."""
    if prop == "reasoning_effort" and value not in REASONING_EFFORTS:
        return f"reasoning_effort {value[:30]!r}: use one of {', '.join(REASONING_EFFORTS)}"
    if prop == "temperature":
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not 0 <= number <= 2:
            return f"temperature {value[:30]!r}: use a number from 0 to 2"
    if prop in ("llm_model", "llm_provider") and not value.strip():
        return f"{prop} is empty"
    return None


@lru_cache(maxsize=16)
def parse_stylesheet(text: str) -> tuple[Rule, ...]:
    """The rules, in the order written; StylesheetError at the first fault."""
    return _Parser(text).rules()


def classes_of(attrs: Mapping[str, str]) -> tuple[str, ...]:
    """`class="a, b"` or `class="a b"`: the node's classes (spec §2.12)."""
    return tuple(c for c in re.split(r"[\s,]+", attrs.get("class", "")) if c)


def node_settings(
    node_id: str,
    shape: str,
    attrs: Mapping[str, str],
    graph_attrs: Mapping[str, str],
) -> dict[str, str]:
    """The model properties a node runs with, by the order of §8.5; a property nobody sets is
    absent (the agent's own setting stands). A stylesheet that does not parse applies nothing
    (`check` refuses it before any run)."""
    sheet = graph_attrs.get("model_stylesheet", "")
    try:
        rules = parse_stylesheet(sheet) if sheet.strip() else ()
    except StylesheetError:
        rules = ()
    classes = classes_of(attrs)
    matching = sorted(
        (r for r in rules if r.matches(node_id, shape, classes)),
        key=lambda r: (r.specificity, r.order),
    )
    out: dict[str, str] = {}
    for prop in PROPERTIES:
        if prop in attrs:
            out[prop] = attrs[prop]
            continue
        for r in reversed(matching):
            if prop in r.declarations:
                out[prop] = r.declarations[prop]
                break
        else:
            if prop in graph_attrs:
                out[prop] = graph_attrs[prop]
    return out


def offset_pos(value_pos: tuple[int, int], value: str, offset: int) -> tuple[int, int]:
    """The line and column of `offset` in an attribute value written at `value_pos` (the
    opening quote of a quoted value). Escapes in the DOT text (`\\"`) are counted as one
    character, so a column after one is off by the escapes before it on its line."""
    line, col = value_pos
    before = value[:offset]
    newlines = before.count("\n")
    if newlines == 0:
        return line, col + 1 + offset
    return line + newlines, offset - before.rfind("\n")
