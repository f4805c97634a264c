"""The daemon's YAML configuration: one pydantic model, errors reported in one line naming the key.

Every key is documented in `config/deltad.yaml`; defaults here are the ones documented there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from deltad import platform, validation
from deltad.core.tenancy import Launcher, Policy
from deltad.inbox.config import HttpConfig, NotifyConfig
from deltad.outbound.config import ChannelsConfig
from deltad.protocol.followup import FollowUp

DEFAULT_RESUME_COMMAND = ["delta", "run", "--work-dir", "{workspace}"]


class ConfigError(Exception):
    """The configuration cannot be used. Each problem is one line naming the key; `str()` is
    the first, with a count of the rest."""

    def __init__(self, *problems: str) -> None:
        self.problems = list(problems)
        rest = len(problems) - 1
        super().__init__(problems[0] + (f" (and {rest} more: see `deltad check`)" if rest else ""))


class _Strict(BaseModel):
    # A misspelt key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid")


BackendName = Literal["auto", "fanotify", "inotify", "watchdog", "polling"]


def auto_backend(roots: list[RootConfig], depth: int, own_cap: int | None) -> None:
    """Resolve each `backend: auto` root (backend_choice.py: inotify while the roots' watches
    fit the kernel's budget with room to spare, else fanotify where a filesystem mark works,
    else inotify with polling for the rest); every root keeps why it has its backend."""
    from deltad.watch.choice import PlannedRoot, plan
    from deltad.watch.fanotify import probe

    planned = [PlannedRoot(r.path, r.backend) for r in roots]
    for r, (name, why, _need) in zip(
        roots, plan(planned, depth, own_cap, platform.LINUX, probe), strict=True
    ):
        r.backend = name  # type: ignore[assignment]  # plan keeps names or picks a real one
        r._why = why


class RootConfig(_Strict):
    path: Path
    backend: BackendName = "auto"
    polling: bool = False  # alias of `backend: polling` (NFS, some container mounts)
    credentials: Path | None = None  # model endpoint settings for this root's resumes
    notify: bool = True  # false: no notifications for this root's workspaces
    _why: str = PrivateAttr(default="configured")  # why it has its backend (auto says)

    @property
    def why(self) -> str:
        return self._why

    @model_validator(mode="after")
    def _resolve_backend(self) -> RootConfig:
        if self.polling:
            if self.backend not in ("auto", "polling"):
                raise ValueError(f"polling: true contradicts backend: {self.backend}")
            self.backend = "polling"
        elif self.backend == "fanotify":
            from deltad.watch.fanotify import probe

            if (reason := probe(self.path)) is not None:
                raise ValueError(f"backend: fanotify is impossible here: {reason}")
        if self.backend == "inotify" and not platform.LINUX:
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


class ModelRetryConfig(_Strict):
    """Runs the model endpoint left INTERRUPTED (an outage) are resumed by deltad itself."""

    enabled: bool = True
    initial_seconds: float = Field(default=30.0, gt=0)
    max_seconds: float = Field(default=900.0, gt=0)
    give_up_after_seconds: float = Field(default=86400.0, gt=0)


class HaConfig(_Strict):
    """Active/standby (docs/daemon.md, "Two daemons, one fleet"): the daemon holding `lease`
    acts; any other daemon configured with the same lease waits as a standby."""

    lease: Path
    poll_seconds: float = Field(default=0.5, gt=0, le=60)  # a standby's tries at the lease
    # A standby takes over from an active whose record has not changed for this long (a
    # frozen or cut-off active); the active renews every fifth of it and acts only within
    # half of it after its last renewal (deltad/core/lease.py).
    lease_seconds: float = Field(default=10.0, ge=1, le=300)

    @field_validator("lease")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return Path(os.path.abspath(os.path.expanduser(v)))


class FollowUpLimits(_Strict):
    """The floor under every question's reminders (docs/inbox.md, "Reminders and escalation"):
    at most one each `min_interval_seconds`, at most `max_per_hour` in any hour."""

    min_interval_seconds: float = Field(default=60.0, ge=1.0, le=86400.0)
    max_per_hour: int = Field(default=10, ge=1, le=60)


class AuditConfig(_Strict):
    """Receipts (docs/inbox.md, "Receipts"): each decision appended to a hash-chained log."""

    enabled: bool = True
    path: Path | None = None  # default: <state_dir>/audit.jsonl (share it across an HA fleet)
    # Moved aside past this size, the chain going on in the next file; the newest `keep_files`
    # files moved aside are kept (0: all of them).
    rotate_bytes: int = Field(default=64 * 1024 * 1024, ge=4096, le=2**40)
    keep_files: int = Field(default=0, ge=0, le=100_000)
    # The chain's head kept where a tenant cannot reach, every so often (core/anchoring.py).
    anchor_file: Path | None = None
    anchor_command: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, min_length=1
    )
    anchor_every_seconds: float = Field(default=3600.0, ge=1, le=7 * 86400)

    @field_validator("path", "anchor_file")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        return None if v is None else Path(os.path.abspath(os.path.expanduser(v)))


def default_per_owner(total: int) -> int:
    """One owner's share of `total` resume slots when none is set: half, rounded up."""
    return (total + 1) // 2


