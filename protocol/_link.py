"""Adjacent broker protocol: the frames two brokers exchange over one TCP connection.

Theory of operation
-------------------
One TCP connection joins a pair of adjacent brokers. Every frame is a `_framing` frame (a
4-byte length and one msgpack array) whose first element is a `FrameKind`. Frames are
frozen dataclasses; each has `encode()` (to the wire array) and `decode()` (from it) next to
it, and `decode_link_frame` dispatches on the kind.

Handshake (the transition table `_TRANSITIONS` is the documentation)::

    initiator                                   acceptor
    Hello(version, id, certificate, nonce_i) ->
                                             <- HelloAccept(version, id, certificate,
                                                            nonce_a, proof over nonce_i)
    Proof(proof over nonce_a)                ->
    ESTABLISHED                                 ESTABLISHED (after checking the proof)

A proof is the sender's RSA signature over both broker ids and the *receiver's* nonce; the
receiver accepts it only with a certificate from its trust store that names the announced
broker id. The connection produces and consumes handshake frames itself: the shell writes
`data_to_send()` after every `receive_data`/`next_event` round and never builds them.

After the handshake both sides exchange `FragmentFrame`s, `BundleFrame`s (several whole
messages of one dialog direction in one frame) and standalone `AckFrame`s (the
dialog layer gives them meaning; they carry the conversation id as 16 raw bytes, not as
the msgpack UUID extension, and decoding interns it) until either sends `CloseFrame` or `ProtocolErrorFrame`, or
the byte stream ends. Any frame that the table does not allow in the current state, or any
malformed frame, raises `RemoteProtocolError`, moves the connection to CLOSED and queues a
`ProtocolErrorFrame` in `data_to_send()` so the peer learns why. Decoding never raises
anything but `ProtocolError` subclasses.

Invariants: no I/O, no clock; sizes are bounded by the `Final` limits below; counters on the
connection feed the connections view.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from enum import Enum, IntEnum
from typing import Any, Final, cast

from cryptography.hazmat.primitives.asymmetric import rsa

from ._errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from ._framing import NEED_DATA, FrameDecoder, _NeedData, encode_frame, pack
from ._integrity import (
    MAX_CERTIFICATE_SIZE,
    MAX_PROOF_SIZE,
    MAX_WRAPPED_KEY_SIZE,
    NONCE_SIZE,
    SIGNATURE_SIZE,
    RandomSource,
    TrustStore,
    certificate_broker_id,
    load_certificate,
    new_nonce,
    sign_handshake_proof,
    verify_handshake_proof,
)

PROTOCOL_VERSION: Final = 2  # 2: bundles (several whole messages in one frame)
MAX_FRAGMENT_SIZE: Final = 1024 * 1024
MAX_FRAGMENT_COUNT: Final = 1 << 24
MAX_SEQ: Final = (1 << 63) - 1
MAX_NAME_LENGTH: Final = 512
MAX_ACK_RANGES: Final = 1024
MAX_ERROR_TEXT: Final = 4096
MAX_BUNDLE_MESSAGES: Final = 256  # messages one bundle carries at most
# Largest encoded frame: one full fragment plus a generous allowance for its header.
MAX_LINK_FRAME_SIZE: Final = MAX_FRAGMENT_SIZE + 64 * 1024


class FrameKind(IntEnum):
    """First element of every link frame."""

    HELLO = 1
    HELLO_ACCEPT = 2
    PROOF = 3
    FRAGMENT = 4
    ACK = 5
    ERROR = 6
    CLOSE = 7
    BUNDLE = 8


class Direction(IntEnum):
    """Which endpoint of a dialog sent a message: each direction is sequenced alone."""

    FROM_INITIATOR = 0
    FROM_TARGET = 1

    @property
    def reverse(self) -> Direction:
        """The other direction of the same dialog (the one its acks ride on)."""
        return (
            Direction.FROM_TARGET if self is Direction.FROM_INITIATOR else Direction.FROM_INITIATOR
        )


# --------------------------------------------------------------------------- field checks


_DIRECTIONS: Final = (Direction.FROM_INITIATOR, Direction.FROM_TARGET)
_FRAGMENT: Final = int(FrameKind.FRAGMENT)
_ACK: Final = int(FrameKind.ACK)
_HEADER_FIELDS: Final = 10
_FRAGMENT_HEADER_TAG: Final = bytes([0x90 | _HEADER_FIELDS])  # msgpack fixarray of 10
_BUNDLE: Final = int(FrameKind.BUNDLE)
_BUNDLE_HEADER_TAG: Final = bytes([0x90 | 6])  # kind, id, direction, seq, type, sizes, ack


def _malformed(what: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed link frame: {what}", ErrorCode.MALFORMED_FRAME)


def _int(value: object, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _malformed(f"{what} must be an integer in {low}..{high}")
    return value


def _bytes(value: object, what: str, max_size: int, exact: int | None = None) -> bytes:
    if type(value) is not bytes or len(value) > max_size:
        raise _malformed(f"{what} must be at most {max_size} bytes")
    if exact is not None and len(value) != exact:
        raise _malformed(f"{what} must be exactly {exact} bytes")
    return value


def _str(value: object, what: str, max_length: int = MAX_NAME_LENGTH) -> str:
    if type(value) is not str or len(value) > max_length:
        raise _malformed(f"{what} must be a string of at most {max_length} characters")
    return value


def _uuid(value: object, what: str) -> uuid.UUID:
    if not isinstance(value, uuid.UUID):
        raise _malformed(f"{what} must be a UUID")
    return value


# Conversation ids travel in fragments and acks as 16 raw bytes (no msgpack extension
# round trip). Decoded ids are interned: a connection sees the same few dialogs over and
# over, and one UUID object per id makes later comparisons identity checks.
MAX_INTERNED_IDS: Final = 4096
_interned_ids: dict[bytes, uuid.UUID] = {}


def _raw_uuid(value: object, what: str) -> uuid.UUID:
    if type(value) is not bytes or len(value) != 16:
        raise _malformed(f"{what} must be 16 bytes")
    known = _interned_ids.get(value)
    if known is None:
        if len(_interned_ids) >= MAX_INTERNED_IDS:
            _interned_ids.clear()
        known = _interned_ids[value] = uuid.UUID(bytes=value)
    return known


def _list(value: object, what: str, length: int | None = None, max_length: int = 64) -> list[Any]:
    if type(value) is not list or len(value) > max_length:
        raise _malformed(f"{what} must be an array")
    if length is not None and len(value) != length:
        raise _malformed(f"{what} must have {length} elements")
    return value


def _fields(obj: list[Any], kind: FrameKind, count: int) -> list[Any]:
    if len(obj) != count + 1:
        raise _malformed(f"{kind.name} frame must have {count} fields, got {len(obj) - 1}")
    return obj


# --------------------------------------------------------------------------- dialog headers


@dataclass(frozen=True, slots=True)
class Envelope:
    """Routing header of one dialog direction; lets the receiver create its endpoint.

    Named from the point of view of the message's travel: `from_*` is the sending side.
    `encrypted`: the direction's bodies are encrypted with its session key.
    `origin_proof`: the sending broker's signature over `origin_transcript` (see
    `_integrity.sign_origin`); a receiver needs it when the direction reaches it through a
    forwarding broker. Wire form: five elements; a sixth (`encrypted`) when encrypted or
    proved; a seventh (the proof) when proved, so older forms still decode.
    """

    from_service: str
    to_service: str
    contract: str
    from_broker_id: uuid.UUID
    to_broker_id: uuid.UUID
    encrypted: bool = False
    origin_proof: bytes | None = None

    def encode(self) -> list[object]:
        """Wire form."""
        wire: list[object] = [
            self.from_service,
            self.to_service,
            self.contract,
            self.from_broker_id,
            self.to_broker_id,
        ]
        if self.encrypted or self.origin_proof is not None:
            wire.append(self.encrypted)
        if self.origin_proof is not None:
            wire.append(self.origin_proof)
        return wire

    @classmethod
    def decode(cls, obj: object) -> Envelope:
        """Raises: RemoteProtocolError: malformed."""
        items = _list(obj, "envelope", max_length=7)
        if len(items) == 6 and items[5] is not True:
            raise _malformed("a 6-element envelope must end with true")
        if len(items) == 7 and type(items[5]) is not bool:
            raise _malformed("a 7-element envelope must have a boolean sixth element")
        if len(items) not in (5, 6, 7):
            raise _malformed("envelope must have 5, 6 or 7 elements")
        return cls(
            _str(items[0], "from service"),
            _str(items[1], "to service"),
            _str(items[2], "contract"),
            _uuid(items[3], "from broker id"),
            _uuid(items[4], "to broker id"),
            len(items) > 5 and items[5] is True,
            _bytes(items[6], "origin proof", MAX_PROOF_SIZE) if len(items) == 7 else None,
        )

    def origin_transcript(
        self, conversation_id: uuid.UUID, direction: Direction, wrapped_session_key: bytes
    ) -> bytes:
        """What the origin proof signs: the direction, this header without the proof,
        and the wrapped session key."""
        unproved = [*self.encode()[:5], self.encrypted]
        return pack([conversation_id.bytes, int(direction), unproved, wrapped_session_key])


@dataclass(frozen=True, slots=True)
class AckRecord:
    """What a receiver confirms for one dialog direction.

    `below`: every message with a smaller sequence number is durably stored and delivered.
    `ranges`: (seq, fragment_count, first, end) — fragments first..end-1 of message `seq`,
    split into `fragment_count` fragments, are durably stored. The count names the layout:
    a sender ignores a range whose count differs from its own (a layout from before a
    restart with another fragment size).
    """

    below: int
    ranges: tuple[tuple[int, int, int, int], ...] = ()

    def encode(self) -> list[object]:
        """Wire form."""
        return [self.below, [list(r) for r in self.ranges]]

    @classmethod
    def decode(cls, obj: object) -> AckRecord:
        """Raises: RemoteProtocolError: malformed."""
        items = _list(obj, "ack", 2)
        below = _int(items[0], "ack below", 0, MAX_SEQ)
        raw = _list(items[1], "ack ranges", max_length=MAX_ACK_RANGES)
        ranges: list[tuple[int, int, int, int]] = []
        for entry in raw:
            seq, count, first, end = _list(entry, "ack range", 4)
            count = _int(count, "ack range fragment count", 1, MAX_FRAGMENT_COUNT)
            first = _int(first, "ack range first", 0, count - 1)
            end = _int(end, "ack range end", first + 1, count)
            ranges.append((_int(seq, "ack range seq", 0, MAX_SEQ), count, first, end))
        return cls(below, tuple(ranges))


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class Hello:
    """First frame of the initiator: who it is and a fresh nonce to sign."""

    version: int
    broker_id: uuid.UUID
    certificate_pem: bytes
    nonce: bytes

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.HELLO, self.version, self.broker_id, self.certificate_pem, self.nonce]

    @classmethod
    def decode(cls, obj: list[Any]) -> Hello:
        """Raises: RemoteProtocolError: malformed."""
        f = _fields(obj, FrameKind.HELLO, 4)
        return cls(
            _int(f[1], "version", 0, 0xFFFF),
            _uuid(f[2], "broker id"),
            _bytes(f[3], "certificate", MAX_CERTIFICATE_SIZE),
            _bytes(f[4], "nonce", NONCE_SIZE, NONCE_SIZE),
        )


@dataclass(frozen=True, slots=True)
class HelloAccept:
    """The acceptor's answer: who it is, its nonce, and its proof over the initiator's nonce."""

    version: int
    broker_id: uuid.UUID
    certificate_pem: bytes
    nonce: bytes
    proof: bytes

    def encode(self) -> list[object]:
        """Wire form."""
        return [
            FrameKind.HELLO_ACCEPT,
            self.version,
            self.broker_id,
            self.certificate_pem,
            self.nonce,
            self.proof,
        ]

    @classmethod
    def decode(cls, obj: list[Any]) -> HelloAccept:
        """Raises: RemoteProtocolError: malformed."""
        f = _fields(obj, FrameKind.HELLO_ACCEPT, 5)
        return cls(
            _int(f[1], "version", 0, 0xFFFF),
            _uuid(f[2], "broker id"),
            _bytes(f[3], "certificate", MAX_CERTIFICATE_SIZE),
            _bytes(f[4], "nonce", NONCE_SIZE, NONCE_SIZE),
            _bytes(f[5], "proof", MAX_PROOF_SIZE),
        )


@dataclass(frozen=True, slots=True)
class Proof:
    """The initiator's proof over the acceptor's nonce; completes the handshake."""

    proof: bytes

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.PROOF, self.proof]

    @classmethod
    def decode(cls, obj: list[Any]) -> Proof:
        """Raises: RemoteProtocolError: malformed."""
        f = _fields(obj, FrameKind.PROOF, 1)
        return cls(_bytes(f[1], "proof", MAX_PROOF_SIZE))


@dataclass(frozen=True, slots=True)
class FragmentFrame:
    """One fragment of one sequenced dialog message, possibly carrying an ack.

    `signature` seals `signed_header()` + `payload` with the direction's session key.
    `envelope` and `wrapped_session_key` ride on fragments until the direction's first ack.
    `ack` confirms the *reverse* direction of the same conversation.
    """

    conversation_id: uuid.UUID
    direction: Direction
    seq: int
    fragment_index: int
    fragment_count: int
    message_type: str
    payload: bytes
    signature: bytes
    envelope: Envelope | None = None
    wrapped_session_key: bytes | None = None
    ack: AckRecord | None = None

    def signed_header(self) -> bytes:
        """Every field but payload and signature, canonically encoded, for signing."""
        return self.header_for(
            self.conversation_id,
            self.direction,
            self.seq,
            self.fragment_index,
            self.fragment_count,
            self.message_type,
            self.envelope,
            self.wrapped_session_key,
            self.ack,
        )

    @staticmethod
    def header_for(
        conversation_id: uuid.UUID,
        direction: Direction,
        seq: int,
        fragment_index: int,
        fragment_count: int,
        message_type: str,
        envelope: Envelope | None,
        wrapped_session_key: bytes | None,
        ack: AckRecord | None,
    ) -> bytes:
        """`signed_header()` of a fragment with these fields, without building it."""
        return FragmentFrame.header_prefix(conversation_id, direction) + FragmentFrame.header_rest(
            seq,
            fragment_index,
            fragment_count,
            message_type,
            envelope,
            wrapped_session_key,
            ack,
        )

    @staticmethod
    def header_prefix(conversation_id: uuid.UUID, direction: Direction) -> bytes:
        """The part of `header_for` fixed by the dialog direction; senders and receivers
        compute it once and append `header_rest` per fragment."""
        # The signed header is one msgpack array of _HEADER_FIELDS elements: its array
        # tag, the kind tag (keeps fragment and ack signatures apart), the id as raw bytes
        # and the direction. `header_rest` packs the remaining fields as an array of
        # their own and drops that array's one-byte tag, so prefix + rest is exactly
        # pack([kind, id, direction, *rest]).
        return (
            _FRAGMENT_HEADER_TAG
            + pack(int(FrameKind.FRAGMENT))
            + pack(conversation_id.bytes)
            + pack(int(direction))
        )

    @staticmethod
    def header_rest(
        seq: int,
        fragment_index: int,
        fragment_count: int,
        message_type: str,
        envelope: Envelope | None,
        wrapped_session_key: bytes | None,
        ack: AckRecord | None,
    ) -> bytes:
        """The per-fragment part of `header_for` (see `header_prefix`)."""
        return pack(
            [
                seq,
                fragment_index,
                fragment_count,
                message_type,
                None if envelope is None else envelope.encode(),
                wrapped_session_key,
                None if ack is None else ack.encode(),
            ]
        )[1:]

    def encode(self) -> list[object]:
        """Wire form (the conversation id as 16 raw bytes)."""
        return [
            _FRAGMENT,
            self.conversation_id.bytes,
            int(self.direction),
            self.seq,
            self.fragment_index,
            self.fragment_count,
            self.message_type,
            self.payload,
            self.signature,
            None if self.envelope is None else self.envelope.encode(),
            self.wrapped_session_key,
            None if self.ack is None else self.ack.encode(),
        ]

    @classmethod
    def decode(cls, obj: list[Any]) -> FragmentFrame:
        """Raises: RemoteProtocolError: malformed."""
        if len(obj) == 12:
            # The steady-state frame (no envelope, no key) checked inline: same rules as
            # the field helpers below, which name the fault when any check fails.
            _, raw_id, direction, seq, index, count, message_type, payload, signature = obj[:9]
            if (
                type(raw_id) is bytes
                and len(raw_id) == 16
                and type(direction) is int
                and 0 <= direction <= 1
                and type(seq) is int
                and 0 <= seq <= MAX_SEQ
                and type(count) is int
                and 1 <= count <= MAX_FRAGMENT_COUNT
                and type(index) is int
                and 0 <= index < count
                and type(message_type) is str
                and len(message_type) <= MAX_NAME_LENGTH
                and type(payload) is bytes
                and len(payload) <= MAX_FRAGMENT_SIZE
                and type(signature) is bytes
                and len(signature) == SIGNATURE_SIZE
                and obj[9] is None
                and obj[10] is None
            ):
                ack = obj[11]
                return new_fragment_frame(
                    _raw_uuid(raw_id, "conversation id"),
                    _DIRECTIONS[direction],
                    seq,
                    index,
                    count,
                    message_type,
                    payload,
                    signature,
                    None,
                    None,
                    None if ack is None else AckRecord.decode(ack),
                )
        f = _fields(obj, FrameKind.FRAGMENT, 11)
        count = _int(f[5], "fragment count", 1, MAX_FRAGMENT_COUNT)
        return cls(
            conversation_id=_raw_uuid(f[1], "conversation id"),
            direction=_DIRECTIONS[_int(f[2], "direction", 0, 1)],
            seq=_int(f[3], "sequence number", 0, MAX_SEQ),
            fragment_index=_int(f[4], "fragment index", 0, count - 1),
            fragment_count=count,
            message_type=_str(f[6], "message type"),
            payload=_bytes(f[7], "payload", MAX_FRAGMENT_SIZE),
            signature=_bytes(f[8], "signature", SIGNATURE_SIZE, SIGNATURE_SIZE),
            envelope=None if f[9] is None else Envelope.decode(f[9]),
            wrapped_session_key=(
                None
                if f[10] is None
                else _bytes(f[10], "wrapped session key", MAX_WRAPPED_KEY_SIZE)
            ),
            ack=None if f[11] is None else AckRecord.decode(f[11]),
        )


# Building a FragmentFrame through its frozen dataclass __init__ costs one
# object.__setattr__ call per field; the hot paths (decoding, and the dialog layer
# building fragments) set the slots through their member descriptors instead, which is
# about twice as fast. The instance is the same (still frozen to everyone else); a test
# checks the result equals FragmentFrame(...) field for field.
_new_object: Final = object.__new__
_set_fragment_fields: Final = tuple(
    FragmentFrame.__dict__[field.name].__set__ for field in fields(FragmentFrame)
)
(
    _set_conversation_id,
    _set_direction,
    _set_seq,
    _set_fragment_index,
    _set_fragment_count,
    _set_message_type,
    _set_payload,
    _set_signature,
    _set_envelope,
    _set_wrapped_session_key,
    _set_ack,
) = _set_fragment_fields


def new_fragment_frame(
    conversation_id: uuid.UUID,
    direction: Direction,
    seq: int,
    fragment_index: int,
    fragment_count: int,
    message_type: str,
    payload: bytes,
    signature: bytes,
    envelope: Envelope | None,
    wrapped_session_key: bytes | None,
    ack: AckRecord | None,
) -> FragmentFrame:
    """`FragmentFrame(...)` with every field given, built without the dataclass __init__."""
    frame: FragmentFrame = _new_object(FragmentFrame)
    _set_conversation_id(frame, conversation_id)
    _set_direction(frame, direction)
    _set_seq(frame, seq)
    _set_fragment_index(frame, fragment_index)
    _set_fragment_count(frame, fragment_count)
    _set_message_type(frame, message_type)
    _set_payload(frame, payload)
    _set_signature(frame, signature)
    _set_envelope(frame, envelope)
    _set_wrapped_session_key(frame, wrapped_session_key)
    _set_ack(frame, ack)
    return frame


@dataclass(frozen=True, slots=True)
class BundleFrame:
    """Several whole messages of one dialog direction in one frame: `payloads[i]` is the
    body of message `seq + i`, each of one fragment, all of type `message_type`.

    Only a confirmed direction is bundled (no envelope, no wrapped key), and only between
    adjacent brokers that both speak protocol version 2. `signature` seals the header
    (`header_prefix` + `header_rest`: every field but payloads and signature, each
    payload's size instead) followed by every payload in order, so the boundaries are
    sealed too. `ack` confirms the reverse direction, as on a fragment.
    Everything else about the messages (acks, retransmissions, which go as fragments) is
    as if each had come in a fragment of its own.
    """

    conversation_id: uuid.UUID
    direction: Direction
    seq: int
    message_type: str
    payloads: tuple[bytes, ...]
    signature: bytes
    ack: AckRecord | None = None

    @property
    def envelope(self) -> None:
        """A bundle never carries the envelope (see the class's comment)."""
        return None

    @staticmethod
    def header_prefix(conversation_id: uuid.UUID, direction: Direction) -> bytes:
        """The part of the signed header fixed by the dialog direction (as for fragments:
        prefix + rest is exactly pack([kind, id, direction, seq, type, sizes, ack]))."""
        return (
            _BUNDLE_HEADER_TAG + pack(_BUNDLE) + pack(conversation_id.bytes) + pack(int(direction))
        )

    @staticmethod
    def header_rest(
        seq: int, message_type: str, payloads: Sequence[bytes], ack: AckRecord | None
    ) -> bytes:
        """The per-bundle part of the signed header."""
        return pack(
            [
                seq,
                message_type,
                [len(payload) for payload in payloads],
                None if ack is None else ack.encode(),
            ]
        )[1:]

    def encode(self) -> list[object]:
        """Wire form (the conversation id as 16 raw bytes)."""
        return [
            _BUNDLE,
            self.conversation_id.bytes,
            int(self.direction),
            self.seq,
            self.message_type,
            list(self.payloads),
            self.signature,
            None if self.ack is None else self.ack.encode(),
        ]

    @classmethod
    def decode(cls, obj: list[Any]) -> BundleFrame:
        """Raises: RemoteProtocolError: malformed."""
        f = _fields(obj, FrameKind.BUNDLE, 7)
        payloads = _list(f[5], "bundle payloads", max_length=MAX_BUNDLE_MESSAGES)
        if not payloads or any(
            type(payload) is not bytes or len(payload) > MAX_FRAGMENT_SIZE for payload in payloads
        ):
            raise _malformed(
                f"bundle payloads must be 1..{MAX_BUNDLE_MESSAGES} byte strings of at most"
                f" {MAX_FRAGMENT_SIZE} bytes"
            )
        return cls(
            _raw_uuid(f[1], "conversation id"),
            _DIRECTIONS[_int(f[2], "direction", 0, 1)],
            _int(f[3], "sequence number", 0, MAX_SEQ - len(payloads) + 1),
            _str(f[4], "message type"),
            tuple(payloads),
            _bytes(f[6], "signature", SIGNATURE_SIZE, SIGNATURE_SIZE),
            None if f[7] is None else AckRecord.decode(f[7]),
        )


@dataclass(frozen=True, slots=True)
class AckFrame:
    """A standalone ack for one dialog direction, sealed with that direction's session key."""

    conversation_id: uuid.UUID
    direction: Direction
    ack: AckRecord
    signature: bytes

    def signed_header(self) -> bytes:
        """Every field but the signature, canonically encoded, for signing."""
        return pack(
            [int(FrameKind.ACK), self.conversation_id.bytes, int(self.direction), self.ack.encode()]
        )

    def encode(self) -> list[object]:
        """Wire form (the conversation id as 16 raw bytes)."""
        return [
            _ACK,
            self.conversation_id.bytes,
            int(self.direction),
            self.ack.encode(),
            self.signature,
        ]

    @classmethod
    def decode(cls, obj: list[Any]) -> AckFrame:
        """Raises: RemoteProtocolError: malformed."""
        f = _fields(obj, FrameKind.ACK, 4)
        return cls(
            _raw_uuid(f[1], "conversation id"),
            _DIRECTIONS[_int(f[2], "direction", 0, 1)],
            AckRecord.decode(f[3]),
            _bytes(f[4], "signature", SIGNATURE_SIZE, SIGNATURE_SIZE),
        )


@dataclass(frozen=True, slots=True)
class ProtocolErrorFrame:
    """The sender found a protocol violation and is closing the connection."""

    code: int
    text: str

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.ERROR, self.code, self.text]

    @classmethod
    def decode(cls, obj: list[Any]) -> ProtocolErrorFrame:
        """Raises: RemoteProtocolError: malformed."""
        f = _fields(obj, FrameKind.ERROR, 2)
        return cls(
            _int(f[1], "error code", 0, 0xFFFFFFFF), _str(f[2], "error text", MAX_ERROR_TEXT)
        )


@dataclass(frozen=True, slots=True)
class CloseFrame:
    """An orderly close (idle timeout, shutdown); nothing follows it."""

    reason: str = ""

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.CLOSE, self.reason]

    @classmethod
    def decode(cls, obj: list[Any]) -> CloseFrame:
        """Raises: RemoteProtocolError: malformed."""
        f = _fields(obj, FrameKind.CLOSE, 1)
        return cls(_str(f[1], "close reason", MAX_ERROR_TEXT))


