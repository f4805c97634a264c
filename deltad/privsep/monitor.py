"""The core's answer to the inbox's calls (OpenSSH's `monitor_read`): a `call` frame's operation
is looked up in the table (deltad/inbox/ops.py), refused if it is not there, its token rule
and arguments checked (the operation's `Input`), and its handler run as a request from the
network would be: the token read here, its role and scope, the question's respondents checked
by the handlers, every answer through the answering path (`inbox.submit`).

Frames come from deltad/privsep/core.py's `Monitor` (one inbox connection, its threads);
`Local` serves the same table in this process, for an app without an inbox process (tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

from deltad import tracing, wire
from deltad.inbox import oidc, ops
from deltad.inbox.context import Context
from deltad.inbox.ops import OPS, ApiError, Args, Op
from deltad.inbox.schemas import Spliced, document, document_json
from deltad.inbox.tokens import Identity, TokenError
from deltad.outbound.mail import Received
from deltad.protocol.printable import json_safe

log = structlog.get_logger("deltad.privsep")

# The email channel's decision on a message the inbox relayed (EmailChannel.receive).
MailTake = Callable[[Received], dict[str, Any]]
# What a handler gives back: a response model, a page already JSON, or a plain document.
Result = BaseModel | Spliced | dict[str, Any]


@dataclass(frozen=True)
class Request:
    """A call as the core took it: its operation from the table, the token it names (None:
    an operation without one) and its arguments, validated."""

    id: int
    op: Op
    token: str | None
    args: Args
    person: wire.Person | None = None  # beside an `oidc:` token name (deltad/inbox/oidc.py)
    traceparent: str | None = None  # the caller's, checked (deltad/tracing.py)


def decode_message(raw: bytes) -> Request | wire.Told | str:
    """A frame from the inbox as a call or its counts, or why it is refused."""
    try:
        msg = wire.FROM_INBOX.validate_json(raw)
    except ValidationError as e:
        return summary(e)
    if isinstance(msg, wire.Hello):
        return "hello again"
    if isinstance(msg, wire.Call):
        return checked(msg)
    return msg


def decode(raw: bytes) -> Request | str:
    """A frame from the inbox as a call, or why it is refused (no other outcome)."""
    msg = decode_message(raw)
    if isinstance(msg, wire.Deliveries):
        return f"{msg.op}: not a call"
    return msg


def checked(call: wire.Call) -> Request | str:
    """The call, if its operation is in the table and it fits the operation."""
    op = OPS.get(call.op)
    if op is None:
        return f"op: no such operation ({call.op!r})"
    if op.token and call.token is None:
        return f"token: {op.name} is asked on behalf of a token"
    if not op.token and call.token is not None:
        return f"token: {op.name} is asked with no token"
    try:
        args = op.Input.model_validate(call.args)
    except ValidationError as e:
        return summary(e, "args")
    return Request(call.id, op, call.token, args, call.person, tracing.checked(call.traceparent))


def identity(ctx: Context, token: str, person: wire.Person | None = None) -> Identity:
    """The named token as the core reads tokens.json (never as the inbox says it is); a person
    signed in through OIDC with the role and scopes of the core's own `http.oidc` (the inbox
    checked them against the provider's keys: it says who, never what they may do)."""
    if oidc.is_person(token):
        if ctx.config.oidc is None:
            raise ApiError(401, "unauthorized", "OIDC sign-in is not configured")
        p = person or wire.Person()
        return oidc.identity(oidc.Person(token, tuple(p.also), tuple(p.groups)), ctx.config.oidc)
    try:
        held = ctx.tokens.by_name(token)
    except TokenError as e:
        log.error("tokens_unreadable", error=str(e))
        held = None
    if held is None:
        raise ApiError(401, "unauthorized", "this token is not valid (revoked, or never issued)")
    return held[1]


def handle(ctx: Context | None, mail: MailTake | None, call: Request) -> Result:
    """The handler's result for one call (a response model, or a plain document), or the
    ApiError a request from the network would get."""
    if call.traceparent is None:  # in this process (Local): the request's own, if any
        return _handle(ctx, mail, call)
    carried = tracing.calling.set(call.traceparent)
    try:
        return _handle(ctx, mail, call)
    finally:
        tracing.calling.reset(carried)


