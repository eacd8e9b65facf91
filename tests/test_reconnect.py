"""Exactly-once across lost connections: clients reconnect and settle what was in flight.

Real daemons on 127.0.0.1. A fault proxy between the clients and the broker cuts
connections at random frames in both directions (so some cuts fall between a commit's
request and its answer); or the broker is killed with SIGKILL and restarted on the same
port. A producer sends numbered messages with `run_transaction`, a reader receives them
with `run_transaction` and records what it got in committed transactions only; the
record must hold every message exactly once, in order per conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from daemon import BrokerProcess
from faultproxy import FaultPlan, ThreadedFaultProxy
from setup_objects import send_numbered

from ssb import client
from ssb.client import _calls as calls
from ssb.client._recovery import uuid7
from ssb.tools import wait_until

TAG = struct.Struct(">II")  # conversation number, message number within it
CONVERSATIONS = 10
BATCH = 100


async def _catalog(conn: client.Connection) -> list[uuid.UUID]:
    await conn.create_queue("Sent")
    await conn.create_queue("Work")
    await conn.create_service("Producer", queue="Sent")
    await conn.create_service("Worker", queue="Work", contracts=["DEFAULT"])
    return [await conn.begin_dialog("Producer", "Worker") for _ in range(CONVERSATIONS)]


async def _produce(
    url: str, handles: list[uuid.UUID], total: int, progress: list[int]
) -> client.Connection:
    """Send `total` numbered messages, BATCH per transaction, round robin over handles."""
    conn = await client.connect(url, reconnect_deadline=60.0)
    await send_numbered(conn, handles, total // CONVERSATIONS, BATCH, TAG.pack, progress)
    return conn


def _read(url: str, total: int, record: list[tuple[int, int]], stop: threading.Event) -> Any:
    """Receive until `total` messages were recorded (blocking client, its own thread)."""
    conn = client.connect_sync(url, reconnect_deadline=60.0)

    def take(c: client.SyncConnection) -> list[client.Message]:
        return c.receive("Work", top=BATCH, timeout=0.5)

    while len(record) < total and not stop.is_set():
        got = conn.run_transaction(take)
        record.extend(TAG.unpack(m.message_body) for m in got)  # committed: counts now
    return conn


def _check(record: list[tuple[int, int]], total: int) -> None:
    per = total // CONVERSATIONS
    by_conversation: dict[int, list[int]] = {}
    for number, index in record:
        by_conversation.setdefault(number, []).append(index)
    assert len(record) == total, f"{len(record)} recorded for {total} sent"
    for number in range(CONVERSATIONS):
        assert by_conversation.get(number) == list(range(per)), f"conversation {number}"


async def _run(
    url: str,
    producer_url: str,
    total: int,
    during: Callable[[list[int], list[tuple[int, int]]], Awaitable[None]] | None = None,
) -> tuple[dict[str, int], dict[str, int], int]:
    setup = await client.connect(url)
    handles = await _catalog(setup)
    await setup.close()
    record: list[tuple[int, int]] = []
    stop = threading.Event()
    reader = asyncio.get_running_loop().run_in_executor(
        None, _read, producer_url, total, record, stop
    )
    try:
        progress = [0]
        producing = asyncio.ensure_future(_produce(producer_url, handles, total, progress))
        if during is not None:
            await during(progress, record)
        producer = await asyncio.wait_for(producing, 300)
        reading = await asyncio.wait_for(reader, 120)
    finally:
        stop.set()
    _check(record, total)
    settled = (producer.settled, reading.settled, producer.reconnects + reading.reconnects)
    await producer.close()
    reading.close()
    return settled


@pytest.mark.slow
async def test_cuts_between_client_and_broker_lose_and_duplicate_nothing(
    broker: BrokerProcess,
) -> None:
    cuts = FaultPlan.cuts_both_ways(seed=13, probability=0.005, most=80)
    with ThreadedFaultProxy(broker.client_port, **cuts) as proxy:
        produced, read, reconnects = await _run(broker.url, proxy.url(broker.url), 100_000)
        stats = proxy.stats
    assert stats.cuts >= 20, stats.as_dict()
    assert reconnects >= 10
    # cuts fell between commits and their answers on both sides and were settled; some of
    # those commits had happened (their answers were lost, not the commits)
    assert sum(n for k, n in produced.items() if k.startswith("commit ")) >= 1, produced
    assert sum(n for k, n in read.items() if k.startswith("commit ")) >= 1, read
    assert produced.get("commit committed", 0) + read.get("commit committed", 0) >= 1


@pytest.mark.slow
async def test_broker_killed_and_restarted_loses_and_duplicates_nothing(
    broker: BrokerProcess,
) -> None:
    total = 100_000

    async def kill_three_times(progress: list[int], record: list[tuple[int, int]]) -> None:
        read_before = -1  # what the reader had recorded when the broker last came back
        for kill in range(1, 4):

            async def both_served(part: int = kill * total // 4, seen: int = read_before) -> bool:
                # the producer's own count, and a reader that has committed on this
                # broker (so each client is connected when it is killed, and sees it)
                return progress[0] >= part and len(record) > seen

            await wait_until(both_served, "the producer's and the reader's progress", 120, 0.02)
            broker.kill()
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            read_before = len(record)

    _, _, reconnects = await _run(broker.url, broker.url, total, kill_three_times)
    assert reconnects >= 6  # each client, each kill


async def test_outcome_window_expires_as_configured(tmp_path: Any) -> None:
    broker = BrokerProcess(
        tmp_path / "data", config={"outcome_window_seconds": 1, "outcome_window_count": 3}
    ).start()
    try:
        conn = await client.connect(broker.url)
        await conn.create_queue("Q")
        await conn.begin_transaction()
        first = conn.transaction_id
        assert first is not None
        await conn.create_service("S", queue="Q")
        await conn.commit()
        assert await conn.transaction_outcome(first) == "committed"
        # an id the broker never saw, sent a moment ago: it did not commit, and now never will
        never = uuid7()
        assert (await conn.call(calls.transaction_outcome(never, 0.5)))[0] == "rolled_back"
        late = await client.connect(broker.url, reconnect=False)
        with pytest.raises(client.ConnectionLostError):  # the broker closes that connection
            await late.begin_transaction(txn_id=never)
        started = time.monotonic()
        await wait_until(
            lambda: conn.transaction_outcome(first),
            "the outcome to expire",
            10,
            until=lambda outcome: outcome != "committed",
        )
        assert time.monotonic() - started >= 0.5  # not before its window
        outcome, why = await conn.call(calls.transaction_outcome(first, 30.0))
        assert outcome == "unknown"
        assert "outcome_window_seconds" in why
        # by count: three newer commits push an outcome out, however young
        await conn.run_transaction(lambda c: c.ping())
        ids = []
        for _ in range(4):
            await conn.begin_transaction()
            ids.append(conn.transaction_id)
            await conn.commit()
        await wait_until(
            lambda: conn.call(calls.transaction_outcome(ids[0], 5.0)),
            "the outcome to be pruned by count",
            10,
            until=lambda answer: answer[0] != "committed",
        )
        assert (await conn.call(calls.transaction_outcome(ids[0], 5.0)))[0] == "unknown"
        assert await conn.transaction_outcome(ids[-1]) == "committed"
        await conn.close()
    finally:
        broker.kill()


async def test_a_waiting_receive_resumes_and_tls_logs_in_again(broker: BrokerProcess) -> None:
    with ThreadedFaultProxy(broker.client_port) as proxy:
        url = proxy.url(broker.tls_url)
        reader = await client.connect(url)
        handles = await _catalog(reader)
        hooked: list[str] = []

        async def again(c: client.Connection) -> None:  # runs before the receive settles
            hooked.append(await c.ping())

        reader.on_reconnect.append(again)
        waiting = asyncio.ensure_future(reader.receive("Work", timeout=30))
        deadline = time.monotonic() + 10
        async with await client.connect(broker.url) as admin:
            await _until_readers_waiting(admin, 1, deadline)
            # the broker must see the old session go before the message is sent, or that
            # session's RECEIVE could take it and lose its answer with the connection
            proxy.hold(True)
            proxy.cut_all()
            await _until_readers_waiting(admin, 0, deadline)
            proxy.hold(False)
            await _until_readers_waiting(admin, 1, deadline)  # the resumed RECEIVE
            await admin.send(handles[0], "DEFAULT", b"after the cut")
        got = await asyncio.wait_for(waiting, 30)
        assert [m.message_body for m in got] == [b"after the cut"]
        assert reader.reconnects == 1 and len(hooked) == 1
        assert reader.settled.get("receive rolled_back") == 1
        await reader.close()


async def _until_readers_waiting(conn: client.Connection, count: int, deadline: float) -> None:
    async def waiting() -> int:
        rows = await conn.view("service_queues")
        return sum(int(r["readers_waiting"]) for r in rows if r["name"] == "Work")

    left = deadline - time.monotonic()
    await wait_until(
        waiting, f"{count} sessions waiting in RECEIVE", left, 0.02, until=lambda n: n == count
    )


async def test_any_login_asks_about_its_own_transactions_only(broker: BrokerProcess) -> None:
    async with await client.connect(broker.url) as admin:
        await admin.create_login("app", "app-password-1")
        async with await client.connect(broker.url_for("app", "app-password-1")) as app:
            await app.run_transaction(lambda c: c.ping())  # no grant needed
            await app.begin_transaction()
            txn = app.transaction_id
            await app.commit()
            assert txn is not None
            assert await app.transaction_outcome(txn) == "committed"
            assert await admin.transaction_outcome(txn) != "committed"  # not admin's
            assert await app.transaction_outcome(txn) == "committed"


def _on_uvloop(work: Callable[[], Awaitable[Any]]) -> Any:
    """Run `work` on uvloop, as the daemon and the benchmarks do: uvloop refuses a write
    to a transport that is closed, where asyncio's loop ignores it."""
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(work())


