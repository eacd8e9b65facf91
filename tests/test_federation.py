"""Dialogs between services on different brokers keep every guarantee of one broker.

Tier 5: real daemons (subprocesses) on 127.0.0.1, each with its own data dir and ports,
joined by routes and trusted certificates (see federation_setup). Covered here: broker
identity and certificates, 10,000 messages on 20 dialogs from A to B and C and back, an
8 MiB message among small ones, a disabled target queue, END CONVERSATION / Error /
timers across brokers, route matching (most specific wins, expired routes ignored,
LOCAL, TRANSPORT), "no route" and "connection refused" in the transmission queue,
authentication of peers, and idle connections closing and reopening. Faults and kill -9
are in test_federation_faults.py.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import operator
import random
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from daemon import run_ssb
from federation_setup import (
    CONTRACT,
    REPLY,
    REQUEST,
    TRANSPORT,
    ConnectionSampler,
    Federation,
    Node,
    acknowledged,
    assert_eoio,
    begin_dialogs,
    connections,
    create_contract,
    create_initiator,
    create_target,
    dialog_services,
    endpoints,
    link,
    produce,
    receive_count,
    route,
    run_together,
    serve,
    transmission_queue,
    trust,
    two_brokers_with_a_dialog_pair,
    wait_quiet,
)
from setup_objects import numbered_batches

from ssb import client
from ssb.protocol import ErrorCode
from ssb.tools import wait_until

TRANSMISSION_QUEUE_COLUMNS = {
    "conversation_handle",
    "to_service_name",
    "to_broker_instance",
    "from_service_name",
    "service_contract_name",
    "message_sequence_number",
    "message_type_name",
    "priority",
    "enqueue_time",
    "is_conversation_error",
    "is_end_of_dialog",
    "message_body_length",
    "transmission_status",
}
BROKER_CONNECTIONS_COLUMNS = {
    "peer",
    "address",
    "direction",
    "state",
    "login_state",
    "bytes_sent",
    "bytes_received",
    "fragments_sent",
    "fragments_received",
    "frames_sent",
    "frames_received",
    "corrupt_fragments",
    "retransmissions",
    "last_activity",
}


def body(dialog: int, number: int, pad: int = 48) -> bytes:
    return b"%d:%d:" % (dialog, number) + b"x" * pad


def dialog_of(payload: bytes) -> int:
    return int(payload.split(b":", 1)[0])


def free_dead_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def endpoint_states(node: Node) -> dict[uuid.UUID, str]:
    return {r["conversation_handle"]: r["state"] for r in await endpoints(node)}


# ---- identity --------------------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_each_broker_has_a_persistent_instance_id_and_certificate(tmp_path: Path) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b = fed["A"], fed["B"]
        assert a.instance != b.instance
        uuid.UUID(a.instance)
        assert a.certificate != b.certificate
        status = run_ssb("status", "--url", a.process.url)
        assert a.instance in status.stdout

        # kill -9 and restart: same instance id, same key pair, trust store kept
        port = a.broker_port
        a = await fed.restart("A")
        assert await a.conn.broker_instance() == a.instance
        assert await a.conn.broker_certificate() == a.certificate
        assert a.broker_port == port

        _, _, _, target_q = await two_brokers_with_a_dialog_pair(fed)
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(h, REQUEST, b"after restart")
        (m,) = await receive_count(b.conn, target_q, 1)
        assert m.message_body == b"after restart"
        assert m.message_sequence_number == 0
        assert m.service_name == "TargetB" and m.service_contract_name == CONTRACT
        rows = await endpoints(b)
        assert [(r["far_broker_instance"], r["far_service"]) for r in rows] == [
            (a.instance, "Initiator")
        ]


# ---- volume: three brokers -----------------------------------------------------------------------

DIALOGS = 20
PER_DIALOG = 500
BATCH = 100
IN_FLIGHT = 8


def _reply(request: bytes) -> bytes:
    return b"re:" + request


async def three_brokers_with_an_initiator(fed: Federation) -> tuple[Node, Node, Node, str]:
    """Brokers A, B and C of `fed` with the contract, and the service Initiator on A: the
    three nodes and Initiator's queue."""
    a, b, c = fed["A"], fed["B"], fed["C"]
    await create_contract(a, b, c)
    return a, b, c, await create_initiator(a, "Initiator")


