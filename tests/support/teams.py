"""A stand-in for Microsoft's side of a Teams bot on 127.0.0.1, playing both sides as the real
services do (learn.microsoft.com, "Authentication with the Bot Connector API" and "Send and
receive activities"):

    GET  /v1/.well-known/openidconfiguration   the OpenID metadata: issuer, `jwks_uri`
    GET  /v1/.well-known/keys                   its JWKS: one RSA key (RS256), endorsed for
                                                `msteams`, as the Bot Connector publishes
    POST /botframework.com/oauth2/v2.0/token    the client-credentials grant: the bot's app id
                                                and password in the form, the Bot Framework
                                                scope; 401 for anything else
    POST /v3/conversations/{id}/activities      a posted activity (201, `{"id"}`)
    POST /v3/conversations/{id}/activities/{a}  a reply to one posted before (201, `{"id"}`):
                                                a text message whose `replyToId` is `a`, its
                                                mentions' `<at>` tags in its text
    PUT  /v3/conversations/{id}/activities/{a}  an update of one posted before (200)

Posted and updated activities need a bearer token this stand-in issued (401 otherwise) and
must be a message with one Adaptive Card whose actions are Action.Execute or Action.Submit
only: an Action.OpenUrl, a selectAction or any `url` anywhere in the card is refused (400).

As the Bot Connector it also signs activities for deltad's endpoint (`sign`, `send`): a JWT
(RS256, its key's `kid`) with issuer `https://api.botframework.com`, audience the app id, and
the activity's `serviceUrl`; `sign` takes overrides to make unsigned, expired, wrong-audience,
wrong-issuer and other-key tokens."""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

ISSUER = "https://api.botframework.com"
SCOPE = "https://api.botframework.com/.default"
CARD = "application/vnd.microsoft.card.adaptive"
ACTIONS = ("Action.Execute", "Action.Submit")


def reply_problems(activity: Any, parent: str, posted: set[str]) -> list[str]:
    """Why this stand-in refuses a reply deltad sends to activity `parent` (empty: takes it)."""
    if not isinstance(activity, dict) or activity.get("type") != "message":
        return ["not a message activity"]
    if parent not in posted:
        return [f"no activity {parent!r} in the conversation"]
    if activity.get("replyToId") != parent:
        return ["replyToId is not the activity replied to"]
    text = activity.get("text")
    if not isinstance(text, str) or not text.strip():
        return ["the reply has no text"]
    out = []
    for e in activity.get("entities") or []:
        mentioned = e.get("mentioned") if isinstance(e, dict) else None
        if not isinstance(mentioned, dict) or not mentioned.get("id") or not mentioned.get("name"):
            out.append("a mention names nobody")
        elif e.get("type") != "mention" or str(e.get("text")) not in text:
            out.append(f"the mention {e.get('text')!r} is not in the text")
    if "http://" in text or "https://" in text:
        out.append("the reply holds a URL")
    return out


def card_problems(activity: Any) -> list[str]:
    """Why this stand-in refuses an activity deltad sends (empty: it takes it)."""
    if not isinstance(activity, dict) or activity.get("type") != "message":
        return ["not a message activity"]
    attachments = activity.get("attachments")
    if not isinstance(attachments, list) or len(attachments) != 1:
        return ["not one attachment"]
    a = attachments[0]
    if not isinstance(a, dict) or a.get("contentType") != CARD:
        return ["not an Adaptive Card"]
    card = a.get("content")
    if not isinstance(card, dict) or card.get("type") != "AdaptiveCard":
        return ["the card is no AdaptiveCard"]
    out = []
    if not isinstance(card.get("body"), list) or not card["body"]:
        out.append("the card has no body")
    for action in card.get("actions") or []:
        if action.get("type") not in ACTIONS:
            out.append(f"an action of type {action.get('type')!r}")
    text = json.dumps(card)
    for banned in ("Action.OpenUrl", "selectAction", '"url"', "Action.ToggleVisibility"):
        if banned in text:
            out.append(f"the card holds {banned}")
    return out


@dataclass
class Call:
    method: str
    path: str
    token: str
    activity: dict[str, Any]
    status: int


