"""Which executor `executor: NAME` means: built-ins by name, others by entry point or path.

A name is looked up in this order (like gunicorn's `worker_class`):

1. a built-in below (`fresh`, `fork`, `command`, and the cluster ones, which are imported
   only when chosen, so a missing optional dependency fails only then);
2. an entry point in the group `deltad.executors` (`toy = "toy_executor:make"`);
3. a dotted path `module:factory`.

A factory is called as `factory(options)` and returns a `JobExecutor` (seam.py), the one
interface the resumer speaks. What `options` is, the factory declares:

- `factory.options_model`, a pydantic model (subclass `ExecutorOptions`: a key it does not
  know is an error, with a did-you-mean): the mapping under `executors: {NAME: ...}` is
  validated through it when the config is read, and the factory gets the model's instance;
- none declared (the default, for older factories): the factory gets the mapping as written,
  checked only by its own `check_options(mapping)` if it carries one.

Either way `check_options(options)` (optional) is called with what the factory will get, when
the config is read; and `preflight(options)` (optional) checks what the options need of this
host without starting anything (a package installed, a directory writable, a program found),
called by `deltad check` and by `deltad serve` before it starts. All raise ValueError with one
line naming the key. A factory with a `build(options, state_dir)` method is called that way
instead, with the daemon's state dir: the local executors (`LocalFactory`, no options: resume
logs, `resumes.json`) and the cluster ones (their signing key, `executor.key`) keep files there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from deltad import platform, validation

from .seam import JobExecutor

GROUP = "deltad.executors"
OptionsModel = TypeVar("OptionsModel", bound=BaseModel)

# One line per executor: a new built-in is a module plus a line here, and nothing in the daemon.
BUILTINS: dict[str, str] = {
    "fresh": "deltad.executors.fresh:make_fresh",
    "command": "deltad.executors.fresh:make_command",
    "fork": "deltad.executors.fork:make_fork",
    "slurm": "deltad.executors.slurm:make_slurm_executor",
    "kubernetes": "deltad.executors.kubernetes:make_kubernetes_executor",
}


class ExecutorOptions(BaseModel):
    """The base of an executor's options model: a key it does not know is an error (a
    misspelling is never a silently ignored setting); frozen, as the running executor's are."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoOptions(ExecutorOptions):
    """What an executor that takes no options takes: any key is a misspelling."""


class OptionsError(ValueError):
    """`executors: {NAME: ...}` cannot be used; the message is one line naming the key."""


def validate(
    model: type[OptionsModel], name: str, options: Any, error: type[ValueError] = OptionsError
) -> OptionsModel:
    """`options` through `model`, or `error` with the first problem as one line
    (`executors.NAME.KEY: ...`, a misspelt key with the closest known one)."""
    try:
        return model.model_validate(options)
    except ValidationError as e:
        lines = validation.problems(e, model, f"executors.{name}", unknown="option")
        if not model.model_fields:
            lines = [f"executors.{name}: takes no options (got {_keys(options)})"]
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        raise error(lines[0] + more) from None


def _keys(options: Any) -> str:
    return ", ".join(sorted(map(str, options))) if isinstance(options, Mapping) else "a value"


class LocalFactory:
    """The factory of a local executor class: it takes no options, and keeps its files (resume
    logs, `resumes.json`) in the daemon's state dir."""

    options_model = NoOptions

    def __init__(
        self, name: str, make: Callable[[Path], JobExecutor], linux_only: bool = False
    ) -> None:
        self.name, self._make, self.linux_only = name, make, linux_only

    def check_options(self, options: NoOptions) -> None:
        if self.linux_only and not platform.LINUX:
            raise ValueError(f"executor: {self.name} needs Linux (use fresh or command)")

    def build(self, options: NoOptions, state_dir: Path) -> JobExecutor:
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


def parse(name: str, factory: Factory, options: Mapping[str, Any]) -> Any:
    """The options as `factory` takes them: its model's instance, or (none declared) the
    mapping as written. Raises ValueError with one line; starts nothing."""
    model = getattr(factory, "options_model", None)
    parsed: Any = options
    if model is not None:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise UnknownExecutor(f"executor: {name}: its options_model is no pydantic model")
        parsed = validate(model, name, options)
    if (check := getattr(factory, "check_options", None)) is not None:
        check(parsed)
    return parsed


def check_options(name: str, options: Mapping[str, Any]) -> Any:
    """Validate `executors: {NAME: options}` without starting anything; ValueError (one line).
    Returns the options as the factory takes them."""
    return parse(name, find(name), options)


def preflight(name: str, options: Mapping[str, Any]) -> None:
    """What the executor needs of this host, checked without starting it (`deltad check`, and
    `deltad serve` before it starts); ValueError with one line naming the key."""
    factory = find(name)
    parsed = parse(name, factory, options)
    if (check := getattr(factory, "preflight", None)) is not None:
        check(parsed)


def make(name: str, options: Mapping[str, Any], state_dir: Path) -> JobExecutor:
    """The executor itself. Raises ValueError (one line) when it cannot be made."""
    factory = find(name)
    parsed = parse(name, factory, options)
    build = getattr(factory, "build", None)
    made = build(parsed, state_dir) if callable(build) else factory(parsed)
    if not isinstance(made, JobExecutor):
        raise UnknownExecutor(
            f"executor: {name}: its factory made no job executor "
            "(subclass deltad.executors.BaseJobExecutor)"
        )
    return made
