"""Orchestra-style agents: `agent="name"` on a box node, resolved from the `agents:` table of
an `orchestra.yaml` beside the DOT file.

An entry names up to four prompt files (`role`, `persona`, `personality`, `task`, in that
order); each is a YAML mapping whose `content` is one layer of the node's system prompt, the
layers joined by a blank line. `model` is an alias looked up in the provider's `models:` table
(`provider`, else `providers.default`); the provider's name becomes the node's `llm_provider`.
Paths are relative to the config file and stay under its directory; every file is read
without following a symlink, with a size cap. Pure where it can be: `resolve` takes a reader.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from deltad.protocol.errors import ProtocolError, UnsafeFile
from deltad.protocol.fsio import lstat_or_none, read_regular_text
from deltad.protocol.safefs import read_beneath

CONFIG_NAME = "orchestra.yaml"
MAX_CONFIG_BYTES = 256 * 1024
MAX_PROMPT_BYTES = 256 * 1024
LAYERS = ("role", "persona", "personality", "task")  # the order the prompt is composed in
AGENT_KEYS = frozenset({*LAYERS, "model", "provider"})
CONFIG_KEYS = frozenset({"providers", "agents"})

Reader = Callable[[Path, PurePosixPath], str]  # (the config's directory, a path under it)


class OrchestraError(Exception):
    """One line: what in the config (or a file it names) cannot be used."""


@dataclass(frozen=True)
class Given:
    """What a node resolved from the config is given: its system prompt and model settings."""

    system_prompt: str
    llm: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    path: Path
    providers: Mapping[str, Any]
    agents: Mapping[str, Any]
    ignored: tuple[str, ...]  # keys we read past (`backend:`, an agent's `tools:`, ...)


def config_beside(dot_dir: Path) -> Path | None:
    """The `orchestra.yaml` in the DOT file's directory, if there is one (a symlink is not)."""
    st = lstat_or_none(dot_dir / CONFIG_NAME)
    return dot_dir / CONFIG_NAME if st is not None else None


def read_file(path: Path, limit: int) -> str:
    """The file's text; OrchestraError (one line) when it is missing, a symlink, too big..."""
    try:
        return read_regular_text(path, limit)
    except FileNotFoundError:
        raise OrchestraError(f"{path}: no such file") from None
    except ProtocolError as e:
        raise OrchestraError(str(e)) from None
    except OSError as e:
        raise OrchestraError(f"{path}: {e.strerror or e}") from None


def _yaml_mapping(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise OrchestraError(f"{where}: not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OrchestraError(f"{source}: must be a YAML mapping")
    return data


def parse_config(text: str, path: Path) -> Config:
    data = _yaml_mapping(text, str(path))
    providers, agents = data.get("providers") or {}, data.get("agents") or {}
    if not isinstance(providers, dict):
        raise OrchestraError(f"{path}: providers: must be a mapping")
    if not isinstance(agents, dict):
        raise OrchestraError(f"{path}: agents: must be a mapping")
    ignored = [k for k in data if k not in CONFIG_KEYS]
    for name, entry in agents.items():
        if isinstance(entry, dict):
            ignored += [f"agents.{name}.{k}" for k in entry if k not in AGENT_KEYS]
    return Config(path, providers, agents, tuple(str(k) for k in ignored))


def load_config(path: Path) -> Config:
    return parse_config(read_file(path, MAX_CONFIG_BYTES), path)


def confined(base: Path, relative: str) -> PurePosixPath:
    """`relative` as a path under `base`; an absolute path or a `..` part is refused."""
    p = PurePosixPath(relative)
    if not relative or p.is_absolute() or ".." in p.parts or not p.parts:
        raise OrchestraError(f"{relative!r} must be a path inside {base}")
    return p


def layer_text(text: str, source: str) -> str:
    """A prompt file's layer: its `content` (the whole file is a mapping, as Orchestra's)."""
    content = _yaml_mapping(text, source).get("content")
    if not isinstance(content, str):
        raise OrchestraError(f"{source}: needs content: with the prompt text")
    return content


def compose(layers: list[str]) -> str:
    """The layers in order, each trimmed, joined by a blank line."""
    return "\n\n".join(t.strip() for t in layers if t.strip())


def model_settings(config: Config, entry: Mapping[str, Any]) -> dict[str, str]:
    """`llm_model` and `llm_provider` for an entry's `model` alias (none when it has none)."""
    provider = entry.get("provider") or config.providers.get("default")
    out: dict[str, str] = {}
    if provider:
        out["llm_provider"] = str(provider)
    alias = entry.get("model")
    if alias is None:
        return out
    table = config.providers.get(str(provider)) if provider else None
    models = table.get("models") if isinstance(table, dict) else None
    models = models if isinstance(models, dict) else {}
    if str(alias) not in models:
        known = ", ".join(sorted(map(str, models))) or "none"
        raise OrchestraError(
            f"{config.path}: model alias {alias!r} is not in providers.{provider}.models ({known})"
        )
    out["llm_model"] = str(models[str(alias)])
    return out


def resolve(config: Config, name: str, read: Reader) -> Given:
    """The system prompt and model settings of agent `name`; OrchestraError when it cannot."""
    entry = config.agents.get(name)
    if not isinstance(entry, dict):
        raise OrchestraError(f"{config.path}: agents.{name} must be a mapping")
    base = config.path.parent
    layers = []
    for layer in LAYERS:
        if (relative := entry.get(layer)) is None:
            continue
        path = confined(base, str(relative))
        layers.append(layer_text(read(base, path), str(base / path)))
    prompt = compose(layers)
    if not prompt:
        raise OrchestraError(f"{config.path}: agents.{name} composes an empty system prompt")
    return Given(prompt, model_settings(config, entry))


def read_prompt(base: Path, relative: PurePosixPath) -> str:
    """A prompt file under `base`, opened one component at a time without following a
    symlink (a linked directory could lead out of it), with a size cap."""
    where = base / relative
    try:
        return read_beneath(base, relative.parts, MAX_PROMPT_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise OrchestraError(f"{where}: no such file") from None
    except UnicodeDecodeError:
        raise OrchestraError(f"{where}: not valid UTF-8") from None
    except UnsafeFile as e:  # not a regular file, or over the limit: the message names it
        raise OrchestraError(str(e)) from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OrchestraError(f"{where}: a symlink on the way; write a regular file") from None
        raise OrchestraError(f"{where}: {e.strerror or e}") from None
