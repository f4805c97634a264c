"""The inbox's listening socket: connections accepted on it the way uvicorn accepts them (an
asyncio server on the pre-bound socket) send small writes at once (TCP_NODELAY). Without it
every response, written as headers then body, waited for the client's delayed ACK: 40 ms."""

from __future__ import annotations

import asyncio
import socket

from deltad.privsep.listen import bind


async def _nodelay_of_an_accepted_connection(sock: socket.socket) -> int:
    loop = asyncio.get_running_loop()
    seen: asyncio.Future[int] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await loop.create_server(Probe, sock=sock)
    async with server:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 60)
        finally:
            writer.close()


def test_connections_on_the_bound_socket_have_tcp_nodelay() -> None:
    sock = bind("127.0.0.1:0")
    assert sock.proto == socket.IPPROTO_TCP
    assert asyncio.run(_nodelay_of_an_accepted_connection(sock)) != 0
