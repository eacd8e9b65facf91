"""The seed-000 scheduler with its tasks run as Spark tasks.

Theory of operation. The scheduler's catalog objects and API are the in-broker
scheduler's (`client._scheduler`): a conversation is the scheduler handle,
`exec_async` logs a task and sends it, `synchronize` collects AsyncDone answers,
`release` ends the conversation. The one difference is who reads the target
queue: its activation is OFF (so the broker starts no worker) and its
MAX_QUEUE_READERS caps the Spark bridge, which subscribes to the queue's
QUEUE_ACTIVATION events and runs the scheduler's activation procedure
(`ssb.client._scheduler:run_tasks`) in Spark tasks. Each task body therefore runs on an
executor, and the execution log row of each task records the reader's executor,
Spark job group and Spark task id (`execution_log` view), next to its times.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ssb import client
from ssb.client._scheduler import (
    DEFAULT_READERS,
    SCHEDULER_PROCEDURE,
    SchedulerNames,
    _install_steps,
)
from ssb.client._url import parse_url

from ._reader import PROCEDURE_MODE, QueueBinding


def _spark_steps(
    name: str, max_queue_readers: int, user: str
) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    names = SchedulerNames(name)
    steps = []
    for operation, args, kwargs in _install_steps(names, max_queue_readers, user):
        if operation == "create_queue" and args[0] == names.target_queue:
            kwargs = {"activation": {"status": "OFF", "max_queue_readers": max_queue_readers}}
        steps.append((operation, args, kwargs))
    return steps


def install_spark_scheduler(
    conn: client.SyncConnection,
    name: str = "Scheduler",
    *,
    max_queue_readers: int = DEFAULT_READERS,
) -> None:
    """Create scheduler `name`'s objects for Spark execution, if missing.

    Its target queue gets activation OFF with `max_queue_readers` (the cap on Spark
    readers); an existing in-broker scheduler of that name is switched to Spark.
    """
    user = parse_url(conn.url).user
    for operation, args, kwargs in _spark_steps(name, max_queue_readers, user):
        with contextlib.suppress(client.AlreadyExistsError):
            getattr(conn, operation)(*args, **kwargs)
    conn.alter_queue(
        SchedulerNames(name).target_queue,
        activation={"status": "OFF", "max_queue_readers": max_queue_readers},
    )


def get_spark_scheduler(
    conn: client.SyncConnection,
    name: str = "Scheduler",
    *,
    max_running: int | None = None,
    max_queue_readers: int = DEFAULT_READERS,
) -> client.SyncScheduler:
    """Begin a scheduler conversation whose tasks a `SparkActivator` runs.

    Returns:
        The same `SyncScheduler` as `conn.get_scheduler()`: exec_async, synchronize,
        release. The bridge must serve it: `activator.add_scheduler(name)`.
    """
    install_spark_scheduler(conn, name, max_queue_readers=max_queue_readers)
    return conn.get_scheduler(name, max_running=max_running, install=False)


async def get_spark_scheduler_async(
    conn: client.Connection,
    name: str = "Scheduler",
    *,
    max_running: int | None = None,
    max_queue_readers: int = DEFAULT_READERS,
) -> client.Scheduler:
    """`get_spark_scheduler` on an async connection."""
    user = parse_url(conn.url).user
    for operation, args, kwargs in _spark_steps(name, max_queue_readers, user):
        with contextlib.suppress(client.AlreadyExistsError):
            await getattr(conn, operation)(*args, **kwargs)
    await conn.alter_queue(
        SchedulerNames(name).target_queue,
        activation={"status": "OFF", "max_queue_readers": max_queue_readers},
    )
    return await conn.get_scheduler(name, max_running=max_running, install=False)


def spark_scheduler_binding(name: str = "Scheduler", **options: Any) -> QueueBinding:
    """The bridge's binding for scheduler `name`: its procedure on its target queue."""
    return QueueBinding(
        SchedulerNames(name).target_queue, SCHEDULER_PROCEDURE, mode=PROCEDURE_MODE, **options
    )
