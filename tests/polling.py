"""Waiting for a condition a test cannot be told about: poll it, with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

POLL_INTERVAL = 0.05


async def wait_until(
    probe: Callable[[], Awaitable[T]],
    what: str,
    timeout: float = 30.0,
    interval: float = POLL_INTERVAL,
) -> T:
    """Poll `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last: {value!r}"
            )
        await asyncio.sleep(interval)
