"""The HTTP listening socket, bound by the core (as root: ports below 1024 work) before
anything else starts, so a busy port is a clear error at startup and port 0 works (the bound
address is logged as `http_listening` and put in status.json); the inbox process serves it
(deltad/http/server.py). And the TLS files, checked before anything starts."""

from __future__ import annotations

import socket
import ssl

from deltad.inbox.config import HttpConfig, split_listen


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
