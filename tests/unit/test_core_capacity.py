"""Quotas, size limits, a full disk and a failing store: refused with the reason,
nothing half-applied, and the broker recovers by itself (core only)."""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Callable

import pytest

from ssb.broker._errors import BrokerError
from ssb.broker._store import CommitHooks
from ssb.protocol import ErrorCode

from .core_harness import BODY, DELIVERY_COUNT, HANDLE, Core


def _code(excinfo: pytest.ExceptionInfo[BrokerError]) -> ErrorCode:
    return excinfo.value.code


def _short_of_disk(body: bytes) -> tuple[Core, uuid.UUID]:
    """A core with `body` sent on a dialog to its Target queue, then its disk measured
    just below min_free_disk: the core and the dialog."""
    core = Core(min_free_disk=1000)
    core.services()
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [body])
    core.engine.capacity.measured(999, "test")
    return core, handle


def test_a_send_past_max_messages_is_refused_and_applies_nothing() -> None:
    core = Core()
    core.services(max_messages=3)
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"1", b"2"])
    with pytest.raises(BrokerError) as refused:
        core.op("send", handle, "DEFAULT", [b"3", b"4"])  # would make 4
    assert _code(refused) == ErrorCode.QUEUE_FULL
    assert "max_messages = 3" in refused.value.message and "'Target'" in refused.value.message
    ep = core.engine.endpoints.get(handle)
    assert ep is not None and ep.send_seq == 2  # nothing of the refused SEND
    core.op("send", handle, "DEFAULT", [b"3"])
    core.op("receive", "Target", top=1)
    core.op("send", handle, "DEFAULT", [b"4"])  # room again
    assert [r[BODY] for r in core.receive_all()] == [b"2", b"3", b"4"]


def test_max_bytes_counts_bodies() -> None:
    core = Core()
    core.services(max_bytes=10)
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"12345678"])
    with pytest.raises(BrokerError) as refused:
        core.op("send", handle, "DEFAULT", [b"123"])
    assert _code(refused) == ErrorCode.QUEUE_FULL and "max_bytes = 10" in refused.value.message
    core.op("send", handle, "DEFAULT", [b"12"])


def test_a_transactions_own_sends_count_toward_the_quota() -> None:
    core = Core()
    core.services(max_messages=3)
    handle = core.dialog()
    core.op("begin_transaction")
    core.op("send", handle, "DEFAULT", [b"1", b"2"])
    with pytest.raises(BrokerError) as refused:
        core.op("send", handle, "DEFAULT", [b"3", b"4"])
    assert _code(refused) == ErrorCode.QUEUE_FULL
    core.op("commit")
    assert core.engine.queues["Target"].ready == 2


def test_a_queue_filled_meanwhile_fails_the_commit_and_rolls_all_of_it_back() -> None:
    core = Core()
    core.services(max_messages=3)
    a, b = core.dialog(), core.dialog()
    other = core.new_session()
    core.op("begin_transaction")
    core.op("send", a, "DEFAULT", [b"a1", b"a2"])
    core.op("send", b, "DEFAULT", [b"b1", b"b2"], session=other)  # autocommit: 2 stored
    with pytest.raises(BrokerError) as refused:
        core.op("commit")
    assert _code(refused) == ErrorCode.QUEUE_FULL and "COMMIT" in refused.value.message
    assert core.engine.queues["Target"].ready == 2
    assert core.engine.transactions.sessions[core.session.ident].txn is None
    ep = core.engine.endpoints.get(a)
    assert ep is not None and ep.send_seq == 0


def test_quotas_can_be_altered_and_removed() -> None:
    core = Core()
    core.services(max_messages=1)
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"1"])
    with pytest.raises(BrokerError):
        core.op("send", handle, "DEFAULT", [b"2"])
    core.op("alter_queue", "Target", max_messages=None)
    core.op("send", handle, "DEFAULT", [b"2", b"3"])
    with pytest.raises(BrokerError) as bad:
        core.op("alter_queue", "Target", max_bytes=-1)
    assert _code(bad) == ErrorCode.BAD_ARGUMENT


def test_held_messages_count_toward_the_quota_of_their_queue() -> None:
    core = Core()
    core.services(max_messages=2, status="OFF")
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"1", b"2"])  # held: the queue is OFF
    assert core.engine.queues["Target"].held == 2
    with pytest.raises(BrokerError) as refused:
        core.op("send", handle, "DEFAULT", [b"3"])
    assert _code(refused) == ErrorCode.QUEUE_FULL
    core.op("alter_queue", "Target", status="ON")
    assert [r[BODY] for r in core.receive_all()] == [b"1", b"2"]


