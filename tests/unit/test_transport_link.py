"""The transport's links, without a daemon: an idle link closes and traffic opens a new one,
and a broker that cannot be reached is dialled again with a doubling backoff (two brokers
on an in-memory network, one fake clock; see transport_harness)."""

from __future__ import annotations

from pathlib import Path

from .transport_harness import B_ID, World


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
