"""The backlog lives on disk: memory holds a budget of bodies, and nothing is lost or
reordered on the way out and back in (core only: in-memory store, fake clock)."""

from __future__ import annotations

import gc
import uuid

import pytest

from ssb.broker._core.backlog import Backlog, MessageCache
from ssb.broker._core.ports import Span
from ssb.broker._core.queues import Queue, Status
from ssb.protocol import ROW_OVERHEAD

from .core_harness import BODY, HANDLE, SEQ, Core, FakeClock

KIB = 1024


def _body(conversation: int, n: int, size: int = KIB) -> bytes:
    head = f"{conversation}:{n}:".encode()
    return head + b"x" * (size - len(head))


def _fill(core: Core, conversations: int, per: int, size: int = KIB) -> list[uuid.UUID]:
    handles = [core.dialog() for _ in range(conversations)]
    for n in range(per):
        for c, handle in enumerate(handles):
            core.op("send", handle, "DEFAULT", [_body(c, n, size)])
        core.flush()
    return handles


def _in_order(core: Core, rows: list[list[object]], handles: list[uuid.UUID], per: int) -> None:
    """Every message exactly once, each conversation's in sequence order."""
    by_target: dict[object, list[bytes]] = {}
    for row in rows:
        by_target.setdefault(row[HANDLE], []).append(row[BODY])  # type: ignore[arg-type]
    assert len(by_target) == len(handles)
    for bodies in by_target.values():
        c = int(bodies[0].split(b":")[0])
        assert bodies == [_body(c, n, len(bodies[0])) for n in range(per)]


def test_a_backlog_beyond_the_cache_stays_within_it_and_comes_back_in_order() -> None:
    core = Core(message_cache_bytes=64 * KIB)
    core.services()
    handles = _fill(core, conversations=10, per=100)
    queue = core.engine.queues["Target"]
    assert queue.ready == 1000
    assert core.engine.cache.resident <= 64 * KIB
    assert sum(c.spilled for c in queue.conversations()) > 900  # most of it only on disk
    rows = core.receive_all(top=7)
    core.flush()
    _in_order(core, rows, handles, 100)
    assert queue.ready == 0 and queue.messages == 0 and queue.bytes == 0
    assert core.engine.cache.resident == 0


def test_bodies_that_are_not_durable_stay_in_memory_until_they_are() -> None:
    core = Core(message_cache_bytes=16 * KIB)
    core.services()
    handle = core.dialog()
    core.flush()
    core.op("send", handle, "DEFAULT", [_body(0, n) for n in range(50)])
    cache = core.engine.cache
    # nothing is durable yet: a store read could not find these, so none may be dropped
    assert cache.resident > 50 * KIB
    core.flush()  # durable now; the cache trims as soon as it hears so
    assert cache.resident <= 16 * KIB
    rows = core.receive_all(top=10)
    assert [r[BODY] for r in rows] == [_body(0, n) for n in range(50)]


def test_new_arrivals_after_a_spill_queue_behind_it() -> None:
    core = Core(message_cache_bytes=8 * KIB)
    core.services()
    handle = core.dialog()
    for n in range(40):
        core.op("send", handle, "DEFAULT", [_body(0, n)])
    core.flush()
    for n in range(40, 60):  # a resident tail behind the spilled range, some not durable
        core.op("send", handle, "DEFAULT", [_body(0, n)])
        if n == 50:
            core.flush()
    rows = core.receive_all(top=3)
    assert [r[BODY] for r in rows] == [_body(0, n) for n in range(60)]


def test_a_restart_rebuilds_queues_from_a_summary_and_loses_nothing() -> None:
    core = Core(message_cache_bytes=32 * KIB)
    core.services()
    handles = _fill(core, conversations=5, per=40)
    core.op("send", handles[0], "DEFAULT", [b"never durable"])  # not flushed: lost in a crash
    again = core.restart(message_cache_bytes=32 * KIB)
    queue = again.engine.queues["Target"]
    assert queue.ready == 200 and queue.messages == 200
    assert again.engine.cache.resident == 0  # start-up reads no message
    rows = again.receive_all(top=13)
    _in_order(again, rows, handles, 40)


def test_a_rollback_puts_spilled_messages_back_and_they_are_read_again() -> None:
    core = Core(message_cache_bytes=4 * KIB)
    core.services()
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [_body(0, n) for n in range(30)])
    core.flush()
    core.op("begin_transaction")
    first = core.op("receive", "Target", top=10)
    core.flush()
    core.op("rollback", error="try again")
    core.flush()
    rows = core.receive_all(top=100)
    assert [r[BODY] for r in rows] == [_body(0, n) for n in range(30)]
    assert [r[BODY] for r in rows[:10]] == [r[BODY] for r in first]


