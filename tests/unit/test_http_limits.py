"""Bounded work per request, in-process: which credential and body cap each route has, the
middleware refusing before it reads (a counting `receive` shows what was read), and the API's
answers to over-long globs and bodies."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from deltad.http import limits
from deltad.http.app import create_app
from deltad.http.limits import ANSWER_BODY_MAX, SMALL_BODY_MAX, BodyLimit, Refusal, Rule
from deltad.inbox import scopes
from deltad.inbox.config import HttpConfig
from deltad.inbox.feed import Feed
from deltad.inbox.handlers import Context
from deltad.inbox.tokens import TokenStore


@pytest.mark.parametrize(
    ("method", "path", "rule"),
    [
        ("POST", "/v1/requests/q1/answer", Rule("token", ANSWER_BODY_MAX)),
        ("POST", "/v1/requests", Rule("token", SMALL_BODY_MAX)),
        ("GET", "/v1/events", Rule("token", SMALL_BODY_MAX)),
        ("DELETE", "/v1/session", Rule("token", SMALL_BODY_MAX)),
        ("POST", "/v1/session", Rule("none", SMALL_BODY_MAX)),  # the body is the credential
        ("POST", "/v1/links/abc/answer", Rule("link", ANSWER_BODY_MAX)),
        ("GET", "/v1/links/abc", Rule("link", SMALL_BODY_MAX)),
        ("POST", "/", Rule("none", SMALL_BODY_MAX)),
        ("POST", "/healthz", Rule("none", SMALL_BODY_MAX)),
        ("POST", "/static/x", Rule("none", SMALL_BODY_MAX)),
    ],
)
def test_rule_for_each_route(method: str, path: str, rule: Rule) -> None:
    assert limits.rule_for(method, path) == rule


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"content-length", b"0")], False),
        ([(b"content-length", b"12")], True),
        ([(b"transfer-encoding", b"chunked")], True),
        ([], False),
    ],
)
def test_has_body(headers: list[tuple[bytes, bytes]], expected: bool) -> None:
    assert limits.has_body(headers) is expected


# -- the middleware, driven by hand --------------------------------------------------------------
class Wire:
    """A request's body as `receive` hands it out, counting what was taken."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.taken = chunks, 0
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if self.taken >= len(self.chunks):
            return {"type": "http.disconnect"}
        self.taken += 1
        more = self.taken < len(self.chunks)
        return {"type": "http.request", "body": self.chunks[self.taken - 1], "more_body": more}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])


def _drive(
    wire: Wire, headers: list[tuple[bytes, bytes]], refusal: Refusal | None = None
) -> list[bytes]:
    got: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        got.append(message["body"])
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    scope = {"type": "http", "method": "POST", "path": "/v1/requests/q/answer", "headers": headers}
    middleware = BodyLimit(app, lambda s, r: refusal, {"X-Test": "1"})
    asyncio.run(middleware(scope, wire.receive, wire.send))
    return got


def test_a_refused_credential_is_answered_before_any_body_byte_is_read() -> None:
    wire = Wire([b"x" * 1000] * 100)
    refusal = Refusal(401, "unauthorized", "a bearer token is needed")
    assert _drive(wire, [(b"content-length", b"100000")], refusal) == []
    assert (wire.status, wire.taken) == (401, 0)
    assert (b"connection", b"close") in wire.sent[0]["headers"]


def test_a_declared_length_over_the_cap_is_413_unread() -> None:
    wire = Wire([b"x"])
    assert _drive(wire, [(b"content-length", str(ANSWER_BODY_MAX + 1).encode())]) == []
    assert (wire.status, wire.taken) == (413, 0)


def test_a_chunked_body_is_cut_off_at_the_cap() -> None:
    chunk = b"x" * (64 * 1024)
    wire = Wire([chunk] * 1000)  # 64 MiB on offer
    assert _drive(wire, [(b"transfer-encoding", b"chunked")]) == []
    assert wire.status == 413
    assert wire.taken * len(chunk) <= ANSWER_BODY_MAX + len(chunk)


def test_a_body_within_the_cap_reaches_the_app_whole() -> None:
    wire = Wire([b"ab", b"cd", b"e"])
    assert _drive(wire, [(b"transfer-encoding", b"chunked")]) == [b"abcde"]
    assert wire.status == 202


# -- the API's answers ---------------------------------------------------------------------------
@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, TokenStore]]:
    store = TokenStore(tmp_path / "state")
    ctx = Context(Feed(), store, HttpConfig(), os.urandom(32), base_url="http://127.0.0.1:1")
    with TestClient(create_app(ctx)) as http:
        yield http, store


def test_bodies_over_a_routes_cap_are_413_and_a_stranger_gets_401_first(
    api: tuple[TestClient, TokenStore],
) -> None:
    http, store = api
    auth = {"Authorization": f"Bearer {store.add('alice', [], 'answerer')}"}
    big = b'{"answer": "' + b"x" * ANSWER_BODY_MAX + b'"}'
    r = http.post("/v1/requests/q1/answer", content=big)
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    r = http.post("/v1/requests/q1/answer", content=big, headers=auth)
    assert r.status_code == 413 and r.headers["content-type"] == "application/problem+json"
    assert r.json() == {  # RFC 9457, with the API's code and its older `error` line
        "type": "about:blank",
        "title": HTTPStatus(413).phrase,
        "status": 413,
        "detail": "the body is over this route's limit (1 MiB)",
        "error": "the body is over this route's limit (1 MiB)",
        "code": "too_large",
    }
    r = http.post("/v1/session", content=b"x" * (SMALL_BODY_MAX + 1))
    assert r.status_code == 413 and "64 KiB" in r.json()["error"]
    r = http.post("/v1/links/forged/answer", content=big)
    assert r.status_code == 404  # a link that does not check out: the body stays unread
    r = http.post("/v1/requests/q1/answer", json={"answer": "x" * 1000}, headers=auth)
    assert r.status_code == 404 and r.json()["code"] == "unknown_request"  # within the cap


@pytest.mark.parametrize("route", ["/v1/requests", "/v1/runs", "/v1/events"])
def test_an_over_long_workspace_glob_is_refused_in_one_line(
    api: tuple[TestClient, TokenStore], route: str
) -> None:
    http, store = api
    auth = {"Authorization": f"Bearer {store.add('alice', [], 'reader')}"}
    for glob in ["/" + "a" * scopes.MAX_GLOB_CHARS, "/" + "**" * (scopes.MAX_GLOBSTARS + 1)]:
        r = http.get(route, params={"workspace": glob}, headers=auth)
        body: dict[str, Any] = r.json()
        assert r.status_code == 422 and body["code"] == "bad_glob", r.text
        assert body["error"].startswith("workspace: a workspace glob ")
