"""Busy polling: waiting a moment for an answer without sleeping in the kernel.

Theory of operation. A broker answers most requests within a few hundred microseconds.
A client that blocks in the kernel while it waits is woken when the answer arrives, and
that wake-up (the scheduler, an interrupt to the other processor, the way back out of
the poll) costs tens of microseconds: on a round trip of three requests made one at a
time it was a quarter of the time on an otherwise idle machine. So after a request is
written, a connection polls for the answer for at most `window` seconds before it
sleeps: the async client keeps its event loop turning (`BusyPoll`: a callback that
schedules itself again, so that the loop polls its sockets without blocking), the
blocking client reads without waiting (`receive`). Each turn gives the processor up to
any other runnable process first (`sched_yield`).

Whether a wait polls is learnt per operation (`Backoffs`), since one kind of request is
answered at once where another waits for a large commit: a poll that ended before its
answers came found nothing worth the processor time, so the next polls after that
operation are skipped, twice as many after each such poll in a row (up to
`MAX_SKIPPED`), and a poll that gets its answers starts the count again (`Backoff`). A
client whose answers come slowly (commits synced to disk, large transactions, a RECEIVE
waiting for messages, many requests in flight) so spends almost nothing on it; one that
makes requests one at a time to a broker that answers at once saves the wake-ups.
`window` 0 turns it off.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from collections.abc import Callable
from typing import Final

DEFAULT_WINDOW: Final = 250e-6  # seconds a connection polls for an answer before sleeping
MAX_WINDOW: Final = 0.01  # at most (a longer poll is a busy loop, not a wait)
MAX_SKIPPED: Final = 63  # polls skipped at most after fruitless ones

_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: None)
_DONTWAIT: Final[int] = getattr(socket, "MSG_DONTWAIT", 0)


def check_window(window: object) -> float:
    """`window` as seconds, or ValueError saying what is wrong."""
    if (
        isinstance(window, bool)
        or not isinstance(window, (int, float))
        or not 0.0 <= window <= MAX_WINDOW  # (also refuses NaN)
    ):
        raise ValueError(
            f"busy_poll must be a number of seconds from 0 (off) to {MAX_WINDOW}, not {window!r}"
        )
    return float(window)


class Backoff:
    """Whether the next wait polls first, after how the last polls went."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._fruitless = 0  # polls in a row that ended before their answers came
        self._skip = 0  # waits left that do not poll

    def due(self) -> bool:
        """Whether this wait polls (counts a skipped one)."""
        if not self.window:
            return False
        if self._skip:
            self._skip -= 1
            return False
        return True

    def ended(self, answered: bool) -> None:
        """A poll ended: with its answers in (`answered`), or at the end of its window."""
        if answered:
            self._fruitless = 0
            return
        self._fruitless = min(self._fruitless + 1, MAX_SKIPPED.bit_length())
        self._skip = min((1 << self._fruitless) - 1, MAX_SKIPPED)


NEVER: Final = Backoff(0.0)  # (a window of 0 never polls: this one is never changed)


class Backoffs:
    """A connection's backoff for each operation it has sent."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._by_operation: dict[str, Backoff] = {}  # (the client's own operation names)

    def of(self, operation: str) -> Backoff:
        if not self.window:
            return NEVER
        backoff = self._by_operation.get(operation)
        if backoff is None:
            backoff = self._by_operation[operation] = Backoff(self.window)
        return backoff


class BusyPoll:
    """An async connection's polling (`awaiting`: whether any answer is still due)."""

    def __init__(self, window: float, awaiting: Callable[[], object]) -> None:
        self.backoffs = Backoffs(window)
        self._awaiting = awaiting
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadline = 0.0
        self._polling: Backoff | None = None  # the backoff of the request polled for

    def wrote(self, operation: str) -> None:
        """A request for `operation` was written (or will be, at the loop's next turn):
        poll for its answer, unless a poll is under way or the backoff says not to."""
        if self._polling is not None:
            return
        backoff = self.backoffs.of(operation)
        if not backoff.due():
            return
        self._polling = backoff
        self._deadline = time.perf_counter() + backoff.window
        self._loop = loop = asyncio.get_running_loop()
        loop.call_soon(self._turn)

    def _turn(self) -> None:
        polling = self._polling
        assert polling is not None
        if not self._awaiting():
            self._polling = None
            polling.ended(True)
        elif time.perf_counter() >= self._deadline:
            self._polling = None
            polling.ended(False)
        else:
            _yield()
            assert self._loop is not None
            self._loop.call_soon(self._turn)


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
                _yield()
                continue
            backoff.ended(True)
            return data
    return sock.recv(size)
