"""The transmission queue lives on disk too: what waits for another broker, or for a
queue that is OFF, is held in memory only within the cache budget and comes back in
order (core only: in-memory store, fake clock)."""

from __future__ import annotations

from ssb.broker._core.transmission import DialogOutbox

from .core_harness import BODY, SEQ, Core

KIB = 1024
PEER = "11111111-2222-4333-8444-555555555555"


def _remote_setup(core: Core) -> None:
    core.op("create_queue", "Initiator")
    core.op("create_service", "InitiatorService", "Initiator")
    core.op("create_route", "far", "FarService", "tcp://127.0.0.1:1", broker_instance=PEER)


def test_a_remote_backlog_spills_and_is_pulled_back_in_sequence_order() -> None:
    core = Core(message_cache_bytes=16 * KIB)
    _remote_setup(core)
    handle = core.op("begin_dialog", "InitiatorService", "FarService", broker_instance=PEER)
    for n in range(20):
        core.op("send", handle, "DEFAULT", [b"%04d" % (n * 10 + i) + b"x" * KIB for i in range(10)])
        core.flush()
    delivery = core.engine.remote
    (box,) = delivery.remote_outboxes()
    assert box.count == 200 and box.spilled > 150
    assert core.engine.cache.resident <= 16 * KIB
    pulled = []
    while True:
        got = delivery.pull(box, 7, 64 * KIB)
        if not got:
            break
        pulled += got
    assert [o.seq for o in pulled] == list(range(200))
    assert [o.body[:4] for o in pulled] == [b"%04d" % n for n in range(200)]
    assert delivery.outboxes.get(box.direction) is None  # all handed to the transport


def test_only_durable_entries_are_pulled() -> None:
    core = Core()
    _remote_setup(core)
    handle = core.op("begin_dialog", "InitiatorService", "FarService", broker_instance=PEER)
    core.flush()
    core.op("send", handle, "DEFAULT", [b"a", b"b"])
    delivery = core.engine.remote
    (box,) = delivery.remote_outboxes()
    assert isinstance(box, DialogOutbox)
    assert delivery.pull(box, 10, 1 << 20) == []  # not durable: could be lost in a crash
    core.flush()
    assert [o.body for o in delivery.pull(box, 10, 1 << 20)] == [b"a", b"b"]


def test_a_restart_resumes_a_remote_backlog_from_the_store() -> None:
    core = Core(message_cache_bytes=8 * KIB)
    _remote_setup(core)
    handle = core.op("begin_dialog", "InitiatorService", "FarService", broker_instance=PEER)
    core.op("send", handle, "DEFAULT", [b"%03d" % n for n in range(50)])
    core.flush()
    box = core.engine.remote.remote_outboxes()[0]
    first = core.engine.remote.pull(box, 5, 1 << 20)  # in flight, not acknowledged
    assert [o.seq for o in first] == [0, 1, 2, 3, 4]
    core.engine.remote.remote_acknowledged(box.conversation_id, True, 1, 1, "DEFAULT")
    core.flush()
    again = core.restart(message_cache_bytes=8 * KIB)
    (box,) = again.engine.remote.remote_outboxes()
    assert box.count == 49 and box.first_key() == 0  # 1 was acknowledged; the rest remain
    pulled = again.engine.remote.pull(box, 100, 1 << 20)
    assert [o.seq for o in pulled] == [0, *range(2, 50)]


def test_a_long_hold_for_a_queue_that_is_off_spills_and_is_released_in_order() -> None:
    core = Core(message_cache_bytes=32 * KIB)
    core.services(status="OFF")
    handle = core.dialog()
    for n in range(30):
        core.op(
            "send", handle, "DEFAULT", [b"%04d" % (n * 100 + i) + b"y" * 200 for i in range(100)]
        )
        core.flush()
    queue = core.engine.queues["Target"]
    assert queue.held == 3000 and queue.ready == 0
    assert core.engine.cache.resident <= 32 * KIB
    core.op("alter_queue", "Target", status="ON")
    for _ in range(10):
        core.clock.run_soon()  # the release goes a chunk per pass of the loop
        core.flush()
    rows = core.receive_all(top=500)
    assert [r[SEQ] for r in rows] == list(range(3000))
    assert [r[BODY][:4] for r in rows] == [b"%04d" % n for n in range(3000)]
    assert queue.held == 0


def test_a_dialog_to_a_service_no_route_leads_to_waits_until_the_service_is_created() -> None:
    """As in Service Broker, BEGIN DIALOG does not refuse a target no route leads to: its
    messages wait in the transmission queue, in order (a long wait spills), and go into
    the service's queue once it exists here."""
    core = Core(message_cache_bytes=16 * KIB)
    core.op("create_queue", "Initiator")
    core.op("create_service", "InitiatorService", "Initiator")
    handle = core.op("begin_dialog", "InitiatorService", "LaterService")
    for n in range(4):
        core.op("send", handle, "DEFAULT", [b"%02d" % (n * 10 + i) + b"x" * KIB for i in range(10)])
        core.flush()
    delivery = core.engine.transmission
    (box,) = delivery.remote_outboxes()
    assert box.count == 40 and box.spilled and box.status == "no route to service 'LaterService'"
    core.op("create_queue", "Later", status=False)
    core.op("create_service", "LaterService", "Later", ["DEFAULT"])
    assert delivery.remote_outboxes() == [] and box.local  # waits for the queue now
    assert core.engine.queues["Later"].held == 40
    core.op("alter_queue", "Later", status=True)
    core.flush()
    got = core.receive_all("Later")
    assert [row[BODY][:2] for row in got] == [b"%02d" % n for n in range(40)]
    assert [row[SEQ] for row in got] == list(range(40))
    assert not delivery.outboxes and core.engine.queues["Later"].held == 0
    assert core.store.transmission_summary() == []
