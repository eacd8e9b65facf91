"""A rogue broker for tests: one a broker under test trusts (its certificate was created
there), run in the test with the protocol package. It completes a real handshake on the
broker port over mutual TLS and sends real, correctly signed fragments with its own
session keys, so a test can see what the broker does with what a trusted peer should not
send."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import rsa
from federation_setup import Federation, Node, two_brokers_with_a_dialog_pair

from ssb.protocol import (
    NEED_DATA,
    AckFrame,
    DialogPeer,
    Direction,
    Envelope,
    FragmentFrame,
    HandshakeCompleted,
    LinkConnection,
    Role,
    TrustStore,
    generate_broker_identity,
    load_private_key,
    new_session_key,
    sign_origin,
    wrap_session_key,
)
from ssb.protocol._integrity import SessionSeal


class Rogue:
    """A broker `target` trusts, speaking the broker protocol (over mutual TLS, with its
    own identity) from the test."""

    def __init__(self, folder: Path) -> None:
        self.instance = uuid.uuid4()
        key_pem, self.cert_pem = generate_broker_identity(self.instance)
        self.key = load_private_key(key_pem)
        self.files = (folder / "rogue-cert.pem", folder / "rogue-key.pem")
        self.files[0].write_bytes(self.cert_pem)
        self.files[1].write_bytes(key_pem)

    @classmethod
    async def trusted_by(cls, target: Node, folder: Path) -> Rogue:
        """A rogue whose certificate `target` trusts (CREATE CERTIFICATE there)."""
        rogue = cls(folder)
        await target.conn.create_certificate("rogue", rogue.cert_pem.decode())
        return rogue

    def tls(self, target: Node) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_cert_chain(*self.files)
        context.check_hostname = False
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        context.load_verify_locations(cadata=target.certificate)
        return context

    async def send(
        self,
        target: Node,
        conversation: uuid.UUID,
        envelope: Envelope,
        message_type: str,
        body: bytes,
        seq: int = 0,
        wait: float = 3.0,
        alter_ciphertext: bool = False,
        prove_with: rsa.RSAPrivateKey | None = None,
    ) -> bool:
        """Send one message on `conversation` (from its initiator); whether it was acked.

        `alter_ciphertext`: flip a byte of an encrypted body and sign the result again
        with the session key, as only a party to the dialog could.
        `prove_with`: sign an origin proof for the envelope with this key."""
        link = LinkConnection(
            Role.INITIATOR,
            broker_id=self.instance,
            private_key=self.key,
            certificate_pem=self.cert_pem,
            trusted=TrustStore([target.certificate.encode()]),
        )
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", target.broker_port, ssl=self.tls(target)
        )
        writer.write(link.data_to_send())
        async with asyncio.timeout(10):
            while True:
                link.receive_data(await reader.read(65536))
                events = []
                while (event := link.next_event()) is not NEED_DATA:
                    events.append(event)
                writer.write(link.data_to_send())
                if any(isinstance(e, HandshakeCompleted) for e in events):
                    break
        dialog = DialogPeer(private_key=self.key, peer_public_key=target.certificate.encode())
        session_key = new_session_key()
        wrapped = wrap_session_key(session_key, target.certificate.encode())
        if prove_with is not None:
            transcript = envelope.origin_transcript(conversation, Direction.FROM_INITIATOR, wrapped)
            envelope = dataclasses.replace(
                envelope, origin_proof=sign_origin(prove_with, transcript)
            )
        dialog.open_sender(
            conversation,
            Direction.FROM_INITIATOR,
            envelope,
            session_key=session_key,
            wrapped_session_key=wrapped,
            next_seq=seq,
        )
        dialog.queue_message(conversation, Direction.FROM_INITIATOR, seq, message_type, body)
        for frame in dialog.frames_to_send(time.monotonic()):
            if alter_ciphertext and isinstance(frame, FragmentFrame):
                altered = bytearray(frame.payload)
                altered[0] ^= 0x01
                frame = dataclasses.replace(frame, payload=bytes(altered))
                frame = dataclasses.replace(
                    frame,
                    signature=SessionSeal(session_key).sign(frame.signed_header(), frame.payload),
                )
            writer.write(link.send(frame))
        acked = False
        deadline = time.monotonic() + wait
        try:
            while not acked and time.monotonic() < deadline:
                try:
                    async with asyncio.timeout(deadline - time.monotonic()):
                        data = await reader.read(65536)
                except TimeoutError:
                    break
                if not data:
                    break
                link.receive_data(data)
                while (event := link.next_event()) is not NEED_DATA:
                    if isinstance(event, AckFrame) and event.conversation_id == conversation:
                        acked = True
        finally:
            writer.close()
        return acked


@contextlib.asynccontextmanager
async def rogue_and_target(root: Path) -> AsyncIterator[tuple[Rogue, Node, str]]:
    """Brokers A and B with a dialog pair (`two_brokers_with_a_dialog_pair`), and a rogue
    that B trusts: the rogue, B, and the queue of B's service TargetB."""
    async with Federation(root, ["A", "B"]) as fed:
        _, b, _, target_q = await two_brokers_with_a_dialog_pair(fed)
        yield await Rogue.trusted_by(b, root), b, target_q
