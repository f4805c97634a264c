"""The HTTP server: uvicorn as the inbox process runs it on the socket the core bound and
handed over (deltad/privsep/listen.py; deltad/http/child.py)."""

from __future__ import annotations

import logging
import socket

import anyio.to_thread
import structlog
import uvicorn
from starlette.types import ASGIApp

from deltad.http import gate
from deltad.http.limits import HEADERS_MAX
from deltad.inbox.config import HttpConfig

log = structlog.get_logger("deltad.http")
HTTP_THREADS = 4


def uvicorn_server(
    app: ASGIApp, config: HttpConfig, certfile: str | None, keyfile: str | None
) -> uvicorn.Server:
    """The server the inbox process runs on the socket the core handed it: its connections
    counted and capped at the gate (per process, per source and network, and below the process's
    descriptor limit less a reserve; deltad/http/gate.py), with deadlines on headers, bodies and
    idleness."""
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
    counted = gate.Gate(
        gate.Caps(cap, config.max_connections_per_source, config.max_connections_per_network)
    )
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
            http=gate.gated(
                counted, config.header_timeout_seconds, config.stranger_header_timeout_seconds
            ),
            h11_max_incomplete_event_size=HEADERS_MAX,
            timeout_keep_alive=config.idle_timeout_seconds,  # type: ignore[arg-type]
        )
    )


async def serve_bounded(server: uvicorn.Server, sock: socket.socket) -> None:
    # Plain routes run in worker threads: few of them, as when the inbox ran in the daemon.
    anyio.to_thread.current_default_thread_limiter().total_tokens = HTTP_THREADS
    await server.serve(sockets=[sock])
