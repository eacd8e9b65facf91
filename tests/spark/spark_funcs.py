"""Functions the Spark tests' readers run; executors import them from tests/spark/."""

from __future__ import annotations

import os
import time

from ssb import client


def reply(message: client.Message, conn: client.SyncConnection) -> None:
    """Answer on the message's conversation, in the reader's transaction."""
    conn.send(message.conversation_handle, "DEFAULT", b"done:" + message.message_body)


def slow_reply(message: client.Message, conn: client.SyncConnection) -> None:
    """`reply` after 20 ms of "work"."""
    time.sleep(0.02)
    reply(message, conn)


def brisk_reply(message: client.Message, conn: client.SyncConnection) -> None:
    """`reply` after 5 ms of "work"."""
    time.sleep(0.005)
    reply(message, conn)


def stuck(message: client.Message, conn: client.SyncConnection) -> None:
    """Hang inside the transaction (at most a minute) unless the body is "quick"."""
    if message.message_body != b"quick":
        time.sleep(60)
    reply(message, conn)


def flaky(message: client.Message, conn: client.SyncConnection) -> None:
    """Fail the first delivery of the message "bad"; answer everything else."""
    if message.message_body == b"bad" and message.delivery_count == 1:
        raise RuntimeError("bad message, first try")
    reply(message, conn)


def poison(message: client.Message, conn: client.SyncConnection) -> None:
    """Always fail on "poison"; answer everything else."""
    if message.message_body == b"poison":
        raise ValueError("cannot process poison")
    reply(message, conn)


def noop(message: client.Message, conn: client.SyncConnection) -> None:
    """The benchmark's trivial function."""


def add(a: int, b: int) -> int:
    """A scheduler task."""
    return a + b


def nap(seconds: float) -> str:
    """A scheduler task that takes a while."""
    time.sleep(seconds)
    return "rested"


def parent_command(_index: int) -> str:
    """The command line of the process that forked this Python worker (Linux)."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()