class TracesConfig(_Strict):
    """OpenTelemetry traces of each question's life (docs/daemon.md, "Traces"; deltad/tracing.py).
    Off unless this section is there: the standard OTEL_EXPORTER_OTLP_* variables do not turn
    it on, nor change where spans go."""

    # The OTLP/HTTP (protobuf) traces URL, `/v1/traces` included: http://collector:4318/v1/traces
    otlp_endpoint: str = Field(min_length=1, max_length=2048)
    service_name: str = Field(default="deltad", min_length=1, max_length=128)
    # `Name: value` lines sent with every export (a vendor's API key): a file, never the config.
    headers_file: Path | None = None
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    max_queue: int = Field(default=2048, ge=1, le=1_000_000)  # spans waiting; more are dropped

    @field_validator("otlp_endpoint")
    @classmethod
    def _url(cls, v: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL (the OTLP/HTTP traces endpoint)")
        if parts.username is not None or parts.password is not None:
            # The URL is logged (traces_exporting): a credential goes in headers_file.
            raise ValueError("no credentials in the URL: put them in headers_file")
        return v

    @field_validator("service_name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("must be printable")
        return v


class DaemonConfig(_Strict):
    roots: list[RootConfig] = Field(default_factory=list)
    discovery_depth: int = Field(default=2, ge=0, le=8)
    max_parallel_resumes: int = Field(default=4, ge=1, le=256)
    # One owner's share of those (None: half of them, rounded up); see slots.py.
    max_parallel_resumes_per_owner: int | None = Field(default=None, ge=1, le=256, strict=True)
    resume_command: list[str] = Field(default_factory=lambda: list(DEFAULT_RESUME_COMMAND))
    # How a resume is started: a name in deltad/executors/registry.py, an entry point
    # in `deltad.executors`, or `module:factory`; its options under `executors: {NAME: ...}`.
    executor: str = "auto"
    executors: dict[str, dict[str, Any]] = Field(default_factory=dict)
    resume_timeout_seconds: float = Field(default=3600.0, gt=0)
    rescan_interval_seconds: float = Field(default=300.0, gt=0)
    liveness_sweep_seconds: float = Field(default=30.0, gt=0)
    poll_interval_seconds: float = Field(default=2.0, gt=0)
    auto_resume_interrupted: bool = False
    model_retry: ModelRetryConfig = Field(default_factory=ModelRetryConfig)
    backoff_initial_seconds: float = Field(default=5.0, gt=0)
    backoff_max_seconds: float = Field(default=600.0, gt=0)
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    settle_seconds: float = Field(default=1.0, ge=0)
    max_inotify_watches: int | None = Field(default=None, ge=1)
    # The inotify watches the directories of one owner (uid; not root's or the daemon's own)
    # may take; beyond, that owner's further directories are polled (said once, and in
    # `deltad status`). None: no cap. Not fanotify's: it takes no watch per directory.
    max_watches_per_owner: int | None = Field(default=1000, ge=1)
    state_dir: Path = Field(default_factory=_default_state_dir)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Tenants (docs/daemon.md, "Privilege model").
    trusted_owners: list[str] = Field(default_factory=list)
    shared_group: str | None = None
    resume_env: list[str] = Field(default_factory=lambda: ["LANG", "LC_ALL", "TZ"])
    owner_credentials: dict[str, Path] = Field(default_factory=dict)
    # The inbox (docs/inbox.md): off unless configured or `deltad serve --listen`.
    http: HttpConfig | None = None
    notify: NotifyConfig | None = None
    channels: ChannelsConfig | None = None  # email (docs/inbox.md, "Channels")
    ha: HaConfig | None = None  # off: this daemon acts alone (its state-dir lock says so)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    # Reminders and escalation of every question that sets none itself (docs/inbox.md,
    # "Reminders and escalation"): the keys of an ask_human call's / an agent's follow_up.
    follow_up: FollowUp | None = None
    # What any question may ask of reminders, whoever set them (the model, the agent, the
    # owner writing request.json): no more often than this, nor more of them an hour.
    follow_up_limits: FollowUpLimits = Field(default_factory=lambda: FollowUpLimits())
    # The key every answer the daemon writes is signed with (deltad/inbox/sealing.py; made on
    # the first start; None: <state_dir>/decision-key), and older public keys a resume still
    # trusts (`ed25519:BASE64`: a rotation, or the other daemons of an HA fleet).
    decision_key_file: Path | None = None
    decision_keys_trusted: list[str] = Field(default_factory=list)
    traces: TracesConfig | None = None  # OpenTelemetry traces (docs/daemon.md): off when absent

    @model_validator(mode="after")
    def _executor(self) -> DaemonConfig:
        """The executor resumes will use must load and take its options (checked through its
        options model, without starting it); `auto` means the one it resolves to."""
        from deltad.executors import registry

        kind = self.executor_kind()
        registry.check_options(kind, self.executors.get(kind, {}))
        return self

    def executor_kind(self) -> str:
        """The executor `executor:` means for this `resume_command` (`auto` resolved)."""
        from deltad.core.argv import build_argv
        from deltad.executors import resolve

        return resolve(self.executor, build_argv(self.resume_command, Path("/"), None))

    @model_validator(mode="after")
    def _auto_backends(self) -> DaemonConfig:
        # Here, not per root: the roots share the kernel's watch budget.
        if any(r.backend == "auto" for r in self.roots):
            auto_backend(self.roots, self.discovery_depth, self.max_inotify_watches)
        return self

    @model_validator(mode="after")
    def _tenants(self) -> DaemonConfig:
        self.policy()  # unknown users or groups are errors now, not at the first resume
        return self

    @model_validator(mode="after")
    def _owner_share(self) -> DaemonConfig:
        # Unset: half the slots, rounded up (shown as the number), so on a fresh install one
        # owner's long resumes never hold every slot; a one-user server sets it to the total.
        if self.max_parallel_resumes_per_owner is None:
            self.max_parallel_resumes_per_owner = default_per_owner(self.max_parallel_resumes)
        return self

    def notes(self) -> list[str]:
        """Settings that are valid but do not do what they say (`deltad check` prints them)."""
        per_owner, total = self.max_parallel_resumes_per_owner, self.max_parallel_resumes
        if per_owner is not None and per_owner > total:
            return [
                f"max_parallel_resumes_per_owner ({per_owner}) is above max_parallel_resumes "
                f"({total}): one owner may use all {total} slots"
            ]
        return []

    def policy(self) -> Policy:
        return Policy.from_names(self.trusted_owners, self.shared_group)

    def launcher(self) -> Launcher:
        return Launcher(
            self.policy(),
            list(self.resume_env),
            {r.path: r.credentials for r in self.roots if r.credentials is not None},
            dict(self.owner_credentials),
        )

    @field_validator("roots", mode="before")
    @classmethod
    def _plain_paths(cls, v: object) -> object:
        # `roots: /srv/ws` would otherwise be read as one root per character.
        if not isinstance(v, list):
            raise ValueError("must be a list of directories (write `roots: [/srv/ws]`)")
        # `- /srv/ws` is shorthand for `- {path: /srv/ws}`.
        return [{"path": item} if isinstance(item, str) else item for item in v]

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

    @field_validator("decision_key_file")
    @classmethod
    def _key_file(cls, v: Path | None) -> Path | None:
        return None if v is None else Path(os.path.abspath(os.path.expanduser(v)))

    @field_validator("decision_keys_trusted")
    @classmethod
    def _trusted(cls, v: list[str]) -> list[str]:
        from deltad.protocol.seal import parse_keys

        for word in v:
            parse_keys(word)  # BadKey is a ValueError: one line, naming the key
        return v

    def decision_key_path(self) -> Path:
        return self.decision_key_file or self.state_dir / "decision-key"


def _problems(e: ValidationError, source: str) -> ConfigError:
    # A problem of the whole (a model validator's) names its keys itself.
    lines = validation.problems(e, DaemonConfig)
    return ConfigError(*(validation.printable(f"{source}: {line}") for line in lines))


def _read(path: Path) -> object:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise ConfigError(f"{path}:{where} is not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None


def load_config(path: Path | None, extra_roots: tuple[str, ...] = ()) -> DaemonConfig:
    """Read `path` (None: defaults only) and append `--root` directories. Raises ConfigError
    carrying every problem found, one line each."""
    source = str(path) if path else "configuration"
    raw = _read(path) if path is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys")
    raw = dict(raw)
    roots = raw.get("roots") or []
    if not isinstance(roots, list):
        raise ConfigError(
            f"{source}: roots: must be a list of directories (write `roots: [{roots}]`)"
        )
    raw["roots"] = [*roots, *({"path": r} for r in extra_roots)]
    try:
        config = DaemonConfig.model_validate(raw)
    except ValidationError as e:
        raise _problems(e, source) from None
    if not config.roots:
        raise ConfigError(f"{source}: roots: give at least one root (or pass --root DIR)")
    return config
