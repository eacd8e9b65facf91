"""The seed-000 scheduler with its tasks run as Spark tasks.

Theory of operation. The scheduler's catalog objects and API are the in-broker
scheduler's (`client._scheduler`): a conversation is the scheduler handle,
`exec_async` logs a task and sends it, `synchronize` collects AsyncDone answers,
`release` ends the conversation. The one difference is who reads the target
queue: its activation is OFF (so the broker starts no worker) and its
MAX_QUEUE_READERS caps the Spark bridge, which subscribes to the queue's
QUEUE_ACTIVATION events and runs the scheduler's activation procedure
(`client.SCHEDULER_PROCEDURE`) in Spark tasks. Each task body therefore runs on an
executor, and the execution log row of each task records the reader's executor,
Spark job group and Spark task id (`execution_log` view), next to its times.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ssb import client

from ._reader import PROCEDURE_MODE, QueueBinding


def _external(max_queue_readers: int) -> dict[str, Any]:
    """The target queue's activation: OFF, its MAX_QUEUE_READERS capping the bridge."""
    return {"status": "OFF", "max_queue_readers": max_queue_readers}


def install_spark_scheduler(
    conn: client.SyncConnection,
    name: str = "Scheduler",
    *,
    max_queue_readers: int = client.SCHEDULER_READERS,
) -> None:
    """Create scheduler `name`'s objects for Spark execution, if missing.

    Its target queue gets activation OFF with `max_queue_readers` (the cap on Spark
    readers); an existing in-broker scheduler of that name is switched to Spark.
    """
    names = client.SchedulerNames(name)
    for request in names.install_calls(_external(max_queue_readers)):
        with contextlib.suppress(client.AlreadyExistsError):
            conn.call(request)
    conn.alter_queue(names.target_queue, activation=_external(max_queue_readers))


def get_spark_scheduler(
    conn: client.SyncConnection,
    name: str = "Scheduler",
    *,
    max_running: int | None = None,
    max_queue_readers: int = client.SCHEDULER_READERS,
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
    max_queue_readers: int = client.SCHEDULER_READERS,
) -> client.Scheduler:
    """`get_spark_scheduler` on an async connection."""
    names = client.SchedulerNames(name)
    for request in names.install_calls(_external(max_queue_readers)):
        with contextlib.suppress(client.AlreadyExistsError):
            await conn.call(request)
    await conn.alter_queue(names.target_queue, activation=_external(max_queue_readers))
    return await conn.get_scheduler(name, max_running=max_running, install=False)


def spark_scheduler_binding(name: str = "Scheduler", **options: Any) -> QueueBinding:
    """The bridge's binding for scheduler `name`: its procedure on its target queue."""
    return QueueBinding(
        client.SchedulerNames(name).target_queue,
        client.SCHEDULER_PROCEDURE,
        mode=PROCEDURE_MODE,
        **options,
    )
