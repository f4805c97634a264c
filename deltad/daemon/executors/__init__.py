"""How resumes are started: the `Executor` seam and its three implementations.

- `fresh`: a new process per resume running `resume_command` (`delta run --work-dir WS`).
- `fork`: the warm fork server (`forkserver.py`): the client pre-imported, one fork per resume;
  falls back to `fresh` while the server is unhealthy. The default on Linux.
- `command`: `resume_command` as a new process, for a template that wraps the client
  (`systemd-run --wait ...`); the same mechanism as `fresh`.

`executor: auto` (the default) is `fork` on Linux when the server can run `resume_command`
warm (the `delta` beside deltad, or `python -m MODULE` with deltad's Python), `command` for any
other template, and `fresh` elsewhere.
"""

from __future__ import annotations

import sys
from typing import Literal, assert_never

from . import orphans
from .base import Child, Executor, Finished, Job, Orphan, exit_meaning
from .fork import ForkExecutor, is_warm
from .fresh import CommandExecutor, FreshExecutor

Kind = Literal["fresh", "fork", "command"]

__all__ = [
    "Child",
    "Executor",
    "Finished",
    "Job",
    "Kind",
    "Orphan",
    "exit_meaning",
    "make_executor",
    "orphans",
    "resolve",
]


def resolve(choice: str, argv: list[str]) -> Kind:
    """The executor `executor: CHOICE` means for the resume command `argv` (resolved)."""
    match choice:
        case "fresh" | "fork" | "command":
            return choice
        case "auto" if not sys.platform.startswith("linux"):
            return "fresh" if is_warm(argv) else "command"
        case "auto":
            return "fork" if is_warm(argv) else "command"
    raise ValueError(f"unknown executor {choice!r}")


def make_executor(kind: Kind, max_parallel: int) -> Executor:
    match kind:
        case "fresh":
            return FreshExecutor(max_parallel)
        case "command":
            return CommandExecutor(max_parallel)
        case "fork":
            return ForkExecutor(max_parallel)
        case _:
            assert_never(kind)
