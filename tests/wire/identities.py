"""The brokers the wire tests speak for: A and B, and M, an impostor that holds a
certificate of its own for B's id (their RSA keys are slow to make: each is made once);
and the link connections A and B hold, before and after their handshake."""

from __future__ import annotations

import uuid
from typing import Any

from ssb.protocol import NEED_DATA, HandshakeCompleted, LinkConnection, LinkState, Role
from ssb.protocol._integrity import TrustStore, generate_broker_identity, load_private_key

A_ID = uuid.UUID("aaaaaaaa-0000-4000-8000-000000000001")
B_ID = uuid.UUID("bbbbbbbb-0000-4000-8000-000000000002")
A_KEY_PEM, A_CERT = generate_broker_identity(A_ID)
B_KEY_PEM, B_CERT = generate_broker_identity(B_ID)
M_KEY_PEM, M_CERT = generate_broker_identity(B_ID)  # claims to be B
A_KEY, B_KEY, M_KEY = (load_private_key(pem) for pem in (A_KEY_PEM, B_KEY_PEM, M_KEY_PEM))


def link(
    role: Role, *, me: str = "a", trusted: list[bytes] | None = None, **kw: Any
) -> LinkConnection:
    """A new link connection as broker A (`me="a"`) or B, trusting the other (or
    `trusted`)."""
    broker_id, key, cert, peer_cert = (
        (A_ID, A_KEY, A_CERT, B_CERT) if me == "a" else (B_ID, B_KEY, B_CERT, A_CERT)
    )
    return LinkConnection(
        role,
        broker_id=broker_id,
        private_key=key,
        certificate_pem=cert,
        trusted=TrustStore(trusted if trusted is not None else [peer_cert]),
        **kw,
    )


def pump(src: LinkConnection, dst: LinkConnection, *, byte_at_a_time: bool = False) -> list[object]:
    """Move src's pending handshake bytes into dst; return dst's events."""
    data = src.data_to_send()
    events: list[object] = []
    chunks = (
        [data[i : i + 1] for i in range(len(data))] if byte_at_a_time else [data] if data else []
    )
    for chunk in chunks:
        dst.receive_data(chunk)
        while (event := dst.next_event()) is not NEED_DATA:
            events.append(event)
    return events


def established(byte_at_a_time: bool = False) -> tuple[LinkConnection, LinkConnection]:
    """A's connection (the initiator) and B's, after a handshake checked step by step."""
    a = link(Role.INITIATOR, me="a")
    b = link(Role.ACCEPTOR, me="b")
    assert pump(a, b, byte_at_a_time=byte_at_a_time) == []
    assert b.state is LinkState.AWAITING_PROOF
    assert pump(b, a, byte_at_a_time=byte_at_a_time) == [HandshakeCompleted(B_ID, B_CERT)]
    assert a.state is LinkState.ESTABLISHED
    assert pump(a, b, byte_at_a_time=byte_at_a_time) == [HandshakeCompleted(A_ID, A_CERT)]
    assert state_of(b) is LinkState.ESTABLISHED
    return a, b


def state_of(conn: LinkConnection) -> LinkState:
    return conn.state