def _handle(ctx: Context | None, mail: MailTake | None, call: Request) -> Result:
    op = call.op
    if not op.http:
        return op.handler(mail, None, call.args)  # type: ignore[no-any-return]
    if ctx is None:  # an inbox started for deliveries has no HTTP to serve
        raise ApiError(403, "forbidden", "this daemon serves no HTTP (no http: in its config)")
    who = identity(ctx, call.token, call.person) if call.token is not None else None
    return op.handler(ctx, who, call.args)  # type: ignore[no-any-return]


def serve(ctx: Context | None, mail: MailTake | None, call: Request) -> dict[str, Any]:
    """The handler's document for one call, as JSON data."""
    out = handle(ctx, mail, call)
    if isinstance(out, Spliced):
        return json.loads(out.json)  # type: ignore[no-any-return]
    return document(out) if isinstance(out, BaseModel) else out


def reply_to(ctx: Context | None, mail: MailTake | None, call: Request) -> bytes:
    """The reply frame to a call: its result, or the refusal a request from the network
    would get. Never raises: a handler's bug fails this call only."""
    try:
        out = handle(ctx, mail, call)
    except ApiError as e:
        return wire.encode(error_reply(call.id, e.http, e.code, str(e), e.workspaces))
    except Exception as e:
        log.error("inbox_call_failed", op=call.op.name, error=f"{type(e).__name__}: {e}")
        return wire.encode(error_reply(call.id, 500, "internal", "the core could not answer this"))
    try:
        if isinstance(out, Spliced):
            return wire.encode_result(call.id, out.json)
        if isinstance(out, BaseModel):
            return wire.encode_result(call.id, document_json(out))
        return wire.encode(wire.Reply(id=call.id, result=out))
    except ValueError as e:  # not JSON (a name in bytes a document kept raw)
        log.error("inbox_reply_failed", op=call.op.name, error=str(e))
        return wire.encode(error_reply(call.id, 500, "internal", "the answer is not JSON"))


def mail_reply(mail: MailTake | None, who: None, q: ops.MailReply) -> dict[str, Any]:
    """A message of the email channel's Maildir, as the inbox relayed it: the channel's
    verdict (the inbox moves the file to cur/ on any reply but a 503)."""
    if mail is None:
        raise ApiError(503, "not_ready", "the email channel is not taking mail (yet): keep it")
    got = Received(
        q.message,
        q.token,
        q.sender,
        q.automatic,
        q.text,
        q.problem,
        q.message_id,
        list(q.authentication),
    )
    return mail(got)


class Local:
    """The table served in this process (an app without an inbox process: tests): each call
    checked as the inbox's `Remote` checks it before sending, then answered as the core
    answers a frame, its token read again from the context's tokens."""

    def __init__(self, ctx: Context, mail: MailTake | None = None) -> None:
        self.ctx, self.mail = ctx, mail

    def call(self, op: str, who: Identity | None = None, /, **args: Any) -> dict[str, Any]:
        token, checked_args = ops.prepared(op, who, args)
        person = ops.person_of(who)
        carried = wire.Person.model_validate(person) if person is not None else None
        return serve(self.ctx, self.mail, Request(0, OPS[op], token, checked_args, person=carried))

    def call_json(self, op: str, who: Identity | None = None, /, **args: Any) -> bytes:
        return json.dumps(self.call(op, who, **args)).encode()


def error_reply(
    cid: int, http: int, code: str, message: str, workspaces: list[str] | None = None
) -> wire.Reply:
    problem = wire.Problem(http=http, code=code, message=json_safe(message), workspaces=workspaces)
    return wire.Reply(id=cid, error=problem)


def summary(e: ValidationError, within: str = "") -> str:
    """A refusal's reason in one line: where, and what."""
    first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid"}
    where = ".".join(str(p) for p in (within, *first.get("loc", ())) if p != "") or "(frame)"
    return f"{where}: {first.get('msg', 'invalid')}"
