"""Dialogs between brokers: only the broker that is party to a conversation speaks on it,
an envelope cannot claim another broker, and a message another broker should not have
sent ends its dialog with an error instead of being delivered.

The rogue here (`rogue_broker.Rogue`) is a broker the target trusts, run in the test: it
completes a real handshake on the broker port and sends real, correctly signed fragments
with its own session keys."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from pathlib import Path

import pytest
from federation_setup import (
    CONTRACT,
    REPLY,
    REQUEST,
    Federation,
    endpoints,
    receive_count,
    two_brokers_with_a_dialog_pair,
)
from rogue_broker import Rogue, rogue_and_target

from ssb.protocol import Envelope


@pytest.mark.slow
async def test_a_trusted_peer_can_neither_hijack_a_dialog_nor_forge_an_envelope(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b, _, target_q = await two_brokers_with_a_dialog_pair(fed)
        handle = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(handle, REQUEST, b"from A")
        (first,) = await receive_count(b.conn, target_q, 1)
        (row,) = await endpoints(b)
        conversation = uuid.UUID(str(row["conversation_id"]))
        rogue = await Rogue.trusted_by(b, tmp_path)
        a_id, b_id = uuid.UUID(a.instance), uuid.UUID(b.instance)

        # the control: the rogue's own new dialog, honestly addressed, is accepted
        own = uuid.uuid4()
        honest = Envelope("RogueService", "TargetB", CONTRACT, rogue.instance, b_id)
        assert await rogue.send(b, own, honest, REQUEST, b"rogue's own")

        # A's conversation, with the rogue's session key: refused, never acked
        assert not await rogue.send(b, conversation, honest, REQUEST, b"hijacked", seq=1)
        # a new conversation whose envelope claims to come from A, as if the rogue were
        # forwarding it: refused without A's origin proof, and with one A did not make
        forged = Envelope("Initiator", "TargetB", CONTRACT, a_id, b_id)
        assert not await rogue.send(b, uuid.uuid4(), forged, REQUEST, b"forged")
        assert not await rogue.send(
            b, uuid.uuid4(), forged, REQUEST, b"forged", prove_with=rogue.key
        )

        bodies = [m.message_body for m in await b.conn.receive(target_q, top=10)]
        assert bodies == [b"rogue's own"]
        log = b.process.log_text()
        assert f"refusing conversation {conversation} from broker {rogue.instance}" in log
        assert f"from broker {a_id} through broker {rogue.instance}: it carries no origin" in log
        assert "its origin proof does not verify" in log

        # A's dialog goes on, in order
        await a.conn.send(handle, REQUEST, b"again from A")
        (second,) = await receive_count(b.conn, target_q, 1)
        assert second.message_body == b"again from A"
        assert second.message_sequence_number == first.message_sequence_number + 1


async def test_a_message_outside_the_contract_ends_the_dialog_with_an_error(
    tmp_path: Path,
) -> None:
    async with rogue_and_target(tmp_path) as (rogue, b, target_q):
        envelope = Envelope(
            "RogueService", "TargetB", CONTRACT, rogue.instance, uuid.UUID(b.instance)
        )
        # REPLY is sent by the TARGET in this contract: from an initiator it is a violation
        conversation = uuid.uuid4()
        assert await rogue.send(b, conversation, envelope, REPLY, b"wrong direction")
        # never delivered: the target side holds only the Error that ended the dialog
        (error,) = await b.conn.receive(target_q, top=10)
        assert error.is_error and b"wrong direction" not in error.message_body
        assert b"AsyncDone" in error.message_body
        # and the rogue is told (its Error waits in B's transmission queue for a route back)
        (out,) = await b.conn.view("transmission_queue")
        assert out["is_conversation_error"] and out["to_service_name"] == "RogueService"
        log = b.process.log_text()
        assert "refused: message type 'AsyncDone' is sent by the TARGET" in log


async def test_brokers_speak_mutual_tls_and_refuse_an_untrusted_certificate(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b, _, target_q = await two_brokers_with_a_dialog_pair(fed)
        captured = bytearray()

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    captured.extend(data)
                    writer.write(data)
            writer.close()

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", b.broker_port)
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

        proxy = await asyncio.start_server(relay, "127.0.0.1", 0)
        port = proxy.sockets[0].getsockname()[1]
        await a.conn.create_route("via_proxy", "TargetB", f"tcp://127.0.0.1:{port}")
        await a.conn.drop_route(
            next(r["name"] for r in await a.view("routes") if r["address"] == b.address)
        )
        handle = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(handle, REQUEST, b"a body nobody on the wire may read")
        (message,) = await receive_count(b.conn, target_q, 1)
        assert message.message_body == b"a body nobody on the wire may read"
        proxy.close()
        assert len(captured) > 1000
        assert b"a body nobody on the wire may read" not in captured

        # a broker B does not trust is refused by TLS itself, before the link handshake
        stranger = Rogue(tmp_path)
        with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError)):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", b.broker_port, ssl=stranger.tls(b)
            )
            writer.write(b"\x00")
            await writer.drain()
            await asyncio.wait_for(reader.readexactly(1), 10)
