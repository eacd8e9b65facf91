"""What code built on top of a connection needs from it: one `call` per request.

The scheduler (and anything else layered on the clients) is written against these
protocols rather than against `Connection` / `SyncConnection`, so the layers import
one way: connections import the scheduler, never the reverse.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from ._calls import Call

T = TypeVar("T")


class AsyncSession(Protocol):
    """An async connection: `await session.call(calls.send(...))`."""

    url: str

    async def call(self, request: Call[T]) -> T: ...


class SyncSession(Protocol):
    """A blocking connection: `session.call(calls.send(...))`."""

    url: str

    def call(self, request: Call[T]) -> T: ...
