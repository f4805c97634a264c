"""How resumes are started: executors behind one job-handle seam (`seam.py`), and the registry.

- `fresh`: a new process per resume running `resume_command` (`delta run --work-dir WS`).
- `fork`: the warm fork server (`forkserver.py`): the client pre-imported, one fork per resume;
  falls back to a fresh process while the server is unhealthy. The default on Linux.
- `command`: `resume_command` as a new process, for a template that wraps the client
  (`systemd-run --wait ...`); the same mechanism as `fresh`.
- anything else by name through `registry.py` (`slurm`, `kubernetes`, an entry point in
  `deltad.executors`, or `module:factory`).

All are `JobExecutor`s; the local three share `local.py` (pids, pidfds, `resumes.json`), which
nothing outside this package sees.

`executor: auto` (the default) is `fork` on Linux when the server can run `resume_command`
warm (the `delta` beside deltad, or `python -m MODULE` with deltad's Python), `command` for any
other template, and `fresh` elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deltad import platform

from . import registry
from .fork import is_warm
from .registry import ExecutorOptions
from .remote import RemoteExecutor
from .seam import (
    AdoptPending,
    BaseJobExecutor,
    Event,
    Exit,
    Handle,
    Identity,
    JobExecutor,
    JobSpec,
    Refused,
    RequestKey,
    Started,
    SubmitError,
    exit_meaning,
)

# What a third party's executor needs is importable from here (`deltad.executors`), nothing
# deeper: the seam's types, `BaseJobExecutor`, and `RemoteExecutor` (remote.py) for an engine
# reached over the network or through commands.
__all__ = [
    "AdoptPending",
    "BaseJobExecutor",
    "Event",
    "ExecutorOptions",
    "Exit",
    "Handle",
    "Identity",
    "JobExecutor",
    "JobSpec",
    "Refused",
    "RemoteExecutor",
    "RequestKey",
    "Started",
    "SubmitError",
    "exit_meaning",
    "make_executor",
    "resolve",
]


def resolve(choice: str, argv: list[str]) -> str:
    """The executor `executor: CHOICE` means for the resume command `argv` (resolved)."""
    if choice != "auto":
        return choice
    if not platform.LINUX:  # no fork server: a fresh process per resume
        return "fresh" if is_warm(argv) else "command"
    return "fork" if is_warm(argv) else "command"


def make_executor(name: str, options: Mapping[str, Any], state_dir: Path) -> JobExecutor:
    """The executor registered as `name`, made from its options. Raises ValueError (one line)
    when it cannot be made."""
    return registry.make(name, options, state_dir)
