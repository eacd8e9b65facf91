"""Adjacent broker layer: frame codecs, the handshake state machine and hostile input."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from identities import (
    A_CERT,
    A_ID,
    B_CERT,
    B_ID,
    B_KEY,
    M_CERT,
    M_KEY,
    established,
    link,
    pump,
)
from wire_values import wire_values

from ssb.protocol import (
    NEED_DATA,
    AckFrame,
    BundleFrame,
    CloseFrame,
    ConnectionClosed,
    Direction,
    Envelope,
    ErrorCode,
    FragmentFrame,
    HandshakeCompleted,
    LinkConnection,
    LinkState,
    LocalProtocolError,
    ProtocolError,
    ProtocolErrorFrame,
    RemoteProtocolError,
    Role,
    UnbundleFrame,
)
from ssb.protocol._dialog_frames import AckRecord, new_fragment_frame
from ssb.protocol._fields import MAX_ACK_RANGES, FrameKind
from ssb.protocol._framing import encode_frame, pack, unpack
from ssb.protocol._integrity import (
    sign_handshake_proof,
)
from ssb.protocol._link import (
    _RECV_KEEPS_ESTABLISHED,
    _SEND_KEEPS_ESTABLISHED,
    _TRANSITIONS,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    RELAY_BUNDLES_VERSION,
    Hello,
    HelloAccept,
    LinkFrame,
    LinkInput,
    Proof,
    decode_link_frame,
    encode_link_frame,
    older_version_in_refusal,
)
from ssb.protocol._locate import LocatedFrame, LocateFrame

CONV = uuid.UUID("cccccccc-0000-4000-8000-000000000003")

SAMPLE_FRAMES: list[LinkFrame] = [
    Hello(PROTOCOL_VERSION, A_ID, A_CERT, bytes(range(32))),
    HelloAccept(PROTOCOL_VERSION, B_ID, B_CERT, bytes(32), b"proof"),
    Proof(b"p" * 256),
    FragmentFrame(CONV, Direction.FROM_INITIATOR, 0, 0, 1, "Msg", b"", bytes(16)),
    FragmentFrame(
        CONV,
        Direction.FROM_TARGET,
        2**40,
        3,
        7,
        "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog",
        b"\x00\xff" * 100,
        bytes(range(16)),
        Envelope("Target", "Initiator", "Contract", B_ID, A_ID),
        b"w" * 256,
        AckRecord(5, ((6, 3, 0, 2), (9, 1, 0, 1))),
    ),
    AckFrame(CONV, Direction.FROM_INITIATOR, AckRecord(0), bytes(16)),
    AckFrame(CONV, Direction.FROM_TARGET, AckRecord(12, ((14, 100, 5, 99),)), bytes(16)),
    BundleFrame(CONV, Direction.FROM_INITIATOR, 7, "Msg", (b"a", b"", b"bc" * 500), bytes(16)),
    BundleFrame(
        CONV, Direction.FROM_TARGET, 2**40, "M", (b"x",), bytes(range(16)), AckRecord(3, ())
    ),
    ProtocolErrorFrame(int(ErrorCode.MALFORMED_FRAME), "bad frame ✗"),
    CloseFrame("idle"),
    CloseFrame(),
    LocateFrame(bytes(range(16)), "//shop/Orders", A_ID, 3),
    LocatedFrame(bytes(16), "Orders", B_ID, b"p" * 256),
    LocatedFrame(bytes(16), "Orders", None, None, "broker x does not forward ✗"),
    UnbundleFrame(CONV, Direction.FROM_TARGET),
]


# =========================================================================== codecs


@pytest.mark.parametrize("frame", SAMPLE_FRAMES, ids=lambda f: type(f).__name__)
def test_every_frame_roundtrips_one_byte_at_a_time(frame: LinkFrame) -> None:
    from ssb.protocol import FrameDecoder

    data = encode_link_frame(frame)
    decoder = FrameDecoder()
    decoded = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        while (obj := decoder.next_frame()) is not NEED_DATA:
            decoded.append(decode_link_frame(obj))
    assert decoded == [frame]


def test_fragment_signed_header_covers_everything_but_payload_and_signature() -> None:
    frame = SAMPLE_FRAMES[4]
    assert isinstance(frame, FragmentFrame)
    base = frame.signed_header()
    import dataclasses

    assert dataclasses.replace(frame, payload=b"other", signature=bytes(16)).signed_header() == base
    for change in (
        {"seq": 1},
        {"fragment_index": 2},
        {"fragment_count": 8},
        {"message_type": "X"},
        {"envelope": None},
        {"wrapped_session_key": None},
        {"ack": None},
        {"direction": Direction.FROM_INITIATOR},
    ):
        assert dataclasses.replace(frame, **change).signed_header() != base, change


def test_signed_header_is_one_canonical_array_whatever_the_split() -> None:
    """header_prefix + header_rest (the senders' and receivers' fast path) is exactly
    the documented layout: pack([kind, id bytes, direction, seq, index, count, type,
    envelope, wrapped key, ack])."""
    for frame in SAMPLE_FRAMES:
        if not isinstance(frame, FragmentFrame):
            continue
        expected = pack(
            [
                int(FrameKind.FRAGMENT),
                frame.conversation_id.bytes,
                int(frame.direction),
                frame.seq,
                frame.fragment_index,
                frame.fragment_count,
                frame.message_type,
                None if frame.envelope is None else frame.envelope.encode(),
                frame.wrapped_session_key,
                None if frame.ack is None else frame.ack.encode(),
            ]
        )
        split = FragmentFrame.header_prefix(
            frame.conversation_id, frame.direction
        ) + FragmentFrame.header_rest(
            frame.seq,
            frame.fragment_index,
            frame.fragment_count,
            frame.message_type,
            frame.envelope,
            frame.wrapped_session_key,
            frame.ack,
        )
        assert frame.signed_header() == split == expected


def test_fragment_and_ack_carry_the_conversation_id_as_raw_bytes() -> None:
    for frame in SAMPLE_FRAMES:
        if isinstance(frame, (FragmentFrame, AckFrame)):
            wire = unpack(encode_link_frame(frame)[4:])
            assert wire[1] == CONV.bytes
            decoded = decode_link_frame(wire)
            assert decoded == frame
            assert type(decoded.conversation_id) is uuid.UUID
            assert type(decoded.direction) is Direction


def test_decoded_conversation_ids_are_interned() -> None:
    first = decode_link_frame(unpack(encode_link_frame(SAMPLE_FRAMES[3])[4:]))
    second = decode_link_frame(unpack(encode_link_frame(SAMPLE_FRAMES[5])[4:]))
    assert isinstance(first, FragmentFrame) and isinstance(second, AckFrame)
    assert first.conversation_id is second.conversation_id


def test_fast_and_general_fragment_decoding_agree() -> None:
    """The inline-checked path (no envelope, no key) and the field helpers build the
    same frame."""
    plain = FragmentFrame(
        CONV, Direction.FROM_TARGET, 7, 2, 3, "M", b"body", bytes(16), ack=AckRecord(4)
    )
    assert decode_link_frame(plain.encode()) == plain
    with_envelope = dataclasses.replace(
        plain, envelope=Envelope("T", "I", "C", B_ID, A_ID), wrapped_session_key=b"k" * 256
    )
    assert decode_link_frame(with_envelope.encode()) == with_envelope


def test_new_fragment_frame_equals_the_dataclass_constructor() -> None:
    frame = SAMPLE_FRAMES[4]
    assert isinstance(frame, FragmentFrame)
    values = [getattr(frame, f.name) for f in dataclasses.fields(FragmentFrame)]
    built = new_fragment_frame(*values)
    assert type(built) is FragmentFrame
    assert built == FragmentFrame(*values) == frame
    assert hash(built) == hash(frame)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.seq = 1  # type: ignore[misc]


def test_established_fast_path_keeps_the_table_authoritative() -> None:
    """Only inputs the table maps ESTABLISHED -> ESTABLISHED skip the lookup."""
    steady = {FragmentFrame, BundleFrame, AckFrame, LocateFrame, LocatedFrame, UnbundleFrame}
    assert steady == _RECV_KEEPS_ESTABLISHED
    assert steady == _SEND_KEEPS_ESTABLISHED


@pytest.mark.parametrize(
    "obj",
    [
        [FrameKind.LOCATE, bytes(15), "S", A_ID, 0],
        [FrameKind.LOCATE, bytes(16), "S", A_ID, 9],  # beyond MAX_LOCATE_HOPS
        [FrameKind.LOCATE, bytes(16), "S", "not a uuid", 0],
        [FrameKind.LOCATED, bytes(16), "S", B_ID, None, ""],  # found, but no proof
        [FrameKind.LOCATED, bytes(16), "S", None, b"p", ""],  # a proof of nobody
        [FrameKind.LOCATED, bytes(16), "S", None, None, "x" * 5000],
    ],
)
def test_malformed_locate_frames(obj: list[Any]) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_link_frame(obj)


@pytest.mark.parametrize(
    "obj",
    [
        [FrameKind.UNBUNDLE, bytes(15), 0],
        [FrameKind.UNBUNDLE, bytes(16), 2],
        [FrameKind.UNBUNDLE, bytes(16), -1],
        [FrameKind.UNBUNDLE, bytes(16), "0"],
        [FrameKind.UNBUNDLE, bytes(16)],
        [FrameKind.UNBUNDLE, bytes(16), 0, 0],
    ],
)
def test_malformed_unbundle_frames(obj: list[Any]) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_link_frame(obj)


def _established_with(peer_version: int) -> tuple[LinkConnection, LinkConnection]:
    """A (version 3) and B speaking `peer_version` (B's Hello says so)."""
    a = link(Role.ACCEPTOR, me="a")
    b = link(Role.INITIATOR, me="b")
    hello = Hello(peer_version, B_ID, B_CERT, bytes(32))
    b._outgoing.clear()
    b._queue(hello)
    b._nonce = bytes(32)
    assert pump(b, a) == []
    assert pump(a, b) == [HandshakeCompleted(A_ID, A_CERT)]
    assert pump(b, a) == [HandshakeCompleted(B_ID, B_CERT)]
    return a, b


def test_a_version_2_peer_is_accepted_and_never_sent_locate_frames() -> None:
    a, b = _established_with(2)
    assert a.peer_version == 2 and a.state is LinkState.ESTABLISHED
    with pytest.raises(LocalProtocolError, match="version 2"):
        a.send(LocateFrame(bytes(16), "S", A_ID))
    b.receive_data(a.send(SAMPLE_FRAMES[4]))  # dialog traffic as before
    assert b.next_event() == SAMPLE_FRAMES[4]
    # (a version 2 broker sends none; one that did would break its own protocol)
    a.receive_data(encode_link_frame(LocateFrame(bytes(16), "S", B_ID)))
    with pytest.raises(RemoteProtocolError, match="version 2 sent a locate frame"):
        a.next_event()


def _handshake(initiator: LinkConnection, acceptor: LinkConnection) -> Hello:
    """Run a handshake to its end; the initiator's Hello as it went on the wire."""
    data = initiator.data_to_send()
    hello = decode_link_frame(unpack(data[4:]))
    assert isinstance(hello, Hello)
    acceptor.receive_data(data)
    assert acceptor.next_event() is NEED_DATA
    assert pump(acceptor, initiator) == [HandshakeCompleted(B_ID, B_CERT)]
    assert pump(initiator, acceptor) == [HandshakeCompleted(A_ID, A_CERT)]
    return hello


@pytest.mark.parametrize(
    ("offered", "spoken"),
    [(PROTOCOL_VERSION, PROTOCOL_VERSION), (3, 3), (MIN_PROTOCOL_VERSION, MIN_PROTOCOL_VERSION)],
)
def test_both_sides_speak_the_lower_of_the_two_versions(offered: int, spoken: int) -> None:
    a = link(Role.INITIATOR, me="a", version=offered)
    b = link(Role.ACCEPTOR, me="b")
    assert _handshake(a, b).version == offered
    assert a.peer_version == b.peer_version == spoken


def test_an_acceptor_answers_a_newer_offer_with_its_own_version() -> None:
    a = link(Role.ACCEPTOR, me="a")
    a.receive_data(encode_link_frame(Hello(PROTOCOL_VERSION + 5, B_ID, B_CERT, bytes(32))))
    assert a.next_event() is NEED_DATA
    answer = decode_link_frame(unpack(a.data_to_send()[4:]))
    assert isinstance(answer, HelloAccept) and answer.version == PROTOCOL_VERSION
    assert a.peer_version == PROTOCOL_VERSION


def test_an_initiator_refuses_an_answer_above_its_offer() -> None:
    a = link(Role.INITIATOR, me="a", version=3)
    a.data_to_send()
    proof = sign_handshake_proof(B_KEY, signer_id=B_ID, peer_id=A_ID, peer_nonce=a._nonce)
    a.receive_data(encode_link_frame(HelloAccept(4, B_ID, B_CERT, bytes(32), proof)))
    with pytest.raises(RemoteProtocolError, match=r"version 4, we speak 2\.\.3"):
        a.next_event()


def test_an_offer_out_of_range_is_a_local_error() -> None:
    for version in (MIN_PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1):
        with pytest.raises(ValueError, match="version must be"):
            link(Role.INITIATOR, me="a", version=version)


def test_a_version_3_acceptors_refusal_names_the_version_to_offer() -> None:
    # a version 3 broker refused any higher offer with this text
    refusal = ProtocolErrorFrame(
        int(ErrorCode.HANDSHAKE_FAILED), "peer speaks protocol version 4, we speak 2..3"
    )
    assert older_version_in_refusal(refusal, PROTOCOL_VERSION) == 3
    # and a version 2 broker refused any other version than its own with this one
    refusal = ProtocolErrorFrame(
        int(ErrorCode.HANDSHAKE_FAILED), "peer speaks protocol version 4, we speak 2"
    )
    assert older_version_in_refusal(refusal, PROTOCOL_VERSION) == 2
    # and offering 3 then is spoken by both (the relayed bundles' version is not)
    a = link(Role.INITIATOR, me="a", version=3)
    b = link(Role.ACCEPTOR, me="b")
    assert _handshake(a, b).version == 3
    assert a.peer_version == b.peer_version == 3 < RELAY_BUNDLES_VERSION


@pytest.mark.parametrize(
    ("code", "text", "offered"),
    [
        (ErrorCode.HANDSHAKE_FAILED, "certificate of broker x is not trusted", 4),
        (ErrorCode.MALFORMED_FRAME, "peer speaks protocol version 4, we speak 2..3", 4),
        (ErrorCode.HANDSHAKE_FAILED, "peer speaks protocol version 3, we speak 2..3", 3),
        (ErrorCode.HANDSHAKE_FAILED, "peer speaks protocol version 4, we speak 0..1", 4),
        (ErrorCode.HANDSHAKE_FAILED, "peer speaks protocol version 4, we speak 3..2", 4),
        (ErrorCode.HANDSHAKE_FAILED, "peer speaks protocol version 4, we speak 2..3 or so", 4),
        (ErrorCode.HANDSHAKE_FAILED, "peer speaks protocol version 4, we speak 2..99999", 4),
        (ErrorCode.HANDSHAKE_FAILED, "peer speaks protocol version 4, we speak 1", 4),
        (ErrorCode.HANDSHAKE_FAILED, "peer speaks protocol version 4, we speak 4", 4),
    ],
)
def test_other_refusals_name_no_version(code: ErrorCode, text: str, offered: int) -> None:
    assert older_version_in_refusal(ProtocolErrorFrame(int(code), text), offered) is None


def test_unbundle_frames_flow_only_between_brokers_of_version_4() -> None:
    notice = UnbundleFrame(CONV, Direction.FROM_INITIATOR)
    a, b = established()
    b.receive_data(a.send(notice))
    assert b.next_event() == notice
    a, b = _established_with(3)
    assert a.peer_version == 3
    with pytest.raises(LocalProtocolError, match="version 3: no unbundle frames"):
        a.send(notice)
    a.receive_data(encode_link_frame(notice))
    with pytest.raises(RemoteProtocolError, match="version 3 sent an unbundle frame"):
        a.next_event()


def test_locate_frames_flow_between_version_3_brokers() -> None:
    a, b = established()
    question = LocateFrame(bytes(16), "Orders", A_ID)
    answer = LocatedFrame(bytes(16), "Orders", None, None, "not here")
    b.receive_data(a.send(question))
    assert b.next_event() == question
    a.receive_data(b.send(answer))
    assert a.next_event() == answer


def test_direction_reverse() -> None:
    assert Direction.FROM_INITIATOR.reverse is Direction.FROM_TARGET
    assert Direction.FROM_TARGET.reverse is Direction.FROM_INITIATOR


@pytest.mark.parametrize(
    "obj",
    [
        [],
        {},
        "x",
        [99],
        [True],
        [1],
        [4, CONV.bytes],
        [5, CONV.bytes, 2, [0, []], bytes(16)],  # direction out of range
        [5, CONV.bytes, 0, [0, []], bytes(15)],  # short signature
        [5, CONV.bytes, 0, [-1, []], bytes(16)],
        [5, CONV.bytes, 0, [0, [[1, 2, 2, 2]]], bytes(16)],  # empty range
        [5, CONV.bytes, 0, [0, [[1, 2, 0, 3]]], bytes(16)],  # range beyond count
        [5, CONV.bytes, 0, [0, [[1, 2, 0]]], bytes(16)],
        [5, CONV.bytes, 0, [0, [[0, 1, 0, 1]] * (MAX_ACK_RANGES + 1)], bytes(16)],
        [4, CONV.bytes, 0, 0, 1, 1, "M", b"", bytes(16), None, None, None],  # index == count
        [4, CONV.bytes, 0, 0, 0, 0, "M", b"", bytes(16), None, None, None],  # count 0
        [4, CONV.bytes, 0, 0, 0, 1, b"M", b"", bytes(16), None, None, None],  # type not str
        [4, CONV.bytes, 0, 0, 0, 1, "M", "", bytes(16), None, None, None],  # payload not bytes
        [4, CONV.bytes, 0, 0, 0, 1, "M", b"", bytes(16), ["a"], None, None],  # bad envelope
        [4, "conv", 0, 0, 0, 1, "M", b"", bytes(16), None, None, None],
        [4, CONV, 0, 0, 0, 1, "M", b"", bytes(16), None, None, None],  # id as UUID ext
        [4, CONV.bytes[:15], 0, 0, 0, 1, "M", b"", bytes(16), None, None, None],  # short id
        [5, CONV, 0, [0, []], bytes(16)],  # id as UUID ext
        [4, CONV.bytes, True, 0, 0, 1, "M", b"", bytes(16), None, None, None],  # bool
        [4, CONV.bytes, 0, 0, 0, 1, "M", b"", bytes(17), None, None, None],  # long signature
        [8, CONV.bytes, 0, 0, "M", [], bytes(16), None],  # a bundle of nothing
        [8, CONV.bytes, 0, 0, "M", [b"x"] * 257, bytes(16), None],  # too many messages
        [8, CONV.bytes, 0, 0, "M", [b"x", "y"], bytes(16), None],  # payload not bytes
        [8, CONV.bytes, 0, 0, "M", b"x", bytes(16), None],  # payloads not an array
        [8, CONV.bytes, 0, 2**63 - 1, "M", [b"x", b"y"], bytes(16), None],  # seq beyond max
        [8, CONV.bytes, 0, 0, "M", [b"x"], bytes(15), None],  # short signature
        [8, CONV.bytes, 0, 0, "M", [b"x"], bytes(16)],  # a field short
        [1, 1, A_ID, A_CERT, bytes(31)],  # short nonce
        [6, "1001", "text"],
        [7, "x" * 5000],
    ],
)
def test_malformed_frames_raise_remote_protocol_error(obj: object) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        decode_link_frame(obj)
    assert caught.value.code is ErrorCode.MALFORMED_FRAME


msgpack_values = wire_values(text=20, items=6, keys=5, leaves=20, nan=False)


@settings(max_examples=300)
@given(kind=st.integers(0, 8), fields=st.lists(msgpack_values, max_size=13))
def test_decode_of_random_structures_only_raises_protocol_errors(
    kind: int, fields: list[object]
) -> None:
    try:
        frame = decode_link_frame([kind, *fields])
    except RemoteProtocolError:
        return
    assert encode_link_frame(frame)  # whatever decodes also encodes


@settings(max_examples=300)
@given(data=st.binary(max_size=200))
def test_random_bytes_into_an_acceptor_only_raise_protocol_errors(data: bytes) -> None:
    conn = link(Role.ACCEPTOR, me="b")
    conn.receive_data(data)
    try:
        while conn.next_event() is not NEED_DATA:
            pass
    except ProtocolError:
        assert conn.state is LinkState.CLOSED
        assert conn.data_to_send()  # the error frame for the peer


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frame_index=st.integers(0, len(SAMPLE_FRAMES) - 1),
    cuts=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    truncate=st.integers(0, 10_000),
    eof=st.booleans(),
)
def test_mutated_frames_into_an_established_link_only_raise_protocol_errors(
    frame_index: int, cuts: list[tuple[int, int]], truncate: int, eof: bool
) -> None:
    _, b = ESTABLISHED_FOR_FUZZ()
    data = bytearray(encode_link_frame(SAMPLE_FRAMES[frame_index]))
    for position, value in cuts:
        data[position % len(data)] = value
    del data[truncate % (len(data) + 1) :]
    b.receive_data(bytes(data))
    if eof:
        b.receive_data(b"")
    try:
        while b.next_event() is not NEED_DATA:
            pass
    except ProtocolError:
        assert b.state is LinkState.CLOSED


