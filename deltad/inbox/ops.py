"""The operations the core serves the inbox: one table (OpenSSH's `mon_table`).

Each entry names an operation, its input model and what the core checks before its handler
runs. The inbox process asks by name (`deltad.http.child.Remote.call`: one `call` frame,
deltad/wire.py); the core looks the name up here, refuses what is not in the table,
validates the arguments as the operation's `Input` and answers with the handler
(deltad/privsep/monitor.py). An app without the inbox process (tests) calls the same table in
its own process (`deltad.privsep.monitor.Local`): one path either way.

    token=True    on behalf of a named token: the frame names it, the core reads it (role,
                  scope) from its own tokens.json, never as the inbox says it is
    token=False   no token: the credential is in the arguments and checked by the core (a
                  signed link, Slack's signature, a reply address) or there is none (vitals:
                  plain figures)
    http=False    served by any inbox process, also one started for deliveries only (no
                  `http:`); every other operation is refused there (403)

An operation is answered by the function of its name in deltad/inbox/handlers.py (or in the
`module` its entry names), called as `handler(ctx, who, args)`: the HTTP context
(deltad/inbox/context.py; for an `http=False` operation, what the core serves it with
instead), the token's identity (None without one) and the validated `Input`. It returns a
response model of deltad/inbox/schemas.py (or a plain document where the API declares none)
or raises ApiError. Adding an operation: its `Input` and `Op` here, its handler, and the route
(deltad/http/app.py) or MCP tool that asks for it.

This module is the contract both processes share: it imports nothing of the answering code
(the inbox process loads it, tests/unit/test_inbox_imports.py), and the handlers only when the
core first runs one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deltad.inbox.paging import Sort
from deltad.protocol.models import InputType
from deltad.protocol.printable import json_safe
from deltad.protocol.states import RunStatus

if TYPE_CHECKING:
    from deltad.inbox.tokens import Identity


class ApiError(Exception):
    """A refusal, with its HTTP status and stable code, the same from every surface (routes,
    MCP tools, the core's replies over the socket)."""

    def __init__(
        self, http: int, code: str, message: str, workspaces: list[str] | None = None
    ) -> None:
        super().__init__(message)
        self.http, self.code, self.workspaces = http, code, workspaces

    def document(self) -> dict[str, Any]:
        # A message may quote a workspace named in bytes: UTF-8 JSON would fail on it.
        doc: dict[str, Any] = {"error": json_safe(str(self)), "code": self.code}
        if self.workspaces is not None:
            doc["workspaces"] = self.workspaces
        return doc


def checked_glob(workspace: str | None) -> str | None:
    """`?workspace=GLOB`, refused (422 `bad_glob`) before any matching if over the matcher's
    caps: by the route in the inbox process, and again by the core, as all the inbox sends."""
    from deltad.inbox import scopes

    if workspace:
        try:
            scopes.check(workspace)
        except scopes.GlobError as e:
            raise ApiError(422, "bad_glob", f"workspace: {e}") from None
    return workspace


def unauthorized(message: str = "a bearer token is needed (Authorization: Bearer ...)") -> ApiError:
    return ApiError(401, "unauthorized", message)


# -- caps on what the inbox may send ---------------------------------------------------------
# Every string: as long as anything the HTTP server lets through can be (a request's line and
# headers are at most 16 KiB together: http.limits.HEADERS_MAX), so no request the API took
# before the split is refused here, and nothing longer reaches the core.
TEXT_MAX = 16 * 1024
Name = Annotated[str, Field(min_length=1, max_length=64)]  # a token's name (tokens.NAME)
Text = Annotated[str, Field(max_length=TEXT_MAX)]
Id = Text  # a request or run id
PathText = Text  # a workspace, as shown
Glob = Text  # a workspace glob (scopes.check caps it further, in the core)
Cursor = Text
LinkToken = Text
Limit = int  # the handlers say 422 outside 1..1000
BULK_MAX = 100  # questions one bulk answer may name
HISTORY_DEFAULT, HISTORY_MAX = 50, 500  # entries `GET /v1/history` returns
# `older_than=`, `due_within=`: a duration like 1h30m (paging.duration parses it in the core;
# 64 characters is far more than any duration up to its 366d needs).
Duration = Annotated[str, Field(min_length=1, max_length=64)]
CHANNEL_BODY_MAX = 256 * 1024  # a Slack interaction's body (outbound.slack.BODY_MAX)
CHANNEL_TOKEN_MAX = 16 * 1024  # a Bot Framework JWT
SLACK_SIGNATURE_MAX = 256  # a Slack signature (v0=, 64 hex digits)
CHANNEL_KEYS_MAX = 256 * 1024  # the Bot Connector's key set (outbound.botauth.DOC_MAX)
SENDER_MAX = 320  # an address's local part and domain at their RFC 5321 limits, and then some
AUTH_RESULTS_MAX, AUTH_RESULT_MAX = 16, 2048  # a mail's Authentication-Results (outbound/mail.py)
# A Maildir file's name as the MTA makes it: no '/', no NUL, not hidden, at most NAME_MAX.
MaildirName = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^./\x00][^/\x00]*$")]


