"""The `http:` and `notify:` sections of the daemon's configuration (documented in
`config/deltad.yaml`)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from deltad.inbox import scopes

NotifyEvent = Literal[
    "request.created",
    "request.expired",
    "request.answered",
    "run.status",
    "request.reminder",
    "request.escalated",
    "request.overdue",
]
DEFAULT_NOTIFY: list[NotifyEvent] = [
    "request.created",
    "request.expired",
    "run.status",
    "request.reminder",
    "request.escalated",
    "request.overdue",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def split_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:8470` for IPv6) → (host, port); ValueError naming the problem."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:8470)")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


# The inbox's own top-level paths (deltad/http/app.py): the MCP endpoint goes elsewhere.
MCP_PATH_TAKEN = ("v1", "static", "a", "metrics", "healthz", "livez", "readyz")


class McpConfig(_Strict):
    """`http.mcp`: the inbox as an MCP server (streamable HTTP) at `path`, for the API's tokens
    (docs/inbox.md, "MCP")."""

    enabled: bool = True
    path: str = Field(default="/mcp", pattern=r"^/[A-Za-z0-9._~/-]{1,63}$")
    max_sessions: int = Field(default=1000, ge=1, le=100_000)  # MCP sessions open at once
    max_listeners: int = Field(default=256, ge=1, le=100_000)  # subscriptions/listen streams
    session_idle_seconds: float = Field(default=1800.0, gt=0, le=86400)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        v = v.rstrip("/")
        if v.split("/")[1] in MCP_PATH_TAKEN:
            taken = ", ".join(f"/{p}" for p in MCP_PATH_TAKEN)
            raise ValueError(f"must not be under a path the inbox already serves ({taken})")
        return v


class Secret(_Strict):
    """A secret named, not written, in the configuration: a file (0600) or an env variable."""

    secret_file: Path | None = None
    secret_env: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Secret:
        if (self.secret_file is None) == (self.secret_env is None):
            raise ValueError("give exactly one of secret_file or secret_env")
        return self

    def read(self) -> bytes:
        if self.secret_env is not None:
            value = os.environ.get(self.secret_env)
            if not value:
                raise ValueError(f"environment variable {self.secret_env} is not set")
            return value.encode()
        assert self.secret_file is not None
        return one_newline_less(self.secret_file.read_bytes())


def one_newline_less(data: bytes) -> bytes:
    """A secret file's bytes without the one newline an editor or `echo` adds at the end (and
    nothing else: leading or inner whitespace is part of the secret)."""
    return data.removesuffix(b"\n").removesuffix(b"\r")


class OidcConfig(_Strict):
    """`http.oidc`: people sign in to the page through an OpenID provider (authorization code
    with PKCE), and the API takes the provider's JWTs beside deltad's own tokens
    (docs/inbox.md, "OIDC sign-in"). Discovery and keys are fetched by the inbox process."""

    issuer: str  # exactly as the provider's discovery document and tokens say it (`iss`)
    client_id: str = Field(min_length=1, max_length=255)
    client_secret: Secret | None = None  # none: a public client (PKCE alone)
    # Where the provider sends people back; default: the inbox's address + /v1/oidc/callback.
    redirect_url: str | None = None
    scopes: list[str] = Field(default_factory=lambda: ["openid", "email", "profile"])
    groups_claim: str = Field(default="groups", min_length=1, max_length=64)
    # The `aud` an API bearer JWT must carry; default: client_id (an ID token's audience).
    audience: str | None = Field(default=None, min_length=1, max_length=255)
    provider_name: str = Field(default="your identity provider", min_length=1, max_length=64)
    # What a person signed in this way may do: a token's role and scopes (`deltad token add`).
    role: Literal["reader", "answerer", "admin"] = "answerer"
    workspaces: list[str] = Field(default_factory=lambda: [scopes.ALL], min_length=1)
    # Discovery and keys are kept this long; an unknown key id fetches the keys again, at most
    # once per `jwks_refetch_seconds`.
    cache_seconds: float = Field(default=3600.0, gt=0, le=7 * 86400)
    jwks_refetch_seconds: float = Field(default=60.0, ge=0, le=86400)
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, v: str) -> str:
        if not v.startswith("https://") and not is_loopback(_host_of(v)):
            raise ValueError("must be an https:// URL (http:// only on a loopback address)")
        if "?" in v or "#" in v:
            raise ValueError("must be a URL with no query or fragment")
        return v

    @field_validator("redirect_url")
    @classmethod
    def _redirect(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v

    @field_validator("scopes")
    @classmethod
    def _openid(cls, v: list[str]) -> list[str]:
        if "openid" not in v:
            raise ValueError("must include openid")
        if any(not s or " " in s for s in v):
            raise ValueError("each scope is one word")
        return v

    @field_validator("workspaces")
    @classmethod
    def _globs(cls, v: list[str]) -> list[str]:
        for glob in v:
            if scopes.normal(glob.replace("*", "x").replace("?", "x")) is None:
                raise ValueError(f"{glob!r}: must be an absolute path glob with no . or ..")
            scopes.check(glob)
        return v


def _host_of(url: str) -> str:
    if not url.startswith("http://"):
        return ""
    host = url.removeprefix("http://").split("/", 1)[0]
    return host.rpartition(":")[0].strip("[]") if ":" in host else host


class HttpConfig(_Strict):
    listen: str = "127.0.0.1:8470"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Plain HTTP on a non-loopback address sends tokens and answers in clear: only on purpose.
    allow_insecure_remote: bool = False
    # The address people reach the page at (links in notifications); default: from `listen`.
    public_url: str | None = None
    event_buffer: int = Field(default=1000, ge=10, le=100_000)
    keepalive_seconds: float = Field(default=15.0, gt=0)
    link_ttl_seconds: float = Field(default=86400.0, gt=0)
    session_ttl_seconds: float = Field(default=43200.0, gt=0)
    # What a peer may hold (docs/inbox.md, "Limits"): connections open at once in all, from
    # one address and from one network (behind a proxy every client is the proxy's address:
    # raise both), descriptors kept free for the daemon's own work, deadlines on a request's
    # headers (shorter before a credential checked out on its connection), its body and an idle
    # keep-alive connection, and event streams per token and how long one lasts.
    max_connections: int = Field(default=512, ge=1, le=1_000_000)
    max_connections_per_source: int = Field(default=128, ge=1, le=1_000_000)
    max_connections_per_network: int = Field(default=256, ge=1, le=1_000_000)
    fd_reserve: int = Field(default=256, ge=0, le=1_000_000)
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    stranger_header_timeout_seconds: float = Field(default=2.0, gt=0, le=3600)
    body_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    idle_timeout_seconds: float = Field(default=5.0, gt=0, le=3600)
    max_streams_per_token: int = Field(default=16, ge=1, le=100_000)
    stream_lifetime_seconds: float = Field(default=3600.0, gt=0, le=7 * 86400)
    # The inbox process (privilege separation, docs/design.md): the user it runs as when
    # deltad is root (made as a system user if it is this default and missing), and, for an
    # inbox started by its own unit (deltad-inbox.service), the socket the core listens on.
    user: str = Field(default="deltad-inbox", min_length=1, max_length=64)
    inbox_socket: Path | None = None
    mcp: McpConfig = Field(default_factory=McpConfig)  # the inbox as an MCP server
    oidc: OidcConfig | None = None  # sign-in through an OpenID provider (docs/inbox.md)

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        split_listen(v)
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if v in ("root", "0"):
            raise ValueError("the inbox never runs as root: name an unprivileged user")
        return v

    @model_validator(mode="after")
    def _tls(self) -> HttpConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        host, _ = split_listen(self.listen)
        if not self.tls and not is_loopback(host) and not self.allow_insecure_remote:
            raise ValueError(
                f"listen {self.listen} is not a loopback address and no tls_cert/tls_key is "
                "set: tokens and answers would cross the network in clear (set "
                "allow_insecure_remote: true if a proxy in front terminates TLS)"
            )
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def base_url(self, port: int | None = None) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host, configured = split_listen(self.listen)
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls else 'http'}://{host}:{port or configured}"


class Target(_Strict):
    events: list[NotifyEvent] = Field(default_factory=lambda: list(DEFAULT_NOTIFY))
    # Workspace globs that never notify through this target (opt-out); `*` stops at `/`.
    exclude: list[str] = Field(default_factory=list)

    @field_validator("exclude")
    @classmethod
    def _globs(cls, v: list[str]) -> list[str]:
        for glob in v:
            scopes.check(glob)  # GlobError is a ValueError: one line, naming the field
        return v


class Webhook(Target):
    url: str
    signing: Secret | None = None
    timeout_seconds: float = Field(default=10.0, gt=0)  # each attempt, whole
    max_attempts: int = Field(default=5, ge=1, le=50)
    backoff_seconds: float = Field(default=2.0, gt=0)
    backoff_max_seconds: float = Field(default=300.0, gt=0)
    # A delivery still not delivered this long after its event goes to the dead letter.
    max_age_seconds: float = Field(default=86400.0, gt=0)
    # Deliveries kept waiting in the outbox (the oldest goes to the dead letter beyond it),
    # and dead letters kept (the oldest are deleted beyond it).
    outbox_max: int = Field(default=1000, ge=1, le=1_000_000)

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v


class Command(Target):
    argv: list[str] = Field(min_length=1)
    timeout_seconds: float = Field(default=30.0, gt=0)


class NotifyConfig(_Strict):
    webhooks: list[Webhook] = Field(default_factory=list)
    commands: list[Command] = Field(default_factory=list)
    # Put a signed single-use answer link in each request.created notification.
    answer_links: bool = False

    @model_validator(mode="after")
    def _distinct_urls(self) -> NotifyConfig:
        # A webhook's outbox is named after its URL: two targets must not share one.
        seen: dict[str, int] = {}
        for i, w in enumerate(self.webhooks):
            if w.url in seen:
                raise ValueError(
                    f"webhooks: entry {i} has the same url as entry {seen[w.url]} (one per URL)"
                )
            seen[w.url] = i
        return self
