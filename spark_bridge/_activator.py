"""The Spark bridge: an external activator that runs activated readers as Spark tasks.

Theory of operation. For every queue it serves, the bridge makes sure a
QUEUE_ACTIVATION event notification posts to its own notification service (created
with its queue if missing), and an event thread RECEIVEs those EventNotifications.
Each one names a queue; the bridge then asks the broker how many readers the queue
has (internal and external together, `queue_monitors`) and how many messages are
ready, and submits one Spark job with `min(free places, ready / batch_size)` tasks,
each an activated reader (`_reader`). Readers of jobs submitted but not registered yet
count as running, so two events in a row do not start twice the readers; the
broker refuses any registration beyond MAX_QUEUE_READERS anyway, so the cap holds
whatever the bridge believes. Every `poll_interval` the bridge also activates a
queue that has ready messages and none of its readers, in case an event was lost.

Starting, the bridge runs one warm-up job (a task per core) that imports the reader
and the readers' functions, so the first activation does not pay for PySpark's daemon
and workers starting (with `EXECUTOR_SETTINGS` the daemon forks workers that have
the reader imported already, see `_daemon`).

Jobs are submitted from a thread pool (PySpark actions block), each in its own job
group (`<activator>/<queue>/<n>`, interruptible) and, under the FAIR scheduler, in
a pool named after the queue; the event thread labels each job's readers with the
Spark job id once Spark has assigned it.

Stopping: no new jobs; `request_stop(activator=...)` makes every reader of this
bridge, registered now or later, get an empty RECEIVE, commit and exit; after
`stop_grace` seconds the job groups still running are cancelled. A cancelled task
killed mid-transaction has its connection dropped, so the broker rolls its
transaction back and the messages return to the queue: committed work is done,
received-but-uncommitted work is redone, nothing is lost.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import signal
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ssb import client

from ._reader import QueueBinding, ReaderSpec, run_partition, warm_up
from ._scheduler import spark_scheduler_binding

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger("ssb.spark_bridge")

EVENT_WAIT: Final = 0.25  # the event thread's RECEIVE timeout (its tick)
WARM_UP_TIMEOUT: Final = 60.0  # start() waits this long at most for the warm-up job
MAX_JOB_THREADS: Final = 64


@dataclass(eq=False)
class JobRecord:
    """One Spark job of readers."""

    queue: str
    group: str
    readers: int
    reason: str  # "event" or "check"
    event_time: float | None  # when the bridge received the QUEUE_ACTIVATION event
    submitted: float
    spark_job_id: int | None = None
    finished: float | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    cancelled: bool = False
    registered_seen: int = 0

    @property
    def running(self) -> bool:
        return self.finished is None

    @property
    def processed(self) -> int:
        return sum(int(r.get("processed", 0)) for r in self.reports)

    @property
    def first_registered(self) -> float | None:
        times = [r["registered_at"] for r in self.reports if r.get("registered_at")]
        return min(times) if times else None


@dataclass(frozen=True, slots=True)
class StopReport:
    """What `SparkActivator.stop` did."""

    readers_asked: int
    jobs_cancelled: int
    seconds: float


def _bindings(
    queues: Mapping[str, str | QueueBinding] | Iterable[QueueBinding],
) -> list[QueueBinding]:
    if isinstance(queues, Mapping):
        return [
            b if isinstance(b, QueueBinding) else QueueBinding(name, b)
            for name, b in queues.items()
        ]
    return list(queues)


def event_queue(body: bytes) -> str | None:
    """The queue (ObjectName) a QUEUE_ACTIVATION EventNotification is about."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    if not any(
        e.tag.rsplit("}", 1)[-1] == "EventType" and e.text == "QUEUE_ACTIVATION"
        for e in root.iter()
    ):
        return None
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] == "ObjectName":
            return element.text or None
    return None