LinkFrame = (
    Hello
    | HelloAccept
    | Proof
    | FragmentFrame
    | BundleFrame
    | AckFrame
    | ProtocolErrorFrame
    | CloseFrame
)

_DECODERS: Final[dict[int, Any]] = {
    FrameKind.HELLO: Hello.decode,
    FrameKind.HELLO_ACCEPT: HelloAccept.decode,
    FrameKind.PROOF: Proof.decode,
    FrameKind.FRAGMENT: FragmentFrame.decode,
    FrameKind.BUNDLE: BundleFrame.decode,
    FrameKind.ACK: AckFrame.decode,
    FrameKind.ERROR: ProtocolErrorFrame.decode,
    FrameKind.CLOSE: CloseFrame.decode,
}


def encode_link_frame(frame: LinkFrame) -> bytes:
    """One length-prefixed frame on the wire."""
    return encode_frame(frame.encode())


def decode_link_frame(obj: object) -> LinkFrame:
    """Turn one decoded msgpack object into a frame.

    Raises: RemoteProtocolError (MALFORMED_FRAME): anything but a well-formed frame.
    """
    if type(obj) is not list or not obj:
        raise _malformed("a frame must be a non-empty array")
    kind = obj[0]
    decoder = _DECODERS.get(kind) if type(kind) is int else None
    if decoder is None:
        shown = repr(kind) if type(kind) is int else f"of type {type(kind).__name__}"
        raise _malformed(f"unknown frame kind {shown}")
    frame: LinkFrame = decoder(obj)
    return frame


