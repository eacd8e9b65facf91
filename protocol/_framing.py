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
until one is complete. A frame longer than the decoder's limit, a payload that is
not exactly one msgpack object, or one whose lists and maps nest deeper than MAX_NESTING
raises `RemoteProtocolError`; nothing else escapes (so no reader of a frame can run out
of recursion on it).
"""

from __future__ import annotations

import itertools
import struct
import uuid
from typing import Any, Final

import msgpack

from ._errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from ._fields import interned_uuid

MAX_FRAME_SIZE: Final = 64 * 1024 * 1024
FRAME_HEADROOM: Final = 1024 * 1024
MAX_MESSAGE_SIZE_LIMIT: Final = MAX_FRAME_SIZE - FRAME_HEADROOM
DEFAULT_MAX_MESSAGE_SIZE: Final = 32 * 1024 * 1024
ROW_OVERHEAD: Final = 1024  # what one message's columns add to an answer, at most
MAX_NESTING: Final = 32  # lists and maps inside each other in one frame, at most
HEADER_SIZE: Final = 4
UUID_EXT: Final = 1

_HEADER = struct.Struct(">I")


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


# The encoded form of recently written UUIDs: the same few conversation and group ids go
# out in row after row, and building the extension object costs more than the lookup.
# (Read ones are interned likewise, see `_fields`: building a UUID costs more still.)
MAX_CACHED_UUIDS: Final = 4096
_uuid_exts: dict[uuid.UUID, msgpack.ExtType] = {}


def _default(obj: object) -> object:
    if isinstance(obj, uuid.UUID):
        ext = _uuid_exts.get(obj)
        if ext is None:
            if len(_uuid_exts) >= MAX_CACHED_UUIDS:
                _uuid_exts.clear()
            ext = _uuid_exts[obj] = msgpack.ExtType(UUID_EXT, obj.bytes)
        return ext
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} on the wire")


def _ext_hook(code: int, data: bytes) -> object:
    if code == UUID_EXT and len(data) == 16:
        return interned_uuid(data)
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


def check_nesting(obj: Any, limit: int = MAX_NESTING) -> None:
    """RemoteProtocolError when lists and maps in `obj` nest deeper than `limit`."""
    if type(obj) in (list, dict) and _too_deep(obj, limit):
        raise RemoteProtocolError(
            f"a frame nests lists and maps more than {MAX_NESTING} deep",
            ErrorCode.MALFORMED_FRAME,
        )


is_container = frozenset({list, dict}).__contains__


def _too_deep(obj: list[Any] | dict[Any, Any], limit: int) -> bool:
    """Whether containers nest beyond `limit` (level by level: no recursion to exhaust;
    a level of scalars is passed over at C speed, and so is a level of lists, such as
    rows of values, whose items are looked at all at once)."""
    level: list[Any] = [obj]
    for _ in range(limit):
        if dict not in set(map(type, level)):
            if not any(map(is_container, map(type, itertools.chain.from_iterable(level)))):
                return False
            level = [x for x in itertools.chain.from_iterable(level) if type(x) in (list, dict)]
            continue
        inner: list[Any] = []
        for container in level:
            if type(container) is dict:
                if any(map(is_container, map(type, container))):
                    return True  # a list or map as a key: nothing of ours sends that
                items: Any = container.values()
            else:
                items = container
            if any(map(is_container, map(type, items))):
                inner.extend(x for x in items if type(x) in (list, dict))
        if not inner:
            return False
        level = inner
    return True


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

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE, *, nesting: bool = True) -> None:
        self._buffer = bytearray()
        self._offset = 0
        self.max_frame_size = max_frame_size  # may change between frames (e.g. after login)
        # check MAX_NESTING on every frame; off where the frame's reader checks it itself
        # (requests: `Request.decode`) or trusts the sender (a client reading answers)
        self.nesting = nesting

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
        if size > self.max_frame_size:
            raise RemoteProtocolError(
                f"frame of {size} bytes exceeds the limit of {self.max_frame_size}",
                ErrorCode.FRAME_TOO_LARGE,
            )
        end = start + HEADER_SIZE + size
        if len(buf) < end:
            return NEED_DATA
        frame = unpack(buf[start + HEADER_SIZE : end])
        if self.nesting:
            check_nesting(frame)
        if end == len(buf):
            buf.clear()
            self._offset = 0
        elif end > 1 << 20:
            del buf[:end]
            self._offset = 0
        else:
            self._offset = end
        return frame
