"""The door of a port tells TLS from plain TCP by peeking at the first byte; a readiness
report with nothing to read (libuv's poll may give one) is not a closed connection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from ssb.broker._tls import Door


class _SpuriousLoop(asyncio.SelectorEventLoop):
    """Reports the first reader readable at once, with nothing to read (as a spurious
    poll event would); the peer's byte is sent only when a reader is added again."""

    def __init__(self, peer: socket.socket) -> None:
        super().__init__()
        self.peer = peer
        self.readers = 0

    def add_reader(self, fd: Any, callback: Callable[..., object], *args: Any) -> None:
        self.readers += 1
        if self.readers == 1:
            self.call_soon(callback, *args)
        else:
            self.peer.send(b"\x16")
        super().add_reader(fd, callback, *args)


def test_a_spurious_readiness_report_waits_for_the_first_byte() -> None:
    server, client = socket.socketpair()
    loop = _SpuriousLoop(client)
    try:
        server.setblocking(False)
        first = loop.run_until_complete(asyncio.wait_for(Door._peek(loop, server), 10))
        assert first == b"\x16"
        assert loop.readers == 2
        assert server.recv(1) == b"\x16"  # peeked, not consumed
    finally:
        server.close()
        client.close()
        loop.close()


def test_a_closed_connection_peeks_nothing() -> None:
    loop = asyncio.SelectorEventLoop()
    server, client = socket.socketpair()
    try:
        server.setblocking(False)
        client.close()
        assert loop.run_until_complete(asyncio.wait_for(Door._peek(loop, server), 10)) == b""
    finally:
        server.close()
        loop.close()
