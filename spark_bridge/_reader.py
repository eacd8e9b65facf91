"""An activated reader running as a Spark task (executor side).

Theory of operation. The bridge's Spark job has one partition per reader; each
partition runs `run_partition`, which opens its own blocking connection to the
broker (nothing but names and numbers crosses the pickle boundary) and registers as
an external activated task of its queue, giving its Spark job group, task id,
executor and pid. The broker refuses the registration when the queue already has
MAX_QUEUE_READERS readers; the reader then exits at once, having touched nothing.

A registered reader loops, one transaction per RECEIVE: RECEIVE TOP(batch) with
WAITFOR idle_timeout, call the user's function `fn(message, conn)` for each message
(conn is the connection, inside the open transaction, so replies sent on it commit
with the RECEIVE), COMMIT. An exception rolls the transaction back with the error's
text (the poison_messages view and dead-letter reason show it); the reader then
takes the failed batch one message at a time, so only the message that keeps
failing accumulates failed deliveries and a poison policy acts on it alone. EndDialog
and Error messages end their conversation and are not given to the function.

A rolled-back transaction counts a failed delivery for every message it received,
and a poison policy takes each of them that reached its threshold, so a batch must
never be rolled back with a message in it that failed before: its good neighbours
would reach the threshold with it (two readers each fail a batch on the same
message, a third batch takes it with its neighbours again: all dead-lettered). What
a reader remembers of its own failures cannot prevent that (another reader, or a new
one, knows nothing of them); the delivery counts can. Before a batch's RECEIVE the
reader takes a savepoint; a batch of more than one message of which one was
delivered before (delivery_count > 1) goes back at once, rolled back to that
savepoint before the function sees any of it (the messages go back as they were: no
delivery counted, nothing for the poison rules), the transaction commits nothing,
and the reader takes that many messages one at a time.

The reader exits when a RECEIVE waited idle_timeout and got nothing, which is also
what a stop request looks like: the broker answers a stopping reader's RECEIVE with
nothing at once, so it commits what it has and exits. In "procedure" mode the
function is an activation procedure `proc(conn, task)` (as in internal activation)
and runs once. A reader never raises into Spark (on a local master one failing task
fails the whole job); it reports what happened instead.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Final

from ssb import client

MESSAGE_MODE: Final = "message"
PROCEDURE_MODE: Final = "procedure"
ISOLATED_AFTER_FAILURE: Final = 1  # RECEIVE TOP(1) while re-taking a failed batch
BATCH_SAVEPOINT: Final = "ssb-reader-batch"  # taken before a batch's RECEIVE
# Spark settings for the executors that run readers: PySpark's daemon with the reader
# imported before it forks its workers (see `_daemon`); set before the session starts
EXECUTOR_SETTINGS: Final = {"spark.python.daemon.module": "ssb.spark_bridge._daemon"}


@dataclass(frozen=True, slots=True)
class ReaderSpec:
    """What a reader needs to know; pickled into the Spark task, so plain data only."""

    url: str
    queue: str
    function: str  # "package.module:function"
    activator: str
    job: str
    mode: str = MESSAGE_MODE
    batch_size: int = 100
    idle_timeout: float = 2.0


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """The second argument of a procedure: where it runs."""

    queue: str
    task_id: int
    job: str
    job_task_id: int | None
    executor: str


@dataclass(slots=True)
class ReaderReport:
    """What one reader did; collected by the bridge."""

    partition: int
    registered: bool = False
    task_id: int | None = None
    refused: str | None = None
    error: str | None = None
    transactions: int = 0
    processed: int = 0
    rolled_back: int = 0
    put_back: int = 0  # batches put back unprocessed: a message in them had failed before
    started_at: float | None = None  # the Spark task began running the reader
    registered_at: float | None = None
    last_processed_at: float | None = None  # its last commit that took messages
    ended_at: float | None = None
    job_task_id: int | None = None
    executor: str | None = None


WHERE: Final = "Spark executors import functions from the bridge's python_path"


def _where() -> tuple[int | None, str]:
    """This Spark task's attempt id and a name for its executor."""
    task_id: int | None = None
    executor = os.environ.get("SPARK_EXECUTOR_ID", "")
    with contextlib.suppress(ImportError):
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:
            task_id = context.taskAttemptId()
            executor = executor or "driver"  # local master: the executor is the driver
    return task_id, f"{executor or 'local'}@{socket.gethostname()}"


def warm_up(functions: tuple[str, ...], _index: int, _rows: Iterator[Any]) -> Iterator[str]:
    """The body of a warm-up task: with this module loaded (the client with it), import
    the readers' functions too; yields why each one that cannot be imported cannot."""
    for function in functions:
        try:
            client.load_function(function, WHERE)
        except Exception as exc:  # reported to the driver; a reader would fail the same way
            yield f"{function}: {exc}"


