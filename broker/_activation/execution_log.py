"""The seed-000 scheduler's broker side: the execution log and the execution status.

Theory of operation. A scheduler (see `client._scheduler`) logs each task it sends
(`log_task`, which returns the log id carried in the task message); the activated
reader that takes the task logs its start (`log_task_start`, recording which
activated task, worker process and session run it) and its end (`log_task_end`,
with the error if it failed). Rows live in memory (the newest
`execution_log_rows`) and in the store's `execution_log` table, so the log survives
a restart; rows a restart interrupted are closed with an error on load.

A task an external reader runs (the Spark bridge's scheduler) also records the
reader's executor, job and job task (Spark task id); these live in memory only, the
stored row keeps the rest.

A worker can die in the middle of a task (`kill -9`, a crash in native code). Then
the task's end is logged here, when activation reports that the activated task
ended, and, if the reader said where it would reply (`conversation_handle` and
`reply_type` of `log_task_start`), the broker sends that reply itself with
`ok = false`, so a scheduler waiting in synchronize() learns of the failure instead
of waiting forever. Reply bodies are JSON: {"log_id", "ok", "error", "result"}.

Views: `execution_log` (every row) and `execution_status` (each activated task
with the logged task it is running now, like the seed's ExecutionStatus view).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from ssb.protocol import ErrorCode

from .._core.names import plain
from .._core.transactions import Session
from .._errors import BrokerError, bad_argument
from .._operations import methods
from .._store import Store
from .._views import iso_time
from .workers import ActivatedTask

log = logging.getLogger("ssb.scheduler")

RESTART_ERROR = "the broker restarted while the task ran"

# the core's SEND: (session, conversation handle, message type, bodies) -> None, or an
# awaitable when it must wait
Send = Callable[[Session, uuid.UUID, str, list[bytes]], Any]


@dataclass(eq=False)
class LogEntry:
    log_id: int
    caller: int | None
    scheduler_handle: uuid.UUID | None
    task: str
    queued_time: float
    start_time: float | None = None
    end_time: float | None = None
    activated_task: int | None = None
    pid: int | None = None
    session_id: int | None = None
    error: str | None = None
    reply_handle: uuid.UUID | None = None  # where to report a worker's death
    reply_type: str | None = None
    # where an external reader (a Spark task) ran it; in memory only (not in row())
    executor: str | None = None
    job: str | None = None
    job_task_id: int | None = None

    def row(self) -> tuple[Any, ...]:
        return (
            self.log_id,
            self.caller,
            self.scheduler_handle,
            self.task,
            self.queued_time,
            self.start_time,
            self.end_time,
            self.activated_task,
            self.pid,
            self.session_id,
            self.error,
        )

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> LogEntry:
        values = list(row)
        if values[2] is not None:
            values[2] = uuid.UUID(bytes=values[2])
        return cls(*values)

    def status(self) -> str:
        if self.end_time is not None:
            return "FAILED" if self.error else "DONE"
        return "RUNNING" if self.start_time is not None else "QUEUED"


def _optional_uuid(value: object, what: str) -> uuid.UUID | None:
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise bad_argument(f"{what} must be a UUID, got {value!r}") from None


class ExecutionLog:
    """The scheduler's execution log of one broker."""

    def __init__(
        self,
        store: Store,
        tasks: Mapping[int, ActivatedTask],
        send: Send,
        own: Callable[[Coroutine[Any, Any, Any]], None],
        keep: int,
    ) -> None:
        """The parts of the daemon the log uses, passed in.

        Args:
            store: where the log's rows live.
            tasks: every activated task, by id (for `execution_status`).
            send: the core's SEND, for the reply to a task whose worker died.
            own: runs a coroutine as a task its owner cancels at stop.
            keep: how many rows to keep.
        """
        self.store = store
        self.tasks = tasks
        self.send = send
        self.own = own
        self.keep = max(1, keep)
        self.entries: OrderedDict[int, LogEntry] = OrderedDict()
        self.running: dict[int, set[int]] = {}  # activated task id -> log ids it runs
        self._system = Session(user="", peer="activation")
        now = time.time()
        for row in store.execution_log(self.keep):
            entry = LogEntry.from_row(row)
            if entry.end_time is None and entry.start_time is not None:
                entry.end_time, entry.error = now, RESTART_ERROR
                store.put_execution_log(entry.row())
            self.entries[entry.log_id] = entry
        self._next_id = (next(reversed(self.entries)) + 1) if self.entries else 1

    def operations(self) -> dict[str, Callable[..., Any]]:
        return methods(self, "log_task", "log_task_start", "log_task_end")

    def views(self) -> dict[str, Callable[[], list[dict[str, Any]]]]:
        return {"execution_log": self.log_rows, "execution_status": self.status_rows}

    # ---- operations --------------------------------------------------------------

    def log_task(self, session: Session, task: object, scheduler: object = None) -> int:
        """Operation `log_task`: a task was queued; returns its log id."""
        if not isinstance(task, str) or not task:
            raise bad_argument("log_task needs the task's description")
        entry = LogEntry(
            self._next_id,
            session.ident,
            _optional_uuid(scheduler, "scheduler"),
            task[:4000],
            time.time(),
        )
        self._next_id += 1
        self.entries[entry.log_id] = entry
        self.store.put_execution_log(entry.row())
        while len(self.entries) > self.keep:
            old_id, _ = self.entries.popitem(last=False)
            self.store.delete_execution_log_upto(old_id)
        return entry.log_id

    def _entry(self, log_id: object) -> LogEntry:
        if not isinstance(log_id, int) or isinstance(log_id, bool):
            raise bad_argument("a log id is an integer")
        entry = self.entries.get(log_id)
        if entry is None:
            raise BrokerError(
                ErrorCode.BAD_ARGUMENT, f"execution log has no row {log_id} (never, or pruned)"
            )
        return entry

    def log_task_start(
        self,
        session: Session,
        log_id: object,
        conversation_handle: object = None,
        reply_type: object = None,
    ) -> None:
        """Operation `log_task_start`: the calling session starts task `log_id`."""
        entry = self._entry(log_id)
        if reply_type is not None and not isinstance(reply_type, str):
            raise bad_argument("reply_type must be a message type name")
        task = session.task if isinstance(session.task, ActivatedTask) else None
        entry.start_time = time.time()
        entry.end_time = entry.error = None
        entry.session_id = session.ident
        entry.activated_task = task.task_id if task else None
        entry.pid = task.pid if task else None
        entry.executor = getattr(task, "executor", None)
        entry.job = getattr(task, "job", None)
        entry.job_task_id = getattr(task, "job_task_id", None)
        entry.reply_handle = _optional_uuid(conversation_handle, "conversation_handle")
        entry.reply_type = reply_type
        if task is not None:
            self.running.setdefault(task.task_id, set()).add(entry.log_id)
        self.store.put_execution_log(entry.row())

    def log_task_end(self, session: Session, log_id: object, error: object = None) -> None:
        """Operation `log_task_end`: task `log_id` ended (with `error` if it failed)."""
        entry = self._entry(log_id)
        if error is not None and not isinstance(error, str):
            raise bad_argument("error must be text")
        self._end(entry, error)

    def _end(self, entry: LogEntry, error: str | None) -> None:
        entry.end_time = time.time()
        entry.error = error
        if entry.activated_task is not None:
            running = self.running.get(entry.activated_task)
            if running is not None:
                running.discard(entry.log_id)
                if not running:
                    del self.running[entry.activated_task]
        self.store.put_execution_log(entry.row())

    # ---- a worker that died mid-task ---------------------------------------------

    def task_ended(self, task: ActivatedTask, error: str | None) -> None:
        for log_id in sorted(self.running.pop(task.task_id, ())):
            entry = self.entries.get(log_id)
            if entry is None or entry.end_time is not None:
                continue
            why = f"activated task {task.task_id} ended before the task did"
            self._end(entry, f"{why}: {error}" if error else why)
            self._reply_failure(entry)

    def _reply_failure(self, entry: LogEntry) -> None:
        if entry.reply_handle is None or entry.reply_type is None:
            return
        body = json.dumps(
            {"log_id": entry.log_id, "ok": False, "error": entry.error, "result": None}
        ).encode()
        try:
            pending = self.send(self._system, entry.reply_handle, entry.reply_type, [body])
        except BrokerError as exc:
            log.info("cannot report the failure of task %s: %s", entry.log_id, exc.message)
            return
        if pending is not None:
            self.own(self._await_send(pending, entry.log_id))

    async def _await_send(self, pending: Any, log_id: int) -> None:
        try:
            await pending
        except BrokerError as exc:
            log.info("cannot report the failure of task %s: %s", log_id, exc.message)

    # ---- views -------------------------------------------------------------------

    def log_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "log_id": e.log_id,
                "caller": e.caller,
                "scheduler_handle": e.scheduler_handle,
                "task": e.task,
                "status": e.status(),
                "queued_time": iso_time(e.queued_time),
                "start_time": iso_time(e.start_time),
                "end_time": iso_time(e.end_time),
                "activated_task": e.activated_task,
                "pid": e.pid,
                "session_id": e.session_id,
                "error": e.error,
                "executor": e.executor,
                "job": e.job,
                "job_task_id": e.job_task_id,
            }
            for e in self.entries.values()
        ]

    def status_rows(self) -> list[dict[str, Any]]:
        rows = []
        for task in self.tasks.values():
            log_ids: list[int | None] = [*sorted(self.running.get(task.task_id, ()))]
            for log_id in log_ids or [None]:
                entry = None if log_id is None else self.entries.get(log_id)
                rows.append(
                    {
                        "queue": plain(task.queue),
                        "activated_task": task.task_id,
                        "pid": task.pid,
                        "session_id": task.session.ident if task.session else None,
                        "log_id": log_id,
                        "caller": entry.caller if entry else None,
                        "scheduler_handle": entry.scheduler_handle if entry else None,
                        "task": entry.task if entry else None,
                        "start_time": iso_time(entry.start_time) if entry else None,
                        "executor": getattr(task, "executor", None),
                        "job_task_id": getattr(task, "job_task_id", None),
                    }
                )
        return rows