def ESTABLISHED_FOR_FUZZ() -> tuple[LinkConnection, LinkConnection]:
    """A fresh established pair without the RSA handshake cost (state forced)."""
    a = link(Role.INITIATOR, me="a")
    b = link(Role.ACCEPTOR, me="b")
    a._state = LinkState.ESTABLISHED
    b._state = LinkState.ESTABLISHED
    return a, b


# =========================================================================== handshake


def test_handshake_completes_and_traffic_flows() -> None:
    a, b = established()
    assert a.peer_broker_id == B_ID and b.peer_broker_id == A_ID
    frame = SAMPLE_FRAMES[4]
    assert isinstance(frame, FragmentFrame)
    b.receive_data(a.send(frame))
    assert b.next_event() == frame
    assert b.next_event() is NEED_DATA
    ack = SAMPLE_FRAMES[6]
    assert isinstance(ack, AckFrame)
    a.receive_data(b.send(ack))
    assert a.next_event() == ack
    assert a.counters.fragments_out == 1 and b.counters.fragments_in == 1
    assert b.counters.acks_out == 1 and a.counters.acks_in == 1
    assert a.counters.bytes_out == b.counters.bytes_in
    assert b.counters.bytes_out == a.counters.bytes_in
    b.record_corrupt_fragment()
    assert b.counters.corrupt_fragments == 1


