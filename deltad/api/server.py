"""The HTTP server: uvicorn in one thread beside the daemon's loop (never in it). The socket is
bound by the caller first, so a busy port is a clear error at startup, and port 0 works (the
bound address is logged as `http_listening` and put in status.json)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from pathlib import Path

import anyio.to_thread
import structlog
import uvicorn

from deltad.health import Standalone, Vitals
from deltad.inbox.feed import Feed

from . import gate, links, sessions
from .app import create_app
from .config import HttpConfig, split_listen
from .handlers import Context, Idempotency
from .limits import HEADERS_MAX
from .tokens import TokenStore

log = structlog.get_logger("deltad.http")
HTTP_THREADS = 4


class ListenError(Exception):
    """One line: why the HTTP server cannot listen."""


def bind(listen: str) -> socket.socket:
    host, port = split_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and
        # without it each response (headers, then body: two writes) waited for the client's
        # delayed ACK, 40 ms a request.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        raise ListenError(f"cannot listen on {listen}: {e.strerror or e}") from None
    sock.set_inheritable(False)
    return sock


class HttpServer:
    def __init__(
        self, config: HttpConfig, feed: Feed, state_dir: Path, vitals: Vitals | None = None
    ) -> None:
        self.config = config
        _check_tls(config)
        self.sock = bind(config.listen)
        self.port = int(self.sock.getsockname()[1])
        self.url = config.base_url(self.port)
        self.context = Context(
            feed=feed,
            tokens=TokenStore(state_dir),
            config=config,
            link_key=links.load_key(state_dir),
            base_url=self.url,
            vitals=vitals if vitals is not None else Standalone(),
            idempotency=Idempotency(state_dir),  # kept across restarts (docs/inbox.md)
        )
        self._stopping = threading.Event()
        soft, in_use = gate.descriptors()
        cap = gate.connection_cap(config.max_connections, soft, in_use, config.fd_reserve)
        if cap < config.max_connections:
            log.warning(
                "http_connections_clamped",
                max_connections=config.max_connections,
                allowed=cap,
                nofile=soft,
                fds_in_use=in_use,
                fd_reserve=config.fd_reserve,
            )
        self.gate = gate.Gate(gate.Caps(cap, config.max_connections_per_source))
        self._server = uvicorn.Server(
            uvicorn.Config(
                create_app(
                    self.context,
                    self._stopping,
                    sessions.Sessions(
                        sessions.load_key(state_dir),
                        config.session_ttl_seconds,
                        state_dir / sessions.CLOSED_NAME,
                    ),
                ),
                log_config=None,
                access_log=False,
                lifespan="off",
                ssl_certfile=str(config.tls_cert) if config.tls_cert else None,
                ssl_keyfile=str(config.tls_key) if config.tls_key else None,
                timeout_graceful_shutdown=2,
                # h11 on purpose: uvicorn applies this limit on a request's headers to h11 only
                # (httptools, if installed, would be picked by "auto" and ignores it); counted
                # at the gate, with a deadline on the headers (deltad/api/gate.py).
                http=gate.gated(self.gate, config.header_timeout_seconds),
                h11_max_incomplete_event_size=HEADERS_MAX,
                timeout_keep_alive=config.idle_timeout_seconds,  # type: ignore[arg-type]
            )
        )
        self._thread = threading.Thread(target=self._serve, name="deltad-http", daemon=True)
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)

    def start(self) -> None:
        self._thread.start()
        log.info("http_listening", url=self.url, port=self.port, tls=self.config.tls)

    def _serve(self) -> None:
        try:
            asyncio.run(self._serve_bounded())
        except Exception as e:  # the loop must go on; systemd's watchdog is not tied to HTTP
            log.error("http_failed", error=f"{type(e).__name__}: {e}")

    async def _serve_bounded(self) -> None:
        # Plain routes run in worker threads, all in the daemon's process: few of them, so a
        # burst of requests leaves the daemon's loop its share of the GIL.
        anyio.to_thread.current_default_thread_limiter().total_tokens = HTTP_THREADS
        await self._server.serve(sockets=[self.sock])

    def stop(self) -> None:
        self._stopping.set()
        self._server.should_exit = True
        self._thread.join(10)
        self.sock.close()


def _check_tls(config: HttpConfig) -> None:
    """A bad certificate is a startup error, not a thread that dies later."""
    if config.tls_cert is None or config.tls_key is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            config.tls_cert, config.tls_key
        )
    except (OSError, ssl.SSLError) as e:
        raise ListenError(f"http.tls_cert/tls_key cannot be used: {e}") from None
