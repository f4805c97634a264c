"""The HTTP server: the listening socket, bound by the core (as root: ports below 1024 work)
before anything else starts, so a busy port is a clear error at startup and port 0 works (the
bound address is logged as `http_listening` and put in status.json); and uvicorn as the inbox
process runs it on that socket (deltad/http/child.py)."""

from __future__ import annotations

import logging
import socket
import ssl

import anyio.to_thread
import structlog
import uvicorn
from starlette.types import ASGIApp

from deltad.http import gate
from deltad.http.limits import HEADERS_MAX
from deltad.inbox.config import HttpConfig, split_listen

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


def uvicorn_server(
    app: ASGIApp, config: HttpConfig, certfile: str | None, keyfile: str | None
) -> uvicorn.Server:
    """The server the inbox process runs on the socket the core handed it: its connections
    counted and capped at the gate (per process, per source, and below the process's descriptor
    limit less a reserve; deltad/http/gate.py), with deadlines on headers, bodies and idleness."""
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
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
    counted = gate.Gate(gate.Caps(cap, config.max_connections_per_source))
    return uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
            timeout_graceful_shutdown=2,
            # h11 on purpose: uvicorn applies this limit on a request's headers to h11 only
            # (httptools, if installed, would be picked by "auto" and ignores it); counted
            # at the gate, with a deadline on the headers (deltad/http/gate.py).
            http=gate.gated(counted, config.header_timeout_seconds),
            h11_max_incomplete_event_size=HEADERS_MAX,
            timeout_keep_alive=config.idle_timeout_seconds,  # type: ignore[arg-type]
        )
    )


async def serve_bounded(server: uvicorn.Server, sock: socket.socket) -> None:
    # Plain routes run in worker threads: few of them, as when the inbox ran in the daemon.
    anyio.to_thread.current_default_thread_limiter().total_tokens = HTTP_THREADS
    await server.serve(sockets=[sock])


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