def test_handshake_one_byte_at_a_time() -> None:
    established(byte_at_a_time=True)


def test_acceptor_refuses_untrusted_initiator() -> None:
    a = link(Role.INITIATOR, me="a")
    b = link(Role.ACCEPTOR, me="b", trusted=[])
    b.receive_data(a.data_to_send())
    with pytest.raises(RemoteProtocolError) as caught:
        b.next_event()
    assert caught.value.code is ErrorCode.HANDSHAKE_FAILED
    assert b.state is LinkState.CLOSED
    assert b.error is caught.value
    events = pump(b, a)
    assert len(events) == 1 and isinstance(events[0], ProtocolErrorFrame)
    assert events[0].code == ErrorCode.HANDSHAKE_FAILED
    assert a.state is LinkState.CLOSED
    assert b.next_event() is NEED_DATA  # closed: nothing more


def test_initiator_refuses_untrusted_acceptor() -> None:
    a = link(Role.INITIATOR, me="a", trusted=[M_CERT])
    b = link(Role.ACCEPTOR, me="b")
    pump(a, b)
    b_bytes = b.data_to_send()
    a.receive_data(b_bytes)
    with pytest.raises(RemoteProtocolError, match="not trusted"):
        a.next_event()
    assert a.state is LinkState.CLOSED