class SparkActivator:
    """Runs activated readers of broker queues as Spark tasks (an external activator).

    Example:
        activator = SparkActivator(spark, "ssb://admin:pw@127.0.0.1:4021",
                                   {"Orders": "myjobs.orders:process"})
        activator.serve()          # until SIGTERM / Ctrl-C or stop() from another thread
    """

    def __init__(
        self,
        spark: SparkSession,
        broker_url: str,
        queues: Mapping[str, str | QueueBinding] | Iterable[QueueBinding] = (),
        *,
        name: str = "spark-bridge",
        poll_interval: float = 1.0,
        stop_grace: float = 10.0,
        warm_up: bool = True,
    ) -> None:
        self.spark = spark
        self.url = broker_url
        self.name = name
        self.activator_id = f"{name}:{uuid.uuid4().hex[:12]}"
        self.poll_interval = poll_interval
        self.stop_grace = stop_grace
        self.warm_up = warm_up
        self.warm_up_seconds: float | None = None  # what start()'s warm-up job took
        self.bindings: dict[str, QueueBinding] = {}
        self._event_thread: threading.Thread | None = None
        for binding in _bindings(queues):
            self.add_queue(binding)
        self.jobs: list[JobRecord] = []
        self._futures: dict[str, Future[None]] = {}
        self._lock = threading.Lock()
        self._job_numbers = itertools.count(1)
        self._pool = ThreadPoolExecutor(MAX_JOB_THREADS, thread_name_prefix="ssb-spark-job")
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._conn: client.SyncConnection | None = None
        self.failure: str | None = None  # why the event thread ended the bridge
        self._fair = spark.sparkContext.getConf().get("spark.scheduler.mode", "FIFO") == "FAIR"

    # ---- configuration -----------------------------------------------------------

    @property
    def notification_queue(self) -> str:
        return f"{self.name}/Notifications"

    @property
    def notification_service(self) -> str:
        return f"{self.name}/NotificationService"

    def add_queue(
        self, binding: QueueBinding | str, function: str | None = None, **options: Any
    ) -> None:
        """Serve another queue: `add_queue("Orders", "myjobs.orders:process", batch_size=50)`."""
        if isinstance(binding, str):
            if function is None:
                raise ValueError("add_queue(queue, function) needs the function")
            binding = QueueBinding(binding, function, **options)
        if self._event_thread is not None:
            raise RuntimeError("add queues before start()")
        self.bindings[binding.queue] = binding

    def add_scheduler(self, name: str = "Scheduler", **options: Any) -> None:
        """Run the seed-000 scheduler `name`'s tasks on Spark (see `install_spark_scheduler`)."""
        self.add_queue(spark_scheduler_binding(name, **options))

    # ---- life ----------------------------------------------------------------------

    def start(self) -> None:
        """Create the notification objects if missing, subscribe, warm the executors'
        Python workers up (unless `warm_up=False`), start the event thread."""
        if self._event_thread is not None:
            raise RuntimeError("the bridge is already started")
        if not self.bindings:
            raise ValueError("the bridge serves no queue; add_queue() first")
        self._conn = client.connect_sync(self.url)
        self._install(self._conn)
        if self.warm_up:
            self._warm_up()
        self._event_thread = threading.Thread(
            target=self._events, name="ssb-spark-events", daemon=True
        )
        self._event_thread.start()

    def serve(self) -> None:
        """start(), then block until stop() (SIGTERM and SIGINT call it when this is the
        main thread)."""
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: threading.Thread(target=self.stop).start())
        if self._event_thread is None:
            self.start()
        self._stopped.wait()
        if self.failure is not None:
            raise RuntimeError(f"the Spark bridge stopped: {self.failure}")

    def stop(self, grace: float | None = None) -> StopReport:
        """Stop cooperatively, then cancel what is left after `grace` seconds."""
        began = time.monotonic()
        grace = self.stop_grace if grace is None else grace
        self._stopping.set()
        asked = 0
        try:
            with client.connect_sync(self.url) as conn:
                asked = conn.request_stop(activator=self.activator_id)
        except client.BrokerError as exc:  # no broker: cancelling the jobs is all there is
            log.warning("cannot ask the readers to stop: %s", exc)
        deadline = time.monotonic() + grace
        for future in list(self._futures.values()):
            with contextlib.suppress(Exception):
                future.result(timeout=max(0.0, deadline - time.monotonic()))
        cancelled = 0
        sc = self.spark.sparkContext
        for job in list(self.jobs):
            if job.running:
                job.cancelled = True
                cancelled += 1
                sc.cancelJobGroup(job.group)
        for future in list(self._futures.values()):
            with contextlib.suppress(Exception):
                future.result(timeout=30.0)
        if self._event_thread is not None and self._event_thread is not threading.current_thread():
            self._event_thread.join(timeout=10.0)
        self._pool.shutdown(wait=False)
        if self._conn is not None:
            self._conn.close()
        self._stopped.set()
        return StopReport(asked, cancelled, time.monotonic() - began)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until none of the bridge's jobs runs; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                futures = list(self._futures.values())
            if not futures:
                return True
            with contextlib.suppress(Exception):
                futures[0].result(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            return not self._futures

    # ---- catalog -------------------------------------------------------------------

    def _install(self, conn: client.SyncConnection) -> None:
        with contextlib.suppress(client.AlreadyExistsError):
            conn.create_queue(self.notification_queue)
        with contextlib.suppress(client.AlreadyExistsError):
            conn.create_service(
                self.notification_service,
                queue=self.notification_queue,
                contracts=[client.POST_EVENT_NOTIFICATION],
            )
        existing = {(row["queue"], row["service"]) for row in _notifications(conn)}
        for queue in self.bindings:
            if (queue, self.notification_service) in existing:
                continue
            with contextlib.suppress(client.AlreadyExistsError):
                conn.create_event_notification(
                    f"{self.name}/{queue}",
                    "QUEUE_ACTIVATION",
                    queue=queue,
                    service=self.notification_service,
                )

    def _warm_up(self) -> None:
        """Run a job of one task per core that imports the reader and the functions, so
        the first activation finds Python workers (and PySpark's daemon) ready: the
        seconds a first task pays go here instead. A function that cannot be imported
        is logged now (its readers will report the same error); a job that does not end
        within WARM_UP_TIMEOUT is cancelled and the bridge starts without it."""
        began = time.monotonic()
        sc = self.spark.sparkContext
        group = f"{self.activator_id}/warm-up"
        functions = tuple(sorted({b.function for b in self.bindings.values()}))
        tasks = max(1, sc.defaultParallelism)

        def run() -> list[str]:
            sc.setJobGroup(group, "ssb: the Spark bridge's warm-up", True)
            try:
                rdd = sc.parallelize(range(tasks), tasks)
                return rdd.mapPartitionsWithIndex(functools.partial(warm_up, functions)).collect()
            finally:
                _clear_job_properties(sc)

        future = self._pool.submit(run)
        try:
            problems = future.result(timeout=WARM_UP_TIMEOUT)
        except Exception as exc:
            sc.cancelJobGroup(group)
            log.warning("the Spark bridge's warm-up job did not finish: %r; starting without", exc)
            return
        for problem in sorted(set(problems)):
            log.warning("executors cannot import a reader's function: %s", problem)
        self.warm_up_seconds = time.monotonic() - began

    # ---- the event thread ----------------------------------------------------------

    def _events(self) -> None:
        try:
            with client.connect_sync(self.url) as events:
                last_check = 0.0
                while not self._stopping.is_set():
                    for message in events.receive(
                        self.notification_queue, top=100, timeout=EVENT_WAIT
                    ):
                        self._on_event(events, message)
                    if time.monotonic() - last_check >= self.poll_interval:
                        last_check = time.monotonic()
                        for queue in self.bindings:
                            self._activate(queue, "check", None)
                    self._label_jobs()
        except Exception as exc:
            if not self._stopping.is_set():
                log.exception("the spark bridge's event thread failed; stopping the bridge")
                self.failure = f"{type(exc).__name__}: {exc}"
                self.stop()

    def _on_event(self, conn: client.SyncConnection, message: client.Message) -> None:
        if message.is_end_dialog or message.is_error:
            with contextlib.suppress(client.BrokerError):
                conn.end_conversation(message.conversation_handle)
            return
        if message.message_type_name != client.EVENT_NOTIFICATION:
            return
        queue = event_queue(message.message_body)
        if queue in self.bindings:
            self._activate(queue, "event", time.time())

    def _label_jobs(self) -> None:
        assert self._conn is not None
        tracker = self.spark.sparkContext.statusTracker()
        for job in self.jobs:
            if job.running and job.spark_job_id is None:
                ids = tracker.getJobIdsForGroup(job.group)
                if ids:
                    job.spark_job_id = int(ids[0])
                    self._conn.label_job(job.group, job.spark_job_id)

    # ---- activation ----------------------------------------------------------------

    def _activate(self, queue: str, reason: str, event_time: float | None) -> JobRecord | None:
        """Submit a job of readers for `queue` if it has ready messages and free places."""
        if self._stopping.is_set():
            return None
        assert self._conn is not None
        binding = self.bindings[queue]
        monitor = next((r for r in self._conn.view("queue_monitors") if r["queue"] == queue), None)
        if monitor is None or not monitor["messages_ready"]:
            return None
        tasks = [t for t in self._conn.view("activated_tasks") if t["queue"] == queue]
        with self._lock:
            pending = 0
            for job in self.jobs:
                if job.running and job.queue == queue:
                    seen = sum(1 for t in tasks if t["job"] == job.group)
                    job.registered_seen = max(job.registered_seen, seen)
                    pending += max(0, job.readers - job.registered_seen)
            ours = any(t["activator"] == self.activator_id for t in tasks)
            if reason == "check" and (pending or ours):
                return None  # a safety net for lost events only
            cap = int(monitor["max_queue_readers"])
            if binding.max_readers is not None:
                cap = min(cap, binding.max_readers)
            free = cap - len(tasks) - pending
            wanted = math.ceil(int(monitor["messages_ready"]) / binding.batch_size)
            readers = min(free, max(1, wanted))
            if readers <= 0:
                return None
            group = f"{self.activator_id}/{queue}/{next(self._job_numbers)}"
            job = JobRecord(queue, group, readers, reason, event_time, time.time())
            self.jobs.append(job)
            self._futures[group] = self._pool.submit(self._run_job, binding, job)
        return job

    def _run_job(self, binding: QueueBinding, job: JobRecord) -> None:
        spec = ReaderSpec(
            url=self.url,
            queue=binding.queue,
            function=binding.function,
            activator=self.activator_id,
            job=job.group,
            mode=binding.mode,
            batch_size=binding.batch_size,
            idle_timeout=binding.idle_timeout,
        )
        sc = self.spark.sparkContext
        sc.setJobGroup(job.group, f"ssb activated readers of {binding.queue}", True)
        if self._fair:
            sc.setLocalProperty("spark.scheduler.pool", binding.queue)
        try:
            rdd = sc.parallelize(range(job.readers), job.readers)
            job.reports = rdd.mapPartitionsWithIndex(
                functools.partial(run_partition, spec)
            ).collect()
        except Exception as exc:  # cancelled on stop, or Spark failed the job
            job.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if not job.cancelled:
                log.warning("spark job %s of queue %s failed: %s", job.group, job.queue, job.error)
        finally:
            _clear_job_properties(sc)
            with self._lock:
                job.finished = time.time()
                self._futures.pop(job.group, None)


def _clear_job_properties(sc: SparkContext) -> None:
    """Pooled threads keep Spark's local properties: leave nothing for the next job."""
    for key in ("spark.jobGroup.id", "spark.job.description", "spark.scheduler.pool"):
        sc.setLocalProperty(key, None)  # type: ignore[arg-type]
    sc.setLocalProperty("spark.job.interruptOnCancel", None)  # type: ignore[arg-type]


def _notifications(conn: client.SyncConnection) -> list[dict[str, Any]]:
    return [
        {"queue": row["queue_name"], "service": row["service_name"]}
        for row in conn.view("event_notifications")
        if row["event"] == "QUEUE_ACTIVATION"
    ]
