"""The routes: thin wrappers that ask the core's operations by name (deltad/inbox/ops.py; the
core answers them with deltad/inbox/handlers.py), plus identity (bearer tokens, or a web
session cookie with CSRF protection), the event stream and the static web page."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio.to_thread
from fastapi import Body, Depends, FastAPI, Header, Query, Request, Response, params
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deltad import __version__, health, tracing
from deltad.http import limits, mcp_gate, oidc, problems
from deltad.http.access import AccessLog, McpMetrics, RateLimit, note_token
from deltad.http.sessions import Sessions, matches
from deltad.inbox import oidc as people
from deltad.inbox import ops, paging, schemas
from deltad.inbox.context import Context, glob_names, visible
from deltad.inbox.feed import EVENT_TYPES, EventType, FeedEvent
from deltad.inbox.ops import ApiError, Caller, unauthorized
from deltad.inbox.schemas import errors
from deltad.inbox.tokens import Identity, TokenError, digest
from deltad.protocol.models import InputType
from deltad.protocol.printable import show
from deltad.protocol.states import RunStatus

if TYPE_CHECKING:
    from deltad.http.mcp_adapter import Endpoint

SESSION_COOKIE = "deltad_session"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
REVOCATION_CHECK_SECONDS = 0.5  # an open event stream re-checks its token this often
STATIC = Path(str(resources.files("deltad.http") / "static"))
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",  # a signed link must not leak through a Referer
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
}


# -- identity (module level: FastAPI resolves annotations from the module) ------------------
def authenticate(
    ctx: Context,
    sessions: Sessions,
    method: str,
    authorization: str | None,
    session_id: str | None,
    x_csrf_token: str | None,
    provider: oidc.Provider | None = None,
) -> Identity:
    """Who is calling, from the headers alone (so it runs before any body byte is read)."""
    if authorization:
        bearer = _bearer(authorization)
        if provider is not None and oidc.looks_like_jwt(bearer):
            return _person(provider, bearer)
        return ctx.tokens.verify(bearer) or _invalid_token()
    claims = sessions.get(session_id)
    if claims is None or session_id is None:
        raise unauthorized()
    if method not in SAFE_METHODS and not (
        x_csrf_token and secrets.compare_digest(x_csrf_token, sessions.csrf(session_id))
    ):
        raise ApiError(403, "csrf", "missing or wrong X-CSRF-Token for this session")
    if people.is_person(claims.name):
        # Signed in through the provider: no token to look up; OIDC switched off ends it.
        if ctx.config.oidc is None:
            raise unauthorized("OIDC sign-in is no longer configured; log in again")
        person = people.Person(claims.name, claims.also, claims.groups)
        return people.identity(person, ctx.config.oidc)
    # The token is looked up on every request: a revoked (or re-made) token ends it at once.
    held = ctx.tokens.by_name(claims.name)
    if held is None or not matches(claims, held[0]):
        raise unauthorized("this session's token was revoked; log in again")
    return held[1]


def _person(provider: oidc.Provider, token: str) -> Identity:
    """A bearer JWT the provider signed (for `audience`), as the person it names."""
    try:
        return provider.caller(token)
    except oidc.Refused as e:
        raise unauthorized(f"this JWT is not accepted: {e}") from None


def _bearer(authorization: str) -> str:
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized()
    return token.strip()


def _invalid_token() -> Identity:
    raise unauthorized("this token is not valid (revoked, or never issued)")


def identity(request: Request) -> Identity:
    # Read from the headers here, not declared as parameters: the document declares them
    # once, as security schemes (schemas.SECURITY_SCHEMES).
    who = authenticate(
        request.app.state.ctx,
        request.app.state.sessions,
        request.method,
        request.headers.get("authorization"),
        request.cookies.get(SESSION_COOKIE),
        request.headers.get("x-csrf-token"),
        request.app.state.oidc,
    )
    note_token(request.scope, who.name)
    if who.role == "metrics":
        raise ApiError(403, "forbidden", f"token {who.name} may only read /metrics")
    return who


def still_allowed(request: Request, who: Identity) -> Callable[[], bool]:
    """Whether the credential behind a long request still stands for `who`: a revoked token,
    a changed role or scope, or a closed session ends the event stream at once."""
    ctx: Context = request.app.state.ctx
    authorization = request.headers.get("authorization")
    session_id = None if authorization else request.cookies.get(SESSION_COOKIE)

    def still() -> bool:
        try:
            return (
                authenticate(
                    ctx,
                    request.app.state.sessions,
                    "GET",
                    authorization,
                    session_id,
                    None,
                    request.app.state.oidc,
                )
                == who
            )
        except (ApiError, TokenError):
            return False  # an unreadable token file counts as revoked

    return still


async def workspace_glob(workspace: str | None = None) -> str | None:
    # async: pure, so FastAPI runs it on the loop, not with a hop to a worker thread
    return ops.checked_glob(workspace)


Who = Annotated[Identity, Depends(identity)]
WorkspaceGlob = Annotated[str | None, Depends(workspace_glob)]


class EventStream(StreamingResponse):
    """An event stream; `release` runs once it ends, however it ends (a body never started
    included: starlette may cancel before the generator's first step)."""

    media_type = schemas.EVENT_STREAM

    def __init__(
        self,
        content: AsyncIterator[bytes],
        release: Callable[[], None] = lambda: None,
        status_code: int = 200,  # FastAPI reads the document's status from this signature
    ) -> None:
        super().__init__(content, status_code, headers={"X-Accel-Buffering": "no"})
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


class StreamCounts:
    """Open event streams per token, at most `cap` each (thread-safe: routes run in threads
    and on the loop)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def open(self, token: str) -> Callable[[], None]:
        """A place for one more stream of `token` (ApiError 429 if it holds `cap`), and the
        function that gives it back (once, however often it is called)."""
        with self._lock:
            if self._open.get(token, 0) >= self.cap:
                raise ApiError(
                    429,
                    "too_many_streams",
                    f"token {token} holds {self.cap} event streams already (the most one may);"
                    " close one, or give each client its own token",
                )
            self._open[token] = self._open.get(token, 0) + 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                self._open[token] -= 1
                if not self._open[token]:
                    del self._open[token]

        return release

    def count(self, token: str) -> int:
        with self._lock:
            return self._open.get(token, 0)


# Operations that write (a session needs its X-CSRF-Token) and those without a credential.
WRITES = {"logout", "answer_request", "answer_many", "delegate_request"}
PUBLIC = {
    "login",
    "oidc_login",
    "oidc_callback",
    "link_request",
    "link_answer",
    "healthz",
    "livez",
    "readyz",
    "metrics",
}
ANONYMOUS_TOO = frozenset({"whoami"})  # answers without a credential too (`{"signed_in": false}`)


def create_app(
    ctx: Context,
    stopping: threading.Event | None = None,
    sessions: Sessions | None = None,
    provider: oidc.Provider | None = None,
) -> FastAPI:
    stopping = stopping or threading.Event()
    # In-process (tests): a key derived from the link key and logouts kept in memory.
    sessions = sessions or Sessions(
        hashlib.sha256(b"deltad session\0" + ctx.link_key).digest(),
        ctx.config.session_ttl_seconds,
    )
    streams = StreamCounts(ctx.config.max_streams_per_token)
    app = FastAPI(
        title="deltad inbox",
        version=__version__,
        description="Every question a deltad-watched agent is waiting on: list, answer, follow.",
        docs_url=None,
        redoc_url=None,
    )
    app.router.route_class = JsonBodyRoute  # before any route is declared
    app.state.ctx, app.state.sessions = ctx, sessions
    if provider is None and ctx.config.oidc is not None:
        provider = oidc.Provider(ctx.config.oidc, None, ctx.base_url)
    app.state.oidc = provider
    # What reads or writes a workspace: the core's operations, over the socket in the inbox
    # process; without one (tests), the same table served here.
    core: Caller
    if ctx.core is not None:
        core = ctx.core
    else:
        from deltad.privsep.monitor import Local

        core = Local(ctx)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = schemas.finish(doc, WRITES, PUBLIC, ANONYMOUS_TOO)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    # -- errors and headers -----------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        doc = e.document()  # its line made JSON-safe (a workspace named in bytes)
        headers = refusal_headers(e.http)
        return problems.response(e.http, e.code, doc["error"], headers, workspaces=e.workspaces)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own 400 is a body it could not parse (JSON nested too deep, say).
        code = {400: "bad_json", 404: "not_found", 405: "method_not_allowed"}.get(
            e.status_code, "error"
        )
        headers = refusal_headers(e.status_code)
        if e.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(app, request.scope))
        return problems.response(e.status_code, code, str(e.detail), headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, e: RequestValidationError) -> JSONResponse:
        status, doc = validation_refusal(request.url.path, list(e.errors()))
        return problems.response(status, doc["code"], doc["error"], refusal_headers(status))

    def credential_first(scope: Scope, rule: limits.Rule) -> limits.Refusal | None:
        """The route's credential, checked from the headers before its body is read."""
        request = Request(scope)
        try:
            if rule.credential == "token":
                authenticate(
                    ctx,
                    sessions,
                    request.method,
                    request.headers.get("authorization"),
                    request.cookies.get(SESSION_COOKIE),
                    request.headers.get("x-csrf-token"),
                    provider,
                )
            elif rule.credential == "link":
                core.call("check_link", link=limits.link_token(request.url.path))
        except ApiError as e:
            return limits.Refusal(e.http, e.code, str(e))
        return None

    mcp_path = ctx.config.mcp.path if ctx.config.mcp.enabled else None
    app.add_middleware(
        limits.BodyLimit,
        check=credential_first,
        headers=SECURITY_HEADERS,
        timeout=ctx.config.body_timeout_seconds,
        mcp_path=mcp_path,
    )

    app.add_middleware(SecurityHeaders)
    app.add_middleware(HeadAsGet)
    # Outermost: it sees every answer, the refusals of the layers above included.
    app.add_middleware(
        AccessLog,
        routes=lambda: app.router.routes,
        metrics=ctx.http_metrics,
        failed_auth=RateLimit(),
    )

    # -- sessions (the web page) ---------------------------------------------------------------
    @app.post(
        "/v1/session",
        tags=["session"],
        operation_id="login",
        response_model=schemas.SessionOut,
        response_model_exclude_unset=True,
        responses=errors(400, 401, 413, 415, 422),
    )
    def login(request: Request, body: schemas.LoginIn, response: Response) -> dict[str, Any]:
        """Exchange a token for an HttpOnly, SameSite=Strict session cookie."""
        who = ctx.tokens.verify(body.token)
        if who is None:
            raise unauthorized("this token is not valid (revoked, or never issued)")
        note_token(request.scope, who.name)
        if who.role == "metrics":
            raise ApiError(403, "forbidden", f"token {who.name} may only read /metrics")
        cookie, csrf = sessions.open(who.name, digest(body.token))
        # No Path attribute: the cookie belongs to the directory the page was served from,
        # so the page works under a reverse proxy's path prefix.
        response.set_cookie(
            SESSION_COOKIE,
            cookie,
            max_age=int(ctx.config.session_ttl_seconds),
            httponly=True,
            samesite="strict",
            secure=ctx.config.tls,
            path=None,
        )
        return {
            "signed_in": True,
            "name": who.name,
            "role": who.role,
            "scopes": list(who.scopes),
            "csrf": csrf,
        }

    @app.get(
        "/v1/session",
        tags=["session"],
        operation_id="whoami",
        response_model=schemas.WhoAmI,
        response_model_exclude_unset=True,
        responses=errors(401, 403),
    )
    def whoami(request: Request) -> dict[str, Any]:
        """Who this credential is (with the session's CSRF token, if it is a session). With no
        credential at all (no `Authorization`, no session cookie): `{"signed_in": false}`, the
        page's question before it shows its login, which is no failed login (a credential that
        does not check out is still a 401)."""
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie and "authorization" not in request.headers:
            if ctx.config.oidc is not None:  # the page offers "Sign in with ..."
                return {"signed_in": False, "sign_in_with": ctx.config.oidc.provider_name}
            return {"signed_in": False}
        who = identity(request)
        return {
            "signed_in": True,
            "name": who.name,
            "role": who.role,
            "scopes": list(who.scopes),
            "csrf": sessions.csrf(cookie) if cookie and sessions.get(cookie) else None,
        }

    @app.delete(
        "/v1/session",
        tags=["session"],
        operation_id="logout",
        response_model=schemas.LoggedOut,
        response_model_exclude_unset=True,
        responses=errors(401, 403),
    )
    def logout(request: Request, response: Response, who: Who) -> dict[str, str]:
        """End the web session (its cookie is cleared)."""
        sessions.close(request.cookies.get(SESSION_COOKIE))
        response.set_cookie(
            SESSION_COOKIE, "", max_age=0, expires=0, path=None, httponly=True, samesite="strict"
        )
        return {"status": "logged out"}

    # -- sign-in through an OpenID provider (http.oidc) ------------------------------------------
    @app.get(
        "/v1/oidc/login",
        tags=["session"],
        operation_id="oidc_login",
        status_code=302,
        response_class=Response,
        responses={302: {"description": "To the provider's sign-in."}, **errors(404, 502)},
    )
    def oidc_login() -> Response:
        """Start signing in through the configured OpenID provider: a redirect to it (code
        flow with PKCE), `state`, `nonce` and the PKCE verifier kept in a short-lived signed
        cookie of this browser."""
        if provider is None:
            raise ApiError(404, "not_found", "OIDC sign-in is not configured")
        try:
            url, pending = provider.start()
        except oidc.Refused as e:
            raise ApiError(502, "provider_unavailable", str(e)) from None
        response = Response(status_code=302, headers={"Location": url})
        # Lax, not Strict: the provider's redirect back is a top-level navigation from its site.
        response.set_cookie(
            oidc.PENDING_COOKIE,
            oidc.seal_pending(sessions.key, pending),
            max_age=oidc.PENDING_SECONDS,
            httponly=True,
            samesite="lax",
            secure=ctx.config.tls,
            path=None,
        )
        return response

    @app.get(
        "/v1/oidc/callback",
        tags=["session"],
        operation_id="oidc_callback",
        status_code=303,
        response_class=Response,
        responses={303: {"description": "Signed in: to the page."}, **errors(401, 404)},
    )
    def oidc_callback(request: Request) -> Response:
        """Where the provider sends the browser back: the state, `iss` (RFC 9207) and the ID
        token (signature, iss, aud, exp, nonce) checked, then the same session cookie a
        token's login gives, for the person it names."""
        if provider is None or ctx.config.oidc is None:
            raise ApiError(404, "not_found", "OIDC sign-in is not configured")
        pending = oidc.unseal_pending(sessions.key, request.cookies.get(oidc.PENDING_COOKIE))
        params = {k: v for k, v in request.query_params.items() if len(v) <= 4096}
        try:
            claims = provider.finish(params, pending)
            person = people.person(claims, ctx.config.oidc.groups_claim)
            if isinstance(person, str):
                raise oidc.Refused(person)
        except oidc.Refused as e:
            oidc.refused(str(e))
            raise unauthorized(f"sign-in refused: {e}") from None
        note_token(request.scope, person.name)
        cookie, _ = sessions.open(person.name, "", also=person.also, groups=person.groups)
        oidc.signed_in(person.name, person.groups)
        # Back to the page (relative: it works under a reverse proxy's path prefix).
        response = Response(status_code=303, headers={"Location": "../../"})
        response.set_cookie(
            SESSION_COOKIE,
            cookie,
            max_age=int(ctx.config.session_ttl_seconds),
            httponly=True,
            samesite="strict",
            secure=ctx.config.tls,
            path=provider.cookie_path(),  # the page's calls go to v1/: the token login's path
        )
        # Its sign-in is over: the pending cookie (path: the login's directory) goes.
        response.delete_cookie(oidc.PENDING_COOKIE, path=provider.cookie_path() + "/oidc")
        return response

    # -- questions --------------------------------------------------------------------------------
    @app.get(
        "/v1/requests",
        tags=["requests"],
        operation_id="list_requests",
        response_model=schemas.QuestionPage,
        response_model_exclude_unset=True,
        responses=errors(401, 422),
    )
    def list_requests(
        who: Who,
        workspace: WorkspaceGlob,
        input_type: InputType | None = None,
        owner: str | None = None,
        run_id: str | None = None,
        limit: int = paging.DEFAULT_LIMIT,
        cursor: str | None = None,
        sort: Annotated[paging.Sort, Query(description=paging.SORT_DOC)] = "newest",
        older_than: Annotated[
            str | None, Query(description=paging.OLDER_DOC, examples=["1h"])
        ] = None,
        due_within: Annotated[
            str | None, Query(description=paging.DUE_DOC, examples=["10m"])
        ] = None,
        mine: Annotated[bool, Query(description=paging.MINE_DOC)] = False,
    ) -> Response:
        """The pending questions this token may see, newest first (or `sort`), a page at a
        time: `{"requests": [...], "next": cursor or null}`."""
        # The page as the core made it (the response model documents it): a page of 100 is
        # not parsed, validated and serialized again here.
        page = core.call_json(
            "list_requests",
            who,
            workspace=workspace,
            input_type=input_type,
            owner=owner,
            run_id=run_id,
            limit=limit,
            cursor=cursor,
            sort=sort,
            older_than=older_than,
            due_within=due_within,
            mine=mine,
        )
        return Response(page, media_type="application/json")

    @app.get(
        "/v1/requests/{request_id}",
        tags=["requests"],
        operation_id="get_request",
        response_model=schemas.Question,
        response_model_exclude_unset=True,
        responses=errors(401, 403, 404, 409, 410, 422),
    )
    def get_request(request_id: str, who: Who, workspace: str | None = None) -> dict[str, Any]:
        """One question; `workspace` (exact path) picks it where its id is in several."""
        return core.call("get_request", who, request_id=request_id, workspace=workspace)

    @app.post(
        "/v1/requests/{request_id}/answer",
        status_code=202,
        tags=["requests"],
        operation_id="answer_request",
        response_model=schemas.AnswerReceipt,
        response_model_exclude_unset=True,
        responses=errors(400, 401, 403, 404, 409, 410, 413, 415, 422),
    )
    def answer(
        request_id: str,
        who: Who,
        body: Annotated[schemas.AnswerBody, Body(openapi_examples=schemas.answer_examples())],
        idempotency_key: Annotated[str | None, Header()] = None,
        workspace: str | None = None,
    ) -> dict[str, Any]:
        """What `response.json` holds minus `request_id`: `{"answer": ...}` or
        `{"decisions": [...]}`, optional `comment`. 202 once it is in the mailbox. On a
        question needing several approvals (four eyes) it is a vote: 202 with `answered` and
        `approvals`; the same token twice is 409 `already_voted`, the workspace owner's own
        approval where refused 403 `owner_may_not_approve`."""
        sent = body.model_dump(mode="json", exclude_unset=True)
        return core.call(
            "answer",
            who,
            request_id=request_id,
            body=sent,
            idempotency_key=idempotency_key,
            workspace=workspace,
        )

    @app.post(
        "/v1/answers",
        tags=["requests"],
        operation_id="answer_many",
        response_model=schemas.AnswersOut,
        response_model_exclude_unset=True,
        responses=errors(400, 401, 403, 413, 415, 422),
    )
    def answer_many(
        who: Who,
        body: schemas.AnswersIn,
        idempotency_key: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any]:
        """One answer for up to 100 questions of the same kind and options. Each is answered
        on its own, as `answer_request` would (respondents, checks, Idempotency-Key per
        question); each result says `accepted`, or `refused` with the code and why."""
        sent = body.answer.model_dump(mode="json", exclude_unset=True)
        items = [i.model_dump() for i in body.items]
        return core.call(
            "answer_many", who, items=items, body=sent, idempotency_key=idempotency_key
        )

    @app.post(
        "/v1/requests/{request_id}/delegate",
        tags=["requests"],
        operation_id="delegate_request",
        response_model=schemas.DelegateOut,
        response_model_exclude_unset=True,
        responses=errors(400, 401, 403, 404, 409, 410, 413, 415, 422),
    )
    def delegate(
        request_id: str, who: Who, body: schemas.DelegateIn, workspace: str | None = None
    ) -> dict[str, Any]:
        """Hand a question to another token, `group:NAME` or person (`oidc:NAME`, with
        `http.oidc`), with a note: recorded beside the question and shown with it; the delegate
        may answer too. Only someone who may answer may hand it over."""
        return core.call(
            "delegate",
            who,
            request_id=request_id,
            to=body.to,
            note=body.note,
            workspace=workspace,
        )

    # -- runs -------------------------------------------------------------------------------------
    @app.get(
        "/v1/runs",
        tags=["runs"],
        operation_id="list_runs",
        response_model=schemas.RunPage,
        response_model_exclude_unset=True,
        responses=errors(401, 422),
    )
    def list_runs(
        who: Who,
        workspace: WorkspaceGlob,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = paging.DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Each workspace's latest run, newest first: `{"runs": [...], "next": ...}`."""
        return core.call(
            "list_runs",
            who,
            workspace=workspace,
            status=status,
            owner=owner,
            limit=limit,
            cursor=cursor,
        )

    @app.get(
        "/v1/runs/{run_id}",
        tags=["runs"],
        operation_id="get_run",
        response_model=schemas.RunDetail,
        response_model_exclude_unset=True,
        responses=errors(401, 403, 404, 409, 422),
    )
    def get_run(run_id: str, who: Who, workspace: str | None = None) -> dict[str, Any]:
        """One run, with the model's last message and the journal's last events."""
        return core.call("get_run", who, run_id=run_id, workspace=workspace)

    @app.get(
        "/v1/history",
        tags=["runs"],
        operation_id="get_history",
        response_model=schemas.History,
        response_model_exclude_unset=True,
        responses=errors(401, 422),
    )
    def get_history(
        who: Who,
        limit: Annotated[int, Query(ge=1, le=ops.HISTORY_MAX)] = ops.HISTORY_DEFAULT,
    ) -> dict[str, Any]:
        """Answers given and runs ended, newest first, from the journals of the latest run of
        each workspace this token may see (a sensitive answer's value is left out)."""
        return core.call("history", who, limit=limit)

    # -- the event stream -------------------------------------------------------------------------
    @app.get(
        "/v1/events",
        tags=["events"],
        operation_id="events",
        response_class=EventStream,
        responses={
            200: {
                "description": "An endless Server-Sent Events stream.",
                "content": {schemas.EVENT_STREAM: {"schema": {"type": "string"}}},
            },
            **errors(401, 422, 429),
        },
    )
    async def events(
        request: Request,
        who: Who,
        workspace: WorkspaceGlob,
        input_type: InputType | None = None,
        type: Annotated[list[EventType] | None, Query()] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> StreamingResponse:
        """Server-Sent Events; `Last-Event-ID` replays what the event log still keeps (across
        restarts), and a `reset` event first says when it no longer keeps all of it (list
        again). Filters as for the list (`input_type` applies to request events; run.status
        always passes). A token holds at most `max_streams_per_token` streams (429), and a
        stream ends after `stream_lifetime_seconds` (reconnect with `Last-Event-ID`)."""
        wanted: set[str] = set(type or EVENT_TYPES)

        def shown(e: FeedEvent) -> bool:
            return (
                e.type in wanted
                and visible(who, Path(e.workspace))
                and (not workspace or glob_names(workspace, Path(e.workspace)))
                and (not input_type or e.data.get("input_type") in (input_type, None))
            )

        since = int(last_event_id) if last_event_id and last_event_id.isdigit() else None
        release = streams.open(who.name)
        stream = _stream(ctx, request, shown, since, stopping, still_allowed(request, who))
        return EventStream(stream, release)

    # -- signed links -----------------------------------------------------------------------------
    @app.get(
        "/v1/links/{token}",
        tags=["links"],
        operation_id="link_request",
        response_model=schemas.Question,
        response_model_exclude_unset=True,
        responses=errors(404, 409, 410, 422),
    )
    def link_request(token: str) -> dict[str, Any]:
        """The question behind a signed link (the link is the credential)."""
        return core.call("link_request", link=token)

    @app.post(
        "/v1/links/{token}/answer",
        status_code=202,
        tags=["links"],
        operation_id="link_answer",
        response_model=schemas.AnswerReceipt,
        response_model_exclude_unset=True,
        responses=errors(400, 403, 404, 409, 410, 413, 415, 422),
    )
    def link_answer(
        token: str,
        body: Annotated[schemas.AnswerBody, Body(openapi_examples=schemas.answer_examples())],
    ) -> dict[str, Any]:
        """Answer the question behind a signed link; single use."""
        sent = body.model_dump(mode="json", exclude_unset=True)
        return core.call("link_answer", link=token, body=sent)

    # -- the page ---------------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/a/{token}", include_in_schema=False)
    def link_page(token: str) -> FileResponse:
        return FileResponse(STATIC / "link.html")

    @app.get(
        "/healthz",
        tags=["health"],
        operation_id="healthz",
        response_model=schemas.Health,
        response_model_exclude_unset=True,
        responses={503: {"model": schemas.Health, "description": "Not ready yet."}},
    )
    def healthz(request: Request) -> JSONResponse:
        """Kept for existing health checks: the same as /readyz."""
        return _health(health.ready_checks(ctx.vitals.health()), request)

    @app.get(
        "/livez",
        tags=["health"],
        operation_id="livez",
        response_model=schemas.Health,
        response_model_exclude_unset=True,
        responses={503: {"model": schemas.Health, "description": "The loop is stuck."}},
    )
    def livez(request: Request) -> JSONResponse:
        """200 while the daemon's loop turns (it turned within the last few seconds), else
        503; `?verbose` lists the checks. Decided by the status code."""
        now = time.monotonic()
        return _health(health.live_checks(ctx.vitals.health(), now), request)

    @app.get(
        "/readyz",
        tags=["health"],
        operation_id="readyz",
        response_model=schemas.Health,
        response_model_exclude_unset=True,
        responses={503: {"model": schemas.Health, "description": "Not ready yet."}},
    )
    def readyz(request: Request) -> JSONResponse:
        """200 once the startup reconcile is done and every workspace found is in the index
        (and, under `ha:`, the lease is held), else 503; `?verbose` lists the checks."""
        return _health(health.ready_checks(ctx.vitals.health()), request)

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """Prometheus' text format; a bearer token with the role `metrics` (or `admin`)."""
        authorization = request.headers.get("authorization")
        if not authorization:
            raise unauthorized()
        who = ctx.tokens.verify(_bearer(authorization)) or _invalid_token()
        note_token(request.scope, who.name)
        if who.role not in ("metrics", "admin"):
            raise ApiError(403, "forbidden", f"token {who.name} may not read /metrics")
        body = ctx.vitals.core_metrics() + ctx.http_metrics.exposition()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    if mcp_path is not None:
        mount_mcp(app, ctx, core, mcp_path, sessions.key, provider)
    return app


def mount_mcp(
    app: FastAPI,
    ctx: Context,
    core: Caller,
    path: str,
    session_key: bytes,
    provider: oidc.Provider | None = None,
) -> None:
    """The inbox as an MCP server at `path`; every method goes to it (the SDK answers each).
    `session_key` is what the MCP task ids' key is derived from (stable across restarts);
    `provider`: the OIDC provider whose JWTs it takes too (None: deltad tokens only)."""
    try:
        metrics = McpMetrics(ctx.http_metrics.registry)
    except ValueError:  # a second app on one context (tests): its figures stay its own
        metrics = McpMetrics(CollectorRegistry(auto_describe=False))
    mount = LazyMcp(ctx, core, metrics, session_key, provider)
    metrics.listeners.set_function(mount.listeners)
    app.router.routes.append(Route(path, endpoint=mount))
    ctx.feed.subscribe(mount.changed)  # a question asked or gone: listeners are told
    app.state.mcp = mount


class LazyMcp:
    """deltad/http/mcp_adapter.py, imported (in a worker thread) and built on the first request
    to the MCP path: the SDK costs the inbox process 1-2 s of start and some 25 MB, which an
    inbox nobody reaches over MCP never pays."""

    def __init__(
        self,
        ctx: Context,
        core: Caller,
        metrics: McpMetrics,
        session_key: bytes,
        provider: oidc.Provider | None = None,
    ) -> None:
        self.ctx, self.core, self.metrics = ctx, core, metrics
        self.session_key, self.provider = session_key, provider
        self.endpoint: Endpoint | None = None  # built on the first request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        admitted = scope["type"] == "http" and (
            await mcp_gate.admit(self.ctx.tokens, scope, send, self.provider) is not None
        )
        if not admitted:
            return  # refused from the headers: the SDK is not loaded for a stranger
        if self.endpoint is None:
            module = await anyio.to_thread.run_sync(
                importlib.import_module, "deltad.http.mcp_adapter"
            )
            if self.endpoint is None:  # no await since the check: one endpoint, ever
                self.endpoint = module.endpoint(
                    self.core,
                    self.ctx.tokens,
                    self.ctx.config.mcp,
                    self.metrics,
                    self.session_key,
                    self.provider,
                )
        assert self.endpoint is not None
        await self.endpoint(scope, receive, send)

    def listeners(self) -> float:
        return float(len(self.endpoint.hub)) if self.endpoint is not None else 0.0

    def changed(self, e: FeedEvent) -> None:
        """On the feed's thread (the loop's, or the inbox's reader)."""
        if (endpoint := self.endpoint) is not None:
            endpoint.changed(e)


def _health(checks: list[health.Check], request: Request) -> JSONResponse:
    """`?verbose` (read here, not declared: a health check has no bad request) adds each
    check; the status code is the answer."""
    doc = health.document(checks)
    if "verbose" not in request.query_params:
        doc = {"status": doc["status"]}
    return JSONResponse(doc, 200 if health.passing(checks) else 503)


# -- HTTP semantics (RFC 9110) ---------------------------------------------------------------------
def refusal_headers(status: int) -> dict[str, str]:
    """A 401 says which scheme would do (RFC 9110 §11.6.1)."""
    headers = dict(SECURITY_HEADERS)
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 429:  # a stream too many: the connection goes too (it holds a gate's place)
        headers |= {"Retry-After": "10", "Connection": "close"}
    return headers


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route takes at this path (for `Allow` on a 405), HEAD with GET."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(scope)
        methods |= set(getattr(route, "methods", None) or ()) if match != Match.NONE else set()
    if not methods or "GET" in methods:
        methods |= {"GET", "HEAD"}  # a mount (the static files) takes GET and HEAD
    return sorted(methods)


def validation_refusal(path: str, problems: list[Any]) -> tuple[int, dict[str, str]]:
    """The status and body for a request that does not fit its declaration: malformed JSON
    is 400 `bad_json`; an answer that does not fit is 422 `misfit`, as `inbox.submit` says it;
    anything else 422 `bad_request`."""
    first = problems[0] if problems else {"loc": (), "msg": "bad request", "type": ""}
    loc = [str(p) for p in first.get("loc", ())]
    if first.get("type") == "json_invalid":
        return 400, {"error": "the body is not valid JSON", "code": "bad_json"}
    if loc[:1] == ["body"] and path.endswith("/answer"):
        where = ".".join(loc[1:]) or "(top level)"
        return 422, {"error": f"{where}: {first['msg']}", "code": "misfit"}
    return 422, {"error": f"{'.'.join(loc)}: {first['msg']}", "code": "bad_request"}


FORM = "application/x-www-form-urlencoded"


class JsonBodyRoute(APIRoute):
    """A route whose body is JSON takes it without `Content-Type: application/json` too, from a
    client with a bearer token: none at all, or `application/x-www-form-urlencoded` (what
    `curl -d` sends), when the body parses as JSON. Anything else not declared JSON is a 415
    naming the header, not FastAPI's 422 "Input should be a valid dictionary". Only with an
    Authorization header (which a browser sends cross-site only after a CORS preflight): a
    form posted from another site, or a no-cors fetch, still cannot pass for JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None or isinstance(self.body_field.field_info, params.Form):
            return handler

        async def route(request: Request) -> Response:
            if (refusal := await _as_json(request)) is not None:
                return refusal
            return await handler(request)

        return route


async def _as_json(request: Request) -> Response | None:
    """None when the body may be read as JSON (its Content-Type made so where it was only
    missing or a form's), else the 415."""
    given = Headers(scope=request.scope).get("content-type")
    kind = given.split(";", 1)[0].strip().lower() if given else ""
    main, _, sub = kind.partition("/")
    if main == "application" and (sub == "json" or sub.endswith("+json")):
        return None
    body = await request.body()  # kept: the route's handler reads the same request
    if not body:
        return None  # no body at all: the route says what it lacks
    if kind in ("", FORM) and "authorization" in Headers(scope=request.scope):
        try:
            json.loads(body)
        except ValueError:
            pass
        else:
            raw = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
            request.scope["headers"] = [*raw, (b"content-type", b"application/json")]
            request.__dict__.pop("_headers", None)  # Starlette's copy, if it made one
            return None
    got = f"Content-Type: {given[:80]}" if given else "no Content-Type"
    detail = f"the body must be JSON, sent with Content-Type: application/json (got {got})"
    return problems.response(415, "unsupported_media_type", show(detail))


class SecurityHeaders:
    """SECURITY_HEADERS on every answer that has not set its own; and a W3C `traceparent` sent
    with the request goes with its calls to the core, where an answer's span links to it
    (deltad/tracing.py); anything else is no context. Plain ASGI: the answer passes through
    untouched but for its first message's headers (no task, stream or copy per request)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = Headers(scope=scope).get("traceparent")
        carried = tracing.calling.set(tracing.checked(sent))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                have = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in _SECURITY_RAW if k not in have]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        finally:
            tracing.calling.reset(carried)


_SECURITY_RAW = [
    (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in SECURITY_HEADERS.items()
]


class HeadAsGet:
    """HEAD on every GET route (RFC 9110 §9.3.2): served as the GET, headers only. The body is
    never sent, and an endless one (the event stream) is stopped at its first chunk."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        done = False

        async def headers_only(message: Message) -> None:
            nonlocal done
            if done:
                raise _HeadDone
            if message["type"] == "http.response.body":
                done = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                raise _HeadDone
            await send(message)

        try:
            await self.app({**scope, "method": "GET"}, receive, headers_only)
        except _HeadDone:
            pass
        except BaseExceptionGroup as group:
            rest = group.subgroup(lambda e: not isinstance(e, _HeadDone))
            if rest is not None:
                raise rest from None


class _HeadDone(Exception):
    pass


def _sse(e: FeedEvent) -> bytes:
    return f"id: {e.id}\nevent: {e.type}\ndata: {json.dumps(e.document())}\n\n".encode()


RESET_DETAIL = (
    "events after Last-Event-ID are no longer kept (older than the event log, or from before "
    "a restart without it): list the requests and runs again, then carry on from this id"
)


def _reset(now: int, since: int) -> bytes:
    """The `reset` event (docs/inbox.md): a gap `Last-Event-ID` cannot fill. Its id is the
    newest event's, so a client that re-lists and reconnects from it misses nothing."""
    doc = {"id": now, "type": "reset", "last_event_id": since, "detail": RESET_DETAIL}
    return f"id: {now}\nevent: reset\ndata: {json.dumps(doc)}\n\n".encode()


async def _stream(
    ctx: Context,
    request: Request,
    shown: Callable[[FeedEvent], bool],
    since: int | None,
    stopping: threading.Event,
    allowed: Callable[[], bool],
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[FeedEvent] = asyncio.Queue(maxsize=10_000)

    def deliver(e: FeedEvent) -> None:  # on the daemon's loop thread: queue and return
        loop.call_soon_threadsafe(_offer, queue, e)

    unsubscribe = ctx.feed.subscribe(deliver)
    try:
        yield b": deltad event stream\nretry: 2000\n\n"
        if ctx.feed.gap(since):  # events after Last-Event-ID are gone: say so, never skip
            assert since is not None
            now = ctx.feed.last_id()
            yield _reset(now, since)
            since = now
        for e in ctx.feed.since(since):
            if shown(e):
                yield _sse(e)
        keepalive_at = loop.time() + ctx.config.keepalive_seconds
        ends_at = loop.time() + ctx.config.stream_lifetime_seconds
        while True:
            if loop.time() >= ends_at:
                # An endless stream would hold its place at the gate for ever: the client
                # reconnects (EventSource does by itself) with Last-Event-ID, losing nothing.
                yield b": this stream reached its lifetime; reconnect with Last-Event-ID\n\n"
                return
            if stopping.is_set():
                # Returning ends the response with its terminating chunk; the page reconnects
                # (and logs in again if it must) once the daemon is back.
                yield b": the daemon is stopping\n\n"
                return
            if not allowed():
                yield b": this credential was revoked, changed or logged out\n\n"
                return
            wait = min(REVOCATION_CHECK_SECONDS, keepalive_at - loop.time(), ends_at - loop.time())
            try:
                e = await asyncio.wait_for(queue.get(), max(wait, 0.0))
            except TimeoutError:
                if loop.time() >= keepalive_at:
                    if await request.is_disconnected():
                        return
                    yield b": keepalive\n\n"
                    keepalive_at = loop.time() + ctx.config.keepalive_seconds
                continue
            if since is not None and e.id <= since:
                continue  # already sent from the buffer
            if shown(e) and allowed():  # nothing goes out after a revoke
                yield _sse(e)
    finally:
        unsubscribe()


def _offer(queue: asyncio.Queue[FeedEvent], e: FeedEvent) -> None:
    # A stuck client loses live events; Last-Event-ID replays them on reconnect.
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(e)