def test_initiator_checks_expected_peer_id() -> None:
    a = link(Role.INITIATOR, me="a", expected_peer_id=uuid.uuid4())
    b = link(Role.ACCEPTOR, me="b")
    pump(a, b)
    a.receive_data(b.data_to_send())
    with pytest.raises(RemoteProtocolError, match="expected broker"):
        a.next_event()


def test_impostor_with_stolen_certificate_fails_the_proof() -> None:
    """Mallory presents B's (trusted) certificate but only has her own key."""
    a = link(Role.ACCEPTOR, me="a")
    hello = Hello(PROTOCOL_VERSION, B_ID, B_CERT, bytes(32))
    a.receive_data(encode_link_frame(hello))
    assert a.next_event() is NEED_DATA
    accept = decode_link_frame(unpack(a.data_to_send()[4:]))
    assert isinstance(accept, HelloAccept)
    forged = sign_handshake_proof(M_KEY, signer_id=B_ID, peer_id=A_ID, peer_nonce=accept.nonce)
    a.receive_data(encode_link_frame(Proof(forged)))
    with pytest.raises(RemoteProtocolError, match="does not verify"):
        a.next_event()
    assert a.state is LinkState.CLOSED


def test_replayed_proof_for_another_nonce_fails() -> None:
    a = link(Role.ACCEPTOR, me="a")
    a.receive_data(encode_link_frame(Hello(PROTOCOL_VERSION, B_ID, B_CERT, bytes(32))))
    a.next_event()
    stale = sign_handshake_proof(B_KEY, signer_id=B_ID, peer_id=A_ID, peer_nonce=bytes(32))
    a.receive_data(encode_link_frame(Proof(stale)))
    with pytest.raises(RemoteProtocolError):
        a.next_event()


