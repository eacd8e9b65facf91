"""Busy polling: when a wait polls, that a poll ends when what it awaits comes or its
window passes, that fruitless polls make the next ones rarer (the pure `Poller` and
`Backoff`, on a fake clock), and the client's two ways of polling on real sockets and a
real event loop."""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from collections.abc import Callable

import pytest

from ssb.client import _polling
from ssb.client._polling import answers_poller, receive
from ssb.protocol import MAX_POLL_WINDOW, Backoff, Backoffs, Poller, check_poll_window
from ssb.protocol._polling import MAX_SKIPPED


def polls_in(backoff: Backoff, waits: int) -> int:
    return sum(backoff.due() for _ in range(waits))


def fruitless(backoff: Backoff, polls: int) -> None:
    for _ in range(polls):
        while not backoff.due():
            pass
        backoff.ended(False)


# ---- the backoff -----------------------------------------------------------------------


def test_fruitless_polls_make_the_next_ones_rarer_and_one_that_pays_resets_them() -> None:
    backoff = Backoff(0.001)
    assert backoff.due()
    backoff.ended(False)  # the first fruitless poll: the next wait sleeps
    assert not backoff.due()
    assert backoff.due()
    backoff.ended(False)  # the second in a row: three waits sleep
    assert polls_in(backoff, 3) == 0
    assert backoff.due()
    backoff.ended(True)  # what it awaited came within the window: every wait polls again
    assert polls_in(backoff, 10) == 10
    backoff.ended(False)  # and the count starts again: one wait sleeps, not seven
    assert polls_in(backoff, 2) == 1


def test_polls_never_skip_more_than_the_bound() -> None:
    backoff = Backoff(0.001)
    fruitless(backoff, 100)
    assert polls_in(backoff, MAX_SKIPPED + 1) == 1


def test_a_window_of_zero_never_polls() -> None:
    assert polls_in(Backoff(0.0), 100) == 0
    assert polls_in(Backoffs(0.0).of("send"), 100) == 0


def test_each_kind_of_wait_learns_on_its_own() -> None:
    backoffs = Backoffs(0.001)
    commit = backoffs.of("commit")
    fruitless(commit, 5)
    assert backoffs.of("commit") is commit
    assert polls_in(backoffs.of("send"), 10) == 10
    assert polls_in(commit, 10) == 0


@pytest.mark.parametrize("window", [-1e-6, math.nan, math.inf, 0.5, "0.001", True, None])
def test_a_bad_window_is_refused_with_what_to_give(window: object) -> None:
    with pytest.raises(ValueError, match="busy_poll must be a number of seconds from 0"):
        check_poll_window(window)


def test_a_window_in_range_is_taken_as_seconds() -> None:
    assert check_poll_window(0) == 0.0
    assert check_poll_window(250e-6) == 250e-6
    assert check_poll_window(MAX_POLL_WINDOW) == MAX_POLL_WINDOW


# ---- the poller, on a fake clock -------------------------------------------------------


class Loop:
    """Turns scheduled one at a time, on a clock that moves as the test says."""

    def __init__(self) -> None:
        self.now = 0.0
        self.turns: list[Callable[[], None]] = []
        self.gave_way = 0

    def run_one(self) -> bool:
        if not self.turns:
            return False
        self.turns.pop(0)()
        return True

    def poller(self, awaiting: Callable[[], object], cpu: list[float] | None = None) -> Poller:
        def give_way() -> None:
            self.gave_way += 1

        # (the thread's processor time: by default all of the time, a processor of its own)
        cpu_clock = (lambda: self.now) if cpu is None else (lambda: cpu[0])
        return Poller(awaiting, lambda: self.now, self.turns.append, give_way, cpu_clock)


def test_a_poll_turns_until_what_it_awaits_comes() -> None:
    loop, waiting = Loop(), [True]
    poller, backoff = loop.poller(lambda: waiting[0]), Backoff(0.001)
    poller.start(backoff)
    for _ in range(5):
        loop.now += 0.0001
        assert loop.run_one()
    assert poller.polling and loop.gave_way == 5
    waiting[0] = False
    assert loop.run_one()
    assert not poller.polling and not loop.turns
    assert polls_in(backoff, 5) == 5  # it paid: no backoff


