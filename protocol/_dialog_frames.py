"""Dialog frames: what the dialog layer sends over a link, with their codecs.

A `FragmentFrame` carries one fragment of one sequenced message of a dialog direction, a
`BundleFrame` several whole messages of one direction, an `AckFrame` a standalone ack,
an `UnbundleFrame` a forwarder's notice that a direction's bundles cannot go on;
the `Envelope` (routing header) and `AckRecord` (what a receiver confirms) ride inside
them. Each frame is a frozen dataclass with `encode()` and `decode()` next to it, and the
exact bytes its signature seals (`signed_header()`, or `header_prefix` + `header_rest`,
the direction's constant part computed once). They carry the conversation id as 16 raw
bytes, not as the msgpack UUID extension, and decoding interns it (see `_fields`).

These are the hot paths of broker-to-broker traffic: the steady-state fragment is decoded
with its checks inline and built without the dataclass constructor (see
`new_fragment_frame`); both keep the rules of the field checks.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any, Final

from ._fields import (
    MAX_ACK_RANGES,
    MAX_BUNDLE_MESSAGES,
    MAX_FRAGMENT_COUNT,
    MAX_FRAGMENT_SIZE,
    MAX_NAME_LENGTH,
    MAX_SEQ,
    FrameKind,
    bytes_field,
    frame_fields,
    int_field,
    list_field,
    malformed,
    raw_uuid_field,
    str_field,
    uuid_field,
)
from ._framing import pack
from ._integrity import MAX_PROOF_SIZE, MAX_WRAPPED_KEY_SIZE, SIGNATURE_SIZE


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


_DIRECTIONS: Final = (Direction.FROM_INITIATOR, Direction.FROM_TARGET)
_FRAGMENT: Final = int(FrameKind.FRAGMENT)
_ACK: Final = int(FrameKind.ACK)
_HEADER_FIELDS: Final = 10
_FRAGMENT_HEADER_TAG: Final = bytes([0x90 | _HEADER_FIELDS])  # msgpack fixarray of 10
_BUNDLE: Final = int(FrameKind.BUNDLE)
_UNBUNDLE: Final = int(FrameKind.UNBUNDLE)
_BUNDLE_HEADER_TAG: Final = bytes([0x90 | 6])  # kind, id, direction, seq, type, sizes, ack


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
        items = list_field(obj, "envelope", max_length=7)
        if len(items) == 6 and items[5] is not True:
            raise malformed("a 6-element envelope must end with true")
        if len(items) == 7 and type(items[5]) is not bool:
            raise malformed("a 7-element envelope must have a boolean sixth element")
        if len(items) not in (5, 6, 7):
            raise malformed("envelope must have 5, 6 or 7 elements")
        return cls(
            str_field(items[0], "from service"),
            str_field(items[1], "to service"),
            str_field(items[2], "contract"),
            uuid_field(items[3], "from broker id"),
            uuid_field(items[4], "to broker id"),
            len(items) > 5 and items[5] is True,
            bytes_field(items[6], "origin proof", MAX_PROOF_SIZE) if len(items) == 7 else None,
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
        items = list_field(obj, "ack", 2)
        below = int_field(items[0], "ack below", 0, MAX_SEQ)
        raw = list_field(items[1], "ack ranges", max_length=MAX_ACK_RANGES)
        ranges: list[tuple[int, int, int, int]] = []
        for entry in raw:
            seq, count, first, end = list_field(entry, "ack range", 4)
            count = int_field(count, "ack range fragment count", 1, MAX_FRAGMENT_COUNT)
            first = int_field(first, "ack range first", 0, count - 1)
            end = int_field(end, "ack range end", first + 1, count)
            ranges.append((int_field(seq, "ack range seq", 0, MAX_SEQ), count, first, end))
        return cls(below, tuple(ranges))


# --------------------------------------------------------------------------- frames


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
                    raw_uuid_field(raw_id, "conversation id"),
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
        f = frame_fields(obj, FrameKind.FRAGMENT, 11)
        count = int_field(f[5], "fragment count", 1, MAX_FRAGMENT_COUNT)
        return cls(
            conversation_id=raw_uuid_field(f[1], "conversation id"),
            direction=_DIRECTIONS[int_field(f[2], "direction", 0, 1)],
            seq=int_field(f[3], "sequence number", 0, MAX_SEQ),
            fragment_index=int_field(f[4], "fragment index", 0, count - 1),
            fragment_count=count,
            message_type=str_field(f[6], "message type"),
            payload=bytes_field(f[7], "payload", MAX_FRAGMENT_SIZE),
            signature=bytes_field(f[8], "signature", SIGNATURE_SIZE, SIGNATURE_SIZE),
            envelope=None if f[9] is None else Envelope.decode(f[9]),
            wrapped_session_key=(
                None
                if f[10] is None
                else bytes_field(f[10], "wrapped session key", MAX_WRAPPED_KEY_SIZE)
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
        f = frame_fields(obj, FrameKind.BUNDLE, 7)
        payloads = list_field(f[5], "bundle payloads", max_length=MAX_BUNDLE_MESSAGES)
        if not payloads or any(
            type(payload) is not bytes or len(payload) > MAX_FRAGMENT_SIZE for payload in payloads
        ):
            raise malformed(
                f"bundle payloads must be 1..{MAX_BUNDLE_MESSAGES} byte strings of at most"
                f" {MAX_FRAGMENT_SIZE} bytes"
            )
        return cls(
            raw_uuid_field(f[1], "conversation id"),
            _DIRECTIONS[int_field(f[2], "direction", 0, 1)],
            int_field(f[3], "sequence number", 0, MAX_SEQ - len(payloads) + 1),
            str_field(f[4], "message type"),
            tuple(payloads),
            bytes_field(f[6], "signature", SIGNATURE_SIZE, SIGNATURE_SIZE),
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
        f = frame_fields(obj, FrameKind.ACK, 4)
        return cls(
            raw_uuid_field(f[1], "conversation id"),
            _DIRECTIONS[int_field(f[2], "direction", 0, 1)],
            AckRecord.decode(f[3]),
            bytes_field(f[4], "signature", SIGNATURE_SIZE, SIGNATURE_SIZE),
        )


@dataclass(frozen=True, slots=True)
class UnbundleFrame:
    """A forwarder's notice to the adjacent broker a bundle of this dialog direction came
    from: bundles of the direction cannot go on (the next hop speaks a protocol version
    older than relayed bundles need), so send its messages as fragments. Passed back
    hop by hop to the origin. Not signed: it can only make the origin stop bundling, and
    a forwarder can always drop frames."""

    conversation_id: uuid.UUID
    direction: Direction

    def encode(self) -> list[object]:
        """Wire form (the conversation id as 16 raw bytes)."""
        return [_UNBUNDLE, self.conversation_id.bytes, int(self.direction)]

    @classmethod
    def decode(cls, obj: list[Any]) -> UnbundleFrame:
        """Raises: RemoteProtocolError: malformed."""
        f = frame_fields(obj, FrameKind.UNBUNDLE, 2)
        return cls(
            raw_uuid_field(f[1], "conversation id"),
            _DIRECTIONS[int_field(f[2], "direction", 0, 1)],
        )