@pytest.mark.parametrize(
    ("hello", "message"),
    [
        (Hello(MIN_PROTOCOL_VERSION - 1, B_ID, B_CERT, bytes(32)), "version"),
        (Hello(PROTOCOL_VERSION, A_ID, A_CERT, bytes(32)), "our own"),
        (Hello(PROTOCOL_VERSION, uuid.uuid4(), B_CERT, bytes(32)), "does not belong"),
        (Hello(PROTOCOL_VERSION, B_ID, b"garbage", bytes(32)), "malformed certificate"),
    ],
)
def test_bad_hellos_fail_the_handshake(hello: Hello, message: str) -> None:
    a = link(Role.ACCEPTOR, me="a", trusted=[B_CERT, A_CERT])
    a.receive_data(encode_link_frame(hello))
    with pytest.raises(RemoteProtocolError, match=message) as caught:
        a.next_event()
    assert caught.value.code is ErrorCode.HANDSHAKE_FAILED


def test_fragment_before_handshake_is_unexpected() -> None:
    b = link(Role.ACCEPTOR, me="b")
    b.receive_data(encode_link_frame(SAMPLE_FRAMES[3]))
    with pytest.raises(RemoteProtocolError) as caught:
        b.next_event()
    assert caught.value.code is ErrorCode.UNEXPECTED_FRAME
    assert b.state is LinkState.CLOSED
    error = decode_link_frame(unpack(b.data_to_send()[4:]))
    assert isinstance(error, ProtocolErrorFrame) and error.code == ErrorCode.UNEXPECTED_FRAME


