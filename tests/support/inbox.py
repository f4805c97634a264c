"""Talking to a real `deltad serve` inbox from tests: tokens made with the real CLI, an HTTP
client, an event-stream reader on its own thread, and a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.support.daemon import DELTAD, Daemon, wait_for


def http_url(d: Daemon) -> str:
    [e] = d.wait_event("http_listening")
    return str(e["url"])


def make_token(state_dir: Path, name: str, *scopes: str, role: str = "answerer") -> str:
    argv = [DELTAD, "token", "add", name, "--role", role, "--state-dir", str(state_dir)]
    for s in scopes:
        argv += ["--scope", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip().splitlines()[-1]


def client(url: str, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


class EventReader:
    """Reads `/v1/events` on a thread; `wait(pred)` waits for a matching event."""

    def __init__(
        self, url: str, token: str, *, last_event_id: int | None = None, **params: Any
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._lock = threading.Lock()
        self._client = client(url, token)
        self._params = params
        self._headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        self._stop = False
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self._connected.wait(30):
            raise AssertionError("the event stream did not connect")

    def _read(self) -> None:
        # The daemon stopped, or close(): the test looks at what was read.
        with contextlib.suppress(httpx.HTTPError):
            self._read_stream()

    def _read_stream(self) -> None:
        with self._client.stream(
            "GET", "/v1/events", params=self._params, headers=self._headers, timeout=None
        ) as r:
            self._connected.set()
            data: list[str] = []
            for line in r.iter_lines():
                if self._stop:
                    return
                with self._lock:
                    self.raw.append(line)
                if line.startswith("data: "):
                    data.append(line[6:])
                elif line == "" and data:
                    with self._lock:
                        self.events.append(json.loads("\n".join(data)))
                    data = []

    def wait(self, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            with self._lock:
                return next((e for e in self.events if pred(e)), None)

        hit = wait_for(found, what)
        assert hit is not None
        return hit

    def ended(self) -> bool:
        """Whether the server ended the stream (or the reader was closed)."""
        return not self._thread.is_alive()

    def close(self) -> None:
        self._stop = True
        self._client.close()


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that records every POST (headers and raw body)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self.send_response(503)
                else:
                    outer.received.append((dict(self.headers.items()), body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        # close() waits for serve_forever's next poll: 0.5 s by default
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
