"""Cross-broker dialogs survive a hostile network and kill -9 of the receiving broker.

Tier 4 and 5: real daemons on 127.0.0.1 with `faultproxy` between them (delays, cuts,
truncated frames, duplicated frames, corrupted bytes), and a receiving broker killed
with SIGKILL in the middle of a transfer and restarted on the same data dir and ports.
Whatever happens, every message the sending broker acknowledged arrives exactly once,
in order, and corrupted fragments show up in broker_connections.corrupt_fragments.
The first test checks the proxy itself against a plain echo server (no broker needed).

`SSB_FAULT_SEED=n` runs the network test with seeds n, n+1000, ..., n+4000 (default 4022).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from faultproxy import LENGTH_SIZE, FaultPlan, FaultProxy, ThreadedFaultProxy
from federation_setup import (
    PLAIN,
    REQUEST,
    ConnectionSampler,
    Exchange,
    Federation,
    Hop,
    Node,
    begin_dialogs,
    dialog_services,
    end_dialogs,
    holds,
    route,
    transmission_queue,
)

from ssb import client
from ssb.tools import wait_until

pytestmark = pytest.mark.slow  # transfers through fault-injecting proxies, kill -9

SEED = int(os.environ.get("SSB_FAULT_SEED", "4022"))

# The fault proxy duplicates and corrupts whole frames, which it can see only in plain
# TCP: these tests run the link without TLS (PLAIN: fragments are still signed, the
# handshake still authenticates both brokers).


# ---- the proxy itself --------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(LENGTH_SIZE, "big") + payload


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _through(proxy: FaultProxy, frames: list[bytes]) -> list[bytes]:
    """Send frames through the proxy to the echo server; read back what comes (until EOF)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    for f in frames:
        writer.write(frame(f))
    await writer.drain()
    writer.write_eof()
    back: list[bytes] = []
    try:
        async with asyncio.timeout(10):
            while header := await reader.read(LENGTH_SIZE):
                header += await reader.readexactly(LENGTH_SIZE - len(header))
                back.append(await reader.readexactly(int.from_bytes(header, "big")))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()
    return back


@pytest.mark.timeout(60)
async def test_fault_proxy_forwards_frames_and_injects_exactly_the_faults_it_is_told() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    frames = [
        bytes([i % 251]) * size for i, size in enumerate([10, 3000, 70_000, 5, 40_000, 20_000])
    ]
    try:
        clean = await FaultProxy(port).start()
        assert await _through(clean, frames) == frames
        assert clean.stats.up.frames == len(frames) and clean.stats.down.frames == len(frames)
        await clean.close()

        corrupt = await FaultProxy(
            port,
            up=FaultPlan(
                seed=SEED,
                payload_corrupt_probability=1.0,
                max_payload_corruptions=2,
                payload_min_frame=16 * 1024,
                protect_frames=1,
            ),
        ).start()
        back = await _through(corrupt, frames)
        assert [len(f) for f in back] == [len(f) for f in frames]  # lengths are never touched
        changed = [i for i, (x, y) in enumerate(zip(frames, back, strict=True)) if x != y]
        assert changed == [2, 4]  # big frames only, after the protected first one, budget 2
        for i in changed:
            diff = [k for k in range(len(frames[i])) if frames[i][k] != back[i][k]]
            assert len(diff) == 1 and len(frames[i]) // 4 <= diff[0] < 3 * len(frames[i]) // 4
        assert corrupt.stats.payload_corruptions == 2
        await corrupt.close()

        duplicate = await FaultProxy(
            port, up=FaultPlan(seed=SEED, duplicate_probability=1.0, max_duplicates=2)
        ).start()
        back = await _through(duplicate, frames)
        f0, f1, f2, f3, f4, f5 = frames
        assert back == [f0, f1, f2, f3, f3, f4, f4, f5]  # frames 3 and 4: protect_frames=3
        await duplicate.close()

        cut = await FaultProxy(
            port, up=FaultPlan(seed=SEED, cut_probability=1.0, max_cuts=1, truncate_fraction=1.0)
        ).start()
        assert await _through(cut, frames) == []
        assert (cut.stats.cuts, cut.stats.up.truncations) == (1, 1)
        assert await _through(cut, frames) == frames  # the budget is spent
        await cut.close()

        delayed = ThreadedFaultProxy(
            port, up=FaultPlan(seed=SEED, delay_probability=1.0, max_delay=0.01)
        ).start()
        try:
            assert await _through(delayed.proxy, frames) == frames
            assert delayed.stats.up.delays == len(frames)
            delayed.set_clean()
            await wait_until(holds(lambda: delayed.proxy.clean), "the proxy to turn clean", 5)
            assert await _through(delayed.proxy, frames) == frames
            assert delayed.stats.up.delays == len(frames)
        finally:
            delayed.stop()
    finally:
        server.close()
        await server.wait_closed()