def test_a_body_over_max_message_size_is_refused() -> None:
    core = Core(max_message_size=100)
    core.services()
    handle = core.dialog()
    with pytest.raises(BrokerError) as refused:
        core.op("send", handle, "DEFAULT", [b"ok", b"x" * 101])
    assert _code(refused) == ErrorCode.MESSAGE_TOO_LARGE
    assert "max_message_size of 100" in refused.value.message
    assert core.engine.queues["Target"].ready == 0


def test_low_disk_refuses_new_messages_keeps_receive_and_recovers() -> None:
    core, handle = _short_of_disk(b"before")
    capacity = core.engine.capacity
    for statement in (
        lambda: core.op("send", handle, "DEFAULT", [b"during"]),
        lambda: core.dialog(),
    ):
        with pytest.raises(BrokerError) as refused:
            statement()
        assert _code(refused) == ErrorCode.DISK_FULL
        assert "min_free_disk" in refused.value.message
    assert [r[BODY] for r in core.op("receive", "Target")] == [b"before"]  # still drains
    core.op("end_conversation", handle)
    capacity.measured(1000, "test")
    core.dialog()


def test_refusals_show_small_sizes_in_bytes_or_kib(caplog: pytest.LogCaptureFixture) -> None:
    """A min_free_disk of a few KiB must not read '0.0 MiB below min_free_disk (0.0 MiB)'."""
    core = Core(min_free_disk=6 * 1024)
    core.services()
    caplog.set_level(logging.INFO, logger="ssb.core")
    core.engine.capacity.measured(900, "test")
    with pytest.raises(BrokerError) as refused:
        core.dialog()
    assert "is 900 bytes, below min_free_disk (6.0 KiB)" in refused.value.message
    assert any(
        "is 900 bytes, below min_free_disk 6.0 KiB" in r.getMessage() for r in caplog.records
    )
    core.engine.capacity.measured(3 << 30, "test")
    assert any("is 3.0 GiB again" in r.getMessage() for r in caplog.records)


