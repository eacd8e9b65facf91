"""Busy polling: waiting a moment for what comes next without sleeping in the kernel.

Theory of operation. A process that sleeps in the kernel while it waits for the other
side is woken when the bytes arrive, and on an otherwise idle machine that wake-up (the
scheduler, an interrupt to another processor, the way back out of the poll) costs tens
of microseconds. When the other side usually answers within a few hundred
microseconds, polling for a moment instead saves it: the client polls for its answer
after writing a request, the broker for the next request after writing its answers.
`Poller` is that loop, whatever turns it: each turn checks whether anything is still
awaited and whether the window has passed, gives the processor up to any other runnable
process (`give_way`), and asks for the next turn (`schedule`); the event loop polls its
sockets without blocking in between.

Whether a wait polls at all is learnt (`Backoff`): a poll whose window passed with
nothing come found nothing worth the processor time, and neither did one that got
what it awaited but spent most of its time off the processor (given away to other
runnable processes: a machine with no processor idle, where a wake-up costs little
and a poll only takes time from the others), so the next polls are skipped,
twice as many after each such poll in a row (up to `MAX_SKIPPED`), and a poll that
ends with what it awaited starts the count again. A party whose waits are long (commits
synced to disk, large transactions, a RECEIVE waiting for messages, a client thinking
between requests) so spends almost nothing on polling; one that talks to a peer that
answers at once saves the wake-ups. A window of 0 never polls.

Pure: the clocks, the scheduling and the giving way come in as functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

MAX_POLL_WINDOW: Final = 0.01  # seconds (a longer poll is a busy loop, not a wait)
MAX_SKIPPED: Final = 63  # waits skipped at most after fruitless polls


def check_poll_window(window: object, name: str = "busy_poll") -> float:
    """`window` as seconds, or ValueError saying what is wrong (`name`: the setting)."""
    if (
        isinstance(window, bool)
        or not isinstance(window, (int, float))
        or not 0.0 <= window <= MAX_POLL_WINDOW  # (also refuses NaN)
    ):
        raise ValueError(
            f"{name} must be a number of seconds from 0 (off) to {MAX_POLL_WINDOW:g},"
            f" not {window!r}"
        )
    return float(window)


class Backoff:
    """Whether the next wait polls first, after how the last polls went."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._fruitless = 0  # polls in a row whose window passed with nothing come
        self._skip = 0  # waits left that do not poll

    def due(self) -> bool:
        """Whether this wait polls (counts a skipped one)."""
        if not self.window:
            return False
        if self._skip:
            self._skip -= 1
            return False
        return True

    def ended(self, came: bool) -> None:
        """A poll ended: with what it awaited (`came`), or at the end of its window."""
        if came:
            self._fruitless = 0
            return
        self._fruitless = min(self._fruitless + 1, MAX_SKIPPED.bit_length())
        self._skip = min((1 << self._fruitless) - 1, MAX_SKIPPED)


def had_a_processor(spent: float, cpu_spent: float) -> bool:
    """Whether a poll that took `spent` seconds ran on a processor of its own: at least
    half of that time on its thread's processor time (`cpu_spent`). Other processes took
    the rest: the machine has none idle, where a wake-up costs little and a poll takes
    from them, so such a poll counts as fruitless too."""
    return 2 * cpu_spent >= spent


NEVER_POLL: Final = Backoff(0.0)  # (a window of 0 never polls: this one never changes)


class Backoffs:
    """A backoff for each kind of wait (a client's: each operation it sends)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._by_kind: dict[str, Backoff] = {}  # (kinds are the caller's own names)

    def of(self, kind: str) -> Backoff:
        if not self.window:
            return NEVER_POLL
        backoff = self._by_kind.get(kind)
        if backoff is None:
            backoff = self._by_kind[kind] = Backoff(self.window)
        return backoff


@dataclass(eq=False)
class Poller:
    """One party's polling, one poll at a time (`awaiting`: whether what it polls for
    has still not come; `cpu_clock`: this thread's processor time)."""

    awaiting: Callable[[], object]
    clock: Callable[[], float]
    schedule: Callable[[Callable[[], None]], object]
    give_way: Callable[[], object]
    cpu_clock: Callable[[], float]
    _polling: Backoff | None = field(default=None, init=False)  # the backoff of the poll under way
    _deadline: float = field(default=0.0, init=False)
    _started: float = field(default=0.0, init=False)  # when the poll under way started
    _cpu_started: float = field(default=0.0, init=False)  # and by `cpu_clock`

    @property
    def polling(self) -> bool:
        return self._polling is not None

    def start(self, backoff: Backoff) -> None:
        """Poll for at most `backoff`'s window, unless a poll is under way or `backoff`
        says not to."""
        if self._polling is not None or not backoff.due():
            return
        self._polling = backoff
        self._started = now = self.clock()
        self._deadline = now + backoff.window
        self._cpu_started = self.cpu_clock()
        self.schedule(self._turn)

    def _turn(self) -> None:
        backoff = self._polling
        assert backoff is not None
        if not self.awaiting():
            self._polling = None
            spent = self.clock() - self._started
            backoff.ended(had_a_processor(spent, self.cpu_clock() - self._cpu_started))
        elif self.clock() >= self._deadline:
            self._polling = None
            backoff.ended(False)
        else:
            self.give_way()
            self.schedule(self._turn)