class Args(BaseModel):
    """An operation's arguments: every field named and capped, nothing else taken."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# -- on behalf of a named token ----------------------------------------------------------------
class ListRequests(Args):
    workspace: Glob | None = None
    input_type: InputType | None = None
    owner: Text | None = None
    run_id: Id | None = None
    limit: Limit = 100
    cursor: Cursor | None = None
    sort: Sort = "newest"
    older_than: Duration | None = None
    due_within: Duration | None = None
    mine: bool = False


class GetRequest(Args):
    request_id: Id
    workspace: PathText | None = None


class Answer(Args):
    request_id: Id
    body: dict[str, Any]
    idempotency_key: Text | None = None
    workspace: PathText | None = None
    # Which surface of the inbox took it (recorded with the answer): the API and the page, or
    # the MCP endpoint (deltad/http/mcp_adapter.py; the core refuses a secret over it).
    channel: Literal["http", "mcp"] = "http"


class BulkItem(Args):
    """One question a bulk answer names."""

    request_id: Id
    workspace: PathText | None = None


class AnswerMany(Args):
    """One answer for up to BULK_MAX questions; the core matches and answers each on its own."""

    items: Annotated[list[BulkItem], Field(min_length=1, max_length=BULK_MAX)]
    body: dict[str, Any]
    idempotency_key: Text | None = None


class Delegate(Args):
    """Hand a question to a token, `group:NAME` or `oidc:NAME`, with a note."""

    request_id: Id
    to: Annotated[str, Field(min_length=1, max_length=80)]  # schemas.DelegateIn's bounds
    note: Annotated[str, Field(max_length=2000)] = ""
    workspace: PathText | None = None


class ListRuns(Args):
    workspace: Glob | None = None
    status: RunStatus | None = None
    owner: Text | None = None
    limit: Limit = 100
    cursor: Cursor | None = None


class GetRun(Args):
    run_id: Id
    workspace: PathText | None = None


class History(Args):
    limit: Annotated[int, Field(ge=1, le=HISTORY_MAX)] = HISTORY_DEFAULT


# -- no token: a signed link is the credential ---------------------------------------------------
class CheckLink(Args):
    """Whether a signed link stands, before its body is read (the core holds the link key)."""

    link: LinkToken


class LinkRequest(Args):
    link: LinkToken


class LinkAnswer(Args):
    link: LinkToken
    body: dict[str, Any]


# -- no token: the channels' own credentials, checked by the core -------------------------------
class ChannelInteraction(Args):
    """A request a channel's service sent to the inbox (Slack's interactions, Teams' activities),
    relayed: the raw body and the service's signature headers (Teams: its bearer JWT as the
    `signature`, and in `keys` the Bot Connector's key set the inbox fetched). The core
    verifies the signature itself and decides everything from there."""

    channel: Literal["slack", "teams"]
    body: Annotated[str, Field(max_length=CHANNEL_BODY_MAX)]
    timestamp: Annotated[str, Field(max_length=64)] = ""
    signature: Annotated[str, Field(max_length=CHANNEL_TOKEN_MAX)]
    keys: Annotated[str, Field(max_length=CHANNEL_KEYS_MAX)] = ""

    @model_validator(mode="after")
    def _slack_is_small(self) -> ChannelInteraction:
        # Slack's v0 signature is 67 characters and comes without keys: its cap stays tight.
        if self.channel == "slack" and (len(self.signature) > SLACK_SIGNATURE_MAX or self.keys):
            raise ValueError(f"signature: a Slack signature is at most {SLACK_SIGNATURE_MAX}")
        return self


class MailReply(Args):
    """One message of the email channel's Maildir as the inbox read it (deltad/outbound/
    maildir.py): only what the core needs, each capped. `token` is the reply address's (None:
    none of ours), `text` the plain part's own words (None: none); `problem` says why nothing
    could be read (not a regular file, over the size cap, not parsable as mail). The core trusts
    none of it: the token decides which question and which address may answer, and is checked
    with the core's key."""

    message: MaildirName
    token: Annotated[str, Field(max_length=64)] | None = None
    sender: Annotated[str, Field(max_length=SENDER_MAX)] = ""
    automatic: bool = False
    text: Text | None = None
    problem: Literal["unreadable", "unparsable"] | None = None
    message_id: Annotated[str, Field(max_length=998)] | None = None  # for a vote's receipt
    # Its Authentication-Results headers, topmost first (the core reads the trusted MTA's).
    authentication: Annotated[
        list[Annotated[str, Field(max_length=AUTH_RESULT_MAX)]], Field(max_length=AUTH_RESULTS_MAX)
    ] = []