def test_second_hello_after_establishment_is_unexpected() -> None:
    _, b = established()
    b.receive_data(encode_link_frame(Hello(PROTOCOL_VERSION, A_ID, A_CERT, bytes(32))))
    with pytest.raises(RemoteProtocolError) as caught:
        b.next_event()
    assert caught.value.code is ErrorCode.UNEXPECTED_FRAME


def test_local_misuse_raises_local_protocol_error() -> None:
    a = link(Role.INITIATOR, me="a")
    with pytest.raises(LocalProtocolError):
        a.send(SAMPLE_FRAMES[3])  # type: ignore[arg-type]  # not yet established
    assert a.state is LinkState.CLOSED
    a, _ = established()
    with pytest.raises(LocalProtocolError):
        a.send(SAMPLE_FRAMES[0])  # type: ignore[arg-type]  # handshake frames are internal


def test_close_and_error_frames_end_the_connection() -> None:
    a, b = established()
    b.receive_data(a.send(CloseFrame("idle")))
    assert b.next_event() == CloseFrame("idle")
    assert a.state is LinkState.CLOSED and b.state is LinkState.CLOSED
    with pytest.raises(LocalProtocolError):
        a.send(CloseFrame())
    a, b = established()
    b.receive_data(a.send(ProtocolErrorFrame(1006, "integrity")))
    assert b.next_event() == ProtocolErrorFrame(1006, "integrity")
    assert b.state is LinkState.CLOSED
    b.receive_data(b"ignored after close")
    assert b.next_event() is NEED_DATA


