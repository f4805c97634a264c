"""Who may reach the MCP endpoint, decided from the headers before the `mcp` SDK is loaded or
reads a byte (deltad/http/mcp_adapter.py holds the SDK; this module holds none of it): the
API's bearer tokens, roles and scopes, and (with `http.oidc`) the provider's JWTs, checked by
the API's own check (oidc.Provider.caller); a refusal is an RFC 9457 problem like the API's."""

from __future__ import annotations

import anyio.to_thread
from starlette.types import Scope, Send

from deltad.http import oidc, problems
from deltad.http.access import note_token
from deltad.inbox.tokens import Identity, TokenError, TokenStore

NO_TOKEN = "a bearer token is needed (Authorization: Bearer ...)"
BAD_TOKEN = "this token is not valid (revoked, or never issued)"


class Unauthorized(Exception):
    def __init__(self, http: int, code: str, message: str) -> None:
        super().__init__(message)
        self.http, self.code = http, code


def identify(
    tokens: TokenStore, authorization: str | None, provider: oidc.Provider | None = None
) -> Identity:
    """The bearer token's identity, as the API reads it (a JWT of the provider's, when OIDC is
    configured, is the person it names); Unauthorized otherwise. A JWT's check may fetch the
    provider's keys: on an event loop, call it in a thread (`admit` does)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(401, "unauthorized", NO_TOKEN)
    if provider is not None and oidc.looks_like_jwt(token.strip()):
        try:
            return provider.caller(token.strip())
        except oidc.Refused as e:
            raise Unauthorized(401, "unauthorized", f"this JWT is not accepted: {e}") from None
    try:
        who = tokens.verify(token.strip())
    except TokenError:
        who = None
    if who is None:
        raise Unauthorized(401, "unauthorized", BAD_TOKEN)
    if who.role == "metrics":
        raise Unauthorized(403, "forbidden", f"token {who.name} may only read /metrics")
    return who


async def admit(
    tokens: TokenStore, scope: Scope, send: Send, provider: oidc.Provider | None = None
) -> Identity | None:
    """The caller, or None once its refusal is sent (401, or 403 for a metrics-only token)."""
    authorization = next(
        (v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"authorization"), None
    )
    try:
        # In a thread: a JWT's keys may be fetched from the provider.
        who = await anyio.to_thread.run_sync(identify, tokens, authorization, provider)
    except Unauthorized as e:
        await problem(send, e.http, e.code, str(e))
        return None
    note_token(scope, who.name)  # the access log names the token
    return who


async def problem(send: Send, http: int, code: str, message: str) -> None:
    doc = problems.encoded(http, code, message)
    headers = [
        (b"content-type", problems.PROBLEM.encode()),
        (b"content-length", str(len(doc)).encode()),
    ]
    if http == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": http, "headers": headers})
    await send({"type": "http.response.body", "body": doc})
