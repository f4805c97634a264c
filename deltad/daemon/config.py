"""The daemon's YAML configuration: one pydantic model, errors reported in one line naming the key.

Every key is documented in `config/deltad.yaml`; defaults here are the ones documented there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

DEFAULT_RESUME_COMMAND = ["delta", "run", "--work-dir", "{workspace}"]


class ConfigError(Exception):
    """The configuration cannot be used; the message is one line and names the key."""


class _Strict(BaseModel):
    # A misspelt key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid")


BackendName = Literal["auto", "inotify", "watchdog", "polling"]


def auto_backend() -> Literal["inotify", "watchdog"]:
    """inotify on Linux (one fd, no thread per watch), watchdog's native observer elsewhere."""
    return "inotify" if sys.platform.startswith("linux") else "watchdog"


class RootConfig(_Strict):
    path: Path
    backend: BackendName = "auto"
    polling: bool = False  # alias of `backend: polling` (NFS, some container mounts)

    @model_validator(mode="after")
    def _resolve_backend(self) -> RootConfig:
        if self.polling:
            if self.backend not in ("auto", "polling"):
                raise ValueError(f"polling: true contradicts backend: {self.backend}")
            self.backend = "polling"
        elif self.backend == "auto":
            self.backend = auto_backend()
        if self.backend == "inotify" and not sys.platform.startswith("linux"):
            raise ValueError("backend: inotify exists only on Linux (use auto or watchdog)")
        self.polling = self.backend == "polling"
        return self

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return Path(os.path.abspath(os.path.expanduser(v)))


def _default_state_dir() -> Path:
    # systemd's StateDirectory= exports $STATE_DIRECTORY; otherwise the XDG state dir.
    if env := os.environ.get("STATE_DIRECTORY"):
        return Path(env.split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "deltad"


class DaemonConfig(_Strict):
    roots: list[RootConfig] = Field(default_factory=list)
    discovery_depth: int = Field(default=2, ge=0, le=8)
    max_parallel_resumes: int = Field(default=4, ge=1, le=256)
    resume_command: list[str] = Field(default_factory=lambda: list(DEFAULT_RESUME_COMMAND))
    resume_timeout_seconds: float = Field(default=3600.0, gt=0)
    rescan_interval_seconds: float = Field(default=300.0, gt=0)
    liveness_sweep_seconds: float = Field(default=30.0, gt=0)
    poll_interval_seconds: float = Field(default=2.0, gt=0)
    auto_resume_interrupted: bool = False
    backoff_initial_seconds: float = Field(default=5.0, gt=0)
    backoff_max_seconds: float = Field(default=600.0, gt=0)
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    settle_seconds: float = Field(default=1.0, ge=0)
    max_inotify_watches: int | None = Field(default=None, ge=1)
    state_dir: Path = Field(default_factory=_default_state_dir)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("roots", mode="before")
    @classmethod
    def _plain_paths(cls, v: object) -> object:
        # `- /srv/ws` is shorthand for `- {path: /srv/ws}`.
        if isinstance(v, list):
            return [{"path": item} if isinstance(item, str) else item for item in v]
        return v

    @field_validator("resume_command")
    @classmethod
    def _has_workspace(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("must name a program")
        if not any("{workspace}" in part for part in v):
            raise ValueError("must contain the placeholder {workspace}")
        return v

    @field_validator("state_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return Path(os.path.abspath(os.path.expanduser(v)))


def _one_line(e: ValidationError, source: str) -> ConfigError:
    first = e.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return ConfigError(f"{source}: {key}: {first['msg']}{more}")


def load_config(path: Path | None, extra_roots: tuple[str, ...] = ()) -> DaemonConfig:
    """Read `path` (None: defaults only) and append `--root` directories."""
    raw: object = {}
    source = str(path) if path else "configuration"
    if path is not None:
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}:{where} is not valid YAML") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys")
    raw = dict(raw)
    raw["roots"] = [*(raw.get("roots") or []), *({"path": r} for r in extra_roots)]
    try:
        config = DaemonConfig.model_validate(raw)
    except ValidationError as e:
        raise _one_line(e, source) from None
    if not config.roots:
        raise ConfigError(f"{source}: roots: give at least one root (or pass --root DIR)")
    return config