def test_end_of_stream() -> None:
    a, b = established()
    data = a.send(SAMPLE_FRAMES[3])  # type: ignore[arg-type]
    b.receive_data(data[:-1])
    b.receive_data(b"")
    assert b.next_event() == ConnectionClosed(mid_frame=True)
    assert b.state is LinkState.CLOSED
    a2 = link(Role.ACCEPTOR, me="a")
    a2.receive_data(b"")
    assert a2.next_event() == ConnectionClosed(mid_frame=False)


def test_oversized_frame_is_rejected_before_buffering() -> None:
    _, b = ESTABLISHED_FOR_FUZZ()
    b.receive_data((10**9).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError) as caught:
        b.next_event()
    assert caught.value.code is ErrorCode.FRAME_TOO_LARGE


def test_non_array_frame_is_malformed() -> None:
    _, b = ESTABLISHED_FOR_FUZZ()
    b.receive_data(encode_frame({"kind": 4}))
    with pytest.raises(RemoteProtocolError):
        b.next_event()


# =========================================================================== state table


@pytest.mark.parametrize("state", list(LinkState))
@pytest.mark.parametrize("event", list(LinkInput))
def test_every_state_and_input(state: LinkState, event: LinkInput) -> None:
    conn = link(Role.ACCEPTOR, me="a")
    conn._state = state
    expected = _TRANSITIONS.get((state, event))
    if expected is not None:
        conn._transition(event)
        assert conn.state is expected
        return
    error = RemoteProtocolError if event.name.startswith("RECV") else LocalProtocolError
    with pytest.raises(error) as caught:
        conn._transition(event)
    assert type(caught.value) is error
    assert caught.value.code is ErrorCode.UNEXPECTED_FRAME
    assert conn.state is LinkState.CLOSED


