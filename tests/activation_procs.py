"""Activation procedures used by the tests; workers import them from tests/ (python_path).

Each one is a small, bounded imitation of a real reader: it RECEIVEs from its own
queue (the task context names it), does something, and returns once the queue
stays empty for `WAIT` seconds. Nothing here runs forever: the "hanging" ones give
up after `HANG_LIMIT` seconds, so a broken test cannot leave a process spinning.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ssb import client

WAIT = 1.0
HANG_LIMIT = 60.0


def echo(conn: client.SyncConnection, task: Any) -> None:
    """Reply to each message with its own body, one transaction per message."""
    while True:
        with conn.transaction():
            messages = conn.receive(task.queue, top=1, timeout=WAIT)
            for m in messages:
                if m.is_end_dialog or m.is_error:
                    conn.end_conversation(m.conversation_handle)
                else:
                    conn.send(m.conversation_handle, "DEFAULT", m.message_body)
        if not messages:
            return


async def async_echo(conn: client.Connection, task: Any) -> None:
    """`echo` for the async client."""
    while True:
        async with conn.transaction():
            messages = await conn.receive(task.queue, top=1, timeout=WAIT)
            for m in messages:
                await conn.send(m.conversation_handle, "DEFAULT", b"async:" + m.message_body)
        if not messages:
            return


def slow(conn: client.SyncConnection, task: Any) -> None:
    """Take one message at a time (committed at once) and spend 0.3 s on it."""
    while conn.receive(task.queue, top=1, timeout=WAIT):
        time.sleep(0.3)


HOLD_WAIT = 5.0  # longer than the test watches a second reader wait: it must not leave


def hold(conn: client.SyncConnection, task: Any) -> None:
    """Receive in a transaction and keep the group locked until the file named by
    the message body exists; a reader waiting for the group waits HOLD_WAIT seconds."""
    while True:
        with conn.transaction():
            messages = conn.receive(task.queue, top=1, timeout=HOLD_WAIT)
            for m in messages:
                marker = Path(m.text())
                deadline = time.monotonic() + HANG_LIMIT
                while not marker.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
        if not messages:
            return


def busy(conn: client.SyncConnection, task: Any) -> None:
    """One message per short transaction, 20 ms of work each, the group locked meanwhile."""
    while True:
        with conn.transaction():
            messages = conn.receive(task.queue, top=1, timeout=WAIT)
            if messages:
                time.sleep(0.02)
        if not messages:
            return


def fail(conn: client.SyncConnection, task: Any) -> None:
    """Receive in a transaction, then raise: the transaction must roll back."""
    with conn.transaction():
        conn.receive(task.queue, top=1, timeout=WAIT)
        raise RuntimeError("procedure failed on purpose")


def burn(conn: client.SyncConnection, task: Any) -> None:
    """Take a message, then spin on the CPU (a procedure that hangs)."""
    conn.receive(task.queue, top=1, timeout=WAIT)
    deadline = time.monotonic() + HANG_LIMIT
    while time.monotonic() < deadline:
        pass


def crash_once(conn: client.SyncConnection, task: Any) -> None:
    """First delivery: hold the message in a transaction until killed. Later
    deliveries: reply with the pid and the delivery count, and commit."""
    while True:
        with conn.transaction():
            messages = conn.receive(task.queue, top=1, timeout=WAIT)
            for m in messages:
                if m.delivery_count == 1:
                    time.sleep(HANG_LIMIT)
                reply = f"{os.getpid()}:{m.delivery_count}"
                conn.send(m.conversation_handle, "DEFAULT", reply)
        if not messages:
            return


def no_context(conn: client.SyncConnection) -> None:
    """The one-argument form: the procedure knows its queue itself."""
    while True:
        messages = conn.receive("OneArgQueue", top=1, timeout=WAIT)
        if not messages:
            return
        conn.send(messages[0].conversation_handle, "DEFAULT", b"one-arg")


def sleep_task(seconds: float) -> float:
    """A scheduler task: sleep, return how long."""
    time.sleep(seconds)
    return seconds


def failing_task(text: str) -> None:
    """A scheduler task that raises."""
    raise ValueError(text)


def worker_pid() -> int:
    """A scheduler task that reports the worker process it ran in."""
    return os.getpid()


def picky(conn: client.SyncConnection, task: Any) -> None:
    """Echo every message but one whose body is b"poison": that one raises (so its
    transaction rolls back and this task ends)."""
    while True:
        with conn.transaction():
            messages = conn.receive(task.queue, top=1, timeout=WAIT)
            for m in messages:
                if m.message_body == b"poison":
                    raise ValueError("cannot process this message")
                conn.send(m.conversation_handle, "DEFAULT", m.message_body)
        if not messages:
            return
