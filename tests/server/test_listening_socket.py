"""The socket `thinkstruct serve` listens on: connections it accepts send at once.

asyncio sets ``TCP_NODELAY`` on an accepted connection only when the listening socket's
protocol is TCP by name; left 0, every response on a kept-alive connection and every
streamed chunk waited for the client's delayed ACK (about 40 ms each).
"""

from __future__ import annotations

import asyncio
import socket

from thinkstruct.server.runner import listening_socket


def test_accepted_connections_have_nagle_off() -> None:
    async def accept_one() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        sock = listening_socket("127.0.0.1", 0)
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            nodelay = await asyncio.wait_for(accepted, 30)
            writer.close()
            return nodelay
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(accept_one()) != 0
