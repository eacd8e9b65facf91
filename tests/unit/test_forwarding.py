"""The forwarder on its own: no daemon, no sockets; next hops and writes are the test's,
time is an argument. Frames are real signed dialog frames from a `DialogSender`."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from ssb.broker._transport.forwarding import FRAME_OVERHEAD, Forwarder, Frame, Hop
from ssb.protocol import (
    AckFrame,
    Direction,
    Envelope,
    IntegrityError,
    generate_broker_identity,
    load_private_key,
    new_session_key,
    sign_origin,
    verify_origin,
    wrap_session_key,
)
from ssb.protocol._dialog_frames import AckRecord
from ssb.protocol._sender import DialogSender

ME, A, B, OTHER = (uuid.uuid4() for _ in range(4))


class Hops:
    """Next hops by service, and what was written to each hop (None: cannot take it)."""

    def __init__(self) -> None:
        self.routes: dict[str, Hop] = {"TargetB": B, "Initiator": A}
        self.up: set[Hop] = {A, B}
        self.sent: dict[Hop, list[Frame]] = {}

    def route(self, service: str, broker: uuid.UUID) -> Hop | None:
        return self.routes.get(service)

    def send(self, hop: Hop, frames: list[Frame]) -> bool:
        if hop not in self.up:
            return False
        self.sent.setdefault(hop, []).extend(frames)
        return True


def _forwarder(hops: Hops, forward_size: int = 1 << 20) -> Forwarder:
    return Forwarder(ME, forward_size, 0.5, hops.route, hops.send)


def _fragments(count: int, size: int = 100, conversation: uuid.UUID | None = None) -> list[Frame]:
    """`count` one-fragment messages from A to B: the first carries the envelope."""
    cid = conversation or uuid.uuid4()
    envelope = Envelope("Initiator", "TargetB", "C", A, B)
    sender = DialogSender(
        cid,
        Direction.FROM_INITIATOR,
        envelope,
        session_key=new_session_key(),
        wrapped_session_key=b"w" * 256,
    )
    frames: list[Frame] = []
    for seq in range(count):
        sender.queue_message(seq, "M", bytes([seq % 256]) * size)
        message, index = sender.next_unsent()  # type: ignore[misc]
        frames.append(sender.build_fragment(message, index, None))
    return frames


def test_a_frame_for_another_broker_goes_on_to_the_next_hop_and_its_ack_comes_back() -> None:
    hops = Hops()
    fwd = _forwarder(hops)
    frames = _fragments(3)
    assert all(fwd.wants(f) for f in frames[:1])
    for frame in frames:
        fwd.relay(frame, A, now=1.0)
    assert hops.sent[B] == frames
    ack = AckFrame(frames[0].conversation_id, Direction.FROM_INITIATOR, AckRecord(3), b"s" * 16)
    assert fwd.wants(ack)
    fwd.relay(ack, B, now=1.1)
    assert hops.sent[A] == [ack]
    (row,) = fwd.view()
    assert row["initiator_broker"] == str(A) and row["target_broker"] == str(B)
    assert row["relayed_frames"] == 4 and row["priority"] == 5


def test_frames_of_this_brokers_own_dialogs_and_unknown_ones_without_envelope_are_not_relayed() -> (
    None
):
    fwd = _forwarder(Hops())
    mine = dataclasses.replace(
        _fragments(1)[0], envelope=Envelope("Initiator", "TargetB", "C", A, ME)
    )
    assert not fwd.wants(mine)
    bare = dataclasses.replace(_fragments(1)[0], envelope=None, wrapped_session_key=None)
    assert not fwd.wants(bare)  # no envelope, conversation never seen
    fwd.relay(bare, A, now=1.0)
    assert fwd.relays == {}


def test_held_frames_stay_within_forward_size_and_go_in_order_when_the_hop_comes_up() -> None:
    hops = Hops()
    hops.up.discard(B)
    fwd = _forwarder(hops, forward_size=5 * (1000 + FRAME_OVERHEAD))
    frames = _fragments(8, size=1000)
    for frame in frames:
        fwd.relay(frame, A, now=1.0)
    assert fwd.held_bytes == 5 * (1000 + FRAME_OVERHEAD)
    (row,) = fwd.view()
    assert row["held_fragments"] == 5 and row["refused_frames"] == 3
    assert "forward_size" in row["status"]
    # a retransmission of a held fragment is held once
    fwd.relay(frames[0], A, now=2.0)
    assert fwd.held_bytes == 5 * (1000 + FRAME_OVERHEAD)
    hops.up.add(B)
    fwd.flush(B)
    assert hops.sent[B] == frames[:5]
    assert fwd.held_bytes == 0 and fwd.view()[0]["held_fragments"] == 0


def test_frames_held_too_long_are_dropped_and_quiet_conversations_forgotten() -> None:
    hops = Hops()
    hops.up.discard(B)
    fwd = _forwarder(hops)
    fwd.relay(_fragments(1)[0], A, now=1.0)
    fwd.expire(now=5.0, idle=100.0, hold_for=10.0)
    assert fwd.held_bytes > 0
    fwd.expire(now=12.0, idle=100.0, hold_for=10.0)
    assert fwd.held_bytes == 0 and len(fwd.relays) == 1
    fwd.expire(now=200.0, idle=100.0, hold_for=10.0)
    assert fwd.relays == {}


def test_a_route_back_to_where_a_frame_came_from_is_a_loop_and_drops_it() -> None:
    hops = Hops()
    hops.routes["TargetB"] = A
    fwd = _forwarder(hops)
    fwd.relay(_fragments(1)[0], A, now=1.0)
    assert hops.sent == {}
    assert fwd.loops == 1 and "loop" in fwd.view()[0]["status"]


def test_the_same_fragment_coming_back_from_another_hop_is_a_loop() -> None:
    hops = Hops()
    fwd = _forwarder(hops)
    (frame,) = _fragments(1)
    fwd.relay(frame, A, now=1.0)
    fwd.relay(frame, OTHER, now=1.1)  # it went round and came back
    assert len(hops.sent[B]) == 1 and fwd.loops == 1
    fwd.relay(frame, A, now=5.0)  # a retransmission from the origin is no loop
    assert len(hops.sent[B]) == 2 and fwd.loops == 1


def test_an_origin_proof_verifies_only_for_the_header_and_key_it_was_made_for() -> None:
    key_pem, cert_pem = generate_broker_identity(A)
    _, other_cert = generate_broker_identity(OTHER)
    key = load_private_key(key_pem)
    cid = uuid.uuid4()
    envelope = Envelope("Initiator", "TargetB", "C", A, B)
    wrapped = wrap_session_key(new_session_key(), cert_pem)
    proof = sign_origin(key, envelope.origin_transcript(cid, Direction.FROM_INITIATOR, wrapped))
    proved = dataclasses.replace(envelope, origin_proof=proof)
    assert Envelope.decode(proved.encode()) == proved
    assert Envelope.decode(envelope.encode()) == envelope
    verify_origin(cert_pem, proved.origin_transcript(cid, Direction.FROM_INITIATOR, wrapped), proof)
    for transcript in (
        envelope.origin_transcript(uuid.uuid4(), Direction.FROM_INITIATOR, wrapped),
        envelope.origin_transcript(cid, Direction.FROM_TARGET, wrapped),
        envelope.origin_transcript(
            cid, Direction.FROM_INITIATOR, wrapped[:-1] + bytes([wrapped[-1] ^ 1])
        ),
        dataclasses.replace(envelope, to_service="Elsewhere").origin_transcript(
            cid, Direction.FROM_INITIATOR, wrapped
        ),
    ):
        with pytest.raises(IntegrityError):
            verify_origin(cert_pem, transcript, proof)
    with pytest.raises(IntegrityError):
        verify_origin(
            other_cert, proved.origin_transcript(cid, Direction.FROM_INITIATOR, wrapped), proof
        )


def test_frames_held_for_a_hop_go_first_once_it_takes_frames_again() -> None:
    hops = Hops()
    hops.up.discard(B)
    fwd = _forwarder(hops)
    frames = _fragments(3)
    fwd.relay(frames[0], A, now=1.0)
    fwd.relay(frames[1], A, now=1.0)
    hops.up.add(B)  # the connection came up (no flush was called: the next frame does it)
    fwd.relay(frames[2], A, now=1.1)
    assert hops.sent[B] == frames and fwd.held_bytes == 0