# -- no credential -------------------------------------------------------------------------------
class Vitals(Args):
    """The core's health snapshot and metrics (deltad/health.py), for /livez, /readyz and
    /metrics in the inbox: plain figures, no workspace (/metrics checked its token itself)."""


# -- the table -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    name: str
    Input: type[Args]
    token: bool = True
    http: bool = True
    module: str = "deltad.inbox.handlers"  # where its handler is: the function of its name

    @property
    def handler(self) -> Callable[..., Any]:
        """The function answering it (its module is imported here: in the core only)."""
        answer: Callable[..., Any] = getattr(importlib.import_module(self.module), self.name)
        return answer


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op("list_requests", ListRequests),
        Op("get_request", GetRequest),
        Op("answer", Answer),
        Op("answer_many", AnswerMany),
        Op("delegate", Delegate),
        Op("list_runs", ListRuns),
        Op("get_run", GetRun),
        Op("history", History),
        Op("check_link", CheckLink, token=False),
        Op("link_request", LinkRequest, token=False),
        Op("link_answer", LinkAnswer, token=False),
        Op("channel_interaction", ChannelInteraction, token=False),
        Op("vitals", Vitals, token=False),
        # The email channel decides, with or without `http:`: its handler, beside the monitor,
        # is given the channel's `receive` instead of the HTTP context.
        Op("mail_reply", MailReply, token=False, http=False, module="deltad.privsep.monitor"),
    )
}


class Caller(Protocol):
    """Where the routes and MCP tools send an operation: the core over the socket in the
    inbox process (`deltad.http.child.Remote`), or the table served in this process
    (`deltad.privsep.monitor.Local`). `who` is the caller for a token operation (None
    otherwise). Returns the handler's document as JSON data; raises ApiError."""

    def call(self, op: str, who: Identity | None = None, /, **args: Any) -> dict[str, Any]: ...

    def call_json(self, op: str, who: Identity | None = None, /, **args: Any) -> bytes:
        """`call`'s document as JSON, passed on as the core made it (a route answering with
        it as it is: a list page is not parsed and validated again)."""
        ...


def person_of(who: Identity | None) -> dict[str, list[str]] | None:
    """What a call carries beside an OIDC person's name (wire.Person); None for a token."""
    if who is None or not who.name.startswith("oidc:"):
        return None
    return {"also": list(who.also), "groups": list(who.groups)}


def prepared(op: str, who: Identity | None, args: Mapping[str, Any]) -> tuple[str | None, Args]:
    """The token and the arguments a call of `op` sends, checked here as the core will check
    them: what a route took and the operation does not is a 422 before anything is sent."""
    spec = OPS[op]  # a name not in the table is the caller's bug, not a request's
    if spec.token != (who is not None):
        how = "on behalf of a token" if spec.token else "with no token"
        raise ValueError(f"{op} is asked {how}")
    try:
        checked = spec.Input.model_validate(args)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ApiError(422, "bad_request", f"{where}: {first['msg']}") from None
    return (who.name if who is not None else None), checked
