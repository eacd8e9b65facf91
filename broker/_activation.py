"""Activation: queue monitors decide when a queue needs another reader and start one.

Theory of operation (seed 001, DESIGN.md §6). A queue monitor exists for every
queue with activation STATUS = ON or a QUEUE_ACTIVATION event notification. It
checks whether activation is needed every `check_interval` seconds and whenever
the engine reports that a message arrived, a RECEIVE ran, a transaction that
received rolled back, a session started or stopped waiting, or the queue was
altered; and when one of its activated tasks ends. Hooks run on the event loop and
only schedule a check (coalesced, `call_soon`), so the engine is never slowed.

Activation is needed when the queue is ON, has ready messages, and either
  (a) the message just arrived in a queue with no other ready message while no
      activated task runs, or
  (b) no session waits in RECEIVE / GET CONVERSATION GROUP without WHERE, and none
      of those returned an empty result for `empty_rowset_window` seconds.
A reader blocked because every message belongs to a group locked by another
transaction is a waiting session, so one busy conversation group never gets more
than one extra reader.

Internal activation (activation STATUS = ON) starts another activated task while
fewer than MAX_QUEUE_READERS run and no task it started is still on its way to its
first RECEIVE (until it runs or waits in one, for at most `notification_timeout`):
readers are added one at a time, each after the previous one reached its queue, as
Service Broker ramps up, and a process still starting is never mistaken for missing
readers. After a task fails the monitor waits one `check_interval` before starting
the next, so a procedure that fails at once cannot spin. External activation (no internal activation, but a
QUEUE_ACTIVATION event notification) posts an EventNotification to the
notification service, then posts no other until a RECEIVE runs on the queue or
`notification_timeout` passes.

External readers (the Spark bridge's tasks, or any program acting as an external
activator's reader) are activated tasks too: a session calls `register_task` for a
queue and becomes an `ExternalTask` of its monitor, counted with the internal tasks
against MAX_QUEUE_READERS (a registration beyond it is refused), shown in
`activated_tasks` with its activator, job, job task and executor, and ended by
`end_task` or by its connection closing (found at the next check). `request_stop`
asks external readers to finish cooperatively: a stopping reader's RECEIVE and GET
CONVERSATION GROUP return nothing at once (one it is blocked in is woken empty), so
it commits the transaction it has, sees an empty queue and exits. Stopping a whole
activator also stops its readers that register afterwards (Spark tasks that were
still waiting for a slot). An external
task's life is `TASK_TRANSITIONS`: RUNNING -> STOP_REQUESTED -> ENDED.

A monitor's state follows Service Broker's sys.dm_broker_queue_monitors: INACTIVE
(nothing to do), NOTIFIED (it activated and waits for a RECEIVE), RECEIVES_OCCURRING
(RECEIVEs run); `TRANSITIONS` is the whole state machine.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, Final

from ssb.protocol import ErrorCode

from ._config import ConfigError
from ._daemon import START_HOOKS
from ._engine import Engine, MaybeAwaitable, QueueListener
from ._errors import BrokerError, bad_argument, not_found
from ._queues import Group, Queue
from ._tasks import ActivatedTask, WorkerPool
from ._transactions import Session
from ._views import VIEWS, _time

if TYPE_CHECKING:
    from ._daemon import Broker

log = logging.getLogger("ssb.activation")

QUEUE_ACTIVATION: Final = "QUEUE_ACTIVATION"


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

_TEXT_LIMIT: Final = 200  # activator, job and executor names
_JOBS_KEPT: Final = 1000  # job ids remembered for readers that register late
_STOPPED_KEPT: Final = 3600.0  # how long a stopped activator's late readers are stopped


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
        try:
            self.state = TASK_TRANSITIONS[(self.state, event)]
        except KeyError:  # the table is complete; a miss is a bug worth hearing about
            raise RuntimeError(
                f"external task {self.task_id}: no transition for {self.state.name} on {event.name}"
            ) from None

    @property
    def stopping(self) -> bool:
        return self.state is not ExternalState.RUNNING


def _text(value: object, what: str, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > _TEXT_LIMIT:
        raise bad_argument(f"{what} must be a non-empty text of at most {_TEXT_LIMIT} characters")
    return value


def _number(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad_argument(f"{what} must be an integer >= 0")
    return value


_NO_GROUP: Final = Group(uuid.UUID(int=0))  # stands in for "nothing" when a wait is ended


_COUNTS: Final = ("idle_workers", "prestart_workers", "execution_log_rows")


@dataclass(frozen=True, slots=True)
class ActivationSettings:
    """The daemon config's [activation] section."""

    check_interval: float = 5.0  # periodic check of every queue monitor
    empty_rowset_window: float = 5.0  # the "few seconds" of condition (b)
    notification_timeout: float = 60.0  # wait for a RECEIVE after activating
    idle_workers: int = 4  # warm worker processes kept for reuse
    prestart_workers: int = 0  # warm workers started with the daemon
    worker_start_timeout: float = 30.0
    python_path: tuple[str, ...] = ()  # extra import paths for procedures
    execution_log_rows: int = 10000  # scheduler execution log rows kept

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> ActivationSettings:
        known = {f.name: f for f in fields(cls)}
        unknown = set(section) - set(known)
        if unknown:
            raise ConfigError(
                f"unknown [activation] setting(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(known)}"
            )
        values: dict[str, Any] = {}
        for name, value in section.items():
            if name == "python_path":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ConfigError("[activation] python_path must be a list of directories")
                values[name] = tuple(value)
            elif name in _COUNTS:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ConfigError(f"[activation] {name} must be an integer >= 0")
                values[name] = value
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise ConfigError(f"[activation] {name} must be a number of seconds > 0")
                values[name] = float(value)
        return cls(**values)