# ---- every message once, in order, through a faulty network ---------------------------------------

DIALOGS = 6
PER_DIALOG = 200
BATCH = 20
BIG_EVERY = 20  # on dialogs 0 and 1, every 20th message is big (several fragments)
BIG_SIZE = 150 * 1024


def fault_body(dialog: int, number: int) -> bytes:
    head = b"%d:%d:" % (dialog, number)
    if dialog < 2 and number % BIG_EVERY == BIG_EVERY - 1:
        return head + bytes([number % 256]) * BIG_SIZE
    return head + b"s" * 32


def faulty(seed: int, corrupt_payloads: bool) -> FaultPlan:
    """A hop's plan (`Hop`): fragment payloads are corrupted only on their way to B."""
    return FaultPlan(
        seed=seed,
        delay_probability=0.05,
        max_delay=0.03,
        cut_probability=0.004,
        max_cuts=4,
        duplicate_probability=0.02,
        max_duplicates=12,
        payload_corrupt_probability=0.3 if corrupt_payloads else 0.0,
        max_payload_corruptions=6,
        header_corrupt_probability=0.004,
        max_header_corruptions=3,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [SEED + 1000 * k for k in range(5)])
async def test_every_message_arrives_once_in_order_through_a_faulty_network(
    tmp_path: Path, seed: int
) -> None:
    async with Federation(tmp_path, ["A", "B"], transport=PLAIN) as fed:
        a, b = fed["A"], fed["B"]
        init_q, target_q = await dialog_services(a, b)
        # A -> B through one proxy, B -> A (when B connects) through another; faults both ways.
        # Which connection carries the traffic depends on the brokers' instance ids (the one
        # opened by the smaller id is kept), so both corrupt payloads travelling towards B.
        with Hop("A-B", a, b, seed, faulty) as hop:
            await route(a, "TargetB", hop.to_y.address)
            await route(b, "Initiator", hop.to_x.address)
            handles = await begin_dialogs(a, DIALOGS)
            sampler = await ConnectionSampler([a, b], interval=0.1).start()
            started = time.monotonic()
            exchange = Exchange(handles, PER_DIALOG, fault_body, _reply)
            try:
                await exchange.run(fed, init_q, target_q, BATCH)
            except TimeoutError:
                print(f"faults injected on {hop.name}:", *hop.events(), sep="\n  ")
                raise AssertionError(await _progress(a, exchange)) from None
            finally:
                await sampler.stop()
            print(
                f"through the fault proxies in {time.monotonic() - started:.1f} s: {hop.describe()}"
            )

            # the network really was hostile (otherwise this test proves nothing)
            assert hop.cuts >= 1, "no connection was cut"
            assert hop.duplicates >= 1, "no frame was duplicated"
            # A -> B bytes use A's connection or B's, whichever the brokers kept; both
            # corrupt fragment payloads on their way to B
            assert hop.corrupted_towards_y >= 1, "no fragment payload on its way to B was corrupted"

            # exactly once, in order, both ways (a reply is b"re:<dialog>:<number>")
            exchange.check()

            # corrupted fragments were caught by the signature check, counted and repaired
            assert sampler.peak(b, a, "corrupt_fragments") > 0, sampler.peer_rows(b, a)[-3:]
            assert sampler.peak(a, b, "retransmissions") > 0
            assert re.search(r"corrupt|integrity|signature", b.process.log_text(), re.IGNORECASE)

            hop.set_clean()
            await end_dialogs(a, b, handles, target_q, PER_DIALOG)


