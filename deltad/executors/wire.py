"""The fork server's wire format: one JSON message per SOCK_SEQPACKET packet, fds alongside
(SCM_RIGHTS). Its own module, so deltad's side never imports the server's."""

from __future__ import annotations

import array
import json
import os
import socket
from typing import Any

MAX_MESSAGE = 1 << 20


def send(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode()
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the fds that came with it; (None, []) at end of stream."""
    fds = array.array("i")
    data, anc, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), list(fds)