@dataclass
class BotService:
    app_id: str
    password: str
    throttle: int = 0  # the first N activity calls answered 429
    channel_id: str = "msteams"
    calls: list[Call] = field(default_factory=list)
    metadata_fetches: int = 0
    key_fetches: int = 0
    token_requests: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "stand-in-key-1"
        self._issued: set[str] = set()
        self._lock = threading.Lock()
        self._ids = 0
        self._posted: set[str] = set()  # the activity ids it gave out
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- the service's URLs ------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def service_url(self) -> str:
        return self.url + "/"

    @property
    def metadata_url(self) -> str:
        return self.url + "/v1/.well-known/openidconfiguration"

    @property
    def token_url(self) -> str:
        return self.url + "/botframework.com/oauth2/v2.0/token"

    def jwks(self) -> dict[str, Any]:
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**jwk, "kid": self.kid, "use": "sig", "endorsements": ["msteams"]}]}

    def __enter__(self) -> BotService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- as the Bot Connector, towards deltad -------------------------------------------------
    def sign(self, key: Any = None, kid: str | None = None, **claims: Any) -> str:
        """A Bot Connector token for an activity; `claims` override (None removes one)."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": ISSUER,
            "aud": self.app_id,
            "serviceUrl": self.service_url,
            "nbf": now - 5,
            "iat": now - 5,
            "exp": now + 3600,
        }
        body |= claims
        body = {k: v for k, v in body.items() if v is not None}
        headers = {"kid": kid or self.kid}
        return jwt.encode(body, key or self.key, algorithm="RS256", headers=headers)

    def invoke(
        self, ref: str, choice: str, aad: str, verb: str = "deltad.answer", **inputs: Any
    ) -> dict[str, Any]:
        """The invoke Teams sends when a person presses an Action.Execute button: the card's
        `inputs` (by their id) merged into the action's data, as Teams does."""
        return {
            "type": "invoke",
            "name": "adaptiveCard/action",
            "id": f"inv-{secrets.token_hex(4)}",
            "channelId": self.channel_id,
            "serviceUrl": self.service_url,
            "from": {"id": f"29:{aad}", "aadObjectId": aad},
            "conversation": {"id": "19:stand-in@thread.tacv2"},
            "value": {
                "action": {
                    "type": "Action.Execute",
                    "verb": verb,
                    "data": {"deltad": ref, "choice": choice, **inputs},
                }
            },
        }

    def send(
        self, endpoint: str, activity: dict[str, Any], token: str | None = ""
    ) -> httpx.Response:
        """POST `activity` to deltad's endpoint, signed (`token` None: no Authorization)."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token or self.sign()}"
        return httpx.post(endpoint, content=json.dumps(activity), headers=headers, timeout=30)

    # -- what it received ----------------------------------------------------------------------
    def posted(self) -> list[Call]:
        """The cards posted (replies aside)."""
        with self._lock:
            return [
                c
                for c in self.calls
                if c.method == "POST" and c.status == 201 and "replyToId" not in c.activity
            ]

    def replies(self) -> list[Call]:
        with self._lock:
            return [
                c
                for c in self.calls
                if c.method == "POST" and c.status == 201 and "replyToId" in c.activity
            ]

    def updated(self) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == "PUT" and c.status == 200]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        svc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_GET(self) -> None:
                if self.path == "/v1/.well-known/openidconfiguration":
                    with svc._lock:
                        svc.metadata_fetches += 1
                    doc = {
                        "issuer": ISSUER,
                        "authorization_endpoint": "https://invalid.example/",
                        "jwks_uri": svc.url + "/v1/.well-known/keys",
                        "id_token_signing_alg_values_supported": ["RS256"],
                        "token_endpoint_auth_methods_supported": ["private_key_jwt"],
                    }
                    self._reply(200, doc)
                elif self.path == "/v1/.well-known/keys":
                    with svc._lock:
                        svc.key_fetches += 1
                    self._reply(200, svc.jwks())
                else:
                    self._reply(404, {"error": "not found"})

            def do_POST(self) -> None:
                if self.path == "/botframework.com/oauth2/v2.0/token":
                    form = {
                        k: v[0] for k, v in urllib.parse.parse_qs(self._body().decode()).items()
                    }
                    with svc._lock:
                        svc.token_requests.append(
                            {k: v for k, v in form.items() if k != "client_secret"}
                        )
                    good = (
                        form.get("grant_type") == "client_credentials"
                        and form.get("client_id") == svc.app_id
                        and form.get("client_secret") == svc.password
                        and form.get("scope") == SCOPE
                    )
                    if not good:
                        self._reply(401, {"error": "invalid_client"})
                        return
                    token = secrets.token_urlsafe(32)
                    with svc._lock:
                        svc._issued.add(token)
                    self._reply(
                        200, {"token_type": "Bearer", "expires_in": 3599, "access_token": token}
                    )
                    return
                self._activity("POST")

            def do_PUT(self) -> None:
                self._activity("PUT")

            def _activity(self, method: str) -> None:
                parts = self.path.split("/")
                # /v3/conversations/{id}/activities[/{activityId}]
                ok = (
                    len(parts) in (5, 6)
                    and parts[1:3] == ["v3", "conversations"]
                    and parts[4] == "activities"
                )
                if not ok:
                    self._reply(404, {"error": "not found"})
                    return
                reply = method == "POST" and len(parts) == 6
                if method == "PUT" and len(parts) != 6:
                    self._reply(404, {"error": "not found"})
                    return
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                try:
                    activity = json.loads(self._body())
                except ValueError:
                    activity = None
                doc: dict[str, Any]
                with svc._lock:
                    if token not in svc._issued:
                        status, doc = 401, {"error": {"code": "Unauthorized"}}
                    elif svc.throttle > 0:
                        svc.throttle -= 1
                        status, doc = 429, {"error": {"code": "Throttled"}}
                    elif problems := (
                        reply_problems(activity, urllib.parse.unquote(parts[5]), svc._posted)
                        if reply
                        else card_problems(activity)
                    ):
                        status, doc = 400, {"error": {"code": "BadArgument", "message": problems}}
                    elif method == "POST":
                        svc._ids += 1
                        status, doc = 201, {"id": f"1:activity-{svc._ids}"}
                        svc._posted.add(doc["id"])
                    else:
                        status, doc = 200, {"id": urllib.parse.unquote(parts[5])}
                    path = urllib.parse.unquote(self.path)
                    svc.calls.append(Call(method, path, token, activity or {}, status))
                self._reply(status, doc)

        return Handler