def test_refusals_for_want_of_disk_are_logged_once_until_they_lift(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer that retries while the disk is full must not fill the log (often on
    that same disk) with a line per refused statement: the first refusal is logged, the
    rest are counted and the count told when new messages are accepted again."""
    core = Core(min_free_disk=1000)
    core.services()
    handle = core.dialog()
    capacity = core.engine.capacity

    def refused_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]

    caplog.set_level(logging.INFO, logger="ssb.core")
    capacity.measured(999, "test")
    for _ in range(50):
        with pytest.raises(BrokerError):
            core.op("send", handle, "DEFAULT", [b"refused"])
    with pytest.raises(BrokerError):
        core.dialog()
    (line,) = refused_lines()
    assert line.startswith("refused SEND: free disk space") and "min_free_disk" in line
    capacity.measured(1000, "test")
    assert any("51 statement(s) were refused" in r.getMessage() for r in caplog.records)
    capacity.measured(999, "test")  # a new shortage: its first refusal is logged again
    with pytest.raises(BrokerError):
        core.op("send", handle, "DEFAULT", [b"refused"])
    assert len(refused_lines()) == 2


def test_refusals_for_a_full_queue_are_logged_at_most_once_a_minute_per_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer retrying in a loop against a full queue must not fill the log either,
    nor a queue held at its quota (a reader takes a message, a producer fills its place):
    the first refusal of each queue is logged, then at most a line a minute with the
    count, until the queue takes a statement a minute after the last line (or its quota
    is changed)."""
    core = Core()
    core.services(max_messages=1)
    core.op("create_queue", "Other", max_messages=1)
    core.op("create_service", "OtherService", "Other", ["DEFAULT"])
    handle = core.dialog()
    other = core.op("begin_dialog", "InitiatorService", "OtherService")
    core.op("send", handle, "DEFAULT", [b"fills Target"])
    core.op("send", other, "DEFAULT", [b"fills Other"])

    def lines(start: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]

    caplog.set_level(logging.INFO, logger="ssb.core")
    for _ in range(50):
        for h in (handle, other):
            with pytest.raises(BrokerError):
                core.op("send", h, "DEFAULT", [b"refused"])
    core.op("begin_transaction")
    with pytest.raises(BrokerError):
        core.op("send", handle, "DEFAULT", [b"refused", b"too"])
    core.op("rollback")
    first, second = lines("refused")
    assert first.startswith("refused SEND: queue 'Target' is full") and "counted" in first
    assert second.startswith("refused SEND: queue 'Other' is full")
    for _ in range(20):  # held at its quota, within the minute: no more lines
        core.receive_all()
        core.op("send", handle, "DEFAULT", [b"fills it again"])
        with pytest.raises(BrokerError):
            core.op("send", handle, "DEFAULT", [b"refused"])
    assert len(lines("refused")) == 2 and lines("queue 'Target'") == []
    core.clock.advance(60)
    with pytest.raises(BrokerError):
        core.op("send", handle, "DEFAULT", [b"refused"])
    (_, summary) = lines("refused SEND: queue 'Target'")
    assert summary.endswith("(and 70 statement(s) since the last line)")  # 50 + 20
    core.clock.advance(60)
    core.receive_all()
    core.op("send", handle, "DEFAULT", [b"room again"])
    (told,) = lines("queue 'Target' has room again")
    assert "0 statement(s) were refused after the last line about it" in told
    core.op("alter_queue", "Other", max_messages=None)
    (told,) = lines("queue 'Other' has a new quota")
    assert "49 statement(s) were refused" in told
    with pytest.raises(BrokerError):  # full again: a new spell, its first refusal logged
        core.op("send", handle, "DEFAULT", [b"refused"])
    assert len(lines("refused SEND: queue 'Target'")) == 3


def _the_request_is_answered(core: Core) -> None:
    """Its queue still enabled, the request is received and its reply goes through."""
    core.op("begin_transaction")
    (request,) = core.op("receive", "Target", top=1)
    core.op("send", request[HANDLE], "DEFAULT", [b"reply"])
    core.op("commit")
    assert [r[BODY] for r in core.receive_all("Initiator")] == [b"reply"]


def _replies_refused(
    core: Core,
    code: ErrorCode,
    room: Callable[[], object],
    full: Callable[[], object],
    attempts: range,
) -> None:
    """On each of `attempts` a reader receives the request and replies in one transaction,
    refused (with `code`) at its SEND on odd attempts; on even ones `room` lets the SEND
    through and `full` takes the room back before the COMMIT. Then it rolls back."""
    for attempt in attempts:
        core.op("begin_transaction")
        (request,) = core.op("receive", "Target", top=1)
        with pytest.raises(BrokerError) as refused:
            if attempt % 2:
                core.op("send", request[HANDLE], "DEFAULT", [b"reply"])
            else:
                room()
                core.op("send", request[HANDLE], "DEFAULT", [b"reply"])
                full()
                core.op("commit")
        assert _code(refused) == code
        if core.session.txn is not None:
            core.op("rollback")


def test_replies_refused_for_want_of_room_do_not_make_the_request_poison(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reader that receives a request and replies in one transaction has its SEND (or
    its COMMIT) refused while the disk is low, and rolls back: the request is not at
    fault, so however often that happens the queue is not disabled as poisoned, and the
    request is answered once there is room. The log says once a minute that messages go
    back so."""
    caplog.set_level(logging.WARNING, logger="ssb.core")
    core, _ = _short_of_disk(b"request")
    capacity = core.engine.capacity
    room, full = lambda: capacity.measured(1000, "test"), lambda: capacity.measured(999, "test")
    # 8 attempts, more than the poison rule's 5; a minute passes after the 7th
    _replies_refused(core, ErrorCode.DISK_FULL, room, full, range(7))
    core.clock.advance(60)
    _replies_refused(core, ErrorCode.DISK_FULL, room, full, range(7, 8))
    went_back = [r.getMessage() for r in caplog.records if "went back" in r.getMessage()]
    assert len(went_back) == 2, went_back  # the first, and the next a minute later
    assert went_back[0].startswith("queue 'Target': 1 received message(s) went back")
    assert went_back[1].startswith("queue 'Target': 7 received message(s)")
    capacity.measured(1000, "test")
    _the_request_is_answered(core)


def test_replies_refused_by_a_full_queue_do_not_make_the_request_poison() -> None:
    """The same for a reply refused because the queue it goes to is at its quota: the
    request is not at fault, at the reply's SEND or at the COMMIT (filled meanwhile)."""
    core = Core()
    core.op("create_queue", "Target")
    core.op("create_queue", "Initiator", max_messages=1)
    core.op("create_service", "TargetService", "Target", ["DEFAULT"])
    core.op("create_service", "InitiatorService", "Initiator")
    handle, other = core.dialog(), core.dialog()
    writer = core.new_session()
    core.op("send", other, "DEFAULT", [b"its reply fills the queue replies go to"])
    (filler,) = core.op("receive", "Target", top=1)
    core.op("send", filler[HANDLE], "DEFAULT", [b"first reply"])  # Initiator is full
    core.op("send", handle, "DEFAULT", [b"request"])
    _replies_refused(  # 8 attempts, more than the poison rule's 5
        core,
        ErrorCode.QUEUE_FULL,
        room=lambda: core.receive_all("Initiator"),
        full=lambda: core.op("send", filler[HANDLE], "DEFAULT", [b"another reply"], session=writer),
        attempts=range(8),
    )
    core.receive_all("Initiator")
    _the_request_is_answered(core)


def test_a_rollback_for_want_of_room_is_not_counted_as_a_failed_delivery() -> None:
    """delivery_count counts the times readers received a message and rolled back: a
    rollback after a refusal for want of room is the broker's doing, so it is not
    counted (on RECEIVE, nor after a restart), and refusals cannot bring a message to its
    poison policy's threshold."""
    core = Core(min_free_disk=1000)
    core.op("create_queue", "Dead")
    policy = {"threshold": 2, "action": "dead_letter", "dead_letter_queue": "Dead"}
    core.services(poison_policy=policy)
    core.op("send", core.dialog(), "DEFAULT", [b"request"])
    capacity = core.engine.capacity
    capacity.measured(999, "test")
    for _ in range(3):
        core.op("begin_transaction")
        (request,) = core.op("receive", "Target", top=1)
        with pytest.raises(BrokerError):
            core.op("send", request[HANDLE], "DEFAULT", [b"reply"])
        core.op("rollback", error="the reply was refused")
    capacity.measured(1000, "test")
    core.op("begin_transaction")
    (request,) = core.op("receive", "Target", top=1)
    assert request[DELIVERY_COUNT] == 1
    core.op("rollback", error="cannot handle it")  # its first failed delivery of 2
    core.flush()
    (request,) = core.restart().op("receive", "Target", top=1)
    assert request[BODY] == b"request" and request[DELIVERY_COUNT] == 2


def test_a_disk_reserve_given_up_refuses_new_messages_until_it_is_back() -> None:
    core = Core()
    core.services()
    handle = core.dialog()
    capacity = core.engine.capacity
    capacity.reserve_kept("the disk is full: the store gave up its disk reserve", "test")
    with pytest.raises(BrokerError) as refused:
        core.op("send", handle, "DEFAULT", [b"refused"])
    assert _code(refused) == ErrorCode.DISK_FULL
    assert "gave up its disk reserve" in refused.value.message
    assert "RECEIVE and END CONVERSATION still work" in refused.value.message
    core.op("end_conversation", handle)  # frees space: goes on
    capacity.reserve_kept(None, "test")
    core.op("send", core.dialog(), "DEFAULT", [b"after"])


def test_batches_given_up_answer_nothing_and_leave_nothing() -> None:
    """What a commit that could not be written wrote is never durable: a restart from the
    store (what the daemon does) finds none of it, and finds what was durable before."""
    core = Core()
    core.services()
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"kept"])
    core.flush()
    core.op("send", handle, "DEFAULT", [b"lost"])
    core.store.fail_next = sqlite3.OperationalError("database or disk is full")
    core.flush()
    core.op("send", handle, "DEFAULT", [b"lost too"])
    core.store.abandon()
    core.flush()
    again = core.restart()
    assert [r[BODY] for r in again.receive_all()] == [b"kept"]


