"""Pure (sans-IO) protocol code shared by the broker and the client.

Nothing in this package performs I/O or reads a clock: bytes and time come in as
arguments, events and bytes go out.
"""

from __future__ import annotations

from ._client_wire import (
    MESSAGE_COLUMNS,
    WIRE_VERSION,
    Hello,
    Reply,
    Request,
    Welcome,
    encode_error,
    encode_ok,
)
from ._errors import (
    ErrorCode,
    IntegrityError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from ._framing import MAX_FRAME_SIZE, NEED_DATA, FrameDecoder, encode_frame, pack, unpack

__all__ = [
    "MAX_FRAME_SIZE",
    "MESSAGE_COLUMNS",
    "NEED_DATA",
    "WIRE_VERSION",
    "ErrorCode",
    "FrameDecoder",
    "Hello",
    "IntegrityError",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "Reply",
    "Request",
    "Welcome",
    "encode_error",
    "encode_frame",
    "encode_ok",
    "pack",
    "unpack",
]
