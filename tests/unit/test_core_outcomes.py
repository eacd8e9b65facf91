"""Transaction outcomes in the core alone: recorded with the commit, fenced, windowed.

No daemon: the engine on an in-memory store whose batches become durable only at
`flush()`, and a fake clock. Each outcome question is driven by hand, so a test sees
exactly when it waits for durability.
"""

from __future__ import annotations

import uuid
from collections.abc import Coroutine
from typing import Any

import pytest

from ssb.broker._core.transactions import Session
from ssb.broker._errors import BrokerError
from ssb.protocol import ErrorCode

from .core_harness import Core


def _ask(
    core: Core, txn: uuid.UUID, age: float | None = 1.0, session: Session | None = None
) -> str:
    """transaction_outcome, made durable by a flush if it waits for one."""
    ops = core.engine.operations()
    coro: Coroutine[Any, Any, list[Any]] = ops["transaction_outcome"](
        session or core.session, txn, age
    )
    try:
        coro.send(None)  # waits until what was applied is durable
        core.flush()
        coro.send(None)
    except StopIteration as done:
        return str(done.value[0])
    raise AssertionError("transaction_outcome did not finish after a flush")


def _core_with_a_dialog() -> tuple[Core, uuid.UUID]:
    """A core with the initiator's and the target's services and a dialog between them."""
    core = Core()
    core.services()
    return core, core.dialog()


def _send_in(core: Core, txn: uuid.UUID, handle: uuid.UUID, session: Session | None = None) -> None:
    who = session or core.session
    core.op("begin_transaction", txn_id=txn, session=who)
    core.op("send", [handle], "DEFAULT", [b"x"], session=who)
    core.op("commit", session=who)


async def test_a_commit_and_its_record_are_durable_together() -> None:
    core, handle = _core_with_a_dialog()
    core.flush()
    kept, lost = uuid.uuid4(), uuid.uuid4()
    _send_in(core, kept, handle)
    core.flush()
    _send_in(core, lost, handle)  # never flushed: a crash takes both back
    again = core.restart()
    assert _ask(again, kept) == "committed"
    assert _ask(again, lost) == "rolled_back"
    assert len(again.receive_all()) == 1


async def test_the_answer_waits_until_the_commit_is_durable() -> None:
    core, handle = _core_with_a_dialog()
    txn = uuid.uuid4()
    _send_in(core, txn, handle)
    coro = core.engine.operations()["transaction_outcome"](core.session, txn, 1.0)
    coro.send(None)  # the record is in the open batch: the question waits
    core.flush()
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    assert done.value.value[0] == "committed"


async def test_asking_rolls_back_the_same_login_still_running_it() -> None:
    core, handle = _core_with_a_dialog()
    core.op("send", [handle], "DEFAULT", [b"one"])
    core.flush()
    straggler = core.new_session()  # the old connection the broker has not seen drop
    txn = uuid.uuid4()
    core.op("begin_transaction", txn_id=txn, session=straggler)
    assert len(core.op("receive", "Target", session=straggler)) == 1
    assert _ask(core, txn) == "rolled_back"
    assert straggler.closed
    assert len(core.receive_all()) == 1  # the message went back to its queue
    late = core.new_session()
    with pytest.raises(BrokerError) as refused:
        core.op("begin_transaction", txn_id=txn, session=late)
    assert refused.value.code == ErrorCode.TRANSACTION_RESOLVED


async def test_a_login_sees_only_its_own_outcomes() -> None:
    core, handle = _core_with_a_dialog()
    txn = uuid.uuid4()
    _send_in(core, txn, handle)
    core.flush()
    stranger = core.new_session("someone_else")
    assert _ask(core, txn, session=stranger) == "rolled_back"
    assert _ask(core, txn) == "committed"


async def test_named_statements_and_detached_transactions() -> None:
    core, handle = _core_with_a_dialog()
    transactions = core.engine.transactions
    statement = transactions.begin_statement(core.session, uuid.uuid4())
    core.op("send", [handle], "DEFAULT", [b"x"])
    transactions.end_statement(core.session, statement, True)
    failed = transactions.begin_statement(core.session, uuid.uuid4())
    transactions.end_statement(core.session, failed, False)
    detached = core.op("begin_transaction", detached=True)
    assert _ask(core, detached) == "open"
    core.op("commit")
    assert _ask(core, statement) == "committed"
    assert _ask(core, failed) == "rolled_back"
    assert _ask(core, detached) == "committed"
    core.op("begin_transaction")
    with pytest.raises(BrokerError, match="outside a transaction"):
        transactions.begin_statement(core.session, uuid.uuid4())


async def test_the_window_by_count_and_by_age_survives_a_restart() -> None:
    core = Core(outcome_window_seconds=60.0, outcome_window_count=3)
    core.services()
    handle = core.dialog()
    ids = [uuid.uuid4() for _ in range(5)]
    for txn in ids:
        _send_in(core, txn, handle)
        core.clock.advance(1.0)  # the pruning tick runs on the durable records
        core.flush()
    core.clock.advance(1.0)
    core.flush()
    assert _ask(core, ids[0], age=10.0) == "unknown"  # pruned by count
    assert _ask(core, ids[-1], age=10.0) == "committed"
    # a record no longer kept makes every older question unknown, after a restart too
    again = core.restart(outcome_window_seconds=60.0, outcome_window_count=3)
    assert _ask(again, uuid.uuid4(), age=10.0) == "unknown"
    assert _ask(again, uuid.uuid4(), age=0.5) == "rolled_back"
    again.clock.advance(61.0)  # older than the window: unknown, even if still stored
    assert _ask(again, ids[-1], age=100.0) == "unknown"
    assert _ask(again, ids[-1], age=None) == "unknown"
