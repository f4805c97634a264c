"""A webhook receiver on 127.0.0.1 for tests: it records every POST (headers, raw body, the
status it answered) and answers from a script (`answers` first, then `default`); `hang_first`
calls get no answer at all until the receiver is closed (status 0). Each call records the uid
that owns the sending socket (read from /proc/net/tcp: which process, not which host, sent it)."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Call:
    headers: dict[str, str]  # names lowercased
    body: bytes
    status: int
    uid: int | None = None  # the sending socket's owner, as the kernel says

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")


def socket_uid(peer_port: int, our_port: int) -> int | None:
    """The uid owning the TCP socket on 127.0.0.1 port `peer_port` connected to `our_port`
    (the `uid` column of /proc/net/tcp); None if it is not there."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote = fields[1], fields[2]
                if (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)) == (
                    peer_port,
                    our_port,
                ):
                    return int(fields[7])
    return None


class Receiver:
    def __init__(
        self, answers: list[int] | None = None, default: int = 204, hang_first: int = 0
    ) -> None:
        self.answers = list(answers or [])
        self.default = default
        self.hang_first = hang_first
        self._release = threading.Event()
        self._calls: list[Call] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                peer, ours = self.client_address, self.server.server_address
                uid = socket_uid(int(peer[1]), int(ours[1]))  # type: ignore[index]
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = outer._answer(headers, body, uid)
                if status == 0:
                    outer._release.wait(120)
                    return  # the sender gave up long ago
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        # close() waits for serve_forever's next poll: 0.5 s by default, each test's wall time
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()

    def _answer(self, headers: dict[str, str], body: bytes, uid: int | None = None) -> int:
        with self._lock:
            if self.hang_first > 0:
                self.hang_first -= 1
                status = 0
            else:
                status = self.answers.pop(0) if self.answers else self.default
            self._calls.append(Call(headers, body, status, uid))
        return status

    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def delivered(self) -> list[Call]:
        return [c for c in self.calls() if 200 <= c.status < 300]

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
