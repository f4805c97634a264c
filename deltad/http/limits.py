"""Bounded work per request, before the app sees it: an ASGI middleware that checks the caller's
credential from the headers first, then the body's size against the route's cap, and only then
reads the body (counted, so a chunked body is cut off at the cap too, and within a deadline, so
a body sent a byte at a time is cut off with a 408). An unauthenticated 99 MB POST gets its 401
after the headers, and is never read.

`rule_for` is the decision (a pure function of method and path); `BodyLimit` is the shell."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deltad.http import problems

KIB = 1024
MIB = 1024 * KIB
# An answer's content is capped at 1 MiB by the answering path; the JSON around it (decisions,
# a comment, escapes) gets room on top.
ANSWER_BODY_MAX = MIB + 64 * KIB
SMALL_BODY_MAX = 64 * KIB
BULK_BODY_MAX = ANSWER_BODY_MAX + MIB  # one answer, and up to 100 ids with their workspaces
CHANNEL_BODY_MAX = 256 * KIB  # a channel's interaction (Slack's), signed: checked in the core
HEADERS_MAX = 16 * KIB  # all request headers together (h11's incomplete-event limit)

Credential = Literal["token", "link", "none"]


@dataclass(frozen=True)
class Rule:
    credential: Credential  # what must check out before a body byte is read
    max_body: int


@dataclass(frozen=True)
class Refusal:
    http: int
    code: str
    message: str


def rule_for(method: str, path: str, mcp_path: str | None = None) -> Rule:
    """Which credential a route takes from its headers (or path), and its body cap
    (`mcp_path`: where the MCP endpoint is mounted, if it is)."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["v1", "links"]:
        return Rule("link", ANSWER_BODY_MAX if parts[-1] == "answer" else SMALL_BODY_MAX)
    if method == "POST" and parts == ["v1", "session"]:
        return Rule("none", SMALL_BODY_MAX)  # the login: its body is the credential
    if mcp_path is not None and path.rstrip("/") == mcp_path:
        return Rule("token", ANSWER_BODY_MAX)  # MCP: one JSON-RPC message, an answer at most
    if method == "POST" and parts[:2] == ["v1", "channels"] and parts[3:] == ["interactions"]:
        return Rule("none", CHANNEL_BODY_MAX)  # a channel's service: its signature, in the core
    if method == "POST" and parts == ["v1", "channels", "teams", "messages"]:
        # Bot Framework's activities: their bearer is the Bot Connector's JWT, not a deltad
        # token (checked by the route and again in the core, deltad/outbound/botauth.py).
        return Rule("none", CHANNEL_BODY_MAX)
    if parts[0] != "v1":
        return Rule("none", SMALL_BODY_MAX)  # the page, static files, health, the schema
    answer = method == "POST" and parts[1:2] == ["requests"] and parts[3:] == ["answer"]
    if method == "POST" and parts == ["v1", "answers"]:
        return Rule("token", BULK_BODY_MAX)
    return Rule("token", ANSWER_BODY_MAX if answer else SMALL_BODY_MAX)


def link_token(path: str) -> str:
    """The token of `/v1/links/{token}[/answer]` ('' for none)."""
    parts = path.strip("/").split("/")
    return parts[2] if len(parts) > 2 else ""


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """Content-Length, or None when the body comes chunked (h11 has checked the syntax)."""
    for k, v in headers:
        if k.lower() == b"content-length":
            return int(v)
    return None


def has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    length = declared_length(headers)
    if length is not None:
        return length > 0
    return any(k.lower() == b"transfer-encoding" for k, _ in headers)


def too_large(max_body: int) -> Refusal:
    size = f"{max_body // MIB} MiB" if max_body >= MIB else f"{max_body // KIB} KiB"
    return Refusal(413, "too_large", f"the body is over this route's limit ({size})")


SLOW_BODY = Refusal(408, "slow_body", "the body did not arrive within this server's deadline")

Check = Callable[[Scope, Rule], Refusal | None]


class BodyLimit:
    """`check(scope, rule)` verifies the credential from the headers (a Refusal, or None);
    `headers` go on every refusal; the whole body must arrive within `timeout` seconds."""

    def __init__(
        self,
        app: ASGIApp,
        check: Check,
        headers: dict[str, str],
        timeout: float = math.inf,
        mcp_path: str | None = None,
    ) -> None:
        self.app, self.check, self.headers, self.timeout = app, check, headers, timeout
        self.mcp_path = mcp_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not has_body(scope["headers"]):
            await self.app(scope, receive, send)
            return
        rule = rule_for(scope["method"], scope["path"], self.mcp_path)
        refusal = self.check(scope, rule)
        length = declared_length(scope["headers"])
        if refusal is None and length is not None and length > rule.max_body:
            refusal = too_large(rule.max_body)
        if refusal is not None:
            await self._refuse(send, refusal)
            return
        try:
            with anyio.fail_after(self.timeout):
                body = await _read(receive, rule.max_body)
        except _ClientLeft:
            return
        except TimeoutError:
            await self._refuse(send, SLOW_BODY)
            return
        if body is None:
            await self._refuse(send, too_large(rule.max_body))
            return
        await self.app(scope, _replay(body, receive), send)

    async def _refuse(self, send: Send, r: Refusal) -> None:
        """The body stays unread: the connection closes after the answer."""
        doc = problems.encoded(r.http, r.code, r.message)
        headers = [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        headers += [
            (b"content-type", problems.PROBLEM.encode()),
            (b"content-length", str(len(doc)).encode()),
            (b"connection", b"close"),
        ]
        if r.http == 401:
            headers.append((b"www-authenticate", b"Bearer"))  # RFC 9110 §11.6.1
        await send({"type": "http.response.start", "status": r.http, "headers": headers})
        await send({"type": "http.response.body", "body": doc})


class _ClientLeft(Exception):
    pass


async def _read(receive: Receive, max_body: int) -> bytes | None:
    """The whole body, or None once it passes `max_body` (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientLeft
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # a disconnect, for whoever waits on one
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
