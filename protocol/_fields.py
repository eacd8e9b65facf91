"""The link frames' kinds, limits and field checks: the rules every decoder applies.

Every frame on a broker-to-broker connection is a `_framing` frame (a 4-byte length and
one msgpack array) whose first element is a `FrameKind`. Decoders read what a peer sent
field by field through the checks below, which accept only the exact type and range and
otherwise raise `RemoteProtocolError` (MALFORMED_FRAME) naming the fault; nothing else
escapes a decoder. Every length and count has a `Final` limit here.
"""

from __future__ import annotations

import uuid
from enum import IntEnum
from typing import Any, Final

from ._errors import ErrorCode, RemoteProtocolError

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
    LOCATE = 9
    LOCATED = 10
    UNBUNDLE = 11


def malformed(what: str) -> RemoteProtocolError:
    """The error a decoder raises for a frame that breaks the rules."""
    return RemoteProtocolError(f"malformed link frame: {what}", ErrorCode.MALFORMED_FRAME)


def int_field(value: object, what: str, low: int, high: int) -> int:
    """`value`, an integer in `low`..`high`."""
    if type(value) is not int or not low <= value <= high:
        raise malformed(f"{what} must be an integer in {low}..{high}")
    return value


def bytes_field(value: object, what: str, max_size: int, exact: int | None = None) -> bytes:
    """`value`, bytes of at most `max_size` (exactly `exact`, if given)."""
    if type(value) is not bytes or len(value) > max_size:
        raise malformed(f"{what} must be at most {max_size} bytes")
    if exact is not None and len(value) != exact:
        raise malformed(f"{what} must be exactly {exact} bytes")
    return value


def str_field(value: object, what: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """`value`, a string of at most `max_length` characters."""
    if type(value) is not str or len(value) > max_length:
        raise malformed(f"{what} must be a string of at most {max_length} characters")
    return value


def uuid_field(value: object, what: str) -> uuid.UUID:
    """`value`, a UUID (the msgpack extension)."""
    if not isinstance(value, uuid.UUID):
        raise malformed(f"{what} must be a UUID")
    return value


# Conversation ids travel in fragments and acks as 16 raw bytes (no msgpack extension
# round trip). Decoded ids are interned: a connection sees the same few dialogs over and
# over, and one UUID object per id makes later comparisons identity checks.
MAX_INTERNED_IDS: Final = 4096
_interned_ids: dict[bytes, uuid.UUID] = {}


def interned_uuid(data: bytes) -> uuid.UUID:
    """The UUID of 16 bytes read from the wire, one object per id while it is in use."""
    known = _interned_ids.get(data)
    if known is None:
        if len(_interned_ids) >= MAX_INTERNED_IDS:
            _interned_ids.clear()
        known = _interned_ids[data] = uuid.UUID(bytes=data)
    return known


def raw_uuid_field(value: object, what: str) -> uuid.UUID:
    """`value`, 16 raw bytes, as the interned UUID they name."""
    if type(value) is not bytes or len(value) != 16:
        raise malformed(f"{what} must be 16 bytes")
    return interned_uuid(value)


def list_field(
    value: object, what: str, length: int | None = None, max_length: int = 64
) -> list[Any]:
    """`value`, an array of at most `max_length` elements (exactly `length`, if given)."""
    if type(value) is not list or len(value) > max_length:
        raise malformed(f"{what} must be an array")
    if length is not None and len(value) != length:
        raise malformed(f"{what} must have {length} elements")
    return value


def frame_fields(obj: list[Any], kind: FrameKind, count: int) -> list[Any]:
    """`obj`, a frame of `kind` with its `count` fields after the kind."""
    if len(obj) != count + 1:
        raise malformed(f"{kind.name} frame must have {count} fields, got {len(obj) - 1}")
    return obj
