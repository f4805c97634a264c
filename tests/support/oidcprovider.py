"""A real OpenID provider on 127.0.0.1 for tests: oidc-provider-mock (Authlib's authorization
server in Flask: discovery, JWKS, the code flow, RS256 ID tokens) with its users and their
claims, served by werkzeug on a thread. `sign` makes a JWT with the provider's own key (an
expired or wrong-audience token the provider itself would never issue); `rewrite` changes the
next ID tokens its token endpoint sends (a tampered one)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import flask
import httpx
import werkzeug.serving
from joserfc import jwt
from joserfc.jwk import RSAKey
from oidc_provider_mock import User, app

CLIENT_ID = "deltad-inbox"


@dataclass
class Provider:
    issuer: str
    key: RSAKey  # the provider's signing key (private)
    rewrite: list[Callable[[str], str]] = field(default_factory=list)  # the next ID tokens

    def sign(self, **claims: Any) -> str:
        """A JWT signed with the provider's key: iss, aud, sub, iat, exp as it issues them,
        `claims` over them."""
        now = int(time.time())
        base = {"iss": self.issuer, "aud": CLIENT_ID, "iat": now, "exp": now + 600}
        header = {"alg": "RS256", **({"kid": self.key.kid} if self.key.kid else {})}
        return jwt.encode(header, {**base, **claims}, self.key)

    def id_token(self, sub: str, redirect: str = "http://127.0.0.1/cb") -> str:
        """An ID token for `sub` the provider issues by its own code flow (as any client of it
        would get one): what an API caller sends as its bearer JWT."""
        with httpx.Client(base_url=self.issuer, timeout=30) as c:
            r = c.post(
                "/oauth2/authorize",
                params={
                    "response_type": "code",
                    "client_id": CLIENT_ID,
                    "redirect_uri": redirect,
                    "scope": "openid email",
                    "nonce": "n",
                },
                data={"sub": sub},
            )
            assert r.status_code == 302, r.text
            code = parse_qs(urlsplit(r.headers["location"]).query)["code"][0]
            t = c.post(
                "/oauth2/token",
                data={"grant_type": "authorization_code", "code": code, "redirect_uri": redirect},
                auth=(CLIENT_ID, "any"),
            )
            assert t.status_code == 200, t.text
            return str(t.json()["id_token"])


class _Rewriting:
    """WSGI: the token endpoint's answer with its ID token passed through `rewrite[0]` (each
    function used once), everything else as the provider sends it."""

    def __init__(self, inner: Any, provider: Provider) -> None:
        self.inner, self.provider = inner, provider

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != "/oauth2/token" or not self.provider.rewrite:
            return self.inner(environ, start_response)
        held: dict[str, Any] = {}

        def keep(status: str, headers: list[tuple[str, str]], exc: Any = None) -> Any:
            held["status"], held["headers"] = status, headers
            return lambda _: None

        body = b"".join(self.inner(environ, keep))
        if held["status"].startswith("200"):
            doc = json.loads(body)
            doc["id_token"] = self.provider.rewrite.pop(0)(doc["id_token"])
            body = json.dumps(doc).encode()
        headers = [(k, v) for k, v in held["headers"] if k.lower() != "content-length"]
        start_response(held["status"], [*headers, ("Content-Length", str(len(body)))])
        return [body]


@contextmanager
def running(users: list[User]) -> Iterator[Provider]:
    flask_app = app(user_claims=users, require_nonce=True)
    with flask_app.test_request_context():
        flask_app.preprocess_request()  # its before_request hands the storage to flask.g
        private = flask.g.oidc_provider_mock_storage.jwk.as_dict(is_private=True)
    key = RSAKey.import_key(private)
    provider = Provider("", key)
    server = werkzeug.serving.make_server(
        "127.0.0.1", 0, _Rewriting(flask_app, provider), threaded=True
    )
    provider.issuer = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def flip(token: str) -> str:
    """The token with one character of its payload changed (its signature no longer fits)."""
    head, payload, sig = token.split(".")
    i = len(payload) // 2
    swapped = "A" if payload[i] != "A" else "B"
    return ".".join((head, payload[:i] + swapped + payload[i + 1 :], sig))


CODE = re.compile(r"[?&]code=")