def test_transition_table_shape() -> None:
    assert (LinkState.CLOSED, LinkInput.SEND_FRAGMENT) not in _TRANSITIONS
    assert (LinkState.AWAITING_PROOF, LinkInput.RECV_FRAGMENT) not in _TRANSITIONS
    open_states = [s for s in LinkState if s is not LinkState.CLOSED]
    for state in open_states:
        for event in (
            LinkInput.RECV_CLOSE,
            LinkInput.RECV_ERROR,
            LinkInput.SEND_CLOSE,
            LinkInput.SEND_ERROR,
        ):
            assert _TRANSITIONS[(state, event)] is LinkState.CLOSED


# =========================================================================== import rule


FORBIDDEN = {"asyncio", "socket", "threading", "time", "select"}


def test_protocol_package_imports_no_io_or_clock_modules() -> None:
    package = pathlib.Path(__file__).resolve().parents[2] / "protocol"
    modules = sorted(package.glob("*.py"))
    assert {m.name for m in modules} >= {"_dialog.py", "_integrity.py", "_link.py", "_framing.py"}
    offenders = []
    for module in modules:
        tree = ast.parse(module.read_text(), filename=str(module))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
                names = [
                    arg.value
                    for arg in node.args[:1]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                ]
            offenders += [
                f"{module.name}: {name}" for name in names if name.split(".")[0] in FORBIDDEN
            ]
    assert offenders == []


def _paths(obj: object, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every position in a decoded frame: each element of each array, at any depth."""
    if type(obj) is not list:
        return [path]
    found = [path] if path else []
    for index, item in enumerate(obj):
        found += _paths(item, (*path, index))
    return found


def _packed_with(obj: object, path: tuple[int, ...], raw: bytes) -> bytes:
    """msgpack of `obj` with the element at `path` replaced by the encoded `raw`."""
    if not path:
        return raw
    assert type(obj) is list
    parts = [
        _packed_with(item, path[1:], raw) if index == path[0] else pack(item)
        for index, item in enumerate(obj)
    ]
    return b"\xdc" + len(obj).to_bytes(2, "big") + b"".join(parts)


@pytest.mark.parametrize("depth", [1000, 2000])
def test_deeply_nested_values_anywhere_in_a_frame_are_malformed(depth: int) -> None:
    # the link does not walk frames for nesting: each decoder's type checks must refuse a
    # deep value wherever it sits, without recursing into it (msgpack stops near 1024)
    deep = b"\x91" * depth + b"\xc0"
    cases = 0
    for frame in SAMPLE_FRAMES:
        wire = unpack(pack(frame.encode()))
        for path in _paths(wire):
            payload = _packed_with(wire, path, deep)
            _, b = established()
            b.receive_data(len(payload).to_bytes(4, "big") + payload)
            with pytest.raises(RemoteProtocolError) as caught:
                while b.next_event() is not NEED_DATA:
                    pass
            assert caught.value.code is ErrorCode.MALFORMED_FRAME
            assert b.state is LinkState.CLOSED
            cases += 1
    assert cases > 60
