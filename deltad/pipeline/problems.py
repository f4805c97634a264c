"""What is wrong with a pipeline graph: one line per problem, naming where it is."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Pos:
    """A place in the DOT source, both counted from 1."""

    line: int
    col: int


@dataclass(frozen=True)
class Problem:
    message: str
    pos: Pos | None = None
    subject: str = ""  # "node review_gate", "edge a -> b", or "" for the whole graph

    def render(self, source: str) -> str:
        """`file:line:col: subject: message`, always one line."""
        where = f"{source}:{self.pos.line}:{self.pos.col}" if self.pos else source
        about = f"{self.subject}: " if self.subject else ""
        return " ".join(f"{where}: {about}{self.message}".split())


def in_order(problems: Iterable[Problem]) -> list[Problem]:
    """Whole-graph problems first, then by position; ties keep the order they were found."""
    return sorted(problems, key=lambda p: p.pos or Pos(0, 0))


class GraphError(Exception):
    """The graph cannot run; `lines()` says every reason, one per line."""

    def __init__(self, problems: list[Problem], source: str) -> None:
        self.problems = in_order(problems)
        self.source = source
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        super().__init__(self.problems[0].render(source) + more)

    def lines(self) -> list[str]:
        return [p.render(self.source) for p in self.problems]
