"""What is wrong with a pipeline graph: one line per problem, naming where it is, with a stable
code. An `E` code refuses the graph; a `W` code is a warning: the graph runs, but something in
it is not carried out as written (`--strict` refuses those too)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple


class Code(StrEnum):
    """Stable codes (docs/pipelines.md lists them); never renumber one, only add."""

    UNREADABLE = "E001 unreadable-file"
    SYNTAX = "E002 syntax"
    BAD_VALUE = "E003 bad-value"
    BAD_CONDITION = "E004 bad-condition"
    START_EXIT = "E005 start-exit"
    UNREACHABLE = "E006 unreachable"
    GATE = "E007 gate"
    NODE_ATTR = "E008 node-attribute"
    NO_AGENT_DIR = "E009 missing-agent"
    RETRY_TARGET = "E010 retry-target"
    CHILD_PIPELINE = "E011 child-pipeline"
    ORCHESTRA_AGENT = "E012 orchestra-agent"
    IGNORED_ATTRIBUTE = "W001 ignored-attribute"
    UNKNOWN_ATTRIBUTE = "W002 unknown-attribute"
    EDGE_ONLY_NODE = "W003 edge-only-node"
    GOAL_GATE_NO_RETRY = "W004 goal-gate-without-retry"
    IGNORED_CONFIG = "W006 ignored-config-key"
    PROMPT_ON_LLM_NODE = "W007 prompt-on-llm-node"
    PROMPT_TEMPLATE = "W008 prompt-template"

    @property
    def warning(self) -> bool:
        return self.value.startswith("W")


class Pos(NamedTuple):
    """A place in the DOT source, both counted from 1 (a tuple: one per token, made fast)."""

    line: int
    col: int


@dataclass(frozen=True)
class Problem:
    message: str
    pos: Pos | None = None
    subject: str = ""  # "node review_gate", "edge a -> b", or "" for the whole graph
    code: Code = field(kw_only=True)

    @property
    def warning(self) -> bool:
        return self.code.warning

    def render(self, source: str) -> str:
        """`file:line:col: subject: message [code]`, always one line."""
        where = f"{source}:{self.pos.line}:{self.pos.col}" if self.pos else source
        about = f"{self.subject}: " if self.subject else ""
        return " ".join(f"{where}: {about}{self.message} [{self.code}]".split())


def in_order(problems: Iterable[Problem]) -> list[Problem]:
    """Whole-graph problems first, then by position; ties keep the order they were found."""
    return sorted(problems, key=lambda p: p.pos or Pos(0, 0))


def errors_of(problems: Iterable[Problem], *, strict: bool = False) -> list[Problem]:
    """The problems that refuse the graph: errors, and under `strict` warnings too."""
    return [p for p in problems if strict or not p.warning]


class GraphError(Exception):
    """The graph cannot run; `lines()` says every reason, one per line. Warnings found beside
    them are kept apart (`warning_lines()`); under `strict` they are reasons too."""

    def __init__(self, problems: list[Problem], source: str, *, strict: bool = False) -> None:
        self.problems = in_order(problems)
        self.source = source
        self.refusing = errors_of(self.problems, strict=strict)
        more = f" (and {len(self.refusing) - 1} more)" if len(self.refusing) > 1 else ""
        super().__init__(self.refusing[0].render(source) + more)

    def lines(self) -> list[str]:
        return [p.render(self.source) for p in self.refusing]

    def warning_lines(self) -> list[str]:
        refusing = set(map(id, self.refusing))
        return [p.render(self.source) for p in self.problems if id(p) not in refusing]
