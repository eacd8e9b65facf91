"""Dialog encryption between brokers, and rotating a broker's certificate without losing
a dialog.

The brokers here speak plain TCP to each other (`tls = false`) where a test reads the
link, so what it checks is the dialog's own encryption, not TLS around it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest
from federation_setup import (
    CONTRACT,
    PLAIN,
    REPLY,
    REQUEST,
    Federation,
    endpoints,
    receive_count,
    request_and_reply,
    two_brokers_with_a_dialog_pair,
)
from rogue_broker import rogue_and_target

from ssb import client
from ssb.protocol import Envelope, ErrorCode, generate_broker_identity
from ssb.tools import wait_until


class Relay:
    """A TCP relay to `port` on 127.0.0.1 that keeps every byte it forwards and can be
    switched off (every connection cut) and on again on the same port. With `hold_after`
    it forwards that many bytes towards the target, then holds the rest until `release`."""

    def __init__(self, port: int, hold_after: int | None = None) -> None:
        self.target = port
        self.port = 0
        self.captured = bytearray()
        self.hold_after = hold_after
        self._forwarded = 0
        self._released = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def release(self) -> None:
        self._released.set()

    async def start(self) -> Relay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        await self._server.wait_closed()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool = False
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if up and self.hold_after is not None and not self._released.is_set():
                    room = max(0, self.hold_after - self._forwarded)
                    if len(data) > room:
                        writer.write(data[:room])
                        self._forwarded += room
                        await self._released.wait()
                        data = data[room:]
                    self._forwarded += len(data)
                self.captured.extend(data)
                writer.write(data)
        writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pump(reader, up_writer, up=True), self._pump(up_reader, writer))


async def _through(relay: Relay, a_conn: client.Connection, service: str) -> None:
    """A's only route to `service` goes through the relay."""
    for row in await a_conn.view("routes"):
        if row["remote_service_name"] == service:
            await a_conn.drop_route(row["name"])
    await a_conn.create_route(f"relay_{uuid.uuid4().hex[:6]}", service, relay.address)


async def test_an_encrypted_dialog_is_not_readable_on_the_link_either_way(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "B"], transport=PLAIN) as fed:
        a, b, init_q, target_q = await two_brokers_with_a_dialog_pair(fed)
        relay = await Relay(b.broker_port).start()
        await _through(relay, a.conn, "TargetB")

        # without a binding for the far service there is nothing to encrypt for
        with pytest.raises(client.BrokerError) as refused:
            await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT, encryption=True)
        assert refused.value.code == ErrorCode.UNKNOWN_REMOTE_SERVICE_BINDING
        assert "create_remote_service_binding" in str(refused.value)
        assert await endpoints(a) == []

        # a binding that names another broker: the message waits and says why
        _, stranger = generate_broker_identity(uuid.uuid4())
        await a.conn.create_remote_service_binding("wrong", "TargetB", stranger.decode())
        handle = await a.conn.begin_dialog(
            "Initiator", "TargetB", contract=CONTRACT, encryption=True
        )
        request = b"SECRET-REQUEST nobody on the wire may read"
        await a.conn.send(handle, REQUEST, request)

        async def waiting_reason() -> str:
            rows = await a.conn.view("transmission_queue")
            status = str(rows[0]["transmission_status"]) if rows else ""
            return status if "names broker" in status else ""

        reason = await wait_until(waiting_reason, "the message to wait for its binding", 20)
        assert "ENCRYPTION = ON" in reason and b.instance in reason
        assert await b.conn.receive(target_q, top=1) == []

        # the right binding: it goes, encrypted
        await a.conn.drop_remote_service_binding("wrong")
        await a.conn.create_remote_service_binding("b", "TargetB", b.certificate)
        assert [r["name"] for r in await a.conn.view("remote_service_bindings")] == ["b"]
        await request_and_reply(a, b, init_q, target_q, request, b"SECRET-REPLY for A only")
        assert [r["is_encrypted"] for r in await endpoints(a)] == [True]
        assert [r["is_encrypted"] for r in await endpoints(b)] == [True]

        # the control: the same link shows an unencrypted dialog's body
        plain = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(plain, REQUEST, b"PLAIN-REQUEST")
        await receive_count(b.conn, target_q, 1)
        await relay.stop()
        assert b"PLAIN-REQUEST" in relay.captured
        assert b"SECRET" not in relay.captured


async def test_a_body_that_does_not_decrypt_ends_its_dialog_and_is_never_delivered(
    tmp_path: Path,
) -> None:
    async with rogue_and_target(tmp_path) as (rogue, b, target_q):
        b_id = uuid.UUID(b.instance)
        sealed = Envelope("RogueService", "TargetB", CONTRACT, rogue.instance, b_id, True)
        # the control: an encrypted message from a party to the dialog is delivered in clear
        assert await rogue.send(b, uuid.uuid4(), sealed, REQUEST, b"well encrypted")
        (good,) = await receive_count(b.conn, target_q, 1)
        assert good.message_body == b"well encrypted"
        # its ciphertext altered and signed again with the session key: never delivered
        assert await rogue.send(
            b, uuid.uuid4(), sealed, REQUEST, b"altered on the way", alter_ciphertext=True
        )
        (error,) = await receive_count(b.conn, target_q, 1)
        assert error.is_error and b"altered on the way" not in error.message_body
        assert b"does not decrypt" in error.message_body
        assert "does not decrypt with the dialog's session key" in b.process.log_text()


async def test_rotating_a_broker_certificate_loses_no_dialog(tmp_path: Path) -> None:
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b, init_q, target_q = await two_brokers_with_a_dialog_pair(fed)
        relay = await Relay(b.broker_port).start()
        await _through(relay, a.conn, "TargetB")
        first = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(first, REQUEST, b"before")
        (before,) = await receive_count(b.conn, target_q, 1)

        # A cannot reach B; a new dialog's session key is wrapped for B's old certificate
        await relay.stop()
        second = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(second, REQUEST, b"wrapped for the old certificate")
        await a.conn.send(first, REQUEST, b"during")

        with pytest.raises(client.BrokerError, match="next_broker_certificate"):
            await b.conn.rotate_broker_certificate()
        staged = await b.conn.next_broker_certificate()
        assert staged == await b.conn.next_broker_certificate()  # made once
        await a.conn.create_certificate("cert_B_next", staged)
        assert await b.conn.rotate_broker_certificate() == staged
        assert await b.conn.broker_certificate() == staged
        await relay.start()  # the same port again

        got = await receive_count(b.conn, target_q, 2)
        assert sorted(m.message_body for m in got) == [
            b"during",
            b"wrapped for the old certificate",
        ]
        await b.conn.send(before.conversation_handle, REPLY, b"reply after the rotation")
        (reply,) = await receive_count(a.conn, init_q, 1)
        assert reply.message_body == b"reply after the rotation"

        # the old certificate goes; B restarts on its new identity; everything flows on
        await a.conn.drop_certificate("cert_B")
        await fed.restart("B")
        b = fed["B"]
        await a.conn.send(first, REQUEST, b"after")
        await a.conn.send(second, REQUEST, b"after, second")
        got = await receive_count(b.conn, target_q, 2)
        assert sorted(m.message_body for m in got) == [b"after", b"after, second"]
        assert "rotated" in b.process.log_text()
