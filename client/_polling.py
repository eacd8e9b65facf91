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

from ssb.protocol import Backoff, Poller, had_a_processor

DEFAULT_WINDOW: Final = 150e-6  # seconds a connection polls for an answer before sleeping

give_way: Callable[[], object] = getattr(os, "sched_yield", lambda: None)
_DONTWAIT: Final[int] = getattr(socket, "MSG_DONTWAIT", 0)


def answers_poller(awaiting: Callable[[], object], loop: asyncio.AbstractEventLoop) -> Poller:
    """An async connection's poller on `loop` (`awaiting`: whether any answer is still
    due)."""
    return Poller(awaiting, time.perf_counter, loop.call_soon, give_way, time.thread_time)


def receive(sock: socket.socket, backoff: Backoff, size: int) -> bytes:
    """Up to `size` bytes from the blocking `sock`, polled for first if `backoff` says
    so (a poll that spent most of its time off the processor counts as fruitless, as
    `Poller`'s do)."""
    if backoff.due():
        started, cpu_started = time.perf_counter(), time.thread_time()
        deadline = started + backoff.window
        while (data := _read_now(sock, size)) is None:
            if time.perf_counter() >= deadline:
                backoff.ended(False)
                return sock.recv(size)
            give_way()
        spent = time.perf_counter() - started
        backoff.ended(had_a_processor(spent, time.thread_time() - cpu_started))
        return data
    return sock.recv(size)


def _read_now(sock: socket.socket, size: int) -> bytes | None:
    """What `sock` has to read at once (None: nothing yet). A plain socket is asked not
    to wait; a TLS one (which takes no flags) is made nonblocking for the read."""
    if _DONTWAIT and not isinstance(sock, ssl.SSLSocket):
        try:
            return sock.recv(size, _DONTWAIT)
        except BlockingIOError:
            return None
    sock.setblocking(False)
    try:
        return sock.recv(size)
    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
        return None
    finally:
        sock.setblocking(True)