def test_the_next_group_is_read_ahead_after_the_commit_of_the_same_turn() -> None:
    core = Core()
    core.services()
    handles = _fill(core, conversations=3, per=20)
    again = core.restart()  # a cold start: every body is on disk only
    queue = again.engine.queues["Target"]
    assert all(c.spilled == 20 and not c.head for c in queue.conversations())
    again.op("begin_transaction")
    first = again.op("receive", "Target", top=100)
    again.op("commit")  # (a client's BEGIN, RECEIVE and COMMIT come in one turn)
    assert len(first) == 20
    following = queue.to_read_ahead(100)
    assert following is not None and following.handle != first[0][HANDLE]
    assert again.clock.turn() >= 1 and not following.head  # the commit goes first
    again.clock.turn()
    assert len(following.head) == 20 and following.spilled == 0  # then the read, at once
    rows = first + again.receive_all()
    again.flush()
    _in_order(again, rows, handles, 20)


def test_small_bodies_are_bounded_by_their_records_too() -> None:
    core = Core(message_cache_bytes=64 * KIB)
    core.services()
    handle = core.dialog()
    for _ in range(20):
        core.op("send", handle, "DEFAULT", [b"."] * 100)
        core.flush()
    # 2,000 one-byte bodies: the per-message record counts against the budget
    assert core.engine.cache.resident <= 64 * KIB
    assert len(core.receive_all()) == 2000


def test_a_message_received_before_it_reached_the_disk_is_never_written() -> None:
    core = Core()
    core.services()
    handle = core.dialog()
    core.flush()
    core.op("send", handle, "DEFAULT", [b"a", b"b", b"c"])
    assert len(core.op("receive", "Target", top=10)) == 3
    core.flush()
    assert core.store.cancelled == 3
    assert core.store.read_queue_messages("Target", None, 10, 1 << 20) == []


def test_an_answer_stops_at_its_byte_budget_and_the_rest_stays() -> None:
    core = Core()
    core.services()
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"1" * 1000, b"2" * 1000, b"3" * 1000])
    core.flush()
    queue: Queue = core.engine.queues["Target"]
    group = queue.peek_eligible()
    assert group is not None
    taken = queue.take(group, 10, None, max_bytes=2 * (1000 + ROW_OVERHEAD) + 10)
    assert [m.message_body for m in taken] == [b"1" * 1000, b"2" * 1000]
    assert queue.ready == 1
    queue.restore(taken)
    one = queue.take(group, 10, None, max_bytes=10)  # the first always goes, alone
    assert [m.message_body for m in one] == [b"1" * 1000]


def test_endpoints_leave_memory_and_come_back_from_the_store() -> None:
    core = Core()
    core.engine.endpoints.cache_size = 4
    core.services()
    handles = [core.dialog() for _ in range(50)]
    for handle in handles:
        core.op("send", handle, "DEFAULT", [b"x"])
    core.flush()
    gc.collect()
    endpoints = core.engine.endpoints
    assert endpoints.in_memory() <= 4 + 2
    reads = endpoints.reads
    for handle in handles:
        ep = endpoints.get(handle)
        assert ep is not None and ep.send_seq == 1 and ep.state.name == "CO"
    assert endpoints.reads > reads
    assert len(core.receive_all()) == 50


def test_a_change_not_yet_durable_survives_eviction() -> None:
    core = Core()
    core.engine.endpoints.cache_size = 1
    core.services()
    handle = core.dialog()
    core.flush()
    core.op("send", handle, "DEFAULT", [b"x", b"y"])  # send_seq 2, not durable
    for _ in range(10):
        core.dialog()  # push it out of the LRU
    gc.collect()
    ep = core.engine.endpoints.get(handle)
    assert ep is not None and ep.send_seq == 2
    core.flush()
    del ep
    gc.collect()
    again = core.engine.endpoints.get(handle)
    assert again is not None and again.send_seq == 2


def test_retained_messages_stay_on_disk_and_go_with_their_conversation() -> None:
    core = Core()
    core.services(retention="ON")
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"kept1", b"kept2"])
    core.flush()
    rows = core.op("receive", "Target", top=10)
    core.flush()
    queue = core.engine.queues["Target"]
    assert queue.ready == 0 and queue.messages == 2
    assert [r[0] for r in core.store.read_queue_messages("Target", None, 10, 1 << 20)] != []
    target = rows[0][HANDLE]
    core.op("end_conversation", handle)
    core.op("receive", "Target")  # the EndDialog
    core.op("end_conversation", target)
    core.flush()
    assert queue.messages == 0
    assert core.store.read_queue_messages("Target", None, 10, 1 << 20) == []


@pytest.mark.parametrize("spill", [False, True])
def test_moving_a_conversation_takes_its_backlog_along(spill: bool) -> None:
    core = Core(message_cache_bytes=4 * KIB if spill else 1 << 20)
    core.services()
    a, b = core.dialog(), core.dialog()
    core.op("send", [a, b], "DEFAULT", [_body(0, n) for n in range(20)])
    core.flush()
    rows = core.op("receive", "Target", top=1)
    target_a = rows[0][HANDLE]
    other = next(
        ep
        for ep in core.engine.endpoints.page(None, 100)
        if not ep.is_initiator and ep.handle != target_a
    )
    core.op("move_conversation", target_a, other.group_id)
    core.flush()
    queue = core.engine.queues["Target"]
    assert len(queue.groups) == 1
    rows = core.receive_all(top=100)
    assert len(rows) == 39
    assert {r[3] for r in rows} == {other.group_id}
    assert [r[SEQ] for r in rows if r[HANDLE] == target_a] == list(range(1, 20))


