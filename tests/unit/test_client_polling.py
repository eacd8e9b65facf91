"""The client's busy polling: when it polls, that it finds answers without sleeping, and
that it stops paying for polls that find nothing."""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time

import pytest

from ssb.client import _polling
from ssb.client._polling import MAX_SKIPPED, Backoff, Backoffs, BusyPoll, check_window, receive


def polls_in(backoff: Backoff, waits: int) -> int:
    return sum(backoff.due() for _ in range(waits))


def test_fruitless_polls_make_the_next_ones_rarer_and_an_answer_resets_them() -> None:
    backoff = Backoff(0.001)
    assert backoff.due()
    backoff.ended(False)  # the first fruitless poll: the next wait sleeps
    assert not backoff.due()
    assert backoff.due()
    backoff.ended(False)  # the second in a row: three waits sleep
    assert polls_in(backoff, 3) == 0
    assert backoff.due()
    backoff.ended(True)  # an answer came within the window: every wait polls again
    assert polls_in(backoff, 10) == 10
    backoff.ended(False)  # and the count starts again: one wait sleeps, not seven
    assert polls_in(backoff, 2) == 1


def test_polls_never_skip_more_than_the_bound() -> None:
    backoff = Backoff(0.001)
    for _ in range(100):
        while not backoff.due():
            pass
        backoff.ended(False)
    assert polls_in(backoff, MAX_SKIPPED + 1) == 1


def test_a_window_of_zero_never_polls() -> None:
    assert polls_in(Backoff(0.0), 100) == 0
    assert polls_in(Backoffs(0.0).of("send"), 100) == 0


def test_each_operation_learns_on_its_own() -> None:
    backoffs = Backoffs(0.001)
    commit = backoffs.of("commit")
    for _ in range(5):
        while not commit.due():
            pass
        commit.ended(False)
    assert backoffs.of("commit") is commit
    assert polls_in(backoffs.of("send"), 10) == 10
    assert polls_in(commit, 10) == 0


@pytest.mark.parametrize("window", [-1e-6, math.nan, math.inf, 0.5, "0.001", True, None])
def test_a_bad_window_is_refused_with_what_to_give(window: object) -> None:
    with pytest.raises(ValueError, match="busy_poll must be a number of seconds"):
        check_window(window)


def test_check_window_takes_seconds_in_range() -> None:
    assert check_window(0) == 0.0
    assert check_window(250e-6) == 250e-6


def count_sleeps(loop: asyncio.AbstractEventLoop) -> list[float | None]:
    """Record each time the loop's selector is asked to wait (the timeouts it got)."""
    selector = loop._selector  # type: ignore[attr-defined]
    timeouts: list[float | None] = []
    select = selector.select

    def recording(timeout: float | None = None) -> object:
        timeouts.append(timeout)
        return select(timeout)

    selector.select = recording
    return timeouts


def test_the_loop_polls_without_blocking_until_the_answer_is_in() -> None:
    """While an answer is awaited within the window, the event loop never blocks."""

    async def main() -> tuple[list[float | None], bool]:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        poll = BusyPoll(0.5, lambda: not answer.done())
        timeouts = count_sleeps(loop)
        poll.wrote("ping")
        loop.call_later(0.02, answer.set_result, None)
        await answer
        answered = poll.backoffs.of("ping").due()  # it ended with its answer: no backoff
        return timeouts, answered

    loop = asyncio.SelectorEventLoop()
    try:
        timeouts, answered = loop.run_until_complete(main())
    finally:
        loop.close()
    assert answered
    assert len(timeouts) > 10
    assert all(timeout == 0 for timeout in timeouts[:-1])


def test_the_loop_sleeps_once_the_window_has_passed() -> None:
    async def main() -> tuple[list[float | None], BusyPoll]:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        poll = BusyPoll(0.001, lambda: not answer.done())
        poll.wrote("commit")
        await asyncio.sleep(0.01)  # the window ends while the answer is still due
        timeouts = count_sleeps(loop)
        loop.call_later(0.05, answer.set_result, None)
        await answer
        return timeouts, poll

    loop = asyncio.SelectorEventLoop()
    try:
        timeouts, poll = loop.run_until_complete(main())
    finally:
        loop.close()
    assert any(timeout is None or timeout > 0 for timeout in timeouts)
    assert not poll.backoffs.of("commit").due()  # the fruitless poll made the next one sleep
    assert poll.backoffs.of("receive").due()  # (another operation's polls are its own)


def test_receive_polls_a_blocking_socket_and_gets_the_answer() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        backoff = Backoff(0.5)
        sender = threading.Timer(0.01, theirs.sendall, (b"answer",))
        sender.start()
        started = time.monotonic()
        assert receive(ours, backoff, 100) == b"answer"
        sender.join()
        assert time.monotonic() - started < 0.5
        assert backoff.due()  # it came within the window


def test_receive_blocks_after_a_fruitless_poll() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        backoff = Backoff(0.001)
        sender = threading.Timer(0.05, theirs.sendall, (b"late",))
        sender.start()
        assert receive(ours, backoff, 100) == b"late"  # polled, then slept until it came
        sender.join()
        assert not backoff.due()


def test_without_nonblocking_reads_receive_just_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_polling, "_DONTWAIT", 0)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        backoff = Backoff(0.001)
        sender = threading.Timer(0.05, theirs.sendall, (b"late",))
        sender.start()
        assert receive(ours, backoff, 100) == b"late"
        sender.join()
        assert backoff.due()  # it never polled, so nothing was counted as fruitless