# --------------------------------------------------------------------------- connection


class Role(Enum):
    """Which side opened the TCP connection."""

    INITIATOR = "initiator"
    ACCEPTOR = "acceptor"


class LinkState(Enum):
    """Handshake and lifetime of one connection."""

    AWAITING_HELLO = "awaiting hello"  # acceptor, before the initiator's Hello
    AWAITING_ACCEPT = "awaiting accept"  # initiator, Hello sent
    AWAITING_PROOF = "awaiting proof"  # acceptor, HelloAccept sent
    ESTABLISHED = "established"
    CLOSED = "closed"


class LinkInput(Enum):
    """Everything that can move a connection's state."""

    RECV_HELLO = "recv hello"
    RECV_HELLO_ACCEPT = "recv hello accept"
    RECV_PROOF = "recv proof"
    RECV_FRAGMENT = "recv fragment"
    RECV_ACK = "recv ack"
    RECV_ERROR = "recv error"
    RECV_CLOSE = "recv close"
    RECV_EOF = "recv eof"
    SEND_FRAGMENT = "send fragment"
    SEND_ACK = "send ack"
    SEND_ERROR = "send error"
    SEND_CLOSE = "send close"


_S = LinkState
_I = LinkInput
_TRANSITIONS: Final[dict[tuple[LinkState, LinkInput], LinkState]] = {
    (_S.AWAITING_HELLO, _I.RECV_HELLO): _S.AWAITING_PROOF,
    (_S.AWAITING_ACCEPT, _I.RECV_HELLO_ACCEPT): _S.ESTABLISHED,
    (_S.AWAITING_PROOF, _I.RECV_PROOF): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.RECV_FRAGMENT): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.RECV_ACK): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.SEND_FRAGMENT): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.SEND_ACK): _S.ESTABLISHED,
}
for _state in (_S.AWAITING_HELLO, _S.AWAITING_ACCEPT, _S.AWAITING_PROOF, _S.ESTABLISHED):
    for _input in (_I.RECV_ERROR, _I.RECV_CLOSE, _I.RECV_EOF, _I.SEND_ERROR, _I.SEND_CLOSE):
        _TRANSITIONS[(_state, _input)] = _S.CLOSED
