"""Which executor `executor: NAME` means: built-ins by name, others by entry point or path.

A name is looked up in this order (like gunicorn's `worker_class`):

1. a built-in below (`fresh`, `fork`, `command`, and the cluster ones, which are imported
   only when chosen, so a missing optional dependency fails only then);
2. an entry point in the group `deltad.executors` (`toy = "toy_executor:make"`);
3. a dotted path `module:factory`.

A factory is called as `factory(options)` with the mapping under `executors: {NAME: ...}`
and returns a `JobExecutor` (seam.py), the one interface the resumer speaks. It raises
ValueError (one line) for options it cannot use. A factory may carry `check_options(options)`,
called by the config and `deltad check` without starting anything. A factory with a
`build(options, state_dir)` method is called that way instead, with the daemon's state dir: the
local executors (`LocalFactory`: resume logs, `resumes.json`) and the cluster ones (their
signing key, `executor.key`) keep files there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from deltad import platform

from .seam import JobExecutor

GROUP = "deltad.executors"

# One line per executor: a new built-in is a module plus a line here, and nothing in the daemon.
BUILTINS: dict[str, str] = {
    "fresh": "deltad.executors.fresh:make_fresh",
    "command": "deltad.executors.fresh:make_command",
    "fork": "deltad.executors.fork:make_fork",
    "slurm": "deltad.executors.slurm:make_slurm_executor",
    "kubernetes": "deltad.executors.kubernetes:make_kubernetes_executor",
}


class LocalFactory:
    """The factory of a local executor class: it takes no options, and keeps its files (resume
    logs, `resumes.json`) in the daemon's state dir."""

    def __init__(
        self, name: str, make: Callable[[Path], JobExecutor], linux_only: bool = False
    ) -> None:
        self.name, self._make, self.linux_only = name, make, linux_only

    def check_options(self, options: Mapping[str, Any]) -> None:
        if self.linux_only and not platform.LINUX:
            raise ValueError(f"executor: {self.name} needs Linux (use fresh or command)")
        if options:  # any key is a misspelling
            keys = ", ".join(sorted(map(str, options)))
            raise ValueError(f"executors.{self.name}: takes no options (got {keys})")

    def build(self, options: Mapping[str, Any], state_dir: Path) -> JobExecutor:
        self.check_options(options)
        return self._make(state_dir)


Factory = Any  # a callable `factory(options)`, or an object with `build(options, state_dir)`


class UnknownExecutor(ValueError):
    """`executor: NAME` names nothing that can be loaded; the message is one line."""


def is_dotted(name: str) -> bool:
    return ":" in name


def where(name: str) -> str | None:
    """The `module:factory` that `name` stands for, or None when nothing is registered."""
    if name in BUILTINS:
        return BUILTINS[name]
    if is_dotted(name):
        return name
    for ep in entry_points(group=GROUP, name=name):
        return str(ep.value)
    return None


def find(name: str) -> Factory:
    """The factory `executor: NAME` means. Raises UnknownExecutor with one line."""
    target = where(name)
    if target is None:
        known = ", ".join(sorted({*BUILTINS, *(ep.name for ep in entry_points(group=GROUP))}))
        raise UnknownExecutor(f"executor: unknown executor {name!r} (known: {known})")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownExecutor(f"executor: {name} cannot be loaded: {e}") from e
    factory = getattr(module, attr, None) if attr else None
    if not (callable(factory) or callable(getattr(factory, "build", None))):
        raise UnknownExecutor(f"executor: {name}: {target} is not a factory")
    return factory


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Validate `executors: {NAME: options}` without starting anything; ValueError (one line)."""
    factory = find(name)
    if (check := getattr(factory, "check_options", None)) is not None:
        check(options)


def make(name: str, options: Mapping[str, Any], state_dir: Path) -> JobExecutor:
    """The executor itself. Raises ValueError (one line) when it cannot be made."""
    factory = find(name)
    build = getattr(factory, "build", None)
    made = build(options, state_dir) if callable(build) else factory(options)
    if not isinstance(made, JobExecutor):
        raise UnknownExecutor(
            f"executor: {name}: its factory made no job executor "
            "(subclass deltad.executors.BaseJobExecutor)"
        )
    return made
