"""What code built on top of a connection needs from it: one `call` per request.

The scheduler (and anything else layered on the clients) is written against these
protocols rather than against `Connection` / `SyncConnection`, so the layers import
one way: connections import the scheduler, never the reverse.

Logic that makes several requests is written once, as `Steps`: a generator that
yields each request, receives its answer (or has its error thrown in at the `yield`)
and returns its result. `run_steps` drives one over an async connection and
`run_steps_sync` over a blocking one, so the async and the blocking API share it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from ._calls import Call

T = TypeVar("T")
R = TypeVar("R")

Steps: TypeAlias = Generator[Call[Any], Any, T]


class AsyncSession(Protocol):
    """An async connection: `await session.call(calls.send(...))`."""

    url: str

    async def call(self, request: Call[T]) -> T: ...


class SyncSession(Protocol):
    """A blocking connection: `session.call(calls.send(...))`."""

    url: str

    def call(self, request: Call[T]) -> T: ...


class Stepper(Generic[R]):
    """Walks a generator of requests: `next()` is the next request to make (None once
    the generator returned `result`); `answered` / `failed` say how it went."""

    def __init__(self, steps: Generator[R, Any, Any]) -> None:
        self.steps = steps
        self.answer: Any = None
        self.failure: BaseException | None = None
        self.result: Any = None

    def next(self) -> R | None:
        answer, failure, self.answer, self.failure = self.answer, self.failure, None, None
        try:
            return self.steps.send(answer) if failure is None else self.steps.throw(failure)
        except StopIteration as done:
            self.result = done.value
            return None

    def answered(self, answer: Any) -> None:
        self.answer = answer

    def failed(self, failure: BaseException) -> None:
        self.failure = failure


async def run_steps(session: AsyncSession, steps: Steps[T]) -> T:
    """Make each request `steps` yields on `session`; return what it returns."""
    stepper = Stepper(steps)
    while (request := stepper.next()) is not None:
        try:
            stepper.answered(await session.call(request))
        except Exception as exc:  # the steps may handle it; if not, it comes back out
            stepper.failed(exc)
    return stepper.result  # type: ignore[no-any-return]


def run_steps_sync(session: SyncSession, steps: Steps[T]) -> T:
    """`run_steps` on a blocking connection."""
    stepper = Stepper(steps)
    while (request := stepper.next()) is not None:
        try:
            stepper.answered(session.call(request))
        except Exception as exc:  # the steps may handle it; if not, it comes back out
            stepper.failed(exc)
    return stepper.result  # type: ignore[no-any-return]
