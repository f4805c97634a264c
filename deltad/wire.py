"""The protocol between the root core and the unprivileged inbox: length-prefixed JSON frames
over a Unix stream socket, typed both ways.

A frame is a 4-byte big-endian length and that many bytes of one UTF-8 JSON object. Every
message names itself in `op`. The inbox starts with `hello` (its protocol version); the core
answers `welcome` (the version, the HTTP settings, the inbox's base URL and the events still
buffered) with the inbox's file descriptors attached (SCM_RIGHTS: the listening socket, its
state directory, the TLS files), then pushes `event`s as the loop publishes them. The inbox
asks with a call: `op` names one operation of the table (deltad/inbox/ops.py), `token` the
named token it is asked for (operations that need one), `args` its arguments; it gets one
`reply` per call id.

Webhooks (version 2) are delivered by the inbox too: `welcome` names each target with its
signing key, the core writes each delivery into the target's `new/` directory in the inbox's
own outbox (deltad/outbound/handoff.py) and says `outbox` (a hint: the inbox also looks on its
own); the inbox tells the core each target's `deliveries` counts (for /metrics), never what a
receiver said. Without `http:` the inbox is started for deliveries only (`listening: false`:
no socket).

The channels' outbound sends (version 3) go the same way: mail (SMTP), Slack's Web API calls
and `notify.commands` are composed by the core and written into one outbox per channel target
(`welcome`'s `channels`, each with the credential it sends with); the inbox sends them and says
their `deliveries` counts as a webhook's (version 4: one message, `target` naming which).

Mail in (version 3 too): the inbox reads the email channel's Maildir (`welcome`'s `mail` names
it and the reply addresses' shape), parses each message and relays only what the core needs in
a `mail_reply` call (the reply-address token, the sender, the answer's text); the file is moved
to `cur/` once the core replied. The core checks the token, the sender and the answer itself.

Version 4: one `call` frame for every operation, its arguments in `args` (until 3, a frame
model per operation, its arguments beside `op`).

A `call` may carry `traceparent` (the W3C trace context of the HTTP request that asked it:
an answer's span links to it, docs/daemon.md "Traces"), sent only when there is one, so a
frame without it is byte for byte a version 5 frame.

The core reads the inbox's side as hostile: a frame over its cap ends the connection, anything
else that does not fit a model below or its operation's input model (an operation not in the
table, a field too many, a string too long) is refused, logged and answered with a 400
`protocol` reply where the frame names a call id (deltad/privsep/monitor.py).
"""

from __future__ import annotations

import json
import re
import socket
import struct
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
)

from deltad.inbox.ops import Name

# 3: the channels' outbound sends, mail_reply; 4: one `deliveries` message per target; 5: one
# `call` frame for every operation (op, token, args: inbox/ops.py's table)
VERSION = 5
HEADER = struct.Struct(">I")
# The inbox's own files in its directory (the core hands it the directory; it moves an older
# deltad's copies in from the state dir): its session key and its record of logouts.
SESSION_KEY_NAME = "session.key"
SESSIONS_CLOSED_NAME = "sessions-closed.json"
# What the inbox may send in one frame: an answer's body (the HTTP cap, 1 MiB + 64 KiB) and
# the names around it. The core's frames carry pages of documents: more room.
# A bulk answer's body is larger (api.limits.BULK_BODY_MAX: one answer and up to 100 ids).
INBOX_FRAME_MAX = 4 * 1024 * 1024
CORE_FRAME_MAX = 32 * 1024 * 1024
MAX_FDS = 8

