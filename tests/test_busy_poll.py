"""Busy polling against a real daemon: a connection waiting for a prompt answer keeps its
event loop turning instead of sleeping in the kernel, `busy_poll=0` sleeps, and a bad
window is refused before anything connects; the daemon's own polling for the next
request, on a real event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from daemon import BrokerProcess

from ssb import client
from ssb.broker._server import NextRequests
from ssb.protocol import _polling

PINGS = 40


def sleeps_per_ping(url: str, busy_poll: float) -> float:
    """Pings, one at a time, on a loop whose selector records each time it was asked to
    wait; how many of those waits could block, per ping."""

    async def pings() -> int:
        loop = asyncio.get_running_loop()
        selector = loop._selector  # type: ignore[attr-defined]
        select: Callable[[float | None], object] = selector.select
        blocking = 0

        def recording(timeout: float | None = None) -> object:
            nonlocal blocking
            blocking += timeout is None or timeout > 0
            return select(timeout)

        async with await client.connect(url, busy_poll=busy_poll) as conn:
            await conn.ping()
            blocking = 0
            selector.select = recording
            for _ in range(PINGS):
                await conn.ping()
            selector.select = select
        return blocking

    loop = asyncio.SelectorEventLoop()
    try:
        return loop.run_until_complete(pings()) / PINGS
    finally:
        loop.close()


def test_a_polling_connection_gets_prompt_answers_without_sleeping(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every poll that got its answer counts as fruitful, as on a machine with a processor
    # idle: on a busy one (other tests beside this one) a poll that spent most of its
    # time off the processor counts as fruitless by design, and the next waits sleep
    # (tests/unit/test_polling.py checks that judgement).
    monkeypatch.setattr(_polling, "had_a_processor", lambda spent, cpu_spent: True)
    # the longest window: a ping's answer comes well within it, even on a busy machine
    assert sleeps_per_ping(broker.url, 0.01) < 0.5
    assert sleeps_per_ping(broker.url, 0.0) >= 1.0  # each answer is waited for asleep


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_the_blocking_client_polls_too(broker: BrokerProcess, tls: bool) -> None:
    url = broker.tls_url if tls else broker.url
    with client.connect_sync(url, busy_poll=0.01) as conn:
        for _ in range(PINGS):
            assert conn.ping()
        assert conn.reconnects == 0


@pytest.mark.parametrize(
    "connect",
    [
        lambda url: client.connect(url, busy_poll=-1.0),
        lambda url: asyncio.to_thread(client.connect_sync, url, busy_poll=float("nan")),
    ],
    ids=["async", "blocking"],
)
async def test_a_bad_window_is_refused_with_what_to_give(
    broker: BrokerProcess, connect: Callable[[str], Awaitable[object]]
) -> None:
    with pytest.raises(ValueError, match="busy_poll must be a number of seconds"):
        await connect(broker.url)


def test_the_daemon_polls_for_the_next_request_until_one_arrives() -> None:
    async def main() -> tuple[list[float | None], bool]:
        loop = asyncio.get_running_loop()
        selector = loop._selector  # type: ignore[attr-defined]
        select: Callable[[float | None], object] = selector.select
        timeouts: list[float | None] = []

        def recording(timeout: float | None = None) -> object:
            timeouts.append(timeout)
            return select(timeout)

        polls = NextRequests(0.5)
        selector.select = recording
        polls.answered()
        arrived = asyncio.Event()

        def request() -> None:
            polls.arrived += 1
            arrived.set()

        loop.call_later(0.02, request)
        await arrived.wait()
        await asyncio.sleep(0)  # (the poll's next turn sees the request)
        return timeouts, polls.poller.polling

    loop = asyncio.SelectorEventLoop()
    try:
        timeouts, polling = loop.run_until_complete(main())
    finally:
        loop.close()
    assert not polling
    assert len(timeouts) > 10 and all(timeout == 0 for timeout in timeouts[:-1])


def test_a_daemon_that_does_not_poll_serves_as_well(tmp_path: Path) -> None:
    daemon = BrokerProcess(tmp_path / "data", config={"busy_poll": 0}).start()
    try:
        with client.connect_sync(daemon.url) as conn:
            assert conn.ping()
    finally:
        daemon.kill()