@pytest.mark.timeout(180)
async def test_ten_thousand_messages_on_twenty_dialogs_to_two_brokers_and_back(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B", "C"]) as fed:
        a, b, c, init_q = await three_brokers_with_an_initiator(fed)
        target_q = {"B": await create_target(b, "TargetB"), "C": await create_target(c, "TargetC")}
        await link(a, "Initiator", b, "TargetB")
        await link(a, "Initiator", c, "TargetC")
        targets = ["B" if i % 2 == 0 else "C" for i in range(DIALOGS)]
        handles = [
            await a.conn.begin_dialog("Initiator", f"Target{t}", contract=CONTRACT) for t in targets
        ]
        per_target = PER_DIALOG * DIALOGS // 2

        sampler = await ConnectionSampler([a, b, c], interval=0.25).start()
        started = time.monotonic()
        served_b: list[client.Message] = []
        served_c: list[client.Message] = []
        try:
            *_, replies = await run_together(
                produce(
                    await fed.session("A"),
                    numbered_batches(handles, PER_DIALOG, BATCH, body),
                    IN_FLIGHT,
                ),
                serve(await fed.session("B"), target_q["B"], served_b, per_target, _reply, BATCH),
                serve(await fed.session("C"), target_q["C"], served_c, per_target, _reply, BATCH),
                receive_count(await fed.session("A"), init_q, DIALOGS * PER_DIALOG, timeout=120),
                timeout=120,
            )
        finally:
            await sampler.stop()
        elapsed = time.monotonic() - started
        print(f"10,000 messages and 10,000 replies across brokers in {elapsed:.1f} s")

        # every request arrived once, in order, on the broker its dialog was begun to
        for name, messages, service in (("B", served_b, "TargetB"), ("C", served_c, "TargetC")):
            assert len(messages) == per_target
            assert {
                (m.service_name, m.service_contract_name, m.message_type_name) for m in messages
            } == {(service, CONTRACT, REQUEST)}
            seen: set[int] = set()
            for bodies in assert_eoio(messages).values():
                dialog = dialog_of(bodies[0])
                assert targets[dialog] == name and dialog not in seen
                seen.add(dialog)
                assert bodies == [body(dialog, n) for n in range(PER_DIALOG)]
            assert len(seen) == DIALOGS // 2
            rows = await endpoints(fed[name])
            assert len(rows) == DIALOGS // 2
            assert {(r["far_broker_instance"], r["far_service"], r["state"]) for r in rows} == {
                (a.instance, "Initiator", "CO")
            }

        # every reply came back once, in order, on the initiator's handle
        reply_bodies = assert_eoio(replies)
        assert set(reply_bodies) == set(handles)
        for dialog, handle in enumerate(handles):
            assert reply_bodies[handle] == [b"re:" + body(dialog, n) for n in range(PER_DIALOG)]

        # one authenticated connection per peer pair; B and C never talked
        for node, peer in ((a, b), (a, c), (b, a), (c, a)):
            rows = sampler.peer_rows(node, peer)
            assert rows, f"{node.name} never showed a connection with {peer.name}"
            assert {"ESTABLISHED"} <= {r["state"] for r in rows}
            assert {"AUTHENTICATED"} <= {r["login_state"] for r in rows}
            assert set(rows[0]) >= BROKER_CONNECTIONS_COLUMNS
        assert not sampler.peer_rows(b, c) and not sampler.peer_rows(c, b)
        crowded = {k: v for k, v in sampler.max_established.items() if v > 1}
        assert not crowded, f"more than one established connection per peer: {crowded}"
        for peer in (b, c):
            assert sampler.peak(a, peer, "fragments_sent") > 0
            assert sampler.peak(a, peer, "bytes_sent") > 0
            assert sampler.peak(peer, a, "fragments_received") > 0
            assert sampler.peak(peer, a, "corrupt_fragments") == 0

        # END CONVERSATION from A: each target gets EndDialog as message 500, then ends too
        await asyncio.gather(*(a.conn.end_conversation(h) for h in handles))
        for name in ("B", "C"):
            node = fed[name]
            ends = await receive_count(node.conn, target_q[name], DIALOGS // 2)
            assert {(m.message_type_name, m.message_sequence_number) for m in ends} == {
                (client.END_DIALOG, PER_DIALOG)
            }
            await asyncio.gather(*(node.conn.end_conversation(m.conversation_handle) for m in ends))
        await wait_quiet([a, b, c])


# ---- one large message among small ones ------------------------------------------------------------

BIG = 8 * 1024 * 1024


@pytest.mark.timeout(120)
async def test_an_8_mib_message_crosses_while_small_messages_keep_flowing(tmp_path: Path) -> None:
    # a long idle timeout keeps the one connection, so its counters stay in the view
    async with Federation(
        tmp_path, ["A", "B"], transport={**TRANSPORT, "idle_timeout": 60.0}
    ) as fed:
        a, b, init_q, target_q = await two_brokers_with_a_dialog_pair(fed)
        big = random.Random(8).randbytes(BIG)
        h_big = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        h_small = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(h_small, REQUEST, body(1, 0))
        await a.conn.send(h_big, REQUEST, b"before")
        await a.conn.send(h_big, REQUEST, big)
        await a.conn.send(h_big, REQUEST, b"after")
        # small messages keep going on another dialog while the big one is on its way
        for batch in range(20):
            await a.conn.send_many(
                h_small, REQUEST, [body(1, 1 + batch * 10 + i) for i in range(10)]
            )
        small_count = 1 + 20 * 10

        sampler = await ConnectionSampler([a, b], interval=0.25).start()
        try:
            got = await receive_count(b.conn, target_q, 3 + small_count, timeout=60, top=50)
            streams = assert_eoio(got)
            assert len(streams) == 2
            big_stream = next(v for v in streams.values() if v[0] == b"before")
            small_stream = next(v for v in streams.values() if v[0] != b"before")
            assert [len(x) for x in big_stream] == [6, BIG, 5]
            assert hashlib.md5(big_stream[1]).digest() == hashlib.md5(big).digest()
            assert big_stream[0] == b"before" and big_stream[2] == b"after"
            assert small_stream == [body(1, n) for n in range(small_count)]

            # and back: the target sends it to the initiator in one message
            t_big = next(m.conversation_handle for m in got if m.message_body == b"before")
            await b.conn.send(t_big, REPLY, big)
            await b.conn.send(t_big, REPLY, b"small after big")
            echo = await receive_count(a.conn, init_q, 2, timeout=60, conversation_handle=h_big)
            assert [m.message_sequence_number for m in echo] == [0, 1]
            assert echo[0].message_body == big and echo[1].message_body == b"small after big"
        finally:
            await sampler.stop()

        fragments = BIG // TRANSPORT["fragment_size"]
        assert sampler.peak(b, a, "fragments_received") >= fragments
        assert sampler.peak(b, a, "bytes_received") >= BIG
        assert sampler.peak(a, b, "fragments_received") >= fragments
        assert sampler.peak(a, b, "fragments_sent") >= fragments

        for h in (h_big, h_small):
            await a.conn.end_conversation(h)
        ends = await receive_count(b.conn, target_q, 2)
        assert {m.message_type_name for m in ends} == {client.END_DIALOG}
        for m in ends:
            await b.conn.end_conversation(m.conversation_handle)
        await wait_quiet([a, b])


# ---- a disabled target queue -------------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_messages_for_a_disabled_queue_wait_on_the_target_broker_until_it_is_on(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b, _, target_q = await two_brokers_with_a_dialog_pair(fed, target_status="OFF")
        handles = await begin_dialogs(a, 2)
        for dialog, h in enumerate(handles):
            await a.conn.send_many(h, REQUEST, [body(dialog, n) for n in range(25)])

        async def held_on_b() -> list[dict[str, Any]]:
            rows = [r for r in await transmission_queue(b) if r["to_service_name"] == "TargetB"]
            return rows if len(rows) == 50 else []

        # B stored and acknowledged them: they left A and wait, visible, in B's transmission queue
        rows = await wait_until(held_on_b, "50 messages held in B's transmission queue")
        assert set(rows[0]) >= TRANSMISSION_QUEUE_COLUMNS
        assert all("disabled" in r["transmission_status"].lower() for r in rows), rows[0]
        assert {
            (r["from_service_name"], r["service_contract_name"], r["message_type_name"])
            for r in rows
        } == {("Initiator", CONTRACT, REQUEST)}
        per_conversation: dict[Any, list[int]] = {}
        for r in rows:
            per_conversation.setdefault(r["conversation_handle"], []).append(
                r["message_sequence_number"]
            )
        assert sorted(sorted(v) for v in per_conversation.values()) == [list(range(25))] * 2
        await acknowledged(a)
        with pytest.raises(client.QueueDisabledError):
            await b.conn.receive(target_q, timeout=0)

        await b.conn.alter_queue(target_q, status="ON")
        await a.conn.send(handles[0], REQUEST, body(0, 25))  # must queue up behind the held ones
        got = await receive_count(b.conn, target_q, 51)
        streams = assert_eoio(got)
        assert sorted(streams.values(), key=lambda v: dialog_of(v[0])) == [
            [body(0, n) for n in range(26)],
            [body(1, n) for n in range(25)],
        ]
        await acknowledged(b)


@pytest.mark.timeout(90)
async def test_messages_for_a_full_queue_stay_unacknowledged_on_the_sender_until_there_is_room(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b, _, target_q = await two_brokers_with_a_dialog_pair(fed)
        await b.conn.alter_queue(target_q, max_messages=10)
        handle = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send_many(handle, REQUEST, [body(0, n) for n in range(30)])

        async def stuck_on_a() -> list[dict[str, Any]]:
            rows = await transmission_queue(a)
            full = await b.conn.view("service_queues")
            ready = next(q["messages_ready"] for q in full if q["name"] == target_q)
            return rows if ready == 10 and len(rows) == 20 else []

        # B took what fits; the rest is not acknowledged and waits, in order, on A
        rows = await wait_until(stuck_on_a, "10 on B and 20 waiting on A")
        assert sorted(r["message_sequence_number"] for r in rows) == list(range(10, 30))
        (connection,) = [c for c in await connections(b) if c["peer"] == a.instance]
        assert connection["refused_fragments"] > 0
        assert await transmission_queue(b) == []  # nothing held on B: it refused, not stored
        got = await receive_count(b.conn, target_q, 30)  # room again: A's retries get through
        assert assert_eoio(got) and [m.message_body for m in got] == [body(0, n) for n in range(30)]
        await acknowledged(a)


@pytest.mark.timeout(60)
async def test_small_messages_travel_bundled_once_the_dialog_is_acknowledged(
    tmp_path: Path,
) -> None:
    """After the first message of a dialog direction is acknowledged, small messages
    waiting together go several to a frame: far fewer frames than messages, and every
    message still arrives once, in order."""
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b, _, target_q = await two_brokers_with_a_dialog_pair(fed)
        handle = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(handle, REQUEST, body(0, 0))
        await acknowledged(a)
        (before,) = [c for c in await connections(a) if c["peer"] == b.instance]
        await a.conn.send_many(handle, REQUEST, [body(0, n) for n in range(1, 501)])
        got = await receive_count(b.conn, target_q, 501, top=100)
        assert assert_eoio(got) and [m.message_body for m in got] == [
            body(0, n) for n in range(501)
        ]
        await acknowledged(a)
        (after,) = [c for c in await connections(a) if c["peer"] == b.instance]
        fragments = after["fragments_sent"] - before["fragments_sent"]
        frames = after["frames_sent"] - before["frames_sent"]
        assert fragments >= 500
        assert frames <= fragments // 10, f"{frames} frames for {fragments} messages"


# ---- END CONVERSATION, Error and timers ---------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_end_conversation_errors_and_timers_across_brokers(tmp_path: Path) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b = fed["A"], fed["B"]
        init_q, target_q = await dialog_services(a, b)
        forward = await route(a, "TargetB", b)
        await route(b, "Initiator", a)

        async def open_dialog(first: bytes) -> tuple[uuid.UUID, uuid.UUID]:
            h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
            await a.conn.send(h, REQUEST, first)
            (m,) = await receive_count(b.conn, target_q, 1)
            assert m.message_body == first, m
            return h, m.conversation_handle

        async def gone(node: Node, handle: uuid.UUID) -> bool:
            return handle not in await endpoint_states(node)

        # 1. timers on both ends of a cross-broker dialog; the target replies and ends first
        h1, t1 = await open_dialog(b"hello")
        await b.conn.begin_conversation_timer(t1, 0.3)
        await a.conn.begin_conversation_timer(h1, 0.3)
        (timer_b,) = await b.conn.receive(target_q, timeout=10, conversation_handle=t1)
        assert timer_b.message_type_name == client.DIALOG_TIMER
        (timer_a,) = await a.conn.receive(init_q, timeout=10, conversation_handle=h1)
        assert timer_a.message_type_name == client.DIALOG_TIMER
        await b.conn.send(t1, REPLY, b"bye")
        await b.conn.end_conversation(t1)
        got = await receive_count(a.conn, init_q, 2, conversation_handle=h1)
        assert [(m.message_type_name, m.message_sequence_number, m.message_body) for m in got] == [
            (REPLY, 0, b"bye"),
            (client.END_DIALOG, 1, b""),
        ]
        assert (await endpoint_states(a))[h1] == "DI"
        await a.conn.end_conversation(h1)
        await wait_until(lambda: gone(a, h1), "A's endpoint of dialog 1 to go")
        await wait_until(lambda: gone(b, t1), "B's endpoint of dialog 1 to go")

        # 2. the initiator ends while no route leads to the target: DO, the EndDialog waits
        h2, t2 = await open_dialog(b"two")

        async def in_transmission_queue() -> list[dict[str, Any]]:
            return [r for r in await transmission_queue(a) if r["conversation_handle"] == h2]

        await wait_until(
            in_transmission_queue, "B to acknowledge message 0 of dialog 2", until=operator.not_
        )
        await a.conn.drop_route(forward)
        await a.conn.end_conversation(h2)
        (row,) = await wait_until(in_transmission_queue, "the EndDialog in A's transmission queue")
        assert row["is_end_of_dialog"] and row["message_type_name"] == client.END_DIALOG
        assert row["message_sequence_number"] == 1
        assert row["transmission_status"] == "no route to service 'TargetB'"
        assert (await endpoint_states(a))[h2] == "DO"
        await route(a, "TargetB", b)  # a route again: the EndDialog goes out
        (end,) = await b.conn.receive(target_q, timeout=15, conversation_handle=t2)
        assert (end.message_type_name, end.message_sequence_number) == (client.END_DIALOG, 1)
        # the initiator's endpoint goes once the target has acknowledged the EndDialog
        await wait_until(lambda: gone(a, h2), "A's DO endpoint to go after the ack")
        assert (await endpoint_states(b))[t2] == "DI"
        await b.conn.end_conversation(t2)
        await wait_until(lambda: gone(b, t2), "B's endpoint of dialog 2 to go")

        # 3. the target ends with an error: the initiator gets Error (code and text), state ER
        h3, t3 = await open_dialog(b"three")
        await b.conn.end_conversation(t3, error=4711, description="order rejected")
        (err,) = await a.conn.receive(init_q, timeout=15, conversation_handle=h3)
        assert err.message_type_name == client.ERROR
        assert err.message_sequence_number == 0
        assert b"4711" in err.message_body and b"order rejected" in err.message_body
        assert (await endpoint_states(a))[h3] == "ER"
        await a.conn.end_conversation(h3)

        # 4. the initiator ends with an error: the target gets it after the earlier message
        h4, t4 = await open_dialog(b"four")
        await a.conn.end_conversation(h4, error=50, description="cancelled by the initiator")
        (err,) = await b.conn.receive(target_q, timeout=15, conversation_handle=t4)
        assert (err.message_type_name, err.message_sequence_number) == (client.ERROR, 1)
        assert b"50" in err.message_body and b"cancelled by the initiator" in err.message_body
        assert (await endpoint_states(b))[t4] == "ER"
        await b.conn.end_conversation(t4)

        await wait_quiet([a, b])


# ---- routes --------------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.slow
async def test_route_matching_most_specific_wins_expired_ignored_local_and_transport(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B", "C"]) as fed:
        a, b, c, _ = await three_brokers_with_an_initiator(fed)  # B and C route acks to it
        queues = {}
        for node in (b, c):  # the same service names on B and C
            queues[node.name] = await create_target(node, "Shared")
            await create_target(node, "Lonely", queue=f"Lonely{node.name}")
            await route(node, "Initiator", a)
        here_a = await create_target(a, "Here")
        here_b = await create_target(b, "Here", queue="HereOnB")

        async def arrives(node: Node, queue: str, handle: uuid.UUID, text: bytes) -> None:
            await a.conn.send(handle, REQUEST, text)
            (m,) = await receive_count(node.conn, queue, 1, timeout=20)
            assert m.message_body == text

        # the most specific route leads nowhere until it expires; then the general one is used
        # (first, while A has no connection to B yet, so only the routes can lead there)
        dead = free_dead_port()
        await route(
            a, "Lonely", f"tcp://127.0.0.1:{dead}", broker_instance=b.instance, lifetime=6.0
        )
        await route(a, "Lonely", b)
        h = await a.conn.begin_dialog(
            "Initiator", "Lonely", contract=CONTRACT, broker_instance=b.instance
        )
        await a.conn.send(h, REQUEST, b"lonely")

        async def refused() -> str:
            rows = [r for r in await transmission_queue(a) if r["conversation_handle"] == h]
            status = rows[0]["transmission_status"] if rows else ""
            return status if f"127.0.0.1:{dead}" in status and "refused" in status.lower() else ""

        # before the specific route expires, A keeps trying the dead address
        await wait_until(refused, f"'connection refused by 127.0.0.1:{dead}' on A", 5)
        (m,) = await receive_count(b.conn, "LonelyB", 1, timeout=20)
        assert m.message_body == b"lonely"

        # service + broker instance beats service alone
        await route(a, "Shared", c, name="shared_any")
        await route(a, "Shared", b, broker_instance=b.instance, name="shared_on_b")
        h = await a.conn.begin_dialog(
            "Initiator", "Shared", contract=CONTRACT, broker_instance=b.instance
        )
        await arrives(b, queues["B"], h, b"to B by instance")
        h = await a.conn.begin_dialog(
            "Initiator", "Shared", contract=CONTRACT, broker_instance=c.instance
        )
        await arrives(c, queues["C"], h, b"to C by service name")
        assert {r["name"] for r in await a.view("routes")} >= {"shared_any", "shared_on_b"}

        # LOCAL: a LOCAL route for A's own instance beats a tcp route for the same name
        await route(a, "Here", b, name="here_remote")
        await route(a, "Here", "LOCAL", broker_instance=a.instance, name="here_local")
        h = await a.conn.begin_dialog("Initiator", "Here", contract=CONTRACT)
        await arrives(a, here_a, h, b"stays on A")
        h = await a.conn.begin_dialog(
            "Initiator", "Here", contract=CONTRACT, broker_instance=b.instance
        )
        await arrives(b, here_b, h, b"goes to B")

        # TRANSPORT: the service name carries the address
        transported = f"tcp://127.0.0.1:{b.broker_port}/Transported"
        transported_q = await create_target(b, transported, queue="TransportedQueue")
        await route(a, transported, "TRANSPORT", name="transport")
        h = await a.conn.begin_dialog("Initiator", transported, contract=CONTRACT)
        await arrives(b, transported_q, h, b"by transport")
        await a.conn.end_conversation(h)
        (end,) = await b.conn.receive(transported_q, timeout=15)
        assert end.message_type_name == client.END_DIALOG


@pytest.mark.timeout(60)
async def test_no_route_is_shown_in_the_transmission_queue_until_a_route_appears(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b = fed["A"], fed["B"]
        _, target_q = await dialog_services(a, b)
        await route(b, "Initiator", a)
        forward = await route(a, "TargetB", b)
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.drop_route(forward)
        await a.conn.send_many(h, REQUEST, [body(0, n) for n in range(3)])

        rows = await transmission_queue(a)
        assert len(rows) == 3 and set(rows[0]) >= TRANSMISSION_QUEUE_COLUMNS
        assert [r["message_sequence_number"] for r in rows] == [0, 1, 2]
        for r in rows:
            assert r["conversation_handle"] == h
            assert r["to_service_name"] == "TargetB" and r["from_service_name"] == "Initiator"
            assert r["service_contract_name"] == CONTRACT and r["message_type_name"] == REQUEST
            assert r["transmission_status"] == "no route to service 'TargetB'"
            assert r["priority"] == 5 and r["message_body_length"] == len(body(0, 0))
            assert not r["is_end_of_dialog"] and not r["is_conversation_error"]
            assert r["enqueue_time"] is not None
        assert await b.conn.receive(target_q, timeout=0) == []

        await route(a, "TargetB", b)
        got = await receive_count(b.conn, target_q, 3, timeout=20)
        assert assert_eoio(got) and [m.message_body for m in got] == [body(0, n) for n in range(3)]
        await acknowledged(a)


# ---- the adjacent broker layer ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_a_peer_is_refused_until_its_certificate_is_trusted(tmp_path: Path) -> None:
    async with Federation(tmp_path, ["A", "B"], trust=False) as fed:
        a, b, _, target_q = await two_brokers_with_a_dialog_pair(fed)
        await trust(a, b)  # A trusts B, B does not know A yet
        sampler = await ConnectionSampler([a, b], interval=0.05).start()
        try:
            h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
            await a.conn.send(h, REQUEST, b"who are you?")

            async def failed_attempt() -> str:
                rows = await transmission_queue(a)
                return rows[0]["transmission_status"] if rows else ""

            status = await wait_until(
                failed_attempt, "the failed handshake named in A's transmission_status", 15
            )
            failed_login = await _seen_failed_login(sampler, a, b)
            print(f"status {status!r}; FAILED login state sampled: {failed_login}")
            assert await b.conn.receive(target_q, timeout=0) == [], status

            await trust(b, a)
            (m,) = await receive_count(b.conn, target_q, 1, timeout=20)
            assert m.message_body == b"who are you?"
            await sampler.sample()
            assert any(r["login_state"] == "AUTHENTICATED" for r in sampler.peer_rows(b, a))

            # once A's certificate is dropped again, a new connection is refused
            await b.conn.drop_certificate("cert_A")
            await wait_until(lambda: _no_established(b, a), "the idle connection to close", 15)
            await a.conn.send(h, REQUEST, b"again")
            await wait_until(failed_attempt, "a failed attempt after DROP CERTIFICATE")
            assert await b.conn.receive(target_q, timeout=0) == []
            await trust(b, a)
            (m,) = await receive_count(b.conn, target_q, 1, timeout=20)
            assert (m.message_body, m.message_sequence_number) == (b"again", 1)
        finally:
            await sampler.stop()


async def test_another_brokers_login_needs_send_on_the_service(tmp_path: Path) -> None:
    """A's certificate maps A to a login of B (PUBLIC when it names none), which needs
    SEND on B's service: without it the dialog ends with Service Broker's error 11215 at
    A, nothing of it reaches B's queue, and B logs the refusal with A's id."""
    async with Federation(tmp_path, ["A", "B"], trust=False) as fed:
        a, b, init_q, target_q = await two_brokers_with_a_dialog_pair(fed)
        await trust(a, b)
        await b.conn.revoke("SEND", "public", "service", "TargetB")  # create_target's grant
        await b.conn.create_login("shop", "a-long-password")
        await b.conn.create_certificate("cert_A", a.certificate, login="shop")
        assert [r["login"] for r in await b.view("certificates")] == ["shop"]

        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(h, REQUEST, b"not allowed")
        (error,) = await receive_count(a.conn, init_q, 1, timeout=20)
        assert error.message_type_name == client.ERROR
        assert b"<Code>-11215</Code>" in error.message_body
        assert b"does not have permission to send to the service" in error.message_body
        assert await b.conn.receive(target_q) == []  # nothing of it reached B's queue
        said = f"from broker {a.instance} refused: its certificate's login 'shop' lacks SEND"
        assert said in b.process.log_text()

        await b.conn.grant("SEND", "shop", "service", "TargetB")
        h2 = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(h2, REQUEST, b"allowed")
        (m,) = await receive_count(b.conn, target_q, 1, timeout=20)
        assert m.message_body == b"allowed"


async def test_a_login_a_certificate_maps_a_broker_to_cannot_be_dropped(tmp_path: Path) -> None:
    """Dropping it would leave the certificate naming no login, and a login created later
    under that name (someone else's) would speak for the other broker, its grants with
    it: the drop is refused, naming the certificate, and nothing changes."""
    async with Federation(tmp_path, ["A", "B"], trust=False) as fed:
        a, b = fed["A"], fed["B"]
        await b.conn.create_login("shop", "a-long-password")
        await b.conn.create_certificate("cert_A", a.certificate, login="shop")
        with pytest.raises(client.BrokerError) as refused:
            await b.conn.drop_login("shop")
        assert refused.value.code == ErrorCode.IN_USE
        assert "certificate 'cert_A'" in refused.value.message
        assert "drop_certificate" in refused.value.message
        assert "shop" in [r["name"] for r in await b.view("logins")]
        await b.conn.drop_certificate("cert_A")
        await b.conn.drop_login("shop")
        assert "shop" not in [r["name"] for r in await b.view("logins")]


async def _seen_failed_login(sampler: ConnectionSampler, a: Node, b: Node) -> bool:
    await sampler.sample()
    rows = sampler.rows[a.name] + sampler.rows[b.name]
    return any(str(r.get("login_state", "")).startswith("FAILED") for r in rows)


async def _no_established(node: Node, peer: Node) -> bool:
    return not any(
        r["peer"] == peer.instance and r["state"] == "ESTABLISHED" for r in await connections(node)
    )


@pytest.mark.timeout(60)
@pytest.mark.slow
async def test_idle_connections_close_and_reopen_on_demand(tmp_path: Path) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:  # idle_timeout 1 s
        a, b, init_q, target_q = await two_brokers_with_a_dialog_pair(fed)
        sampler = await ConnectionSampler([a, b], interval=0.05).start()
        try:
            h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
            for n in range(2):
                await a.conn.send(h, REQUEST, body(0, n))
                (m,) = await receive_count(b.conn, target_q, 1)
                assert (m.message_body, m.message_sequence_number) == (body(0, n), n)
                await b.conn.send(m.conversation_handle, REPLY, b"ok %d" % n)
                (r,) = await receive_count(a.conn, init_q, 1)
                assert (r.message_body, r.message_sequence_number) == (b"ok %d" % n, n)
                for node, peer in ((a, b), (b, a)):
                    await wait_until(
                        functools.partial(_no_established, node, peer),
                        f"{node.name}'s idle connection to {peer.name} to close",
                        15,
                    )
        finally:
            await sampler.stop()
        outbound = [r for r in sampler.peer_rows(a, b) if r["state"] == "ESTABLISHED"]
        inbound = [r for r in sampler.peer_rows(b, a) if r["state"] == "ESTABLISHED"]
        assert outbound and inbound, "never saw the connection established"
        assert set(outbound[0]) >= BROKER_CONNECTIONS_COLUMNS
        assert {(r["direction"], r["address"], r["login_state"]) for r in outbound} == {
            ("outbound", b.host_port, "AUTHENTICATED")
        }
        assert {(r["direction"], r["login_state"]) for r in inbound} == {
            ("inbound", "AUTHENTICATED")
        }
        assert all(r["last_activity"] for r in outbound + inbound)


async def test_send_permission_is_checked_on_the_service_of_another_database(
    tmp_path: Path,
) -> None:
    """A message from another broker for a service of a database other than master is
    checked against that service's grants (and reaches it once granted)."""
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b = fed["A"], fed["B"]
        await create_contract(a)
        init_q = await create_initiator(a, "Initiator")
        await b.conn.create_database("Shop")
        await b.conn.use("Shop")
        await create_contract(b)
        target_q = await create_target(b, "InShop")
        await b.conn.revoke("SEND", "public", "service", "InShop")
        await link(a, "Initiator", b, "InShop")

        h = await a.conn.begin_dialog("Initiator", "InShop", contract=CONTRACT)
        await a.conn.send(h, REQUEST, b"not allowed")
        (error,) = await receive_count(a.conn, init_q, 1, timeout=20)
        assert b"<Code>-11215</Code>" in error.message_body

        await b.conn.grant("SEND", "public", "service", "InShop")
        h2 = await a.conn.begin_dialog("Initiator", "InShop", contract=CONTRACT)
        await a.conn.send(h2, REQUEST, b"allowed")
        (got,) = await receive_count(b.conn, target_q, 1, timeout=20)  # only the granted one
        assert got.message_body == b"allowed"
