"""Activation: queue monitors decide when a queue needs another reader and start one.

Theory of operation (seed 001, DESIGN.md §6). A queue monitor exists for every
queue with activation STATUS = ON or a QUEUE_ACTIVATION event notification. It
checks whether activation is needed every `check_interval` seconds and whenever
the core reports that a message arrived, a RECEIVE ran, a transaction that
received rolled back, a session started or stopped waiting, or the queue was
altered; and when one of its activated tasks ends. The core reports to `Monitors`
(see `monitors`), which only records and wakes the manager, so the core is never
slowed; checks are coalesced per monitor.

Activation is needed when the queue is ON, has ready messages, and either
  (a) the message just arrived in a queue with no other ready message while no
      activated task runs, or
  (b) no session waits in RECEIVE / GET CONVERSATION GROUP without WHERE, and none
      of those returned an empty result for `empty_rowset_window` seconds.
A reader blocked because every message belongs to a group locked by another
transaction is a waiting session, so one busy conversation group never gets more
than one extra reader.

A procedure is Python (`module:function`, which must be in the operator's `procedures`
list) or a T-SQL stored procedure of the queue's database, which the worker runs with
the T-SQL interpreter (`_procedures.TSQL_ENTRY`) in that database; a T-SQL procedure
that does not exist when the monitor wants a reader fails that task as a Python one
that cannot be imported does.

Internal activation (activation STATUS = ON) starts another activated task while
fewer than MAX_QUEUE_READERS run and no task it started is still on its way to its
first RECEIVE (until it runs or waits in one, for at most `notification_timeout`):
readers are added one at a time, each after the previous one reached its queue, as
Service Broker ramps up, and a process still starting is never mistaken for missing
readers. After a task fails the monitor waits one `check_interval` before starting
the next, so a procedure that fails at once cannot spin. External activation (no
internal activation, but a QUEUE_ACTIVATION event notification) posts an EventNotification to the
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
still waiting for a slot).

The state machines and the activation rule are `monitor`'s, what the core tells them
`monitors`'; the worker processes are `workers`'.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Container, Coroutine, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from ssb.protocol import ErrorCode

from .._config import ConfigError, checked_section, setting
from .._core.catalog import EventNotification
from .._core.names import database_of, display, plain
from .._core.queue_options import is_python
from .._core.queues import Queue
from .._core.transactions import Session
from .._errors import BrokerError, bad_argument, not_found
from .._logins import ADMIN
from .._operations import methods
from .._procedures import TSQL_ENTRY, ProcedurePolicy
from .._views import iso_time
from .monitor import (
    ExternalInput,
    ExternalState,
    ExternalTask,
    MonitorInput,
    MonitorState,
    QueueMonitor,
    activation_needed,
)
from .monitors import Monitors
from .workers import ActivatedTask, WorkerPool

log = logging.getLogger("ssb.activation")

QUEUE_ACTIVATION: Final = "QUEUE_ACTIVATION"
READER_GONE: Final = "the reader's connection closed before it ended"


_TEXT_LIMIT: Final = 200  # activator, job and executor names
_MAX_ID: Final = 2**63 - 1  # job_id and job_task_id
_MAX_PID: Final = 2**31 - 1  # a process id on any system (Linux: at most 2**22)
_JOBS_KEPT: Final = 1000  # job ids remembered for readers that register late
_STOPPED_KEPT: Final = 3600.0  # how long a stopped activator's late readers are stopped


def _text(value: object, what: str, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > _TEXT_LIMIT:
        raise bad_argument(f"{what} must be a non-empty text of at most {_TEXT_LIMIT} characters")
    return value


def _number(value: object, what: str) -> int | None:
    """A Spark job or task id (Spark's are 64 bits), if given."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID:
        raise bad_argument(f"{what} must be an integer from 0 to 2**63-1, got {value!r}")
    return value


def _pid(value: object) -> int | None:
    """A reader's process id, if given."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _MAX_PID:
        raise bad_argument(f"pid must be a process id from 1 to {_MAX_PID}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ActivationSettings:
    """The daemon config's [activation] section."""

    check_interval: float = setting(5.0, 0.01, 3600.0)  # periodic check of every queue monitor
    empty_rowset_window: float = setting(5.0, 0.01, 3600.0)  # the "few seconds" of condition (b)
    # wait for a RECEIVE after activating
    notification_timeout: float = setting(60.0, 0.01, 86400.0)
    idle_workers: int = setting(4, 0, 1000)  # warm worker processes kept for reuse
    prestart_workers: int = setting(0, 0, 1000)  # warm workers started with the daemon
    worker_start_timeout: float = setting(30.0, 0.1, 3600.0)
    python_path: tuple[str, ...] = ()  # extra import paths for procedures
    execution_log_rows: int = setting(10000, 1, 10_000_000)  # scheduler execution log rows kept

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> ActivationSettings:
        """The config's [activation] section, every value checked."""
        values = checked_section("activation", section, cls, elsewhere=("python_path",))
        python_path = values.pop("python_path", [])
        if not isinstance(python_path, list) or not all(isinstance(v, str) for v in python_path):
            raise ConfigError("[activation] python_path must be a list of directories")
        return cls(**values, python_path=tuple(python_path))


TaskEndHook = Callable[[ActivatedTask, "str | None"], None]


@dataclass(eq=False)
class ActivationManager:
    """Acts on the queue monitors: starts activated tasks and posts QUEUE_ACTIVATION
    notifications; the operations and views of activation.

    Args (the parts of the daemon activation uses):
        monitors: the queue monitors the core tells of what happens to queues.
        settings, pool: the [activation] section, and the worker processes.
        queues, notifications: the core's queues and event notifications.
        waiting: how many sessions wait in RECEIVE on a queue without WHERE.
        end_wait: ends the RECEIVE a session waits in, empty.
        fire: posts the event notifications of (event, queue); returns how many.
        logins, procedures, queue_owner: who an activated task runs as, and whether
            it may run its procedure.
        task_ended: hears of every activated task that ended (with its error).
        stored_procedure: whether a T-SQL stored procedure (its key) exists.
    """

    monitors: Monitors
    settings: ActivationSettings
    pool: WorkerPool
    _: KW_ONLY
    queues: Mapping[str, Queue]
    notifications: Mapping[str, EventNotification]
    waiting: Callable[[Queue], int]
    end_wait: Callable[[Session], None]
    fire: Callable[[str, str], int]
    logins: Container[str]
    procedures: ProcedurePolicy
    queue_owner: Callable[[str], str | None]
    task_ended: TaskEndHook
    stored_procedure: Callable[[str], bool] = lambda key: False

    def __post_init__(self) -> None:
        self.tasks = self.monitors.tasks
        self.tokens = self.monitors.tokens
        self.stopped_activators: dict[str, float] = {}  # request_stop(activator=) -> when
        self.job_ids: dict[str, int] = {}  # label_job: job -> id, for readers still to come
        self._next_task = 1
        self._jobs: set[asyncio.Task[Any]] = set()
        self._closed = False

    # ---- life ------------------------------------------------------------------

    def start(self) -> None:
        for name in list(self.queues):
            self._reconcile(name)
        self.own(self._tick())
        self.own(self._listen())

    def own(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` as a task owned (and cancelled on close) by the manager."""
        job = asyncio.get_running_loop().create_task(coro)
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
                for name in set(self.queues) | set(self.monitors.by_queue):
                    self._reconcile(name)
            except Exception:  # a bug here must not end the periodic checks for good
                log.exception("queue monitor check failed")

    async def _listen(self) -> None:
        """Act on what the core told the monitors, each time it told them something."""
        monitors = self.monitors
        while True:
            await monitors.wakeup.wait()
            recorded = monitors.take()
            for name in recorded.altered:
                self._guarded(self._reconcile, name)
            for task in recorded.closed:
                self._guarded(self._end_external, task, READER_GONE)
            for monitor in recorded.due:
                self._guarded(self._check, monitor)

    @staticmethod
    def _guarded(action: Callable[..., None], *args: Any) -> None:
        try:
            action(*args)
        except Exception:  # one queue's trouble must not stop activation for the others
            log.exception("queue monitor check failed")

    # ---- which queues have a monitor ------------------------------------------------

    def _external(self, queue: str) -> bool:
        return any(
            n.queue == queue and n.event == QUEUE_ACTIVATION for n in self.notifications.values()
        )

    def _wanted(self, queue: str) -> bool:
        q = self.queues.get(queue)
        return q is not None and (q.definition.activation.status or self._external(queue))

    def _reconcile(self, name: str) -> None:
        by_queue = self.monitors.by_queue
        monitor = by_queue.get(name)
        if self._wanted(name):
            if monitor is None:
                monitor = by_queue[name] = QueueMonitor(name)
            self.monitors.request(monitor)
        elif monitor is not None and not monitor.tasks:
            del by_queue[name]

    # ---- the check ------------------------------------------------------------------

    def _check(self, monitor: QueueMonitor) -> None:
        monitor.check_scheduled = False
        if self._closed or self.monitors.by_queue.get(monitor.queue) is not monitor:
            return
        queue = self.queues.get(monitor.queue)
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
            receivable=queue.receivable(),
            arrived_into_empty=arrived,
            running=running,
            waiting=self.waiting(queue),
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
        elif monitor.state is not MonitorState.NOTIFIED and self.fire(QUEUE_ACTIVATION, queue.name):
            monitor.notifications += 1
            monitor.notified_at = monitor.last_activated = now
            monitor.feed(MonitorInput.ACTIVATED)

    # ---- activated tasks -------------------------------------------------------------

    def _start_task(self, monitor: QueueMonitor, queue: Queue, now: float) -> None:
        activation = queue.definition.activation
        # EXECUTE AS the named login, else the queue's owner (admin for an unowned queue)
        user = activation.execute_as or self.queue_owner(queue.name) or ADMIN
        if user not in self.logins:
            self._failed(monitor, f"EXECUTE AS user '{user}' is not a login of this broker")
            return
        procedure, entry = activation.procedure, ""
        if not is_python(procedure):
            entry = TSQL_ENTRY
            if not self.stored_procedure(procedure):
                self._failed(
                    monitor,
                    f"stored procedure '{plain(procedure)}' does not exist in database"
                    f" '{database_of(procedure)}'",
                )
                return
        else:
            try:
                self.procedures.check(procedure, "activation procedure", user)
            except BrokerError as exc:
                self._failed(monitor, exc.message)
                return
        task = ActivatedTask(
            task_id=self._next_task,
            queue=queue.name,
            procedure=procedure,
            execute_as=user,
            token=secrets.token_urlsafe(24),
            started=now,
            entry=entry,
        )
        self._adopt(monitor, task)
        self.tokens[task.token] = task
        monitor.last_activated = now
        monitor.feed(MonitorInput.ACTIVATED)
        log.info(
            "activated task %s started: %s on queue %s as %r",
            task.task_id,
            display(task.procedure),
            display(task.queue),
            task.execute_as,
        )
        self.own(self._run(task))

    def _adopt(self, monitor: QueueMonitor, task: ActivatedTask) -> None:
        """A task just made, internal or external (it took `_next_task` as its id), counts
        among its queue's readers (MAX_QUEUE_READERS) and in the views from now on."""
        self._next_task += 1
        monitor.tasks[task.task_id] = task
        self.tasks[task.task_id] = task
        monitor.tasks_started += 1

    async def _run(self, task: ActivatedTask) -> None:
        try:
            error = await self.pool.run(task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "activated task %s of queue %s could not run: %r",
                task.task_id,
                display(task.queue),
                exc,
            )
            error = f"the activated task could not be started: {exc!r}"
        self._ended(task, error)

    def _ended(self, task: ActivatedTask, error: str | None) -> None:
        self.tasks.pop(task.task_id, None)
        self.tokens.pop(task.token, None)
        monitor = self.monitors.by_queue.get(task.queue)
        if monitor is not None:
            monitor.tasks.pop(task.task_id, None)
            if error is not None:
                self._failed(monitor, error)
        if error is not None:
            log.warning(
                "activated task %s (%s on queue %s) failed: %s",
                task.task_id,
                display(task.procedure),
                display(task.queue),
                error,
            )
        else:
            log.info(
                "activated task %s (%s on queue %s) ended after %.1f s",
                task.task_id,
                display(task.procedure),
                display(task.queue),
                time.time() - task.started,
            )
        self.task_ended(task, error)
        if monitor is not None:
            self._reconcile(task.queue)

    def _failed(self, monitor: QueueMonitor, error: str) -> None:
        monitor.tasks_failed += 1
        monitor.last_error = error
        monitor.retry_after = time.time() + self.settings.check_interval

    # ---- task identity: attach --------------------------------------------

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
        return {
            "task_id": task.task_id,
            "queue": plain(task.queue),
            "procedure": plain(task.procedure),
        }

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
        where, process = _text(executor, "executor"), _pid(pid)
        if session.task is not None:
            raise BrokerError(
                ErrorCode.TRANSACTION_ACTIVE,
                "this session is already an activated task; open a connection per reader",
            )
        q = self.queues.get(queue)
        if q is None:
            raise not_found(ErrorCode.UNKNOWN_QUEUE, "queue", queue)
        self._sweep()
        by_queue = self.monitors.by_queue
        monitor = by_queue.get(queue)
        if monitor is None:
            monitor = by_queue[queue] = QueueMonitor(queue)
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
        self._adopt(monitor, task)
        session.task = task
        return {"task_id": task.task_id, "queue": plain(queue), "max_queue_readers": limit}

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

    def _sweep(self) -> None:
        """End external tasks whose connection closed without end_task (a killed task)."""
        for task in [t for t in self.tasks.values() if isinstance(t, ExternalTask)]:
            if task.session is not None and task.session.closed:
                self._end_external(task, READER_GONE)

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
            if task.session is not None:
                # a RECEIVE it is blocked in ends empty now (GET CONVERSATION GROUP
                # keeps its own timeout: its answer cannot say "nothing" this way)
                self.end_wait(task.session)
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

    # ---- views -------------------------------------------------------------------------

    def operations(self) -> dict[str, Callable[..., Any]]:
        return methods(
            self, "attach_task", "register_task", "end_task", "request_stop", "label_job"
        )

    def views(self) -> dict[str, Callable[[], list[dict[str, Any]]]]:
        return {
            "queue_monitors": self.queue_monitor_rows,
            "activated_tasks": self.activated_task_rows,
            "activation_workers": self.worker_rows,
        }

    def queue_monitor_rows(self) -> list[dict[str, Any]]:
        self._sweep()
        rows = []
        for monitor in self.monitors.by_queue.values():
            queue = self.queues.get(monitor.queue)
            activation = queue.definition.activation if queue is not None else None
            rows.append(
                {
                    "database": database_of(monitor.queue),
                    "queue": plain(monitor.queue),
                    "state": monitor.state.name,
                    "activation": "INTERNAL" if activation and activation.status else "EXTERNAL",
                    "last_empty_rowset_time": iso_time(queue.last_empty_rowset if queue else None),
                    "last_activated_time": iso_time(monitor.last_activated),
                    "tasks_waiting": self.waiting(queue) if queue else 0,
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
                    "database": database_of(task.queue),
                    "queue": plain(task.queue),
                    "task_id": task.task_id,
                    "procedure": plain(task.procedure),
                    "execute_as": task.execute_as,
                    "started": iso_time(task.started),
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
                "queue": plain(worker.task.queue) if worker.task else None,
                "tasks_run": worker.tasks_run,
                "started": iso_time(worker.started),
            }
            for worker, state in self.pool.rows()
        ]


def loopback(host: str) -> str:
    """The address local workers use to reach a daemon listening on `host`."""
    return "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
