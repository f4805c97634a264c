"""From a DOT file to a graph that can run, or a GraphError listing every problem."""

from __future__ import annotations

from pathlib import Path

from deltad.protocol.errors import ProtocolError
from deltad.protocol.fsio import read_regular_text

from .dot import DotSyntaxError, parse_dot
from .model import Graph, build_graph
from .problems import GraphError, Problem
from .validate import validate

MAX_DOT_BYTES = 1024 * 1024  # a pipeline is a page of text, never a megabyte


def parse_pipeline(
    text: str, source: str = "<pipeline>", base_dir: Path | None = None, *, check_files: bool = True
) -> Graph:
    """Parse, type and validate; raises GraphError (a syntax error stops at itself, every other
    problem is collected). `base_dir` resolves `agent` attributes (the DOT file's directory)."""
    try:
        dot = parse_dot(text.removeprefix("\ufeff"))
    except DotSyntaxError as e:
        raise GraphError([Problem(e.message, e.pos)], source) from None
    graph, problems = build_graph(dot, base_dir)
    problems += validate(graph, check_files=check_files)
    if problems:
        raise GraphError(problems, source)
    return graph


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
    raise GraphError([Problem(why)], str(path))


def load_pipeline(path: Path) -> Graph:
    """The graph in `path`, checked; `agent` attributes are relative to the file's directory."""
    return parse_pipeline(read_dot(path), str(path), path.resolve().parent)
