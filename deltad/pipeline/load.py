"""From a DOT file to a graph that can run, or a GraphError listing every problem."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from deltad.protocol.errors import ProtocolError
from deltad.protocol.fsio import read_regular_text

from .dot import DotSyntaxError, parse_dot
from .lint import lint
from .model import Graph, Kind, build_graph
from .orchestra_check import with_orchestra
from .problems import Code, GraphError, Problem, errors_of, in_order
from .validate import validate

MAX_DOT_BYTES = 1024 * 1024  # a pipeline is a page of text, never a megabyte


@dataclass(frozen=True)
class Checked:
    """A graph that can run, and what it says that will not be carried out."""

    graph: Graph
    warnings: list[Problem]
    source: str

    def warning_lines(self) -> list[str]:
        return [w.render(self.source) for w in self.warnings]


@contextmanager
def _no_cycle_collector() -> Iterator[None]:
    """A graph is hundreds of thousands of small objects and no cycles to free: the collector's
    full passes over them cost about a third of a large check."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def check_pipeline(
    text: str,
    source: str = "<pipeline>",
    base_dir: Path | None = None,
    *,
    check_files: bool = True,
    strict: bool = False,
    child: bool = True,
) -> Checked:
    """Parse, type, validate and lint; raises GraphError when there is an error (a syntax error
    stops at itself, every other problem is collected), or under `strict` any warning.
    `base_dir` resolves `agent` attributes (the DOT file's directory). With `check_files`, a
    manager loop's child pipeline (`stack.child_dotfile`) is checked too (unless `child` is
    off: a child is checked without its own child)."""
    with _no_cycle_collector():
        try:
            dot = parse_dot(text.removeprefix("\ufeff"))
        except DotSyntaxError as e:
            raise GraphError([Problem(e.message, e.pos, code=Code.SYNTAX)], source) from None
        graph, problems = build_graph(dot, base_dir)
        if base_dir is not None and check_files:
            graph, found = with_orchestra(graph, base_dir)
            problems += found
        problems += validate(graph, check_files=check_files) + lint(graph)
        if check_files and child and graph.child_dotfile and graph.of_kind(Kind.MANAGER):
            problems += _child_problems(graph)
    if errors_of(problems, strict=strict):
        raise GraphError(problems, source, strict=strict)
    return Checked(graph, in_order(problems), source)


def parse_pipeline(
    text: str,
    source: str = "<pipeline>",
    base_dir: Path | None = None,
    *,
    check_files: bool = True,
    child: bool = True,
) -> Graph:
    """The graph only (warnings do not stop it); see `check_pipeline`."""
    return check_pipeline(text, source, base_dir, check_files=check_files, child=child).graph


def read_dot(path: Path) -> str:
    """The file's text; a missing, unreadable, oversized or non-UTF-8 file is a GraphError."""
    try:
        return read_regular_text(path, MAX_DOT_BYTES, follow=True)
    except FileNotFoundError:
        why = "no such file"
    except IsADirectoryError:
        why = "is a directory, not a DOT file"
    except ProtocolError as e:
        why = str(e).replace(str(path), "").strip(" :") or str(e)
    except OSError as e:
        why = e.strerror or str(e)
    raise GraphError([Problem(why, code=Code.UNREADABLE)], str(path))


def check_file(path: Path, *, strict: bool = False) -> Checked:
    """The graph in `path` with its warnings; `agent` attributes are relative to the file's
    directory."""
    return check_pipeline(read_dot(path), str(path), path.resolve().parent, strict=strict)


def load_pipeline(path: Path) -> Graph:
    """The graph in `path`, checked (warnings do not stop it)."""
    return check_file(path).graph


def load_child(path: Path) -> Graph:
    """The child pipeline of a manager loop, checked; GraphError when it cannot run (a manager
    loop of its own included: a child cannot supervise another)."""
    return load_child_text(read_dot(path), str(path), path.resolve().parent)


def load_child_text(text: str, source: str, base_dir: Path) -> Graph:
    try:  # a manager loop in the child is the reason, before what it would lack
        nested = build_graph(parse_dot(text.removeprefix("\ufeff")), base_dir)[0].of_kind(
            Kind.MANAGER
        )
    except DotSyntaxError:
        nested = []  # check_pipeline says where
    if nested:
        why = "a manager loop in a child pipeline is not supported"
        raise GraphError(
            [Problem(why, nested[0].pos, nested[0].subject, code=Code.NODE_ATTR)], source
        )
    return check_pipeline(text, source, base_dir, child=False).graph


def _child_problems(graph: Graph) -> list[Problem]:
    """The child pipeline's refusal, as one problem at `stack.child_dotfile`."""
    assert graph.child_dotfile is not None
    try:
        load_child(graph.child_dotfile)
    except GraphError as e:
        more = f" (and {len(e.refusing) - 1} more)" if len(e.refusing) > 1 else ""
        return [
            Problem(
                f"the child pipeline does not run: {e.lines()[0]}{more}",
                graph.attr_pos.get("stack.child_dotfile"),
                "graph",
                code=Code.CHILD_PIPELINE,
            )
        ]
    return []