def test_a_connection_reset_as_it_is_made_is_a_lost_connection() -> None:
    """A broker that resets connections as it accepts them (a daemon dying, a standby's
    backlog dropped): every connect fails with ConnectionLostError, which a reconnect
    retries, never with an error from inside the event loop (seen about once in four
    tries on uvloop, which failed a client's reconnect during a failover)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def reset_each() -> None:
        while True:
            try:
                accepted, _ = server.accept()
            except OSError:
                return  # the listening socket was closed: the test is over
            accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            accepted.close()  # (linger 0: a reset)

    threading.Thread(target=reset_each, daemon=True).start()

    async def connect_often() -> dict[str, int]:
        failures: dict[str, int] = {}
        for _ in range(200):
            with pytest.raises(Exception) as caught:  # (counted by type below)
                await client.connect(f"ssb://u:p@127.0.0.1:{port}", reconnect=False)
            name = type(caught.value).__name__
            failures[name] = failures.get(name, 0) + 1
        return failures

    try:
        assert _on_uvloop(connect_often) == {"ConnectionLostError": 200}
    finally:
        server.close()


class _HeldAnswers:
    """A TCP relay to the broker whose answers to the client can be held back, and whose
    connections can be cut; what it holds is lost with the connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.holding = False
        self.held = 0  # frames' bytes not passed on while holding
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_writer]

        async def pump(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, down: bool
        ) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    if down and self.holding:
                        self.held += len(data)
                        continue
                    sink.write(data)

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))

    def cut(self) -> None:
        self.holding = False
        for writer in self.writers:
            writer.transport.abort()
        self.writers = []

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def test_a_begin_lost_before_its_block_hears_it_holds_up_nothing_else(
    broker: BrokerProcess,
) -> None:
    """transaction() writes BEGIN with the block's first request and hears its answer at
    the block's end. When that answer is lost with the connection, BEGIN is settled at once
    like any lost request: another request on the connection does not wait for the block."""
    relay = _HeldAnswers(broker.client_port)
    port = await relay.start()
    try:
        conn = await client.connect(broker.url.replace(f":{broker.client_port}", f":{port}"))
        handles = await _catalog(conn)
        relay.holding = True
        may_end = asyncio.Event()
        first: list[asyncio.Future[None]] = []

        async def block() -> None:
            async with conn.transaction():
                first.append(asyncio.ensure_future(conn.send(handles[0], "DEFAULT", b"lost")))
                await may_end.wait()
                with pytest.raises(client.TransactionRolledBackError):
                    await first[0]

        async def held() -> int:
            return relay.held

        async def reconnected() -> bool:
            return conn.reconnects == 1 and first[0].done()

        running = asyncio.ensure_future(block())
        await wait_until(held, "the answers to BEGIN and SEND held", 10.0)
        relay.cut()
        await wait_until(reconnected, "the SEND settled after the reconnect", 10.0)
        assert await asyncio.wait_for(conn.ping(), 10.0)  # not held up until the block ends
        may_end.set()
        with pytest.raises(client.TransactionRolledBackError):
            await running
        assert await conn.peek("Work") == []
        await conn.close()
    finally:
        await relay.close()
