"""A stand-in for Slack's Web API on 127.0.0.1, for tests and benches: `slack_sdk.WebClient`
pointed at `SlackApi().url` (its `base_url`) talks to it as to Slack. It records every call
(the method, its arguments, the bearer token) and answers as Slack does for the methods a
channel uses (`chat.postMessage` with a `channel` and a `ts`, `chat.update`,
`chat.postEphemeral`, `views.open`); anything else answers `{"ok": true}`.

Faults are scripted per method: `fail(method, error)` answers the next calls `{"ok": false,
"error": error}` (Slack's way), `fail(method, status=503)` answers an HTTP status instead;
`hang(method)` leaves the next call unanswered until the stand-in closes. Each call records
the uid owning the calling socket (/proc/net/tcp: which process called, as the kernel says).
With `token` set, a call without that bearer token gets `invalid_auth`, as from Slack.

    with SlackApi(token="xoxb-test") as api:
        WebClient(token="xoxb-test", base_url=api.url).chat_postMessage(channel="C1", text="hi")
        [call] = api.calls("chat.postMessage")
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.webhooks import socket_uid

BODY_MAX = 4 * 1024 * 1024


@dataclass(frozen=True)
class ApiCall:
    method: str  # "chat.postMessage"
    args: dict[str, Any]  # the JSON body, or the form's fields
    token: str | None  # the bearer token it came with
    result: dict[str, Any]  # what it was answered
    uid: int | None = None  # the calling socket's owner


@dataclass
class _Fault:
    error: str | None
    status: int
    times: int


class SlackApi:
    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self._calls: list[ApiCall] = []
        self._faults: dict[str, _Fault] = {}
        self._lock = threading.Lock()
        self._ts = itertools.count(1)
        self._hang: dict[str, int] = {}
        self._closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length", "0")), BODY_MAX)
                raw = self.rfile.read(length)
                method = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
                kind = self.headers.get("Content-Type", "")
                peer, ours = self.client_address, self.server.server_address
                uid = socket_uid(int(peer[1]), int(ours[1]))  # type: ignore[index]
                if outer._hung(method):
                    auth = self.headers.get("Authorization") or ""
                    token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
                    outer._record(ApiCall(method, _args(kind, raw), token, {}, uid))
                    outer._closing.wait()
                    return
                status, doc = outer._answer(
                    method, kind, raw, self.headers.get("Authorization"), uid
                )
                data = json.dumps(doc).encode()
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()

    # -- the script ----------------------------------------------------------------------------
    def fail(
        self, method: str, error: str | None = None, status: int = 200, times: int = 1
    ) -> None:
        """The next `times` calls of `method` fail: Slack's `error`, or an HTTP `status`."""
        with self._lock:
            self._faults[method] = _Fault(error, status, times)

    def hang(self, method: str, times: int = 1) -> None:
        """The next `times` calls of `method` get no answer until the stand-in closes (their
        `result` is empty)."""
        with self._lock:
            self._hang[method] = times

    def _hung(self, method: str) -> bool:
        with self._lock:
            left = self._hang.get(method, 0)
            if left > 0:
                self._hang[method] = left - 1
            return left > 0

    def _record(self, call: ApiCall) -> None:
        with self._lock:
            self._calls.append(call)

    def calls(self, method: str | None = None) -> list[ApiCall]:
        with self._lock:
            return [c for c in self._calls if method is None or c.method == method]

    # -- answering -------------------------------------------------------------------------------
    def _answer(
        self, method: str, kind: str, raw: bytes, auth: str | None, uid: int | None = None
    ) -> tuple[int, dict[str, Any]]:
        args = _args(kind, raw)
        token = auth.removeprefix("Bearer ") if auth and auth.startswith("Bearer ") else None
        with self._lock:
            fault = self._faults.get(method)
            if fault is not None:
                fault.times -= 1
                if fault.times <= 0:
                    del self._faults[method]
            if fault is not None and fault.status != 200:
                status, doc = fault.status, {"ok": False, "error": f"http_{fault.status}"}
            elif fault is not None:
                status, doc = 200, {"ok": False, "error": fault.error or "internal_error"}
            elif self.token is not None and token != self.token:
                status, doc = 200, {"ok": False, "error": "invalid_auth"}
            else:
                status, doc = 200, self._result(method, args)
            self._calls.append(ApiCall(method, args, token, doc, uid))
        return status, doc

    def _result(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        if method == "chat.postMessage":
            channel = str(args.get("channel", ""))
            if channel.startswith(("U", "W")):  # a DM: Slack answers with the DM's own id
                channel = "D" + channel[1:]
            ts = f"{int(time.time())}.{next(self._ts):06d}"
            return {"ok": True, "channel": channel, "ts": ts, "message": {"ts": ts}}
        if method == "chat.update":
            return {"ok": True, "channel": args.get("channel"), "ts": args.get("ts")}
        if method == "chat.postEphemeral":
            return {"ok": True, "message_ts": f"{int(time.time())}.{next(self._ts):06d}"}
        if method == "views.open":
            return {"ok": True, "view": {"id": f"V{next(self._ts):08d}", **args.get("view", {})}}
        return {"ok": True}

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> SlackApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _args(kind: str, raw: bytes) -> dict[str, Any]:
    if kind.startswith("application/json"):
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) else {}
    fields = urllib.parse.parse_qs(raw.decode(errors="replace"))
    out: dict[str, Any] = {}
    for k, [v, *_] in fields.items():
        try:  # slack_sdk sends `blocks` and `view` JSON-encoded inside a form
            out[k] = json.loads(v) if k in ("blocks", "view", "attachments") else v
        except ValueError:
            out[k] = v
    return out


def interaction(
    payload: dict[str, Any], signing_secret: str, at: float | None = None
) -> tuple[str, dict[str, str]]:
    """What Slack POSTs to an interactivity endpoint: the form body (`payload=<JSON>`) and its
    headers, signed with slack_sdk's own signer (v0) at time `at` (now by default)."""
    from slack_sdk.signature import SignatureVerifier

    body = urllib.parse.urlencode({"payload": json.dumps(payload)})
    timestamp = str(int(time.time() if at is None else at))
    signature = SignatureVerifier(signing_secret).generate_signature(timestamp=timestamp, body=body)
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature or "",
    }
    return body, headers
