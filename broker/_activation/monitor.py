"""Queue monitors: the state machine and the rule that decides activation (pure).

Theory of operation (seed 001, DESIGN.md §6). A queue monitor follows Service Broker's
sys.dm_broker_queue_monitors: INACTIVE (nothing to do), NOTIFIED (it activated and waits
for a RECEIVE), RECEIVES_OCCURRING (RECEIVEs run); `TRANSITIONS` is the whole state
machine, and a pair not in it is a bug. `activation_needed` is seed 001's two conditions
as one pure function. An external reader's life is `TASK_TRANSITIONS`: RUNNING ->
STOP_REQUESTED -> ENDED. Nothing here does I/O or reads a clock (`manager` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final, TypeVar

from .workers import ActivatedTask


class MonitorState(Enum):
    INACTIVE = "INACTIVE"
    NOTIFIED = "NOTIFIED"
    RECEIVES_OCCURRING = "RECEIVES_OCCURRING"


class MonitorInput(Enum):
    ACTIVATED = "activated"  # a task was started or an event notification posted
    RECEIVED = "received"  # a RECEIVE or GET CONVERSATION GROUP ran on the queue
    TIMED_OUT = "timed out"  # notified, and no RECEIVE within notification_timeout
    IDLE = "idle"  # no ready message and no activated task


_S, _I = MonitorState, MonitorInput
TRANSITIONS: Final[dict[tuple[MonitorState, MonitorInput], MonitorState]] = {
    (_S.INACTIVE, _I.ACTIVATED): _S.NOTIFIED,
    (_S.INACTIVE, _I.RECEIVED): _S.RECEIVES_OCCURRING,
    (_S.INACTIVE, _I.TIMED_OUT): _S.INACTIVE,
    (_S.INACTIVE, _I.IDLE): _S.INACTIVE,
    (_S.NOTIFIED, _I.ACTIVATED): _S.NOTIFIED,
    (_S.NOTIFIED, _I.RECEIVED): _S.RECEIVES_OCCURRING,
    (_S.NOTIFIED, _I.TIMED_OUT): _S.INACTIVE,
    (_S.NOTIFIED, _I.IDLE): _S.NOTIFIED,
    (_S.RECEIVES_OCCURRING, _I.ACTIVATED): _S.NOTIFIED,
    (_S.RECEIVES_OCCURRING, _I.RECEIVED): _S.RECEIVES_OCCURRING,
    (_S.RECEIVES_OCCURRING, _I.TIMED_OUT): _S.RECEIVES_OCCURRING,
    (_S.RECEIVES_OCCURRING, _I.IDLE): _S.INACTIVE,
}


class ExternalState(Enum):
    RUNNING = "RUNNING"
    STOP_REQUESTED = "STOP_REQUESTED"
    ENDED = "ENDED"


class ExternalInput(Enum):
    STOP = "stop"  # request_stop named it
    END = "end"  # end_task, or its connection closed


_E, _X = ExternalState, ExternalInput
TASK_TRANSITIONS: Final[dict[tuple[ExternalState, ExternalInput], ExternalState]] = {
    (_E.RUNNING, _X.STOP): _E.STOP_REQUESTED,
    (_E.RUNNING, _X.END): _E.ENDED,
    (_E.STOP_REQUESTED, _X.STOP): _E.STOP_REQUESTED,
    (_E.STOP_REQUESTED, _X.END): _E.ENDED,
    (_E.ENDED, _X.STOP): _E.ENDED,
    (_E.ENDED, _X.END): _E.ENDED,
}


State = TypeVar("State", bound=Enum)
Input = TypeVar("Input", bound=Enum)


def step(
    table: Mapping[tuple[State, Input], State], state: State, event: Input, what: str
) -> State:
    """The state `event` moves `state` to in `table`. The tables are complete, so a
    miss is a bug worth hearing about: RuntimeError naming `what`."""
    try:
        return table[(state, event)]
    except KeyError:
        raise RuntimeError(f"{what}: no transition for {state.name} on {event.name}") from None


@dataclass(eq=False)
class ExternalTask(ActivatedTask):
    """A reader that an external activator started (a Spark task) and that registered."""

    activator: str = ""  # who started it, e.g. "spark-bridge:<id>"
    job: str | None = None  # the activator's job (Spark: the job group)
    job_id: int | None = None  # Spark: the job id
    job_task_id: int | None = None  # Spark: the task (attempt) id
    executor: str | None = None  # Spark: executor id and host
    state: ExternalState = ExternalState.RUNNING

    def feed(self, event: ExternalInput) -> None:
        self.state = step(TASK_TRANSITIONS, self.state, event, f"external task {self.task_id}")

    @property
    def stopping(self) -> bool:
        return self.state is not ExternalState.RUNNING


def activation_needed(
    *,
    ready: int,
    receivable: bool = True,
    arrived_into_empty: bool,
    running: int,
    waiting: int,
    last_empty_rowset: float | None,
    now: float,
    window: float,
) -> bool:
    """Seed 001's two conditions; pure, so the rule reads (and tests) on its own.

    `receivable`: some ready message is in a group no transaction holds. Messages that
    transactions hold are work for their holders, not for a new reader, except that one
    more reader may come and wait for them (the seed's example: one busy conversation has
    the reader that holds it and a second waiting in RECEIVE, never a third, even in the
    instant when the holder is between its COMMIT and its next RECEIVE)."""
    if ready <= 0:
        return False
    if arrived_into_empty and running == 0:
        return True
    recently_empty = last_empty_rowset is not None and now - last_empty_rowset < window
    return waiting == 0 and not recently_empty and (receivable or running <= 1)


class QueueMonitor:
    """What activation knows about one queue."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.state = MonitorState.INACTIVE
        self.tasks: dict[int, ActivatedTask] = {}
        self.last_activated: float | None = None
        self.notified_at: float | None = None
        self.arrived_into_empty = False
        self.check_scheduled = False
        self.retry_after = 0.0
        self.tasks_started = 0
        self.tasks_failed = 0
        self.notifications = 0
        self.last_error: str | None = None

    def feed(self, event: MonitorInput) -> None:
        self.state = step(TRANSITIONS, self.state, event, f"queue monitor {self.queue}")

    def starting(self, now: float, timeout: float) -> bool:
        """A task it started has not reached its first RECEIVE yet (within timeout)."""
        return any(not t.received and now - t.started < timeout for t in self.tasks.values())