_TRANSITIONS[(_S.CLOSED, _I.RECV_EOF)] = _S.CLOSED

_RECV_INPUT: Final[dict[type, LinkInput]] = {
    Hello: _I.RECV_HELLO,
    HelloAccept: _I.RECV_HELLO_ACCEPT,
    Proof: _I.RECV_PROOF,
    FragmentFrame: _I.RECV_FRAGMENT,
    BundleFrame: _I.RECV_FRAGMENT,
    AckFrame: _I.RECV_ACK,
    ProtocolErrorFrame: _I.RECV_ERROR,
    CloseFrame: _I.RECV_CLOSE,
}
_SEND_INPUT: Final[dict[type, LinkInput]] = {
    FragmentFrame: _I.SEND_FRAGMENT,
    BundleFrame: _I.SEND_FRAGMENT,
    AckFrame: _I.SEND_ACK,
    ProtocolErrorFrame: _I.SEND_ERROR,
    CloseFrame: _I.SEND_CLOSE,
}
# Frame types whose input leaves ESTABLISHED as it is, derived from the table: the
# steady-state traffic skips the (state, input) lookup and its enum hashing.
_RECV_KEEPS_ESTABLISHED: Final = frozenset(
    kind
    for kind, event in _RECV_INPUT.items()
    if _TRANSITIONS.get((_S.ESTABLISHED, event)) is _S.ESTABLISHED
)
_SEND_KEEPS_ESTABLISHED: Final = frozenset(
    kind
    for kind, event in _SEND_INPUT.items()
    if _TRANSITIONS.get((_S.ESTABLISHED, event)) is _S.ESTABLISHED
)


