"""The `channels:` section of the daemon's configuration (documented in `config/deltad.yaml`
and docs/inbox.md, "Channels"). Every model forbids unknown keys, so `deltad check` names a
misspelt one in one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from deltad.inbox.config import Secret

ADDRESS = re.compile(r"[^@\s<>\"]+@[^@\s<>\"]+\.[^@\s<>\"]+")
LOCAL = re.compile(r"[a-z0-9][a-z0-9._-]{0,15}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OutboxConfig(_Strict):
    """One channel's own durable outbox: retries and the dead letter (as a webhook's)."""

    max_attempts: int = Field(default=8, ge=1, le=50)
    backoff_seconds: float = Field(default=5.0, gt=0)
    backoff_max_seconds: float = Field(default=600.0, gt=0)
    max_age_seconds: float = Field(default=86400.0, gt=0)
    outbox_max: int = Field(default=10_000, ge=1, le=1_000_000)


class Smtp(_Strict):
    """Where question mail goes out: the site's MTA (a submission port with STARTTLS and a
    login, or a local relay on port 25)."""

    host: str = "127.0.0.1"
    port: int = Field(default=25, ge=1, le=65535)
    # starttls: upgrade before sending anything (refuse a server that cannot); tls: TLS from
    # the first byte (port 465); none: plain (a relay on loopback only).
    security: Literal["starttls", "tls", "none"] = "starttls"
    username: str | None = None
    password: Secret | None = None
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    # Verify the server's certificate against this CA file (None: the system's store).
    ca_file: Path | None = None

    @model_validator(mode="after")
    def _login(self) -> Smtp:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if self.username is not None and self.security == "none":
            raise ValueError("a login over a plain connection would send the password in clear")
        return self


class Person(_Strict):
    name: str  # who they are for `respondents`: a token name
    groups: list[str] = Field(default_factory=list)  # `group:NAME` in respondents


class EmailConfig(_Strict):
    """Questions as mail, replies as answers (deltad/outbound/email.py)."""

    from_address: str  # the From of every mail deltad sends
    reply_domain: str  # reply addresses are <reply_local>+<token>@<reply_domain>
    reply_local: str = "reply"
    maildir: Path  # where the MTA delivers mail for reply_domain (new/, cur/, tmp/)
    smtp: Smtp = Field(default_factory=Smtp)
    # Who gets questions, by address: a token name, or {name, groups}.
    people: dict[str, str | Person] = Field(default_factory=dict)
    reply_ttl_seconds: float = Field(default=7 * 86400.0, gt=0)
    poll_seconds: float = Field(default=2.0, gt=0, le=3600)
    max_message_bytes: int = Field(default=256 * 1024, ge=1024, le=64 * 1024 * 1024)
    max_per_pass: int = Field(default=100, ge=1, le=100_000)
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)
    # Which replies count only when the trusted MTA's Authentication-Results (its authserv-id
    # below) say the From is authenticated (deltad/outbound/authres.py): every reply, only
    # approvals and votes (the default), or none.
    authentication: Literal["required", "approvals", "off"] = "approvals"
    authserv_id: str | None = Field(default=None, min_length=1, max_length=255)

    @field_validator("authserv_id")
    @classmethod
    def _authserv_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", v):
            raise ValueError(f"{v!r} is not an authserv-id (a host name)")
        return v.lower() if v is not None else None

    @field_validator("from_address")
    @classmethod
    def _address(cls, v: str) -> str:
        if not ADDRESS.fullmatch(v):
            raise ValueError(f"{v!r} is not a mail address")
        return v

    @field_validator("reply_domain")
    @classmethod
    def _domain(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9.-]+\.[A-Za-z0-9-]+", v):
            raise ValueError(f"{v!r} is not a domain name")
        return v.lower()

    @field_validator("reply_local")
    @classmethod
    def _local(cls, v: str) -> str:
        if not LOCAL.fullmatch(v):
            raise ValueError("must be 1-16 lowercase letters, digits, '.', '_' or '-'")
        return v

    @field_validator("people")
    @classmethod
    def _people(cls, v: dict[str, str | Person]) -> dict[str, str | Person]:
        for address in v:
            if not ADDRESS.fullmatch(address):
                raise ValueError(f"{address!r} is not a mail address")
        return {a.lower(): p for a, p in v.items()}

    def person(self, address: str) -> Person | None:
        p = self.people.get(address.lower())
        return Person(name=p) if isinstance(p, str) else p


# -- Slack (deltad/outbound/slack.py) ------------------------------------------------------------
SLACK_USER = re.compile(r"[UW][A-Z0-9]{2,20}")
SLACK_CONVERSATION = re.compile(r"[CGDU][A-Z0-9]{2,20}")


class SlackConfig(_Strict):
    """Questions as Block Kit messages, answers from their buttons and modals."""

    # The bot token (xoxb-...) and the app's signing secret: named, never written here.
    token: Secret
    signing_secret: Secret
    # Where questions are posted: a conversation id (C..., G...), and/or each mapped person
    # allowed to answer, by direct message (`dm: true`).
    channel: str | None = None
    dm: bool = False
    # Slack user id -> who they are for `respondents`: a token name, or {name, groups}. An
    # action from a user not listed is refused.
    users: dict[str, str | Person] = Field(default_factory=dict)
    # The Web API (a stand-in's on loopback in tests; a proxy's at some sites).
    api_url: str = "https://slack.com/api/"
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    context_chars: int = Field(default=600, ge=0, le=2900)  # task, last message: cut to this
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)

    @field_validator("channel")
    @classmethod
    def _channel(cls, v: str | None) -> str | None:
        if v is not None and not SLACK_CONVERSATION.fullmatch(v):
            raise ValueError(f"{v!r} is not a Slack conversation id (C..., G...)")
        return v

    @field_validator("users")
    @classmethod
    def _users(cls, v: dict[str, str | Person]) -> dict[str, str | Person]:
        for user in v:
            if not SLACK_USER.fullmatch(user):
                raise ValueError(f"{user!r} is not a Slack user id (U..., W...)")
        return v

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, v: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", v):
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v if v.endswith("/") else v + "/"

    @model_validator(mode="after")
    def _somewhere(self) -> SlackConfig:
        if self.channel is None and not self.dm:
            raise ValueError("give a channel, or dm: true (or both)")
        if self.channel is None and not self.users:
            raise ValueError("dm: true without a channel needs users (nobody would be asked)")
        return self

    def person(self, user: str) -> Person | None:
        p = self.users.get(user)
        return Person(name=p) if isinstance(p, str) else p


class PagerDutyConfig(_Strict):
    """Escalations as PagerDuty alerts (Events API v2): an escalated question triggers one
    alert, deduplicated per question, resolved when the question closes."""

    # The Events API v2 integration key of the service to page: named, never written here.
    routing_key: Secret
    events_url: str = "https://events.pagerduty.com/v2/enqueue"
    severity: Literal["critical", "error", "warning", "info"] = "warning"
    # Which system the alert is about (PagerDuty's `source`); None: this host's name.
    source: str | None = Field(default=None, min_length=1, max_length=255)
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)

    @field_validator("events_url")
    @classmethod
    def _events_url(cls, v: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", v):
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v


# -- Microsoft Teams (deltad/outbound/teams.py) --------------------------------------------------
HTTP_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")
# An Entra object id (`from.aadObjectId`): a GUID.
AAD_OBJECT_ID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


class TeamsConfig(_Strict):
    """Questions as Adaptive Cards posted by a Bot Framework bot; answers from their
    Action.Execute buttons, each activity's JWT checked against the Bot Connector's keys."""

    app_id: str = Field(min_length=1, max_length=128)  # the bot's Microsoft App ID
    # The bot's app password (client secret): named, never written here.
    app_password: Secret
    # The Bot Connector's service URL for the tenant (the `serviceUrl` of its activities) and
    # the conversations questions are posted to (a channel's `19:...@thread.tacv2` id).
    service_url: str
    conversations: list[str] = Field(min_length=1, max_length=50)
    # Entra object id (`from.aadObjectId`) -> who they are for `respondents`: a token name, or
    # {name, groups}. An action from a user not listed is refused.
    people: dict[str, str | Person] = Field(default_factory=dict)
    # Where the keys that sign incoming activities are published, and where the bot gets its
    # own token (client credentials): a stand-in's on loopback in tests.
    openid_metadata_url: str = "https://login.botframework.com/v1/.well-known/openidconfiguration"
    token_url: str = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    context_chars: int = Field(default=600, ge=0, le=2900)
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)

    @field_validator("service_url", "openid_metadata_url", "token_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not HTTP_URL.fullmatch(v):
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v

    @field_validator("conversations")
    @classmethod
    def _conversations(cls, v: list[str]) -> list[str]:
        for c in v:
            if not c or len(c) > 512 or any(ch.isspace() or ch in "/?#" for ch in c):
                raise ValueError(f"{c!r} is not a conversation id")
        return v

    @field_validator("people")
    @classmethod
    def _people(cls, v: dict[str, str | Person]) -> dict[str, str | Person]:
        for oid in v:
            if not AAD_OBJECT_ID.fullmatch(oid):
                raise ValueError(f"{oid!r} is not an Entra object id (a GUID)")
        return {k.lower(): p for k, p in v.items()}

    def person(self, oid: str) -> Person | None:
        p = self.people.get(oid.lower())
        return Person(name=p) if isinstance(p, str) else p


class ChannelsConfig(_Strict):
    """Where questions reach people besides the page and the API. One key per channel."""

    email: EmailConfig | None = None
    slack: SlackConfig | None = None
    pagerduty: PagerDutyConfig | None = None
    teams: TeamsConfig | None = None
