"""Length-prefixed msgpack framing, shared by the client wire and the broker link.

A frame is a 4-byte big-endian payload length followed by one msgpack object. UUIDs
travel as msgpack extension type 1 (16 raw bytes) so both ends get `uuid.UUID` back
without a schema.

Size limits agree everywhere: a frame carries at most MAX_FRAME_SIZE bytes; a message
body is at most a broker's `max_message_size` (DEFAULT_MAX_MESSAGE_SIZE unless
configured), which can never exceed MAX_MESSAGE_SIZE_LIMIT, the frame limit less
FRAME_HEADROOM for the columns and headers around a body. So one message always fits
in a frame, and an answer carrying several is cut to fit (ROW_OVERHEAD per message). The decoder is incremental: feed it any slice of the stream with
`receive_data` and pull whole frames with `next_frame`, which returns `NEED_DATA`
until one is complete. A frame longer than the decoder's limit, or a payload that is
not exactly one msgpack object, raises `RemoteProtocolError`; nothing else escapes.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, Final

import msgpack

from ._errors import ErrorCode, LocalProtocolError, RemoteProtocolError

MAX_FRAME_SIZE: Final = 64 * 1024 * 1024
FRAME_HEADROOM: Final = 1024 * 1024
MAX_MESSAGE_SIZE_LIMIT: Final = MAX_FRAME_SIZE - FRAME_HEADROOM
DEFAULT_MAX_MESSAGE_SIZE: Final = 32 * 1024 * 1024
ROW_OVERHEAD: Final = 1024  # what one message's columns add to an answer, at most
HEADER_SIZE: Final = 4
UUID_EXT: Final = 1

_HEADER = struct.Struct(">I")


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


def _default(obj: object) -> object:
    if isinstance(obj, uuid.UUID):
        return msgpack.ExtType(UUID_EXT, obj.bytes)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} on the wire")


def _ext_hook(code: int, data: bytes) -> object:
    if code == UUID_EXT and len(data) == 16:
        return uuid.UUID(bytes=data)
    raise RemoteProtocolError(f"unknown msgpack extension type {code}")


_packer = msgpack.Packer(default=_default, use_bin_type=True)


def pack(obj: object) -> bytes:
    """Encode one object as msgpack (no length prefix)."""
    packed: bytes = _packer.pack(obj)
    return packed


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """Decode exactly one msgpack object; anything malformed is a RemoteProtocolError."""
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except RemoteProtocolError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types for bad input
        raise RemoteProtocolError(
            f"malformed frame payload: {exc}", ErrorCode.MALFORMED_FRAME
        ) from exc


def encode_frame(obj: object) -> bytes:
    """One frame: length prefix plus msgpack payload.

    Raises: LocalProtocolError (FRAME_TOO_LARGE): the payload exceeds MAX_FRAME_SIZE.
    """
    payload: bytes = _packer.pack(obj)
    if len(payload) > MAX_FRAME_SIZE:
        raise LocalProtocolError(
            f"a frame of {len(payload)} bytes exceeds the limit of {MAX_FRAME_SIZE}",
            ErrorCode.FRAME_TOO_LARGE,
        )
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental decoder: bytes in, whole decoded frames out."""

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self._buffer = bytearray()
        self._offset = 0
        self._max = max_frame_size

    def receive_data(self, data: bytes) -> None:
        if self._offset:  # drop consumed frames first: appending then moves less
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._offset

    def next_frame(self) -> Any:
        """The next decoded frame, or NEED_DATA when none is complete yet."""
        buf = self._buffer
        start = self._offset
        if len(buf) - start < HEADER_SIZE:
            return NEED_DATA
        (size,) = _HEADER.unpack_from(buf, start)
        if size > self._max:
            raise RemoteProtocolError(
                f"frame of {size} bytes exceeds the limit of {self._max}",
                ErrorCode.FRAME_TOO_LARGE,
            )
        end = start + HEADER_SIZE + size
        if len(buf) < end:
            return NEED_DATA
        frame = unpack(buf[start + HEADER_SIZE : end])
        if end == len(buf):
            buf.clear()
            self._offset = 0
        elif end > 1 << 20:
            del buf[:end]
            self._offset = 0
        else:
            self._offset = end
        return frame