def run_partition(spec: ReaderSpec, index: int, _rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
    """The body of one Spark task: one reader. Yields its report (one row)."""
    yield asdict(run_reader(spec, index))


def run_reader(spec: ReaderSpec, index: int = 0) -> ReaderReport:
    """Register, read until idle or stopped, end; never raises."""
    report = ReaderReport(partition=index, started_at=time.time())
    report.job_task_id, report.executor = _where()
    try:
        conn = client.connect_sync(spec.url)
    except client.BrokerError as exc:
        report.error = f"cannot connect: {exc}"
        return report

    def register(session: client.SyncConnection) -> dict[str, Any]:
        return session.register_task(
            spec.queue,
            spec.activator,
            procedure=spec.function,
            job=spec.job,
            job_task_id=report.job_task_id,
            executor=report.executor,
            pid=os.getpid(),
        )

    try:
        try:
            info = register(conn)
        except client.InUseError as exc:
            report.refused = str(exc)
            return report
        # the broker ended the task with the old connection: the new one is the task again
        conn.on_reconnect.append(register)
        report.registered, report.task_id = True, int(info["task_id"])
        report.registered_at = time.time()
        error: str | None = None
        try:
            fn = client.load_function(spec.function, WHERE)
            if spec.mode == PROCEDURE_MODE:
                task = TaskInfo(
                    spec.queue, int(info["task_id"]), spec.job, report.job_task_id, report.executor
                )
                fn(conn, task)
            else:
                _read_messages(conn, spec, fn, report)
        except Exception as exc:  # reported, not raised: one failing task fails a local job
            error = f"{type(exc).__name__}: {exc}"
            report.error = error
        if not conn.closed:
            if error is not None:  # it may have left a transaction open
                with contextlib.suppress(client.TransactionError):
                    conn.rollback(error=error)
            conn.end_task(error)
    except client.BrokerError as exc:
        report.error = report.error or f"{type(exc).__name__}: {exc}"
    finally:
        report.ended_at = time.time()
        conn.close()
    return report


def _read_messages(
    conn: client.SyncConnection,
    spec: ReaderSpec,
    fn: Callable[[client.Message, client.SyncConnection], Any],
    report: ReaderReport,
) -> None:
    isolated = 0  # messages still to take one at a time after a failure
    while True:
        top = ISOLATED_AFTER_FAILURE if isolated > 0 else spec.batch_size
        try:
            messages, put_back = _one_transaction(conn, spec, fn, top)
        except client.TransactionRolledBackError:  # the connection dropped: rolled back
            with contextlib.suppress(client.BrokerError):
                conn.rollback()
            continue
        except _Failed as failed:  # the user's function failed: rolled back, go on
            report.rolled_back += 1
            isolated = max(isolated, failed.messages)
            continue
        report.transactions += 1
        if put_back:  # it held a message that failed before: one at a time
            report.put_back += 1
            isolated = max(isolated, put_back)
            continue
        if not messages:
            return
        report.processed += sum(1 for m in messages if not (m.is_end_dialog or m.is_error))
        report.last_processed_at = time.time()
        if isolated > 0:
            isolated -= len(messages)


class _Failed(Exception):
    """The user's function failed on a transaction of `messages` messages (rolled back)."""

    def __init__(self, messages: int) -> None:
        super().__init__(messages)
        self.messages = messages


def _one_transaction(
    conn: client.SyncConnection,
    spec: ReaderSpec,
    fn: Callable[[client.Message, client.SyncConnection], Any],
    top: int,
) -> tuple[list[client.Message], int]:
    """RECEIVE, process, COMMIT; once the commit is known to have happened, the messages
    and how many were put back (none processed). BEGIN leaves with the RECEIVE, or with the savepoint a batch takes before it (see
    `SyncConnection.transaction`); a failure of the user's function rolls the
    transaction back with the function's error. A batch that holds a message delivered
    before is put back unprocessed, and the empty transaction commits."""
    messages: list[client.Message] = []
    processing = False
    put_back = 0
    try:
        with conn.transaction():
            if top > 1:
                conn.save_transaction(BATCH_SAVEPOINT)
            # the broker's errors here (queue disabled, ...) end the reader
            messages = conn.receive(spec.queue, top=top, timeout=spec.idle_timeout)
            if len(messages) > 1 and any(m.delivery_count > 1 for m in messages):
                # a rollback of this batch would count a failed delivery for each of them;
                # back to the savepoint, they go back as they were
                conn.rollback_to_savepoint(BATCH_SAVEPOINT)
                put_back, messages = len(messages), []
            processing = True
            for message in messages:
                if message.is_end_dialog or message.is_error:
                    with contextlib.suppress(client.ConversationEndedError, client.NotFoundError):
                        conn.end_conversation(message.conversation_handle)
                else:
                    fn(message, conn)
            processing = False
    except (client.ConnectionLostError, client.TransactionRolledBackError):
        raise
    except Exception as exc:
        if processing:  # the user's function failed: rolled back, go on
            raise _Failed(len(messages)) from exc
        raise
    return messages, put_back


@dataclass(frozen=True, slots=True)
class QueueBinding:
    """A queue the bridge serves and what its readers run.

    Args:
        queue: the queue.
        function: "package.module:function"; `fn(message, conn)` per message, or in
            procedure mode an activation procedure `proc(conn, task)`.
        mode: "message" or "procedure".
        batch_size: RECEIVE TOP(n) per transaction.
        idle_timeout: a reader exits after a RECEIVE waited this long for nothing.
        max_readers: a further cap below the queue's MAX_QUEUE_READERS (None: none).
    """

    queue: str
    function: str
    mode: str = MESSAGE_MODE
    batch_size: int = 100
    idle_timeout: float = 2.0
    max_readers: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in (MESSAGE_MODE, PROCEDURE_MODE):
            raise ValueError(f"mode is 'message' or 'procedure', got {self.mode!r}")
        if ":" not in self.function:
            raise ValueError(f"function is 'package.module:function', got {self.function!r}")
        batch, idle = self.batch_size, self.idle_timeout
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, got {batch!r}")
        if (
            isinstance(idle, bool)
            or not isinstance(idle, (int, float))
            or not 0 < idle < math.inf  # (NaN fails too)
        ):
            raise ValueError(f"idle_timeout must be a finite number of seconds > 0, got {idle!r}")
        readers = self.max_readers
        if readers is not None and (
            isinstance(readers, bool) or not isinstance(readers, int) or readers < 1
        ):
            raise ValueError(f"max_readers must be a whole number >= 1, got {readers!r}")
