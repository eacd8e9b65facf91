"""Waiting for a condition nothing announces: poll it, with a deadline, never a bare sleep.

`wait_until` polls a coroutine function, `wait_until_sync` a plain one, every `interval`
seconds until what it returns satisfies `until` (by default: is truthy), and returns that
value. Past the deadline the wait fails with AssertionError, naming what it waited for and
the last value seen, as a failed check in a test does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

T = TypeVar("T")

POLL_INTERVAL: Final = 0.05


@dataclass(eq=False)
class _Wait(Generic[T]):
    """One wait: whether a value ends it; fails once the deadline has passed."""

    what: str
    timeout: float
    until: Callable[[T], object]
    deadline: float = field(init=False)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    def over(self, value: T) -> bool:
        if self.until(value):
            return True
        if time.monotonic() > self.deadline:
            raise AssertionError(
                f"timed out after {self.timeout:g} s waiting for {self.what}; last: {value!r}"
            )
        return False


async def wait_until(
    probe: Callable[[], Awaitable[T]],
    what: str,
    timeout: float = 30.0,
    interval: float = POLL_INTERVAL,
    *,
    until: Callable[[T], object] = bool,
) -> T:
    """Await `probe()` every `interval` seconds until `until` holds for its value.

    Args:
        probe: reads the state waited for (a view, a file, a counter).
        what: what is waited for, in words, for the failure's message.
        timeout: seconds before the wait fails.
        until: whether a value ends the wait (default: it is truthy).

    Returns:
        The first value for which `until` holds.

    Raises:
        AssertionError: `timeout` seconds passed first.
    """
    wait = _Wait(what, timeout, until)
    while not wait.over(value := await probe()):
        await asyncio.sleep(interval)
    return value


def wait_until_sync(
    probe: Callable[[], T],
    what: str,
    timeout: float = 30.0,
    interval: float = POLL_INTERVAL,
    *,
    until: Callable[[T], object] = bool,
) -> T:
    """`wait_until` for a blocking `probe`: calls it every `interval` seconds until `until`
    holds for its value, and returns that value (AssertionError after `timeout` seconds)."""
    wait = _Wait(what, timeout, until)
    while not wait.over(value := probe()):
        time.sleep(interval)
    return value