def activation_needed(
    *,
    ready: int,
    arrived_into_empty: bool,
    running: int,
    waiting: int,
    last_empty_rowset: float | None,
    now: float,
    window: float,
) -> bool:
    """Seed 001's two conditions; pure, so the rule reads (and tests) on its own."""
    if ready <= 0:
        return False
    if arrived_into_empty and running == 0:
        return True
    recently_empty = last_empty_rowset is not None and now - last_empty_rowset < window
    return waiting == 0 and not recently_empty


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
        try:
            self.state = TRANSITIONS[(self.state, event)]
        except KeyError:  # the table is complete; a miss is a bug worth hearing about
            raise RuntimeError(
                f"queue monitor {self.queue}: no transition for {self.state.name} on {event.name}"
            ) from None

    def starting(self, now: float, timeout: float) -> bool:
        """A task it started has not reached its first RECEIVE yet (within timeout)."""
        return any(not t.received and now - t.started < timeout for t in self.tasks.values())


TaskEndHook = Callable[[ActivatedTask, "str | None"], None]


class ActivationManager(QueueListener):
    """All queue monitors of one broker, their activated tasks and the worker pool."""

    def __init__(
        self,
        engine: Engine,
        settings: ActivationSettings,
        pool: WorkerPool,
        users: dict[str, str],
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.pool = pool
        self.users = users
        self.monitors: dict[str, QueueMonitor] = {}
        self.tasks: dict[int, ActivatedTask] = {}
        self.tokens: dict[str, ActivatedTask] = {}
        self.task_end_hooks: list[TaskEndHook] = []
        self.stopped_activators: dict[str, float] = {}  # request_stop(activator=) -> when
        self.job_ids: dict[str, int] = {}  # label_job: job -> id, for readers still to come
        self._next_task = 1
        self._jobs: set[asyncio.Task[Any]] = set()
        self._closed = False

    # ---- life ------------------------------------------------------------------

    def start(self) -> None:
        for name in list(self.engine.queues):
            self._reconcile(name)
        self.own(self._tick())

    def own(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` as a task owned (and cancelled on close) by the manager."""
        job = self.engine.loop.create_task(coro)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def close(self) -> None:
        self._closed = True
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)
        await self.pool.close()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.settings.check_interval)
            try:
                self._sweep()
                for name in set(self.engine.queues) | set(self.monitors):
                    self._reconcile(name)
            except Exception:  # a bug here must not end the periodic checks for good
                log.exception("queue monitor check failed")

    # ---- which queues have a monitor ------------------------------------------------

    def _external(self, queue: str) -> bool:
        return any(
            n.queue == queue and n.event == QUEUE_ACTIVATION
            for n in self.engine.catalog.notifications.values()
        )

    def _wanted(self, queue: str) -> bool:
        q = self.engine.queues.get(queue)
        return q is not None and (q.definition.activation.status or self._external(queue))

    def _reconcile(self, name: str) -> None:
        monitor = self.monitors.get(name)
        if self._wanted(name):
            if monitor is None:
                monitor = self.monitors[name] = QueueMonitor(name)
            self._request(monitor)
        elif monitor is not None and not monitor.tasks:
            del self.monitors[name]

    # ---- QueueListener: the engine's events (on the loop; never block) ---------------

    def message_arrived(self, queue: Queue) -> None:
        monitor = self.monitors.get(queue.name)
        if monitor is not None:
            if queue.ready == 1:
                monitor.arrived_into_empty = True
            self._request(monitor)

    def received(self, queue: Queue, session: Session, empty: bool) -> None:
        task = session.task
        if isinstance(task, ActivatedTask) and task.queue == queue.name:
            task.received = True
        monitor = self.monitors.get(queue.name)
        if monitor is not None:
            monitor.feed(MonitorInput.RECEIVED)
            self._request(monitor)

    def rolled_back(self, queue: Queue) -> None:
        monitor = self.monitors.get(queue.name)
        if monitor is not None:
            self._request(monitor)

    def altered(self, queue: Queue) -> None:
        self._reconcile(queue.name)

    def waiting_changed(self, queue: Queue) -> None:
        monitor = self.monitors.get(queue.name)
        if monitor is not None:
            for waiter in queue.waiters:  # a task blocked in its first RECEIVE has arrived
                task = waiter.txn.session.task
                if isinstance(task, ActivatedTask) and task.queue == queue.name:
                    task.received = True
            self._request(monitor)

    # ---- the check ------------------------------------------------------------------

    def _request(self, monitor: QueueMonitor) -> None:
        if not monitor.check_scheduled and not self._closed:
            monitor.check_scheduled = True
            self.engine.loop.call_soon(self._check, monitor)

    def _check(self, monitor: QueueMonitor) -> None:
        monitor.check_scheduled = False
        if self._closed or self.monitors.get(monitor.queue) is not monitor:
            return
        queue = self.engine.queues.get(monitor.queue)
        if queue is None or not self._wanted(monitor.queue):
            self._reconcile(monitor.queue)
            return
        arrived, monitor.arrived_into_empty = monitor.arrived_into_empty, False
        if not queue.definition.status:
            return
        now = time.time()
        settings = self.settings
        running = len(monitor.tasks)
        if queue.ready == 0 and running == 0:
            monitor.feed(MonitorInput.IDLE)
        if (
            monitor.state is MonitorState.NOTIFIED
            and monitor.notified_at is not None
            and now - monitor.notified_at >= settings.notification_timeout
        ):
            monitor.feed(MonitorInput.TIMED_OUT)
        if not activation_needed(
            ready=queue.ready,
            arrived_into_empty=arrived,
            running=running,
            waiting=self.engine.waiting_sessions(queue),
            last_empty_rowset=queue.last_empty_rowset,
            now=now,
            window=settings.empty_rowset_window,
        ):
            return
        activation = queue.definition.activation
        if activation.status:
            if (
                running < activation.max_queue_readers
                and now >= monitor.retry_after
                and not monitor.starting(now, settings.notification_timeout)
            ):
                self._start_task(monitor, queue, now)
        elif monitor.state is not MonitorState.NOTIFIED and self.engine.fire_event(
            QUEUE_ACTIVATION, queue.name
        ):
            monitor.notifications += 1
            monitor.notified_at = monitor.last_activated = now
            monitor.feed(MonitorInput.ACTIVATED)

    # ---- activated tasks -------------------------------------------------------------

    def _start_task(self, monitor: QueueMonitor, queue: Queue, now: float) -> None:
        activation = queue.definition.activation
        user = activation.execute_as
        if self.users and user and user not in self.users:
            self._failed(monitor, f"EXECUTE AS user '{user}' is not a login of this broker")
            return
        task = ActivatedTask(
            task_id=self._next_task,
            queue=queue.name,
            procedure=activation.procedure,
            execute_as=user,
            token=secrets.token_urlsafe(24),
            started=now,
        )
        self._next_task += 1
        monitor.tasks[task.task_id] = task
        self.tasks[task.task_id] = task
        self.tokens[task.token] = task
        monitor.tasks_started += 1
        monitor.last_activated = now
        monitor.feed(MonitorInput.ACTIVATED)
        self.own(self._run(task))

    async def _run(self, task: ActivatedTask) -> None:
        try:
            error = await self.pool.run(task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "activated task %s of queue %s could not run: %r", task.task_id, task.queue, exc
            )
            error = f"the activated task could not be started: {exc!r}"
        self._ended(task, error)

    def _ended(self, task: ActivatedTask, error: str | None) -> None:
        self.tasks.pop(task.task_id, None)
        self.tokens.pop(task.token, None)
        monitor = self.monitors.get(task.queue)
        if monitor is not None:
            monitor.tasks.pop(task.task_id, None)
            if error is not None:
                self._failed(monitor, error)
        if error is not None:
            log.warning(
                "activated task %s (%s on queue %s) failed: %s",
                task.task_id,
                task.procedure,
                task.queue,
                error,
            )
        for hook in self.task_end_hooks:
            hook(task, error)
        if monitor is not None:
            self._reconcile(task.queue)

    def _failed(self, monitor: QueueMonitor, error: str) -> None:
        monitor.tasks_failed += 1
        monitor.last_error = error
        monitor.retry_after = time.time() + self.settings.check_interval

    # ---- task identity: login and attach --------------------------------------------

    def task_login(self, user: str, password: str) -> bool:
        """A worker may log in as its task's EXECUTE AS user with the task's token."""
        task = self.tokens.get(password)
        return task is not None and task.session is None and task.execute_as == user

    def attach_task(self, session: Session, token: object) -> dict[str, Any]:
        """Operation `attach_task`: mark this session as the activated task of `token`."""
        if not isinstance(token, str):
            raise bad_argument("attach_task needs the task token")
        task = self.tokens.pop(token, None)
        if task is None or task.session is not None:
            raise BrokerError(
                ErrorCode.PERMISSION_DENIED,
                "no activated task waits for this token (it was used or the task ended)",
            )
        if session.user != task.execute_as:
            raise BrokerError(
                ErrorCode.PERMISSION_DENIED,
                f"activated task {task.task_id} runs as '{task.execute_as}', "
                f"not as '{session.user}'",
            )
        task.session = session
        session.task = task
        return {"task_id": task.task_id, "queue": task.queue, "procedure": task.procedure}

    # ---- external readers: register, end, stop -----------------------------------------

    def register_task(
        self,
        session: Session,
        queue: object,
        activator: object,
        procedure: object = None,
        job: object = None,
        job_id: object = None,
        job_task_id: object = None,
        executor: object = None,
        pid: object = None,
    ) -> dict[str, Any]:
        """Operation `register_task`: this session becomes an external activated task
        of `queue`, if the queue has a free reader place (MAX_QUEUE_READERS counts
        internal and external tasks together)."""
        if not isinstance(queue, str):
            raise bad_argument("register_task needs a queue name")
        who = _text(activator, "activator", required=True)
        assert who is not None
        what = _text(procedure, "procedure") or who
        job_text = _text(job, "job")
        job_number, task_number = _number(job_id, "job_id"), _number(job_task_id, "job_task_id")
        where, process = _text(executor, "executor"), _number(pid, "pid")
        if session.task is not None:
            raise BrokerError(
                ErrorCode.TRANSACTION_ACTIVE,
                "this session is already an activated task; open a connection per reader",
            )
        q = self.engine.queues.get(queue)
        if q is None:
            raise not_found(ErrorCode.UNKNOWN_QUEUE, "queue", queue)
        self._sweep()
        monitor = self.monitors.get(queue)
        if monitor is None:
            monitor = self.monitors[queue] = QueueMonitor(queue)
        limit = q.definition.activation.max_queue_readers
        if len(monitor.tasks) >= limit:
            raise BrokerError(
                ErrorCode.IN_USE,
                f"queue '{queue}' already has {len(monitor.tasks)} activated reader(s) and "
                f"MAX_QUEUE_READERS = {limit}; wait for one to end, or "
                f"alter_queue('{queue}', activation={{'max_queue_readers': N}})",
            )
        now = time.time()
        task = ExternalTask(
            task_id=self._next_task,
            queue=queue,
            procedure=what,
            execute_as=session.user,
            token="",
            started=now,
            pid=process,
            session=session,
            received=True,  # it is at its queue already: never "still starting"
            activator=who,
            job=job_text,
            job_id=job_number if job_number is not None else self.job_ids.get(job_text or ""),
            job_task_id=task_number,
            executor=where,
        )
        if who in self.stopped_activators:  # started before the stop, registered after it
            task.feed(ExternalInput.STOP)
        self._next_task += 1
        monitor.tasks[task.task_id] = task
        self.tasks[task.task_id] = task
        monitor.tasks_started += 1
        session.task = task
        return {"task_id": task.task_id, "queue": queue, "max_queue_readers": limit}

    def end_task(self, session: Session, error: object = None) -> None:
        """Operation `end_task`: the calling external reader is done (its session stays)."""
        task = session.task
        if not isinstance(task, ExternalTask):
            raise bad_argument("end_task: this session is not a registered external reader")
        if error is not None and not isinstance(error, str):
            raise bad_argument("end_task error must be a text")
        session.task = None
        self._end_external(task, error)

    def _end_external(self, task: ExternalTask, error: str | None) -> None:
        if task.state is ExternalState.ENDED:
            return
        task.feed(ExternalInput.END)
        self._ended(task, error)

    def session_closed(self, session: Session) -> None:
        """A reader's connection closed: an external task ends now, freeing its place."""
        task = session.task
        if isinstance(task, ExternalTask) and task.state is not ExternalState.ENDED:
            self._end_external(task, "the reader's connection closed before it ended")

    def _sweep(self) -> None:
        """End external tasks whose connection closed without end_task (a killed task)."""
        for task in [t for t in self.tasks.values() if isinstance(t, ExternalTask)]:
            if task.session is not None and task.session.closed:
                self._end_external(task, "the reader's connection closed before it ended")

    def request_stop(
        self,
        session: Session,
        queue: object = None,
        activator: object = None,
        job: object = None,
        task_id: object = None,
    ) -> int:
        """Operation `request_stop`: ask the external readers that match every given
        filter to finish after their current transaction; returns how many were asked."""
        if all(v is None for v in (queue, activator, job, task_id)):
            raise bad_argument("request_stop needs a queue, activator, job or task_id")
        if isinstance(activator, str) and queue is None and job is None and task_id is None:
            # the whole activator stops: readers it started that register later stop too
            now = time.time()
            self.stopped_activators = {
                a: t for a, t in self.stopped_activators.items() if now - t < _STOPPED_KEPT
            }
            self.stopped_activators[activator] = now
        asked = 0
        for task in list(self.tasks.values()):
            if not isinstance(task, ExternalTask) or task.state is ExternalState.ENDED:
                continue
            if (
                (queue is not None and task.queue != queue)
                or (activator is not None and task.activator != activator)
                or (job is not None and task.job != job)
                or (task_id is not None and task.task_id != task_id)
            ):
                continue
            task.feed(ExternalInput.STOP)
            asked += 1
            waiter = task.session.waiting if task.session is not None else None
            if waiter is not None and not waiter.get_group and not waiter.future.done():
                # a RECEIVE it is blocked in ends empty now (GET CONVERSATION GROUP
                # keeps its own timeout: its answer cannot say "nothing" this way)
                waiter.future.set_result((_NO_GROUP, []))
        return asked

    def label_job(self, session: Session, job: object, job_id: object) -> int:
        """Operation `label_job`: record the job id the activator learned after it
        submitted `job`, on that job's readers; returns how many were labelled."""
        name = _text(job, "job", required=True)
        number = _number(job_id, "job_id")
        assert name is not None
        if number is not None:
            self.job_ids[name] = number
            while len(self.job_ids) > _JOBS_KEPT:
                del self.job_ids[next(iter(self.job_ids))]
        labelled = 0
        for task in self.tasks.values():
            if isinstance(task, ExternalTask) and task.job == name:
                task.job_id = number
                labelled += 1
        return labelled

    @staticmethod
    def _stopping(session: Session) -> bool:
        task = session.task
        return isinstance(task, ExternalTask) and task.stopping

    def receive(
        self,
        session: Session,
        queue: object,
        top: object = None,
        timeout: object = 0.0,
        conversation_handle: object = None,
        conversation_group_id: object = None,
    ) -> MaybeAwaitable[list[list[Any]]]:
        """Operation `receive`: the engine's, except that a stopping reader gets nothing."""
        if self._stopping(session):
            return []
        return self.engine.receive(
            session, queue, top, timeout, conversation_handle, conversation_group_id
        )

    def get_conversation_group(
        self, session: Session, queue: object, timeout: object = 0.0
    ) -> MaybeAwaitable[uuid.UUID | None]:
        """Operation `get_conversation_group`: the engine's; a stopping reader gets None."""
        if self._stopping(session):
            return None
        return self.engine.get_conversation_group(session, queue, timeout)

    # ---- views -------------------------------------------------------------------------

    def queue_monitor_rows(self) -> list[dict[str, Any]]:
        self._sweep()
        rows = []
        for monitor in self.monitors.values():
            queue = self.engine.queues.get(monitor.queue)
            activation = queue.definition.activation if queue is not None else None
            rows.append(
                {
                    "queue": monitor.queue,
                    "state": monitor.state.name,
                    "activation": "INTERNAL" if activation and activation.status else "EXTERNAL",
                    "last_empty_rowset_time": _time(queue.last_empty_rowset if queue else None),
                    "last_activated_time": _time(monitor.last_activated),
                    "tasks_waiting": self.engine.waiting_sessions(queue) if queue else 0,
                    "tasks_running": len(monitor.tasks),
                    "tasks_external": sum(
                        isinstance(t, ExternalTask) for t in monitor.tasks.values()
                    ),
                    "max_queue_readers": activation.max_queue_readers if activation else 0,
                    "messages_ready": queue.ready if queue else 0,
                    "tasks_started": monitor.tasks_started,
                    "tasks_failed": monitor.tasks_failed,
                    "notifications_sent": monitor.notifications,
                    "last_task_error": monitor.last_error,
                }
            )
        return rows

    def activated_task_rows(self) -> list[dict[str, Any]]:
        self._sweep()
        rows = []
        for task in self.tasks.values():
            external = task if isinstance(task, ExternalTask) else None
            session = task.session
            if session is None:
                state, group = "STARTING", None
            else:
                state = "WAITING" if session.waiting is not None else "RUNNING"
                locks = session.txn.locks if session.txn is not None else {}
                group = next(iter(locks), None)
            rows.append(
                {
                    "queue": task.queue,
                    "task_id": task.task_id,
                    "procedure": task.procedure,
                    "execute_as": task.execute_as,
                    "started": _time(task.started),
                    "pid": task.pid,
                    "session_id": None if session is None else session.ident,
                    "state": "STOPPING" if external and external.stopping else state,
                    "conversation_group_id": group,
                    "kind": "EXTERNAL" if external else "INTERNAL",
                    "activator": external.activator if external else None,
                    "job": external.job if external else None,
                    "job_id": external.job_id if external else None,
                    "job_task_id": external.job_task_id if external else None,
                    "executor": external.executor if external else None,
                }
            )
        return rows

    def worker_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "pid": worker.pid,
                "state": state,
                "task_id": worker.task.task_id if worker.task else None,
                "queue": worker.task.queue if worker.task else None,
                "tasks_run": worker.tasks_run,
                "started": _time(worker.started),
            }
            for worker, state in self.pool.rows()
        ]


class _Fanout(QueueListener):
    """Several listeners on one engine (activation plus whatever was installed)."""

    def __init__(self, *listeners: QueueListener) -> None:
        self.listeners = listeners

    def message_arrived(self, queue: Queue) -> None:
        for listener in self.listeners:
            listener.message_arrived(queue)

    def received(self, queue: Queue, session: Session, empty: bool) -> None:
        for listener in self.listeners:
            listener.received(queue, session, empty)

    def rolled_back(self, queue: Queue) -> None:
        for listener in self.listeners:
            listener.rolled_back(queue)

    def altered(self, queue: Queue) -> None:
        for listener in self.listeners:
            listener.altered(queue)

    def waiting_changed(self, queue: Queue) -> None:
        for listener in self.listeners:
            listener.waiting_changed(queue)

    def session_closed(self, session: Session) -> None:
        for listener in self.listeners:
            listener.session_closed(session)


_MANAGERS: weakref.WeakKeyDictionary[Engine, ActivationManager] = weakref.WeakKeyDictionary()


def manager_for(engine: Engine) -> ActivationManager | None:
    """The activation manager running on `engine`, if any."""
    return _MANAGERS.get(engine)


def _view(
    rows: Callable[[ActivationManager], list[dict[str, Any]]],
) -> Callable[[Engine], list[dict[str, Any]]]:
    def view(engine: Engine) -> list[dict[str, Any]]:
        manager = _MANAGERS.get(engine)
        return [] if manager is None else rows(manager)

    return view


def _loopback(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host


async def start(broker: Broker) -> Callable[[], Coroutine[Any, Any, None]]:
    """Start hook: install queue monitors, the worker pool and the scheduler's log."""
    from ._scheduler import ExecutionLog

    settings = ActivationSettings.from_section(broker.config.sections.get("activation", {}))
    engine = broker.engine
    pool = WorkerPool(
        _loopback(broker.client_address[0]),
        broker.client_address[1],
        settings.idle_workers,
        settings.worker_start_timeout,
        settings.python_path,
    )
    manager = ActivationManager(engine, settings, pool, broker.config.users)
    _MANAGERS[engine] = manager
    if type(engine.listener) is QueueListener:
        engine.listener = manager
    else:
        engine.listener = _Fanout(engine.listener, manager)
    broker.operations.add("attach_task", manager.attach_task)
    for name in ("register_task", "end_task", "request_stop", "label_job"):
        broker.operations.add(name, getattr(manager, name))
    # RECEIVE and GET CONVERSATION GROUP pass through the manager, which answers a
    # stopping external reader itself
    broker.operations.add("receive", manager.receive)
    broker.operations.add("get_conversation_group", manager.get_conversation_group)
    broker.operations.task_login = manager.task_login
    execution_log = ExecutionLog(engine, manager, settings.execution_log_rows)
    execution_log.install(broker.operations)
    manager.start()
    pool.prestart(settings.prestart_workers)
    return manager.close


VIEWS["queue_monitors"] = _view(ActivationManager.queue_monitor_rows)
VIEWS["activated_tasks"] = _view(ActivationManager.activated_task_rows)
VIEWS["activation_workers"] = _view(ActivationManager.worker_rows)
START_HOOKS.append(start)
