"""A scripted OpenAI-compatible Chat Completions server on 127.0.0.1.

Each POST to /v1/chat/completions pops the next scripted reply and records the request body.
When the script runs out it answers 500 with a clear message, so a test fails loudly instead
of hanging. Faults can be scripted too: errors with headers (Retry-After), raw broken bodies,
`finish_reason` cut-offs, a hang, and the server going away (`down()`: connection refused)
and coming back on the same port (`up()`). Run standalone with
`python -m deltad.testing.fakellm --help`: a fixed reply (benchmarks), the name demo, or a
YAML script of questions, tool calls and pipeline outcomes (`--script`; see fakescript.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .completions import completion, tool_call

if TYPE_CHECKING:
    from .fakescript import Script

__all__ = ["FakeLLM", "Scripted", "completion", "tool_call"]


@dataclass
class Scripted:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict[str, Any])
    delay: float = 0.0  # seconds before answering (a hung endpoint)


def _json(status: int, doc: dict[str, Any], **headers: str) -> Scripted:
    return Scripted(status, json.dumps(doc).encode(), headers)


class FakeLLM:
    """Use as a context manager; `url` is the base URL for OPENAI_BASE_URL."""

    def __init__(self, port: int = 0) -> None:
        self._script: deque[Scripted] = deque()
        self._fallback: Scripted | None = None
        self._responder: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = self._listen(port)
        self._port = self._server.server_address[1]
        self._thread = self._serving()

    # -- scripting ---------------------------------------------------------------------
    def _push(self, item: Scripted) -> FakeLLM:
        with self._lock:
            self._script.append(item)
        return self

    def reply(self, content: str | None = None, *calls: dict[str, Any]) -> FakeLLM:
        return self._push(_json(200, completion(content, list(calls) or None)))

    def cut_off(self, finish: str, content: str | None = None, *calls: dict[str, Any]) -> FakeLLM:
        """A reply whose finish_reason says it is not whole (length, content_filter)."""
        return self._push(_json(200, completion(content, list(calls) or None, finish)))

    def raw(self, status: int, body: bytes, **headers: str) -> FakeLLM:
        """Exactly these bytes (a truncated or malformed body)."""
        return self._push(Scripted(status, body, headers))

    def hang(self, seconds: float) -> FakeLLM:
        """Answer only after `seconds` (the client should give up first)."""
        return self._push(Scripted(503, b"{}", {}, seconds))

    def call(
        self, name: str, args: dict[str, Any] | str | None = None, id: str | None = None
    ) -> FakeLLM:
        return self.reply(None, tool_call(name, args, id))

    def error(self, status: int, message: str = "scripted error", **headers: str) -> FakeLLM:
        body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
        return self._push(
            _json(status, body, **{k.replace("_", "-"): v for k, v in headers.items()})
        )

    def errors(self, n: int, status: int = 503, **headers: str) -> FakeLLM:
        for _ in range(n):
            self.error(status, "scripted outage", **headers)
        return self

    def always(self, content: str | None = None, *calls: dict[str, Any]) -> FakeLLM:
        """Answer this whenever the script is empty (benchmarks)."""
        self._fallback = _json(200, completion(content, list(calls) or None))
        return self

    def demo(self) -> FakeLLM:
        """The keyless first try (examples/demo.sh): ask the human's name, then greet them."""
        self._responder = _demo_reply
        return self

    def scripted(self, script: Script) -> FakeLLM:
        """Answer by a script (deltad/testing/fakescript.py): each reply a pure function of
        the conversation, so pauses, resumes and many runs at once all get the right step."""
        from .fakescript import reply

        self._responder = lambda body: reply(script, body)
        return self

    # -- the server going away and coming back ------------------------------------------
    def down(self) -> None:
        """Stop listening: connections are refused until `up()`."""
        self._server.shutdown()
        self._server.server_close()

    def up(self) -> None:
        self._server = self._listen(self._port)
        self._thread = self._serving()
        self._thread.start()

    @property
    def remaining(self) -> int:
        return len(self._script)

    # -- recorded requests ----------------------------------------------------------------
    def last_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.requests[-1]["messages"]
        return messages

    def tool_results(self, request_index: int = -1) -> dict[str, str]:
        msgs = self.requests[request_index]["messages"]
        return {m["tool_call_id"]: m["content"] for m in msgs if m.get("role") == "tool"}

    # -- server ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    def _listen(self, port: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        server.daemon_threads = True
        return server

    def _serving(self) -> threading.Thread:
        # stop() and down() wait for serve_forever's next poll: 0.5 s by default, paid by
        # every test that uses the fake (its teardown)
        return threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next(self, body: dict[str, Any]) -> Scripted:
        with self._lock:
            self.requests.append(body)
            if self._script:
                return self._script.popleft()
        if self._fallback:
            return self._fallback
        if self._responder is not None:
            return _json(200, self._responder(body))
        return _json(
            500, {"error": {"message": "fake LLM: script exhausted", "type": "server_error"}}
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(_json(404, {"error": {"message": f"no route {self.path}"}}))
                try:
                    body = json.loads(raw)
                except ValueError:
                    return self._send(_json(400, {"error": {"message": "body is not JSON"}}))
                self._send(fake._next(body))

            def _send(self, item: Scripted) -> None:
                if item.delay:
                    time.sleep(item.delay)  # the client has hung up by now: that is the point
                with contextlib.suppress(OSError):
                    self.send_response(item.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(item.body)))
                    for k, v in item.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(item.body)

        return Handler


def _demo_reply(body: dict[str, Any]) -> dict[str, Any]:
    answers = [m for m in body.get("messages", []) if m.get("role") == "tool"]
    if not answers:
        return completion(None, [tool_call("ask_human", {"prompt": "What is your name?"})])
    name = str(answers[-1].get("content", "")).strip()
    return completion(f"Hello {name}! (a scripted reply from the fake model)")


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve a fake OpenAI-compatible endpoint.")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--final", default="done", help="content of every reply")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--demo", action="store_true", help="ask for a name, then greet it")
    how.add_argument(
        "--script",
        type=Path,
        metavar="FILE",
        help="a YAML script: questions of any kind, tool calls, pipeline outcomes "
        "(examples/fake-model/)",
    )
    args = ap.parse_args()
    fake = FakeLLM(args.port)
    if args.script is not None:
        from .fakescript import ScriptError, load

        try:
            fake.scripted(load(args.script))
        except ScriptError as e:
            print(f"fakellm: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    elif args.demo:
        fake.demo()
    else:
        fake.always(args.final)
    fake.start()
    print(fake.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
