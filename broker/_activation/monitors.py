"""The queue monitors and activated tasks of one broker; the core's `QueueListener`.

Theory of operation. The core tells activation what happens to queues (a message
arrived, a RECEIVE ran, a rollback, a queue altered), and activation needs the core
(its queues, the sessions waiting in RECEIVE, event notifications): a true cycle. It is
cut here. `Monitors` is made first and needs nothing: the core takes it as its
listener at construction, and the activation manager, built after the core, takes it
at its own. What others ask about activation lives here with them: every activated
task (views, metrics, the execution log) and the one-time tokens of the internal ones
not attached yet (the client port's login, which starts before activation).

A hook runs inside one of the core's synchronous stretches, so it only records: a
monitor's state-machine input, an activated task that reached its queue, a check that
is due, a queue that was altered, an external reader whose session closed. Then it
wakes the manager (`wakeup`), whose task acts on what was recorded (`take`) one turn of
the event loop later, as a scheduled check did. A queue without a monitor costs one
dictionary lookup per message. `stopping(session)`, which RECEIVE asks, is answered at
once: the session carries its task.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .._core.queues import Queue
from .._core.receive import Waiter
from .._core.transactions import Session
from .monitor import ExternalState, ExternalTask, MonitorInput, QueueMonitor
from .workers import ActivatedTask


@dataclass(slots=True)
class Recorded:
    """What the hooks recorded since the manager last looked."""

    altered: list[str] = field(default_factory=list)  # queues to reconcile, in order
    closed: list[ExternalTask] = field(default_factory=list)  # readers whose session closed
    due: list[QueueMonitor] = field(default_factory=list)  # monitors whose check is due


class Monitors:
    """Every queue monitor and activated task of one broker; the core's QueueListener.
    The activation manager alone changes them."""

    def __init__(self) -> None:
        self.by_queue: dict[str, QueueMonitor] = {}
        self.tasks: dict[int, ActivatedTask] = {}  # every activated task, by id
        self.tokens: dict[str, ActivatedTask] = {}  # internal tasks not attached yet
        self.wakeup = asyncio.Event()  # something was recorded
        self._recorded = Recorded()

    def task_login(self, user: str, password: str) -> bool:
        """A worker may log in as its task's EXECUTE AS user with the task's token."""
        task = self.tokens.get(password)
        return task is not None and task.session is None and task.execute_as == user

    def request(self, monitor: QueueMonitor) -> None:
        """Have the manager check `monitor` (once, however often asked before it does)."""
        if not monitor.check_scheduled:
            monitor.check_scheduled = True
            self._recorded.due.append(monitor)
            self.wakeup.set()

    def take(self) -> Recorded:
        """What was recorded since the last call (the manager's, when woken)."""
        recorded, self._recorded = self._recorded, Recorded()
        self.wakeup.clear()
        return recorded

    # ---- QueueListener: the core's events (on the loop; never block) ------------------

    def message_arrived(self, queue: Queue) -> None:
        monitor = self.by_queue.get(queue.name)
        if monitor is not None:
            if queue.ready == 1:
                monitor.arrived_into_empty = True
            self.request(monitor)

    def received(self, queue: Queue, session: Session, empty: bool) -> None:
        task = session.task
        if isinstance(task, ActivatedTask) and task.queue == queue.name:
            task.received = True
        monitor = self.by_queue.get(queue.name)
        if monitor is not None:
            monitor.feed(MonitorInput.RECEIVED)
            self.request(monitor)

    def rolled_back(self, queue: Queue) -> None:
        monitor = self.by_queue.get(queue.name)
        if monitor is not None:
            self.request(monitor)

    def altered(self, queue: Queue) -> None:
        self._recorded.altered.append(queue.name)
        self.wakeup.set()

    def waiting_changed(self, queue: Queue) -> None:
        monitor = self.by_queue.get(queue.name)
        if monitor is not None:
            for waiter in queue.waiters:  # a task blocked in its first RECEIVE has arrived
                assert isinstance(waiter, Waiter)
                task = waiter.txn.session.task
                if isinstance(task, ActivatedTask) and task.queue == queue.name:
                    task.received = True
            self.request(monitor)

    def session_closed(self, session: Session) -> None:
        """A reader's connection closed: its external task ends (and frees its place)."""
        task = session.task
        if isinstance(task, ExternalTask) and task.state is not ExternalState.ENDED:
            self._recorded.closed.append(task)
            self.wakeup.set()

    def stopping(self, session: Session) -> bool:
        """A reader asked to stop gets nothing from RECEIVE."""
        task = session.task
        return isinstance(task, ExternalTask) and task.stopping