def _reply(request: bytes) -> bytes:
    return b"re:" + b":".join(request.split(b":", 2)[:2])


async def _progress(a: Node, exchange: Exchange) -> str:
    """Where a stalled transfer stands, to tell 'stuck' from 'acknowledged but lost'."""
    on_b = [0] * DIALOGS
    for m in exchange.served:
        on_b[int(m.message_body.split(b":", 1)[0])] += 1
    on_a = [
        sum(1 for m in exchange.replies if m.conversation_handle == h) for h in exchange.handles
    ]
    pending = await transmission_queue(a)
    return (
        f"transfer stalled: B received {on_b} and A got replies {on_a} of {PER_DIALOG} per "
        f"dialog; A's transmission queue holds {len(pending)} messages"
        + ("" if pending else " (so B acknowledged messages it never delivered)")
    )


# ---- kill -9 of the receiving broker ---------------------------------------------------------------

KILL_DIALOGS = 4
KILL_BATCH = 20
MAX_BATCHES = 1500  # a bound; the run normally stops far earlier
KILLS = 3
AHEAD = 1000  # the producer stays this close to B's consumer, except while B is down
BIG_BATCH_EVERY = 10  # every 10th batch starts with a 200 KiB message (4 fragments)


def kill_body(dialog: int, batch: int, i: int) -> bytes:
    head = b"%d:%d:%d:" % (dialog, batch, i)
    return head + (b"K" * 200 * 1024 if i == 0 and batch % BIG_BATCH_EVERY == 0 else b"k" * 16)


class Ledger:
    """What A acknowledged and what B's consumer committed, saw in doubt, and drained."""

    def __init__(self) -> None:
        self.sent: dict[int, list[bytes]] = {d: [] for d in range(KILL_DIALOGS)}
        self.acked = 0
        self.committed: list[client.Message] = []
        self.in_doubt: list[client.Message] = []  # received, commit unanswered at a kill
        self.drained: list[client.Message] = []
        self.b_down = False

    def ahead(self) -> bool:
        return not self.b_down and self.acked - len(self.committed) >= AHEAD


async def _keep_sending(
    conn: client.Connection, handles: list[uuid.UUID], ledger: Ledger, stop: asyncio.Event
) -> None:
    for batch in range(MAX_BATCHES):
        while ledger.ahead() and not stop.is_set():
            await asyncio.sleep(0.005)  # flow control: let B's consumer catch up
        if stop.is_set():
            return
        dialog = batch % KILL_DIALOGS
        bodies = [kill_body(dialog, batch, i) for i in range(KILL_BATCH)]
        await conn.send_many(handles[dialog], REQUEST, bodies)
        ledger.sent[dialog] += bodies
        ledger.acked += len(bodies)


async def _consume(
    conn: client.Connection, queue: str, ledger: Ledger, stop: asyncio.Event
) -> None:
    """Receive in transactions until told to stop or the broker is killed."""
    while not stop.is_set():
        messages: list[client.Message] = []
        try:
            await conn.begin_transaction()
            messages = await conn.receive(queue, top=50, timeout=0.5)
            await conn.commit()
        except client.BrokerError:
            # the broker was killed: this batch may or may not have committed
            ledger.in_doubt += messages
            return
        ledger.committed += messages


