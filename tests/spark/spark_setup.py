"""Shared set-up for the Spark tests: services, loads, and watching from the broker's side."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from ssb import client
from ssb.spark_bridge import QueueBinding, SparkActivator

Rows = list[dict[str, Any]]


@contextlib.contextmanager
def activated(
    spark: Any, url: str, queue: str, function: str, **binding: Any
) -> Iterator[SparkActivator]:
    """A SparkActivator that serves `queue` with `function` (in transactions of up to 20
    messages, readers idle for a second stop, unless `binding` says otherwise), started,
    and stopped with a grace of 5 s at the end."""
    settings = {"batch_size": 20, "idle_timeout": 1.0, **binding}
    activator = SparkActivator(spark, url, [QueueBinding(queue, function, **settings)])
    activator.start()
    try:
        yield activator
    finally:
        activator.stop(grace=5)


def work_queue(conn: client.SyncConnection, name: str, readers: int, **queue: Any) -> None:
    """Queue `name` (external activation only: activation OFF, MAX_QUEUE_READERS =
    readers), its service, and a reply service `name`Replies."""
    conn.create_queue(name, activation={"status": "OFF", "max_queue_readers": readers}, **queue)
    conn.create_service(f"{name}Service", queue=name, contracts=["DEFAULT"])
    conn.create_queue(f"{name}Replies")
    conn.create_service(f"{name}ReplyService", queue=f"{name}Replies")


def load_body(conversation: int, number: int) -> bytes:
    """The body of message `number` of dialog `conversation` in a load (`send_load`)."""
    return f"{conversation}:{number}".encode()


def one_body_replaced(at: tuple[int, int], body: bytes) -> Callable[[int, int], bytes]:
    """A load's bodies (`load_body`), but message `at` (dialog, number) is `body`."""
    return lambda c, i: body if (c, i) == at else load_body(c, i)


def replies_to_load(
    conversations: int, per_conversation: int, but: tuple[int, int] | None = None
) -> dict[bytes, int]:
    """The replies "done:" + body (as `spark_funcs.reply` answers) to a load of that size,
    each once (but none for message `but`, whose body the test replaced)."""
    return {
        f"done:{c}:{i}".encode(): 1
        for c in range(conversations)
        for i in range(per_conversation)
        if (c, i) != but
    }


def send_load(
    conn: client.SyncConnection,
    name: str,
    conversations: int,
    per_conversation: int,
    body: Callable[[int, int], bytes] = load_body,
) -> list[uuid.UUID]:
    """`conversations` dialogs to `name`Service with `per_conversation` messages each."""
    handles = []
    with conn.transaction():
        for c in range(conversations):
            handle = conn.begin_dialog(f"{name}ReplyService", f"{name}Service")
            conn.send_many(handle, "DEFAULT", [body(c, i) for i in range(per_conversation)])
            handles.append(handle)
    return handles


def collect_replies(
    conn: client.SyncConnection, name: str, expected: int, timeout: float
) -> Counter[bytes]:
    """Receive replies until `expected` arrived (more may follow: the caller checks)."""
    seen: Counter[bytes] = Counter()
    deadline = time.monotonic() + timeout
    while sum(seen.values()) < expected:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"only {sum(seen.values())} of {expected} replies in {timeout} s")
        for m in conn.receive(f"{name}Replies", top=500, timeout=min(left, 1.0)):
            seen[m.message_body] += 1
    return seen


class ReaderWatch:
    """Samples the broker's activated_tasks view in a thread: the most readers of a
    queue seen at once, and every external task seen."""

    def __init__(self, url: str, queue: str) -> None:
        self.url = url
        self.queue = queue
        self.most = 0
        self.samples = 0
        self.tasks: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with client.connect_sync(self.url) as conn:
            while not self._stop.is_set():
                rows = [r for r in conn.view("activated_tasks") if r["queue"] == self.queue]
                monitor = [r for r in conn.view("queue_monitors") if r["queue"] == self.queue]
                running = max(len(rows), monitor[0]["tasks_running"] if monitor else 0)
                self.most = max(self.most, running)
                self.samples += 1
                for row in rows:
                    self.tasks.setdefault(row["task_id"], row)
                self._stop.wait(0.01)