def test_a_failed_commit_is_retried_and_refuses_new_messages_meanwhile() -> None:
    core = Core()
    hooks = CommitHooks(on_failure=lambda exc: None, on_trouble=_trouble(core))
    core.store.attach(None, hooks)  # type: ignore[arg-type]
    core.services()
    handle = core.dialog()
    core.flush()
    core.op("send", handle, "DEFAULT", [b"kept"])
    core.store.fail_next = sqlite3.OperationalError("database or disk is full")
    core.flush()
    assert core.store.trouble is not None and "disk is full" in core.store.trouble
    assert core.store.durable < core.store.watermark()
    with pytest.raises(BrokerError) as refused:
        core.op("send", handle, "DEFAULT", [b"refused"])
    assert _code(refused) == ErrorCode.STORE_FAILED and "disk is full" in refused.value.message
    core.flush()  # the retry: the failed batch and what came after it, together
    assert core.store.trouble is None and core.store.durable == core.store.watermark()
    core.op("send", handle, "DEFAULT", [b"after"])
    core.flush()
    again = core.restart()
    assert [r[BODY] for r in again.receive_all()] == [b"kept", b"after"]


def test_a_failure_that_retrying_cannot_fix_is_reported_as_fatal() -> None:
    core = Core()
    failures: list[BaseException] = []
    hooks = CommitHooks(on_failure=failures.append, on_trouble=_trouble(core))
    core.store.attach(None, hooks)  # type: ignore[arg-type]
    core.services()
    core.store.fail_next = sqlite3.IntegrityError("UNIQUE constraint failed")
    core.dialog()
    core.flush()
    assert len(failures) == 1 and core.store.failed is failures[0]


def _trouble(core: Core):  # type: ignore[no-untyped-def]
    def hear(reason: str | None) -> None:
        if reason is None:
            core.engine.capacity.commit_succeeded()
        else:
            core.engine.capacity.commit_failed(reason)

    return hear