@pytest.mark.timeout(150)
async def test_kill_9_of_the_receiving_broker_mid_transfer_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B"], durability="fsync", transport=PLAIN) as fed:
        a, b = fed["A"], fed["B"]
        _, target_q = await dialog_services(a, b)
        await route(a, "TargetB", b)
        await route(b, "Initiator", a)
        handles = await begin_dialogs(a, KILL_DIALOGS)
        instance = b.instance
        ledger = Ledger()
        stop = asyncio.Event()
        producer = asyncio.ensure_future(
            _keep_sending(await fed.session("A"), handles, ledger, stop)
        )

        async def refused() -> str:
            statuses = [r["transmission_status"] for r in await transmission_queue(a)]
            return next((s for s in statuses if _refused_by(s, b.host_port)), "")

        try:
            for kill in range(KILLS):
                consumer = asyncio.ensure_future(
                    _consume(await fed.session("B", reconnect=False), target_q, ledger, stop)
                )
                enough = len(ledger.committed) + 1500

                async def mid_transfer(enough: int = enough) -> bool:
                    return len(ledger.committed) >= enough and bool(await transmission_queue(a))

                await wait_until(mid_transfer, "1,500 more receives on B, more in flight", 60)
                ledger.b_down = True
                b.process.kill()
                await asyncio.wait_for(consumer, 30)
                acked_at_kill = ledger.acked

                # A keeps accepting sends and says why it cannot deliver them
                await wait_until(refused, f"'connection refused by {b.host_port}' on A", 15)
                await wait_until(
                    holds(lambda at=acked_at_kill: ledger.acked >= at + 200),
                    "A to accept sends while B is down",
                    15,
                )
                b = await fed.restart("B")
                ledger.b_down = False
                assert await b.conn.broker_instance() == instance
                print(
                    f"kill {kill + 1}: acked {acked_at_kill}, committed {len(ledger.committed)}, "
                    f"in doubt {len(ledger.in_doubt)}"
                )
            # after the last restart: go on for a while with a consumer, then stop both
            consumer = asyncio.ensure_future(
                _consume(await fed.session("B", reconnect=False), target_q, ledger, stop)
            )
            more = ledger.acked + 1000
            await wait_until(
                holds(lambda: ledger.acked >= more or producer.done()),
                "more sends after the last restart",
                60,
            )
        finally:
            stop.set()
            await asyncio.wait_for(producer, 30)
        await asyncio.wait_for(consumer, 30)

        # drain B until A has nothing left to deliver and B's queue is empty
        drain = await fed.session("B")
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "B's queue did not settle within 60 s"
            batch = await drain.receive(target_q, top=500, timeout=0.5)
            ledger.drained += batch
            if batch or await transmission_queue(a) or await transmission_queue(b):
                continue
            if not await drain.receive(target_q, top=1, timeout=0):
                break
        print(
            f"acked {ledger.acked}, committed {len(ledger.committed)}, drained {len(ledger.drained)}"
        )
        _check_ledger(ledger, handles)


def _refused_by(status: str, host_port: str) -> bool:
    return host_port in status and "refused" in status.lower()


def _check_ledger(ledger: Ledger, handles: list[uuid.UUID]) -> None:
    received = ledger.committed + ledger.drained
    bodies = [m.message_body for m in received]
    assert len(bodies) == len(set(bodies)), "a message was received twice"
    acked = {x for sent in ledger.sent.values() for x in sent}
    assert len(acked) == ledger.acked
    assert set(bodies) <= acked, "a message nobody sent"
    doubtful = {m.message_body for m in ledger.in_doubt}
    missing = acked - set(bodies) - doubtful
    assert not missing, (
        f"{len(missing)} acknowledged messages were lost, e.g. {sorted(missing)[:3]}"
    )
    # in-doubt messages either committed before the kill (gone) or came back once
    lost_in_doubt = doubtful - set(bodies)

    position = {x: (d, n) for d, sent in ledger.sent.items() for n, x in enumerate(sent)}
    per_conversation: dict[Any, list[client.Message]] = {}
    for m in received:
        per_conversation.setdefault(m.conversation_handle, []).append(m)
    assert len(per_conversation) == len(handles) == KILL_DIALOGS
    for messages in per_conversation.values():
        dialog = position[messages[0].message_body][0]
        expected = [x for x in ledger.sent[dialog] if x not in lost_in_doubt]
        assert [m.message_body for m in messages] == expected, f"dialog {dialog} out of order"
        for m in messages:
            assert position[m.message_body] == (dialog, m.message_sequence_number), m