def test_a_poll_stops_when_its_window_passes_and_backs_off() -> None:
    loop = Loop()
    poller, backoff = loop.poller(lambda: True), Backoff(0.001)
    poller.start(backoff)
    loop.now += 0.0005
    assert loop.run_one() and poller.polling
    loop.now += 0.0005
    assert loop.run_one() and not poller.polling and not loop.turns
    assert not backoff.due()  # the next wait sleeps


@pytest.mark.parametrize(("cpu_share", "paid"), [(0.9, True), (0.3, False)])
def test_a_poll_that_spent_its_time_off_the_processor_counts_as_fruitless(
    cpu_share: float, paid: bool
) -> None:
    """What it awaited came, but other processes had the processor most of the time (no
    processor idle: a wake-up would have cost little): the next wait sleeps."""
    loop, waiting, cpu = Loop(), [True], [5.0]
    poller, backoff = loop.poller(lambda: waiting[0], cpu), Backoff(0.001)
    poller.start(backoff)
    for _ in range(4):
        loop.now += 0.0001
        cpu[0] += 0.0001 * cpu_share
        assert loop.run_one()
    waiting[0] = False
    assert loop.run_one() and not poller.polling
    assert backoff.due() is paid


def test_one_poll_at_a_time() -> None:
    loop = Loop()
    poller = loop.poller(lambda: True)
    poller.start(Backoff(0.001))
    poller.start(Backoff(0.001))
    assert len(loop.turns) == 1


def test_a_backed_off_wait_does_not_poll() -> None:
    loop = Loop()
    poller, backoff = loop.poller(lambda: True), Backoff(0.001)
    fruitless(backoff, 3)
    poller.start(backoff)
    assert not poller.polling and not loop.turns


# ---- the client's polling on real sockets ----------------------------------------------


def selector_timeouts(loop: asyncio.AbstractEventLoop) -> list[float | None]:
    """Record the timeout of each wait the loop's selector is asked for."""
    selector = loop._selector  # type: ignore[attr-defined]
    timeouts: list[float | None] = []
    select = selector.select

    def recording(timeout: float | None = None) -> object:
        timeouts.append(timeout)
        return select(timeout)

    selector.select = recording
    return timeouts


def run(main: Callable[[], object]) -> object:
    loop = asyncio.SelectorEventLoop()
    try:
        return loop.run_until_complete(main())  # type: ignore[arg-type]
    finally:
        loop.close()


def test_the_event_loop_never_blocks_while_an_answer_is_polled_for() -> None:
    async def main() -> list[float | None]:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        poller = answers_poller(lambda: not answer.done(), loop)
        timeouts = selector_timeouts(loop)
        poller.start(Backoff(0.5))
        loop.call_later(0.02, answer.set_result, None)
        await answer
        return timeouts

    timeouts = run(main)
    assert isinstance(timeouts, list) and len(timeouts) > 10
    assert all(timeout == 0 for timeout in timeouts[:-1])


def test_receive_polls_a_blocking_socket_and_gets_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer comes within the window: the next wait polls again, unless this poll
    spent most of its time off the processor (a busy machine, where polling only takes
    time from the others): then it skips."""
    judged: list[bool] = []  # what the real judgement said of each poll
    judge = _polling.had_a_processor

    def had_a_processor(spent: float, cpu_spent: float) -> bool:
        judged.append(judge(spent, cpu_spent))
        return judged[-1]

    monkeypatch.setattr(_polling, "had_a_processor", had_a_processor)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        backoff = Backoff(0.5)
        sender = threading.Timer(0.01, theirs.sendall, (b"answer",))
        sender.start()
        started = time.monotonic()
        assert receive(ours, backoff, 100) == b"answer"
        sender.join()
        assert time.monotonic() - started < 0.5
        assert len(judged) == 1  # it came within the window
        assert backoff.due() is judged[0]


@pytest.mark.parametrize("read_flags", [True, False])
def test_receive_sleeps_for_a_late_answer(
    monkeypatch: pytest.MonkeyPatch, read_flags: bool
) -> None:
    """It polls, then sleeps until the answer comes, which makes the next wait sleep
    (also where reads take no flags: a TLS socket, or a system without MSG_DONTWAIT)."""
    if not read_flags:
        monkeypatch.setattr(_polling, "_DONTWAIT", 0)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        backoff = Backoff(0.001)
        sender = threading.Timer(0.05, theirs.sendall, (b"late",))
        sender.start()
        assert receive(ours, backoff, 100) == b"late"
        sender.join()
        assert not backoff.due()
        assert ours.getblocking()  # (left as it was)
