"""The transport's links, without a daemon: an idle link closes and traffic opens a new one,
a broker that cannot be reached is dialled again with a doubling backoff, and a read is
handled a slice at a time (two brokers on an in-memory network, one fake clock; see
transport_harness)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from ssb.broker._transport import link

from .core_harness import BODY
from .transport_harness import B_ID, Pipe, World


async def test_an_idle_link_closes_and_new_traffic_opens_another(tmp_path: Path) -> None:
    world = World(tmp_path, idle_timeout=10.0)
    a, b = world.pair()
    handle = a.op("begin_dialog", "InitiatorService", "TargetService", broker_instance=B_ID)
    a.op("send", handle, "DEFAULT", [b"1"])
    await world.settle()
    link = a.link_to(b)
    assert link is not None and b.queue("Target") == 1
    await world.advance(9.0)
    assert a.link_to(b) is link  # quiet for less than idle_timeout
    await world.advance(6.0)  # checked every idle_timeout / 2
    assert a.link_to(b) is None and b.link_to(a) is None
    assert link.reason == "idle for 10 s"
    a.op("send", handle, "DEFAULT", [b"2"])
    await world.settle()
    assert b.queue("Target") == 2
    assert [address for address, _ in world.network.attempts] == [b.address, b.address]


async def test_an_unreachable_broker_is_dialled_again_with_a_doubling_backoff(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, retry_initial=1.0, retry_max=4.0)
    a, b = world.pair()
    del world.network.listeners[b.address]
    await world.settle()
    start = world.clock.now
    handle = a.op("begin_dialog", "InitiatorService", "TargetService", broker_instance=B_ID)
    a.op("send", handle, "DEFAULT", [b"waits"])
    await world.advance(20.0)
    assert [at - start for _, at in world.network.attempts] == [0, 1, 3, 7, 11, 15, 19]
    assert b.queue("Target") == 0
    world.network.listeners[b.address] = b.transport.links
    await world.advance(4.0)
    assert b.queue("Target") == 1
    assert world.network.attempts[-1][1] - start == 23
    assert a.transport.links.connect_errors == {}  # reached: the backoff starts over


async def test_a_read_is_handled_a_slice_at_a_time_with_reading_paused_in_between(
    tmp_path: Path,
) -> None:
    """Other brokers' traffic takes at most READ_SLICE messages per turn of the event loop,
    so that clients' requests and the store's commits wait behind that much of it only;
    the rest of a read waits, in order, with the socket's reading paused."""
    world = World(tmp_path, fragment_size=1024)  # bundles of 8 messages of 128 bytes
    a, b = world.pair()
    handle = a.op("begin_dialog", "InitiatorService", "TargetService", broker_instance=B_ID)
    a.op("send", handle, "DEFAULT", [b"first"])
    await world.advance(1.0)  # acked: the direction is confirmed, so its messages bundle
    count = 3 * link.READ_SLICE + 10
    bodies = [b"%03d" % n + b"." * 125 for n in range(count)]
    a.op("send", handle, "DEFAULT", bodies)
    a.core.flush()
    world.clock.run_soon()  # placed and pumped: A wrote them, B has not read them
    a_link, b_link = a.link_to(b), b.link_to(a)
    assert a_link is not None and b_link is not None
    assert a_link.transport is not None and b_link.transport is not None
    written = cast(Pipe, a_link.transport).sent
    data = b"".join(written)
    written.clear()
    b_link.data_received(data)  # all of it in one read, as a socket may give it
    taken = [b.queue("Target") - 1]
    assert b_link.slicing and not b_link.transport.is_reading()
    while b_link.slicing:
        world.clock.turn()  # the loop's next turn: the next slice
        taken.append(b.queue("Target") - 1)
    assert taken == [link.READ_SLICE, 2 * link.READ_SLICE, 3 * link.READ_SLICE, count]
    assert b_link.transport.is_reading()
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all()] == [b"first", *bodies]