def test_requeued_messages_keep_their_place_across_a_restart() -> None:
    core = Core()
    core.op("create_queue", "DLQ")
    policy = {"threshold": 1, "action": "dead_letter", "dead_letter_queue": "DLQ"}
    core.services(poison_policy=policy)
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"poison", b"fine"])
    core.flush()
    core.op("begin_transaction")
    core.op("receive", "Target", top=1)
    core.op("rollback", error="cannot")
    core.flush()
    (letter,) = core.store.read_queue_messages("DLQ", None, 10, 1 << 20)
    core.op("requeue_dead_letter", "DLQ", letter[0])
    core.flush()
    assert len(core.store.read_messages_with_status([Status.REQUEUED])) == 1
    again = core.restart()
    rows = again.receive_all()
    assert [r[BODY] for r in rows] == [b"poison", b"fine"]
    again.flush()
    assert core.store.read_messages_with_status([Status.REQUEUED]) == []  # received: deleted


class _Item:
    """A backlog item for the cache tests: `spillable` False is a re-queued message."""

    def __init__(self, key: int, batch: int, spillable: bool = True) -> None:
        self.key, self.batch, self.spillable = key, batch, spillable
        self.size = KIB
        self.resident_size = KIB + 256


class _Journal:
    def __init__(self) -> None:
        self.durable = self.open = 1
        self.armed: list[object] = []

    def watermark(self) -> int:
        return self.open

    def when_durable(self, batch: int, callback: object) -> None:
        if batch <= self.durable:
            callback()  # type: ignore[operator]  # as the store does: at once
        else:
            self.armed.append(callback)


class _Backlog(Backlog[_Item]):
    def __init__(self, cache: MessageCache) -> None:
        super().__init__(cache)
        self.rows: dict[int, _Item] = {}

    def _read(self, span: Span) -> list[_Item]:
        first, before = span.first, span.before
        keys = sorted(k for k in self.rows if k >= first and (before is None or k < before))
        return [self.rows[k] for k in keys[: span.limit]]

    def _next_key(self, after: int, before: int | None) -> int | None:
        keys = [k for k in self.rows if k > after and (before is None or k < before)]
        return min(keys, default=None)


def test_a_requeued_message_does_not_keep_later_arrivals_in_memory() -> None:
    journal = _Journal()
    clock = FakeClock()
    cache = MessageCache(KIB, journal, clock)  # type: ignore[arg-type]
    backlog = _Backlog(cache)
    journal.open = 2  # the re-queue is not durable yet, and alone over the budget
    backlog.appendleft(_Item(0, batch=2, spillable=False))
    clock.run_soon()
    journal.durable = 2
    for key in range(1, 200):  # arrivals, each durable at once
        journal.open = journal.durable = key + 2
        item = _Item(key, batch=key + 2)
        backlog.rows[key] = item
        backlog.append(item)
    assert cache.resident <= 2 * (KIB + 256)  # the re-queued one and the newest arrival
    assert [i.key for i in backlog.take(300, 1 << 30)] == list(range(200))


def test_a_cache_over_budget_with_nothing_spillable_does_not_loop() -> None:
    journal = _Journal()
    clock = FakeClock()
    cache = MessageCache(4 * KIB, journal, clock)  # type: ignore[arg-type]
    backlog = _Backlog(cache)
    for key in range(10):  # durable, but re-queued: they stay until received
        backlog.appendleft(_Item(key, batch=1, spillable=False))
    clock.run_soon()  # the scheduled trim must return, not recurse
    assert cache.resident > cache.budget and not journal.armed


def test_read_ahead_tops_up_a_head_a_take_left_short() -> None:
    journal = _Journal()
    clock = FakeClock()
    cache = MessageCache(4 << 20, journal, clock)  # type: ignore[arg-type]
    backlog = _Backlog(cache)
    for key in range(200):
        item = _Item(key, batch=1)
        backlog.rows[key] = item
        backlog.append(item)
    backlog.spill(journal.durable, 1 << 30)
    assert backlog.spilled == 200 and not backlog.head
    reads: list[int] = []
    plain_read = backlog._read
    backlog._read = lambda span: reads.append(span.limit) or plain_read(span)  # type: ignore[method-assign]
    assert [i.key for i in backlog.take(10, 1 << 30)] == list(range(10))
    assert len(reads) == 1 and 0 < len(backlog.head) < 50  # the prefetch remainder
    assert backlog.read_ahead(50)  # between takes: the head is brought up to 50
    assert len(reads) == 2 and len(backlog.head) >= 50
    assert [i.key for i in backlog.take(50, 1 << 30)] == list(range(10, 60))
    assert len(reads) == 2  # the take itself read nothing
