"""Everything the core does with time, on a fake clock: conversation timers, dialog
lifetimes, detached-transaction expiry, lock waits and RECEIVE ... WAITFOR."""

from __future__ import annotations

import asyncio

import pytest

from ssb.broker._core import catalog as cat
from ssb.broker._core.endpoints import HORIZON
from ssb.broker._errors import BrokerError
from ssb.protocol import ErrorCode

from .core_harness import HANDLE, MTYPE, Core


def test_a_conversation_timer_fires_once_at_its_time() -> None:
    core = Core()
    core.services()
    handle = core.dialog()
    core.op("begin_conversation_timer", handle, 5.0)
    core.flush()
    core.clock.advance(4.9)
    assert core.op("receive", "Initiator") == []
    core.clock.advance(0.2)
    (timer,) = core.op("receive", "Initiator")
    assert timer[MTYPE] == cat.DIALOG_TIMER and timer[HANDLE] == handle
    core.clock.advance(60)
    assert core.op("receive", "Initiator") == []


def test_a_timer_beyond_the_horizon_is_found_by_a_refill_after_a_restart() -> None:
    core = Core()
    core.services()
    handle = core.dialog()
    core.op("begin_conversation_timer", handle, 3 * HORIZON)
    core.flush()
    again = core.restart()
    assert again.engine.dialogs.timers.pending() == 0  # far away: not held in memory
    again.clock.advance(3 * HORIZON + 1)
    (timer,) = again.op("receive", "Initiator")
    assert timer[MTYPE] == cat.DIALOG_TIMER


def test_a_dialog_lifetime_ends_both_sides_with_an_error() -> None:
    core = Core()
    core.services()
    handle = core.op("begin_dialog", "InitiatorService", "TargetService", lifetime=10)
    core.op("send", handle, "DEFAULT", [b"hello"])
    core.flush()
    (first,) = core.op("receive", "Target")
    core.clock.advance(10.5)
    errors = core.op("receive", "Initiator") + core.op("receive", "Target")
    assert {r[MTYPE] for r in errors} == {cat.ERROR}
    assert {r[HANDLE] for r in errors} == {handle, first[HANDLE]}


def test_timeouts_must_be_finite_and_bounded() -> None:
    core = Core()
    core.services()
    handle = core.dialog()
    for bad in (float("nan"), float("inf"), 1e300, -1, True):
        with pytest.raises(BrokerError) as refused:
            core.op("begin_conversation_timer", handle, bad)
        assert refused.value.code == ErrorCode.BAD_ARGUMENT
        with pytest.raises(BrokerError):
            core.op("receive", "Target", timeout=bad)
    assert core.engine.transactions.sessions[core.session.ident].txn is None


async def test_receive_waitfor_wakes_on_arrival_and_times_out_on_the_clock() -> None:
    core = Core()
    core.services()
    handle = core.dialog()
    reader = core.new_session()
    waiting = asyncio.ensure_future(core.aop("receive", "Target", timeout=30.0, session=reader))
    await asyncio.sleep(0)
    core.op("send", handle, "DEFAULT", [b"wake"])
    core.clock.run_soon()
    (row,) = await waiting
    assert row[10] == b"wake"
    idle = asyncio.ensure_future(core.aop("receive", "Target", timeout=30.0, session=reader))
    await asyncio.sleep(0)
    core.clock.run_soon()
    core.clock.advance(29)
    await asyncio.sleep(0)
    assert not idle.done()
    core.clock.advance(2)
    assert await idle == []


async def test_a_lock_wait_times_out_on_the_clock_or_proceeds_at_commit() -> None:
    core = Core(lock_timeout=5.0)
    core.services()
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"m1", b"m2"])
    holder = core.new_session()
    core.op("begin_transaction", session=holder)
    (row,) = core.op("receive", "Target", top=1, session=holder)  # locks the target's group
    target = row[HANDLE]
    blocked = asyncio.ensure_future(core.aop("end_conversation", target))
    await asyncio.sleep(0)
    core.clock.advance(5.1)
    with pytest.raises(BrokerError) as refused:
        await blocked
    assert refused.value.code == ErrorCode.LOCK_TIMEOUT
    waiting = asyncio.ensure_future(core.aop("end_conversation", target))
    await asyncio.sleep(0)
    core.clock.advance(2)
    assert not waiting.done()
    core.op("commit", session=holder)
    await waiting  # the lock came free within its time
    assert core.op("receive", "Target") == []  # ending deleted m2


def test_a_detached_transaction_rolls_back_when_it_expires() -> None:
    core = Core()
    core.services()
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"leased"])
    ident = core.op("begin_transaction", detached=True, timeout=30)
    (row,) = core.op("receive", "Target")
    core.op("detach_transaction")
    assert core.op("receive", "Target") == []  # leased
    core.clock.advance(31)
    (again,) = core.op("receive", "Target")
    assert again[10] == b"leased" and again[12] == 2  # delivered twice
    with pytest.raises(BrokerError) as gone:
        core.op("commit_transaction", ident)
    assert gone.value.code == ErrorCode.NO_TRANSACTION
    assert row[2] == again[2]
