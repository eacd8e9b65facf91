"""A connection polls a moment for its answer before it sleeps (see `ssb.protocol`'s
`Poller` for why and how it backs off): the async client by keeping its event loop
turning (`answers_poller`), the blocking client by reading without waiting (`receive`).
Whether a wait polls is learnt per operation, since one kind of request is answered at
once where another waits for a large commit.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from collections.abc import Callable
from typing import Final

from ssb.protocol import Backoff, Poller

DEFAULT_WINDOW: Final = 250e-6  # seconds a connection polls for an answer before sleeping

give_way: Callable[[], object] = getattr(os, "sched_yield", lambda: None)
_DONTWAIT: Final[int] = getattr(socket, "MSG_DONTWAIT", 0)


def _next_turn(turn: Callable[[], None]) -> None:
    asyncio.get_running_loop().call_soon(turn)


def answers_poller(awaiting: Callable[[], object]) -> Poller:
    """An async connection's poller (`awaiting`: whether any answer is still due)."""
    return Poller(awaiting, time.perf_counter, _next_turn, give_way)


def receive(sock: socket.socket, backoff: Backoff, size: int) -> bytes:
    """Up to `size` bytes from the blocking `sock`, polled for first if `backoff` says so
    (not over TLS: an SSL socket takes no flags)."""
    if _DONTWAIT and not isinstance(sock, ssl.SSLSocket) and backoff.due():
        deadline = time.perf_counter() + backoff.window
        while True:
            try:
                data = sock.recv(size, _DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() >= deadline:
                    backoff.ended(False)
                    break
                give_way()
                continue
            backoff.ended(True)
            return data
    return sock.recv(size)
