"""Savepoints, and DROP SERVICE / DROP QUEUE with conversations and messages, in the core
without a daemon."""

from __future__ import annotations

import asyncio

import pytest

from ssb.broker._core.catalog import ERROR
from ssb.broker._errors import BrokerError
from ssb.protocol import ErrorCode

from .core_harness import BODY, DELIVERY_COUNT, HANDLE, MTYPE, Core


@pytest.fixture
def core() -> Core:
    core = Core()
    core.services()
    return core


def test_rollback_to_a_savepoint_undoes_only_what_came_after_it(core: Core) -> None:
    handle = core.dialog()
    core.op("send", [handle], bodies=[b"1", b"2", b"3"])
    core.op("begin_transaction")
    (first,) = core.op("receive", "Target", top=1)
    core.op("send", [handle], bodies=[b"kept"])
    core.op("save_transaction", "s")
    (second,) = core.op("receive", "Target", top=1)
    core.op("send", [handle], bodies=[b"undone"])
    begun = core.dialog()
    core.op("end_conversation", handle)
    core.op("save_transaction", "later")
    core.op("rollback_to_savepoint", "s")
    txn = core.session.txn
    assert txn is not None and [s.name for s in txn.savepoints] == ["s"]  # later goes
    assert core.engine.endpoints.get(begun) is None or core.engine.endpoints.get(begun).gone
    with pytest.raises(BrokerError) as gone:
        core.op("rollback_to_savepoint", "later")
    assert gone.value.code == ErrorCode.UNKNOWN_SAVEPOINT
    # its group stays locked by this transaction: another session waits, as in SQL Server
    other = core.new_session()
    assert core.op("receive", "Target", session=other) == []
    # the second message is back in its place, and the same transaction takes it again
    again = core.op("receive", "Target", top=1)
    assert [r[BODY] for r in again] == [second[BODY]]
    core.op("rollback_to_savepoint", "s")  # a savepoint can be rolled back to again
    core.op("commit")
    bodies = [r[BODY] for r in core.receive_all()]
    assert bodies == [b"2", b"3", b"kept"]  # the END was undone too: the dialog goes on
    assert first[BODY] == b"1"


def test_a_message_put_back_by_a_rollback_to_a_savepoint_is_not_a_failed_delivery() -> None:
    """The messages go back as they were (a reader may put a batch back unseen): only
    whole rollbacks raise delivery_count, and a poison policy that records at its
    threshold records when the failures reach it, whatever savepoints came between."""
    core = Core()
    core.services(
        poison_policy={"threshold": 2, "action": "record"},
        poison_message_handling={"status": "OFF"},
    )
    core.op("send", [core.dialog()], bodies=[b"bad"])

    def put_back(times: int) -> None:
        for _ in range(times):
            core.op("begin_transaction")
            core.op("save_transaction", "before")
            core.op("receive", "Target", top=1)
            core.op("rollback_to_savepoint", "before")
            core.op("commit")

    def fail() -> int:
        """A reader takes the message and rolls back: the delivery_count it saw."""
        core.op("begin_transaction")
        (taken,) = core.op("receive", "Target", top=1)
        core.op("rollback", error="cannot process")
        count: int = taken[DELIVERY_COUNT]
        return count

    put_back(3)
    assert fail() == 1
    put_back(2)
    assert fail() == 2  # the second failure: the policy's threshold
    core.flush()
    assert [row[5] for row in core.store.read_poison(10)] == ["record"]
    assert [row[DELIVERY_COUNT] for row in core.op("receive", "Target")] == [3]


def test_a_savepoint_of_the_same_name_as_the_last_replaces_it(core: Core) -> None:
    core.op("begin_transaction")
    for _ in range(3):
        core.op("save_transaction", "again")
    txn = core.session.txn
    assert txn is not None and len(txn.savepoints) == 1
    core.op("rollback")
    with pytest.raises(BrokerError) as outside:
        core.op("save_transaction", "s")
    assert outside.value.code == ErrorCode.NO_TRANSACTION


async def test_drop_service_ends_its_conversations_with_an_error_to_the_far_side(
    core: Core,
) -> None:
    handle = core.dialog()
    core.op("send", [handle], bodies=[b"1"])
    # a transaction of another session holds the target's group: the drop waits for it
    reader = core.new_session()
    core.op("begin_transaction", session=reader)
    (taken,) = core.op("receive", "Target", session=reader)
    dropping = asyncio.ensure_future(core.aop("drop", "service", "TargetService"))
    await asyncio.sleep(0)
    assert not dropping.done() and "TargetService" in core.engine.catalog.services
    core.op("commit", session=reader)
    await asyncio.wait_for(dropping, 5)
    assert "TargetService" not in core.engine.catalog.services
    got = core.op("receive", "Initiator")
    assert [r[MTYPE] for r in got] == [ERROR]
    assert b"<Code>-8490</Code>" in got[0][BODY] and b"TargetService" in got[0][BODY]
    assert core.engine.endpoints.get(taken[HANDLE]) is None
    core.op("end_conversation", handle)
    core.flush()
    assert core.engine.endpoints.page(None, 10) == []


async def test_drop_queue_deletes_its_messages_and_ends_waiting_receives_empty() -> None:
    core = Core()
    core.op("create_queue", "Dead")
    policy = {"threshold": 1, "action": "dead_letter", "dead_letter_queue": "Dead"}
    core.services(poison_policy=policy)
    core.op("send", [core.dialog()], bodies=[b"poison"])
    core.op("begin_transaction")
    core.op("receive", "Target", top=1)
    core.op("rollback", error="cannot")  # the message goes to Dead
    core.flush()
    assert len(core.store.read_queue_messages("Dead", None, 10, 1 << 20)) == 1
    with pytest.raises(BrokerError) as used:
        core.op("drop", "queue", "Dead")
    assert used.value.code == ErrorCode.IN_USE  # Target's poison policy names it
    core.op("alter_queue", "Target", poison_policy=None)
    core.op("drop", "queue", "Dead")  # what it holds goes with it
    core.flush()
    assert core.store.read_queue_messages("Dead", None, 10, 1 << 20) == []
    assert "Dead" not in core.engine.queues
    core.op("create_queue", "Empty")
    reader = core.new_session()
    waiting = asyncio.ensure_future(core.aop("receive", "Empty", timeout=60, session=reader))
    await asyncio.sleep(0)
    assert not waiting.done()
    core.op("drop", "queue", "Empty")
    assert await asyncio.wait_for(waiting, 5) == []  # as if its timeout had passed


def test_a_conversation_ended_in_a_transaction_cannot_be_ended_again_in_it(core: Core) -> None:
    handle = core.dialog()
    core.op("begin_transaction")
    core.op("end_conversation", handle)
    with pytest.raises(BrokerError, match="already ended in this transaction") as again:
        core.op("end_conversation", handle)
    assert again.value.code == ErrorCode.CONVERSATION_ENDED
    core.op("commit")
