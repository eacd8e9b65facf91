"""The Spark bridge's activated reader against a poison policy, without Spark or a daemon.

The reader's loop (`_read_messages`) runs on a connection that hands each request to a
broker core on an in-memory store with a fake clock (`CoreConnection`): the requests
are the client's own (`ssb.client._calls`), answered by the engine's operations. What
other readers did before (their batches that failed, the messages they committed) is
played on other sessions of the same core.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from ssb import client
from ssb.client import _calls as calls
from ssb.spark_bridge._reader import ReaderReport, ReaderSpec, _read_messages

from .core_harness import BODY, Core

POLICY = {"threshold": 3, "action": "dead_letter", "dead_letter_queue": "DLQ"}


class CoreConnection:
    """What the reader asks of a `SyncConnection`, answered by a core's session.
    RECEIVE never waits: nothing ready now is what a reader's idle timeout would find."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.session = core.new_session()
        self.closed = False

    def _run(self, call: calls.Call[Any]) -> Any:
        answer = self.core.engine.operations()[call.operation](self.session, **call.arguments)
        return call.decode(answer)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[CoreConnection]:
        self._run(calls.begin_transaction())
        try:
            yield self
        except BaseException as exc:
            self.rollback(error=f"{type(exc).__name__}: {exc}")
            raise
        self._run(calls.commit())

    def receive(self, queue: str, top: int | None = None, timeout: float = 0.0) -> Any:
        return self._run(calls.receive(queue, top=top, timeout=0.0))

    def send(self, handle: uuid.UUID, message_type: str = "DEFAULT", body: bytes = b"") -> None:
        self._run(calls.send(handle, message_type, body))

    def end_conversation(self, handle: uuid.UUID) -> None:
        self._run(calls.end_conversation(handle))

    def rollback(self, error: str | None = None) -> None:
        self._run(calls.rollback(error))

    def save_transaction(self, name: str) -> None:
        self._run(calls.save_transaction(name))

    def rollback_to_savepoint(self, name: str) -> None:
        self._run(calls.rollback_to_savepoint(name))


def reply_unless_poison(message: client.Message, conn: Any) -> None:
    """`spark_funcs.poison`: fail on b"poison", answer everything else."""
    if message.message_body == b"poison":
        raise ValueError("cannot process poison")
    conn.send(message.conversation_handle, "DEFAULT", b"done:" + message.message_body)


def _queue_with_poison(messages: int = 10, poison_at: int = 5) -> Core:
    """Queue Target (its poison policy dead-letters at the third failed delivery) with one
    dialog of `messages` messages, the one at `poison_at` being b"poison"."""
    core = Core()
    core.op("create_queue", "DLQ")
    core.services(poison_policy=POLICY)
    bodies = [b"poison" if i == poison_at else f"1:{i}".encode() for i in range(messages)]
    core.op("send", core.dialog(), "DEFAULT", bodies)
    return core


def _batch_fails(core: Core) -> None:
    """Another reader takes a batch, its function fails on the poison: rolled back."""
    other = CoreConnection(core)
    with contextlib.suppress(ValueError), other.transaction():
        for message in other.receive("Target", top=20):
            reply_unless_poison(message, other)


def _bodies(core: Core, queue: str) -> list[bytes]:
    """The bodies of what `queue` holds (taken: the test looks once, at its end)."""
    return [row[BODY] for row in core.receive_all(queue)]


def _read(core: Core, batch_size: int = 20) -> ReaderReport:
    spec = ReaderSpec("ssb://unused", "Target", "unused:fn", "tests", "job", batch_size=batch_size)
    report = ReaderReport(partition=0)
    _read_messages(CoreConnection(core), spec, reply_unless_poison, report)  # type: ignore[arg-type]
    return report


def test_a_reader_alone_dead_letters_the_poison_and_answers_the_rest() -> None:
    core = _queue_with_poison()
    report = _read(core)
    assert _bodies(core, "DLQ") == [b"poison"]
    assert _bodies(core, "Target") == []
    assert len(_bodies(core, "Initiator")) == 9
    assert report.processed == 9 and report.rolled_back == 3


def test_a_batch_that_failed_in_other_readers_is_not_rolled_back_with_its_good_messages() -> None:
    # two batches holding the poison failed (every message of it has had two failed
    # deliveries: what readers that did not put such a batch back, or whose connection
    # dropped, leave), then a reader answered the first three one at a time
    core = _queue_with_poison()
    _batch_fails(core)
    _batch_fails(core)
    helper = CoreConnection(core)
    for _ in range(3):
        with helper.transaction():
            (message,) = helper.receive("Target", top=1)
            reply_unless_poison(message, helper)
    # a reader that knows nothing of those failures takes the rest (in a batch, it would
    # give each of them its third failed delivery and the policy would take them all)
    report = _read(core)
    assert _bodies(core, "DLQ") == [b"poison"]
    assert _bodies(core, "Target") == []
    replies = _bodies(core, "Initiator")
    assert replies == [f"done:1:{i}".encode() for i in range(10) if i != 5]  # in order
    assert report.processed == 6 and report.rolled_back == 1 and report.put_back == 1