@dataclass(frozen=True, slots=True)
class HandshakeCompleted:
    """The peer proved its identity; fragments and acks may flow."""

    peer_broker_id: uuid.UUID
    peer_certificate_pem: bytes


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The byte stream ended (`receive_data(b"")`) before a Close or an error frame."""

    mid_frame: bool = False


LinkEvent = (
    HandshakeCompleted
    | FragmentFrame
    | BundleFrame
    | AckFrame
    | ProtocolErrorFrame
    | CloseFrame
    | ConnectionClosed
)


@dataclass(slots=True)
class LinkCounters:
    """Running totals for the connections view."""

    bytes_in: int = 0
    bytes_out: int = 0
    frames_in: int = 0
    frames_out: int = 0
    fragments_in: int = 0
    fragments_out: int = 0
    acks_in: int = 0
    acks_out: int = 0
    corrupt_fragments: int = 0


@dataclass(slots=True)
class _PeerInfo:
    broker_id: uuid.UUID
    certificate_pem: bytes
    nonce: bytes = field(repr=False)


class LinkConnection:
    """Sans-IO facade for one broker-to-broker TCP connection.

    Drive it with::

        link = LinkConnection(Role.INITIATOR, ...)      # or Role.ACCEPTOR
        writer.write(link.data_to_send())               # the initiator's Hello
        # on every read:
        link.receive_data(data)                         # b"" means EOF
        while (event := link.next_event()) is not NEED_DATA: ...
        writer.write(link.data_to_send())               # handshake answers, error frame
        # to transmit dialog traffic once ESTABLISHED:
        writer.write(link.send(frame))
    """

    def __init__(
        self,
        role: Role,
        *,
        broker_id: uuid.UUID,
        private_key: rsa.RSAPrivateKey,
        certificate_pem: bytes,
        trusted: TrustStore,
        expected_peer_id: uuid.UUID | None = None,
        random: RandomSource = os.urandom,
        max_frame_size: int = MAX_LINK_FRAME_SIZE,
    ) -> None:
        """Args:
        role: INITIATOR for the side that connected, ACCEPTOR for the listener.
        broker_id: this broker's instance id.
        private_key: this broker's key, used to sign handshake proofs.
        certificate_pem: this broker's certificate, sent to the peer.
        trusted: certificates of peers this broker accepts.
        expected_peer_id: if set, a peer announcing another id is refused.
        random: source of the handshake nonce.
        max_frame_size: largest frame accepted, at most MAX_LINK_FRAME_SIZE.
        """
        self.role = role
        self.counters = LinkCounters()
        self._broker_id = broker_id
        self._private_key = private_key
        self._certificate_pem = certificate_pem
        self._trusted = trusted
        self._expected_peer_id = expected_peer_id
        self._nonce = new_nonce(random)
        # no nesting walk: every decoder checks the type of each field it reads, so a
        # list or map where it expects none is malformed at once, and nothing recurses
        # into what a peer sent (msgpack itself stops at about a thousand levels)
        self._decoder = FrameDecoder(min(max_frame_size, MAX_LINK_FRAME_SIZE), nesting=False)
        self._outgoing = bytearray()
        self._eof = False
        self._peer: _PeerInfo | None = None
        self.error: ProtocolError | None = None
        if role is Role.INITIATOR:
            self._state = LinkState.AWAITING_ACCEPT
            self._queue(Hello(PROTOCOL_VERSION, broker_id, certificate_pem, self._nonce))
        else:
            self._state = LinkState.AWAITING_HELLO

    # -- state

    @property
    def state(self) -> LinkState:
        """Current handshake/lifetime state."""
        return self._state

    @property
    def peer_broker_id(self) -> uuid.UUID | None:
        """The peer's instance id once its hello arrived (verified once ESTABLISHED)."""
        return None if self._peer is None else self._peer.broker_id

    def _transition(self, event: LinkInput) -> None:
        try:
            self._state = _TRANSITIONS[(self._state, event)]
        except KeyError:
            state = self._state
            self._state = LinkState.CLOSED
            if event.name.startswith("RECV"):
                raise RemoteProtocolError(
                    f"peer sent {event.value} in state {state.value}", ErrorCode.UNEXPECTED_FRAME
                ) from None
            raise LocalProtocolError(
                f"cannot {event.value} in state {state.value}", ErrorCode.UNEXPECTED_FRAME
            ) from None

    # -- input

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the socket; `b""` signals end of stream."""
        if not data:
            self._eof = True
            return
        self.counters.bytes_in += len(data)
        if self._state is not LinkState.CLOSED:
            self._decoder.receive_data(data)

    def next_event(self) -> LinkEvent | _NeedData:
        """The next event, or NEED_DATA when no complete frame is buffered.

        Handshake frames are answered internally (see `data_to_send`); the caller sees
        `HandshakeCompleted` once the peer is authenticated.

        Raises: RemoteProtocolError: the peer sent a malformed or unexpected frame, or
            failed the handshake. The connection is then CLOSED and `data_to_send()`
            holds a ProtocolErrorFrame to write before closing the socket.
        """
        while self._state is not LinkState.CLOSED:
            try:
                obj: object = self._decoder.next_frame()
                if isinstance(obj, _NeedData):
                    if not self._eof:
                        return obj
                    self._transition(LinkInput.RECV_EOF)
                    return ConnectionClosed(mid_frame=self._decoder.buffered > 0)
                frame = decode_link_frame(obj)
                self.counters.frames_in += 1
                if not (
                    self._state is LinkState.ESTABLISHED and type(frame) in _RECV_KEEPS_ESTABLISHED
                ):
                    self._transition(_RECV_INPUT[type(frame)])
                event = self._handle(frame)
            except RemoteProtocolError as exc:
                self._fail(exc)
                raise
            if event is not None:
                return event
        return NEED_DATA

    def _handle(self, frame: LinkFrame) -> LinkEvent | None:
        if isinstance(frame, FragmentFrame):
            self.counters.fragments_in += 1
            return frame
        if isinstance(frame, BundleFrame):
            self.counters.fragments_in += len(frame.payloads)
            return frame
        if isinstance(frame, AckFrame):
            self.counters.acks_in += 1
            return frame
        if isinstance(frame, (ProtocolErrorFrame, CloseFrame)):
            return frame
        if isinstance(frame, Hello):
            self._on_hello(frame)
            return None
        if isinstance(frame, HelloAccept):
            return self._on_hello_accept(frame)
        assert isinstance(frame, Proof)
        return self._on_proof(frame)

    def _check_peer(self, version: int, broker_id: uuid.UUID, certificate_pem: bytes) -> None:
        if version != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                f"peer speaks protocol version {version}, we speak {PROTOCOL_VERSION}",
                ErrorCode.HANDSHAKE_FAILED,
            )
        if broker_id == self._broker_id:
            raise RemoteProtocolError(
                "peer announced our own broker id", ErrorCode.HANDSHAKE_FAILED
            )
        if self._expected_peer_id is not None and broker_id != self._expected_peer_id:
            raise RemoteProtocolError(
                f"expected broker {self._expected_peer_id}, peer is {broker_id}",
                ErrorCode.HANDSHAKE_FAILED,
            )
        if not self._trusted.is_trusted(load_certificate(certificate_pem)):
            raise RemoteProtocolError(
                f"certificate of broker {broker_id} is not trusted", ErrorCode.HANDSHAKE_FAILED
            )
        if certificate_broker_id(certificate_pem) != broker_id:
            raise RemoteProtocolError(
                f"certificate does not belong to broker {broker_id}", ErrorCode.HANDSHAKE_FAILED
            )

    def _on_hello(self, frame: Hello) -> None:
        self._check_peer(frame.version, frame.broker_id, frame.certificate_pem)
        self._peer = _PeerInfo(frame.broker_id, frame.certificate_pem, frame.nonce)
        proof = sign_handshake_proof(
            self._private_key,
            signer_id=self._broker_id,
            peer_id=frame.broker_id,
            peer_nonce=frame.nonce,
        )
        self._queue(
            HelloAccept(
                PROTOCOL_VERSION, self._broker_id, self._certificate_pem, self._nonce, proof
            )
        )

    def _on_hello_accept(self, frame: HelloAccept) -> HandshakeCompleted:
        self._check_peer(frame.version, frame.broker_id, frame.certificate_pem)
        verify_handshake_proof(
            certificate_pem=frame.certificate_pem,
            proof=frame.proof,
            signer_id=frame.broker_id,
            peer_id=self._broker_id,
            peer_nonce=self._nonce,
            trusted=self._trusted,
        )
        self._peer = _PeerInfo(frame.broker_id, frame.certificate_pem, frame.nonce)
        self._queue(
            Proof(
                sign_handshake_proof(
                    self._private_key,
                    signer_id=self._broker_id,
                    peer_id=frame.broker_id,
                    peer_nonce=frame.nonce,
                )
            )
        )
        return HandshakeCompleted(frame.broker_id, frame.certificate_pem)

    def _on_proof(self, frame: Proof) -> HandshakeCompleted:
        peer = self._peer
        assert peer is not None  # AWAITING_PROOF is only reached through a Hello
        verify_handshake_proof(
            certificate_pem=peer.certificate_pem,
            proof=frame.proof,
            signer_id=peer.broker_id,
            peer_id=self._broker_id,
            peer_nonce=self._nonce,
            trusted=self._trusted,
        )
        return HandshakeCompleted(peer.broker_id, peer.certificate_pem)

    def _fail(self, exc: RemoteProtocolError) -> None:
        self._state = LinkState.CLOSED
        if self.error is None:
            self.error = exc
            self._queue(ProtocolErrorFrame(int(exc.code), str(exc)[:MAX_ERROR_TEXT]))

    # -- output

    def _queue(self, frame: LinkFrame) -> None:
        self._outgoing += encode_link_frame(frame)
        self.counters.frames_out += 1

    def data_to_send(self) -> bytes:
        """Bytes the connection produced by itself (handshake, error report); may be empty."""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        self.counters.bytes_out += len(data)
        return data

    def send(
        self, frame: FragmentFrame | BundleFrame | AckFrame | ProtocolErrorFrame | CloseFrame
    ) -> bytes:
        """Encode one frame for the wire.

        Fragments and acks are allowed only when ESTABLISHED; an error or close frame
        from any open state, after which the connection is CLOSED.

        Raises: LocalProtocolError: the frame is not allowed in the current state.
        """
        kind = type(frame)
        if not (self._state is LinkState.ESTABLISHED and kind in _SEND_KEEPS_ESTABLISHED):
            event = _SEND_INPUT.get(kind)
            if event is None:
                raise LocalProtocolError(
                    f"{kind.__name__} frames are produced by the connection itself",
                    ErrorCode.UNEXPECTED_FRAME,
                )
            self._transition(event)
        data = encode_frame(frame.encode())
        counters = self.counters
        counters.bytes_out += len(data)
        counters.frames_out += 1
        if kind is FragmentFrame:
            counters.fragments_out += 1
        elif kind is BundleFrame:
            counters.fragments_out += len(cast(BundleFrame, frame).payloads)
        elif kind is AckFrame:
            counters.acks_out += 1
        return data

    def record_corrupt_fragment(self) -> None:
        """Count a fragment the dialog layer dropped for a failed integrity check."""
        self.counters.corrupt_fragments += 1