CallId = Annotated[int, Field(ge=0, lt=2**53)]
OpName = Annotated[str, Field(min_length=1, max_length=64)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- the inbox asks --------------------------------------------------------------------------
class Hello(Strict):
    op: Literal["hello"]
    version: int


class Person(Strict):
    """A person signed in through OIDC (`token` is their `oidc:` name): the other names they
    answer to and their groups, as the inbox checked them against the provider's keys. The
    core gives them the role and scopes its own `http.oidc` says (deltad/inbox/oidc.py)."""

    also: list[Name] = Field(default_factory=list, max_length=4)
    groups: list[Name] = Field(default_factory=list, max_length=64)


class Call(Strict):
    """One operation the inbox asks of the core: its name in the table (deltad/inbox/ops.py),
    the token it is asked for (None: an operation without one) and its arguments, which the
    core validates as the operation's input model (deltad/privsep/monitor.py)."""

    op: OpName
    id: CallId
    token: Name | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    # The W3C traceparent of the HTTP request that asked it (deltad/tracing.py): an answer's
    # span links to it. Sent only when there is one, so a frame without it is as it was.
    traceparent: Annotated[str, Field(max_length=55)] | None = Field(
        default=None, exclude_if=lambda v: v is None
    )
    # With an `oidc:` token name only (deltad/inbox/oidc.py); sent only then, as traceparent.
    person: Person | None = Field(default=None, exclude_if=lambda v: v is None)


class Deliveries(Strict):
    """One target's deliveries from its outbox in the inbox since it started (attempts by
    result) and what waits there now: figures only, added to the core's
    deltad_deliveries_total (no reply). `target`: its name (webhook0, email, slack,
    command0, ...); one the core did not configure is ignored."""

    op: Literal["deliveries"]
    target: Name
    sent: Annotated[int, Field(ge=0, lt=2**53)]
    retry: Annotated[int, Field(ge=0, lt=2**53)]
    dead: Annotated[int, Field(ge=0, lt=2**53)]
    depth: Annotated[int, Field(ge=0, lt=2**53)]


Told = Deliveries  # what the inbox says without a reply
NOT_CALLS = frozenset({"hello", "deliveries"})  # every other `op` is a call


def _kind(frame: Any) -> str | None:
    if isinstance(frame, BaseModel):
        frame = {"op": getattr(frame, "op", None)}
    if not isinstance(frame, dict):
        return None  # not a frame at all
    op = frame.get("op")
    return op if op in NOT_CALLS else "call"


FromInbox = Annotated[
    Annotated[Hello, Tag("hello")]
    | Annotated[Deliveries, Tag("deliveries")]
    | Annotated[Call, Tag("call")],
    Discriminator(_kind),
]
FROM_INBOX: TypeAdapter[Hello | Told | Call] = TypeAdapter(FromInbox)


# -- the core tells --------------------------------------------------------------------------
class Problem(Strict):
    http: int
    code: str
    message: str
    workspaces: list[str] | None = None


class Reply(Strict):
    op: Literal["reply"] = "reply"
    id: int
    result: dict[str, Any] | None = None
    error: Problem | None = None


class EventMsg(Strict):
    op: Literal["event"] = "event"
    id: int
    type: str
    at: str
    data: dict[str, Any]


class WebhookTarget(Strict):
    """One webhook the inbox delivers to (api.config.Webhook's settings) and its signing key
    (base64; None: unsigned). `key` names its directories in the outbox (outbox.target_key)."""

    name: str
    key: str
    url: str
    signing_key: str | None = None
    timeout_seconds: float
    max_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float
    max_age_seconds: float
    outbox_max: int


# -- the channels' outbound sends (version 3): what the inbox is handed ------------------------
ChannelKind = Literal["smtp", "slack", "command", "pagerduty", "teams"]


class ChannelTarget(Strict):
    """One channel's outbox the inbox sends from (deltad/outbound/senders.py), with what the
    sending needs: `kind` says how (SMTP, Slack's Web API, a command), `settings` its
    non-secret settings (kind-specific, checked by the sender), `secret` the credential (the
    SMTP password, the Slack bot token; None: none). `key` names its directories in the
    outbox, as a webhook's (outbox.target_key of `name`)."""

    name: str  # "email", "slack", "command0", ...: the log's and the metrics' `channel`
    key: str
    kind: ChannelKind
    settings: dict[str, Any] = Field(default_factory=dict)
    secret: str | None = None
    max_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float
    max_age_seconds: float
    outbox_max: int


class OutboxHint(Strict):
    """Deliveries wait in `new/` of this target's outbox (its `key`)."""

    op: Literal["outbox"] = "outbox"
    target: str


class Welcome(Strict):
    """Sent with the inbox's descriptors, in this order: the listening socket (unless not
    `listening`), the state directory, then the TLS certificate and key if `tls`."""

    op: Literal["welcome"] = "welcome"
    version: int
    http: dict[str, Any]  # HttpConfig, as JSON
    base_url: str
    tls: bool
    events: list[EventMsg]
    floor: int = 0  # a Last-Event-ID below it has a gap the events cannot fill (a `reset`)
    listening: bool = True  # False: no HTTP, the inbox delivers webhooks only
    inbox_dir: str = ""  # the directory handed over, as the core names it (for log lines)
    webhooks: list[WebhookTarget] = Field(default_factory=list)
    channels: list[ChannelTarget] = Field(default_factory=list)  # version 3
    mail: MailIntake | None = None  # the email channel's Maildir, read by the inbox (version 3)
    # http.oidc's client secret, read by the core (the inbox cannot read its file); None: none.
    # Sent only when set: an inbox of the release before forbids keys it does not know.
    oidc_client_secret: str | None = Field(default=None, exclude_if=lambda v: v is None)


class MailIntake(Strict):
    """The email channel's Maildir, for the inbox to read (welcome's `mail`): its path, the
    reply addresses' shape (`<reply_local>+<token>@<reply_domain>`) and the channel's caps."""

    maildir: str
    reply_local: str
    reply_domain: str
    max_message_bytes: int
    max_per_pass: int
    poll_seconds: float


FromCore = Annotated[Reply | EventMsg | Welcome | OutboxHint, Field(discriminator="op")]
FROM_CORE: TypeAdapter[Reply | EventMsg | Welcome | OutboxHint] = TypeAdapter(FromCore)


# -- framing ---------------------------------------------------------------------------------
class WireError(Exception):
    """The other side broke the framing (or hung up): the connection is over."""


def encode(msg: BaseModel) -> bytes:
    body = msg.model_dump_json(exclude_none=False).encode()
    return HEADER.pack(len(body)) + body


def encode_result(cid: int, result: bytes) -> bytes:
    """A `reply` with its result already JSON (a response model serialized once, straight from
    the model: a page of documents is not made into Python objects first): the frame
    `encode(Reply(id=cid, result=...))` makes."""
    body = b'{"op":"reply","id":%d,"result":%s,"error":null}' % (cid, result)
    return HEADER.pack(len(body)) + body


_RESULT_HEAD = re.compile(rb'\{"op":"reply","id":(\d+),"result":')
_RESULT_TAIL = b',"error":null}'


def result_of(frame: bytes) -> tuple[int, bytes] | None:
    """A reply frame's call id and its result's JSON as the core wrote it (`encode_result`, or
    `encode` of a Reply with no error: the same shape), unparsed; None for any other frame.
    The inbox passes a page on as it came (the core made it from models) instead of parsing
    it into Python objects to serialize it again."""
    m = _RESULT_HEAD.match(frame)
    if m is None or not frame.endswith(_RESULT_TAIL):
        return None
    return int(m[1]), frame[m.end() : -len(_RESULT_TAIL)]


def call_id_of(raw: bytes) -> int | None:
    """The call id a refused frame names, if it names one (to answer it with a 400)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # nested past the parser's depth: any frame may be
        return None
    if isinstance(doc, dict):
        cid = doc.get("id")
        if isinstance(cid, int) and not isinstance(cid, bool) and 0 <= cid < 2**53:
            return cid
    return None


class Reader:
    """Frames from a stream socket, each at most `cap` bytes; descriptors passed along with a
    frame's first bytes are collected (the inbox's side only takes them with `welcome`)."""

    def __init__(self, sock: socket.socket, cap: int, fds: bool = False) -> None:
        self.sock, self.cap, self.fds = sock, cap, fds
        self.buf = bytearray()
        self.received: list[int] = []

    def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            if self.fds:
                data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, MAX_FDS)
                self.received += fds
            else:
                data = self.sock.recv(1 << 16)
            if not data:
                raise WireError("the other side closed the connection")
            self.buf += data

    def frame(self) -> bytes:
        self._fill(HEADER.size)
        (n,) = HEADER.unpack_from(self.buf)
        if n > self.cap:
            raise WireError(f"a frame of {n} bytes is over the cap ({self.cap})")
        self._fill(HEADER.size + n)
        body = bytes(self.buf[HEADER.size : HEADER.size + n])
        del self.buf[: HEADER.size + n]
        return body


def send(sock: socket.socket, msg: BaseModel, fds: list[int] | None = None) -> None:
    data = encode(msg)
    if fds:
        socket.send_fds(sock, [data[: HEADER.size]], fds)
        sock.sendall(data[HEADER.size :])
    else:
        sock.sendall(data)
