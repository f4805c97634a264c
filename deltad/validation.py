"""A pydantic ValidationError as one line per problem, naming the full key path, with a
did-you-mean for a misspelt key (the daemon's config and every executor's options use it)."""

from __future__ import annotations

import difflib
import inspect
import os
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

UNKNOWN = "extra_forbidden"


def problems(
    e: ValidationError, model: type[BaseModel], prefix: str = "", unknown: str = "key"
) -> list[str]:
    """One line per error: `PREFIX.KEY.PATH: message`. A key the model does not have says
    `unknown KEY` (`unknown` names what it is: key, option) and the closest known one."""
    lines = []
    for err in e.errors():
        loc = tuple(p for p in err["loc"] if p != "[key]")  # a map's key: named by its map
        key = ".".join(str(p) for p in (prefix, *loc) if p != "")
        if err["type"] == UNKNOWN:
            msg = f"unknown {unknown}" + did_you_mean(str(loc[-1]), keys_at(model, loc[:-1]))
        elif err["type"] == "missing":
            msg = "required"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            msg = msg.replace("a valid tuple", "a list").replace("a valid dictionary", "a map")
        lines.append(printable(f"{key}: {msg}" if key else msg))
    return lines


def did_you_mean(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def keys_at(model: type[BaseModel], path: Sequence[int | str]) -> list[str]:
    """The keys the model allows at `path` (as written in YAML: aliases), [] when unknown."""
    tp: Any = model
    for part in path:
        tp = _step(tp, part)
        if tp is None:
            return []
    found = _model_of(tp)
    if found is None:
        return []
    return [f.alias or name for name, f in found.model_fields.items()]


def _step(tp: Any, part: int | str) -> Any:
    if (m := _model_of(tp)) is not None:
        for name, f in m.model_fields.items():
            if part in (name, f.alias):
                return f.annotation
        return None
    origin, args = get_origin(tp), get_args(tp)
    if origin in (list, tuple, set, frozenset, Sequence) and args:
        return args[0]
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1]
    return None


def _model_of(tp: Any) -> type[BaseModel] | None:
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return tp
    if get_origin(tp) in (Union, types.UnionType):
        for arg in get_args(tp):
            if (m := _model_of(arg)) is not None:
                return m
    return None


def printable(text: str) -> str:
    # A key may be any YAML string, newlines included: one problem must stay one line.
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def dir_problem(path: Path) -> str | None:
    """Why this process could not make or write the directory `path`, or None: the directory,
    or else the nearest part of the path that exists, must be a directory it may write and
    enter (access(2) with the effective ids: permissions, read-only mounts)."""
    here = path
    while True:
        try:
            is_dir = here.is_dir()
            exists = is_dir or here.exists() or here.is_symlink()
        except OSError as e:
            return f"{here}: {e.strerror}"
        if exists:
            break
        if here.parent == here:
            return f"{path}: nothing of it exists"
        here = here.parent
    if not is_dir:
        return f"{here} is not a directory" + (f" (on the way to {path})" if here != path else "")
    if not os.access(here, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        what = "cannot be written" if here == path else f"cannot be made ({here} cannot be written)"
        return f"{path} {what} by uid {os.geteuid()}"
    return None


class Unusable(ValueError):
    """A setting that parsed but cannot be used here (a port taken, a secret that cannot be
    read, an outbox that cannot be made): one line naming its key. `deltad serve` says it and
    exits 2, as it does for a configuration that does not parse."""


def unusable(where: str, why: object, *, named: tuple[str, ...] = ()) -> Unusable:
    """`why` (an exception, or a line) as one line under the key `where`, unless what it says
    already starts with one of `named` (a key of its own)."""
    said = str(why)
    return Unusable(said if named and said.startswith(named) else f"{where}: {said}")
