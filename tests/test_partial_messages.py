"""A large message from another broker that is still arriving is visible, with status 2,
and cannot be received (seed 004): in the target queue, or in the transmission queue
when the target queue is OFF. The relay between the brokers passes the first part of
the message and holds the rest until the test releases it."""

from __future__ import annotations

from pathlib import Path

from federation_setup import (
    CONTRACT,
    REQUEST,
    Federation,
    Node,
    receive_count,
    two_brokers_with_a_dialog_pair,
)
from test_dialog_encryption import Relay, _through

from ssb import client
from ssb.tools import wait_until

BODY = bytes(range(256)) * 8192  # 2 MiB: 32 fragments of the tests' 64 KiB
HOLD_AFTER = 700_000  # bytes towards B before the relay holds: about a third of it


async def _held_message(fed: Federation) -> tuple[Node, str, Relay]:
    a, b, _, target_q = await two_brokers_with_a_dialog_pair(fed)
    relay = await Relay(b.broker_port, hold_after=HOLD_AFTER).start()
    await _through(relay, a.conn, "TargetB")
    return b, target_q, relay


async def _send_large(fed: Federation) -> None:
    handle = await fed["A"].conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
    await fed["A"].conn.send(handle, REQUEST, BODY)


async def test_a_message_still_arriving_shows_with_status_2_in_its_queue(tmp_path: Path) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        b, target_q, relay = await _held_message(fed)
        await _send_large(fed)

        async def arriving() -> list[client.Message]:
            return [m for m in await b.conn.peek(target_q) if m.status == 2]

        (partial,) = await wait_until(arriving, "part of the message to arrive", 30)
        assert (partial.message_sequence_number, partial.message_type_name) == (0, REQUEST)
        assert partial.service_name == "TargetB" and partial.message_body == b""
        (detail,) = await b.conn.view("partial_messages")
        assert 0 < detail["fragments_received"] < detail["fragment_count"] == 32
        assert detail["queue_name"] == target_q
        assert await b.conn.receive(target_q, top=10) == []  # never received in part

        relay.release()
        (message,) = await receive_count(b.conn, target_q, 1)
        assert message.message_body == BODY and message.status == 1
        assert await b.conn.peek(target_q) == []
        assert await b.conn.view("partial_messages") == []


async def test_for_a_queue_that_is_off_it_shows_in_the_transmission_queue(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        b, target_q, relay = await _held_message(fed)
        await b.conn.alter_queue(target_q, status="OFF")
        await _send_large(fed)

        async def arriving() -> list[dict[str, object]]:
            rows = await b.conn.view("transmission_queue")
            return [r for r in rows if "status 2" in str(r["transmission_status"])]

        (row,) = await wait_until(arriving, "part of the message to arrive", 30)
        assert row["to_service_name"] == "TargetB" and row["message_sequence_number"] == 0
        assert "fragments received" in str(row["transmission_status"])

        relay.release()
        await b.conn.alter_queue(target_q, status="ON")
        (message,) = await receive_count(b.conn, target_q, 1)
        assert message.message_body == BODY
