"""Priority where the socket takes bytes, without a daemon: on a link that carries 1.5 MB/s,
a low-priority message committed together with 60 high-priority messages of 200 KB goes
within the starvation bound plus one fragment's transfer time, and the high ones still go
first (two brokers on an in-memory network whose sockets take bytes at a set rate, one
fake clock; see transport_harness)."""

from __future__ import annotations

from pathlib import Path

from .transport_harness import World

RATE = 1.5e6  # bytes a second A's socket takes
BOUND = 2.0  # [transport] starvation_bound
FRAGMENT = 64 * 1024
HIGHS = 60
HIGH_SIZE = 200 * 1024
STEP = 0.005  # seconds the clock moves between looks


async def test_a_low_message_goes_within_the_bound_and_one_fragment_on_a_slow_link(
    tmp_path: Path,
) -> None:
    world = World(
        tmp_path,
        starvation_bound=BOUND,
        fragment_size=FRAGMENT,
        retry_initial=60.0,  # nothing is lost here: no retransmission in the picture
        retry_max=60.0,
    )
    a, b = world.pair()
    a.op("create_service", "LowService", "Initiator")
    b.op("create_queue", "Low")
    b.op("create_service", "LowTarget", "Low", ["DEFAULT"])
    a.op("create_route", "to_low", "LowTarget", f"tcp://{b.address}")
    a.op("create_broker_priority", "high", "DEFAULT", "InitiatorService", level=10)
    a.op("create_broker_priority", "low", "DEFAULT", "LowService", level=1)
    highs = [a.op("begin_dialog", "InitiatorService", "TargetService") for _ in range(6)]
    low = a.op("begin_dialog", "LowService", "LowTarget")
    world.network.throttle(a.transport.links, RATE)

    a.op("begin_transaction")  # committed together: the low message is not older
    for handle in highs:
        a.op("send", handle, "DEFAULT", [bytes(HIGH_SIZE)] * (HIGHS // len(highs)))
    a.op("send", low, "DEFAULT", [b"low"])
    a.op("commit")
    start = world.clock.now
    while b.queue("Low") == 0:
        assert world.clock.now - start < 20, "the low message never arrived"
        await world.advance(STEP)
    waited = world.clock.now - start
    highs_before = b.queue("Target")

    one_fragment = (FRAGMENT + 1024) / RATE  # its payload and a frame header
    assert waited <= BOUND + one_fragment + STEP, waited
    # the high ones went first until the bound: about as many as the link carried
    assert highs_before >= int(BOUND * RATE / HIGH_SIZE) - 2, highs_before
    # the write buffer held one write at most, never the backlog
    (pipe,) = [p for p in world.network.pipes if p.protocol is a.link_to(b)]
    assert pipe.largest_buffer <= FRAGMENT + 4096, pipe.largest_buffer

    while b.queue("Target") < HIGHS:
        assert world.clock.now - start < 30, f"{b.queue('Target')} of {HIGHS} arrived"
        await world.advance(0.1)
    # the link stayed busy: the whole backlog took about what the link needs for it
    assert world.clock.now - start <= HIGHS * HIGH_SIZE / RATE * 1.05 + 0.2
