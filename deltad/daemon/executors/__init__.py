"""How resumes are started: the `Executor` seam, its local implementations and the registry.

- `fresh`: a new process per resume running `resume_command` (`delta run --work-dir WS`).
- `fork`: the warm fork server (`forkserver.py`): the client pre-imported, one fork per resume;
  falls back to `fresh` while the server is unhealthy. The default on Linux.
- `command`: `resume_command` as a new process, for a template that wraps the client
  (`systemd-run --wait ...`); the same mechanism as `fresh`.
- anything else by name through `registry.py` (`slurm`, `kubernetes`, an entry point in
  `deltad.executors`, or `module:factory`): a `JobExecutor` (seam.py) driven through
  `SeamExecutor` (adapter.py).

`executor: auto` (the default) is `fork` on Linux when the server can run `resume_command`
warm (the `delta` beside deltad, or `python -m MODULE` with deltad's Python), `command` for any
other template, and `fresh` elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deltad import platform

from . import orphans, registry
from .adapter import SeamExecutor
from .base import Child, Executor, Finished, Job, Orphan, exit_meaning
from .fork import is_warm
from .seam import JobExecutor

__all__ = [
    "Child",
    "Executor",
    "Finished",
    "Job",
    "Orphan",
    "exit_meaning",
    "make_executor",
    "orphans",
    "resolve",
]


def resolve(choice: str, argv: list[str]) -> str:
    """The executor `executor: CHOICE` means for the resume command `argv` (resolved)."""
    if choice != "auto":
        return choice
    if not platform.LINUX:  # no fork server: a fresh process per resume
        return "fresh" if is_warm(argv) else "command"
    return "fork" if is_warm(argv) else "command"


def make_executor(name: str, options: Mapping[str, Any], max_parallel: int) -> Executor:
    """The executor registered as `name`, made from its options; a `JobExecutor` is driven
    through `SeamExecutor`. Raises ValueError (one line) when it cannot be made."""
    made = registry.make(name, options)
    executor: Executor = SeamExecutor(made) if isinstance(made, JobExecutor) else made
    executor.max_parallel = max_parallel
    return executor
