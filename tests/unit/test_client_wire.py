"""The client wire codec, pure: frames fed one byte at a time, bad bytes rejected."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssb.protocol import (
    NEED_DATA,
    FrameDecoder,
    Hello,
    ProtocolError,
    RemoteProtocolError,
    Reply,
    Request,
    _fields,
    _framing,
    encode_error,
    encode_frame,
    encode_ok,
)
from ssb.protocol._errors import ErrorCode


def _feed_bytewise(data: bytes, decoder: FrameDecoder) -> list[object]:
    frames = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        while (frame := decoder.next_frame()) is not NEED_DATA:
            frames.append(frame)
    return frames


def test_requests_and_replies_survive_one_byte_at_a_time() -> None:
    handle = uuid.uuid4()
    request = Request(7, "send", {"handles": [handle], "bodies": [b"\x00" * 300, "text"]})
    stream = (
        encode_frame(Hello(1, "admin", "secret").encode())
        + encode_frame(request.encode())
        + encode_frame(encode_ok(7, None))
        + encode_frame(encode_error(8, ErrorCode.UNKNOWN_QUEUE, "queue 'Q' does not exist"))
    )
    hello, req, ok, err = _feed_bytewise(stream, FrameDecoder())
    assert Hello.decode(hello) == Hello(1, "admin", "secret")
    assert Request.decode(req) == request
    assert Reply.decode(ok) == Reply(7, True, None)
    reply = Reply.decode(err)
    assert (reply.ok, reply.code, reply.text) == (
        False,
        ErrorCode.UNKNOWN_QUEUE,
        "queue 'Q' does not exist",
    )


def test_an_error_code_this_client_does_not_know_keeps_its_number() -> None:
    """A newer broker's code is not taken for the broker's own fault (which a login
    retries elsewhere): it is a disagreement about the protocol, its number kept."""
    reply = Reply.decode(encode_error(8, 6099, "a refusal a newer broker has"))
    assert reply.code is ErrorCode.UNRECOGNISED_CODE
    assert reply.text.startswith("the broker answered with error 6099, which this client")
    assert reply.text.endswith(": a refusal a newer broker has")
    for body in (["6099", "text"], [True, "text"], [6099], "text"):
        malformed = encode_error(8, 6099, "text")
        malformed[2] = body
        with pytest.raises(RemoteProtocolError, match="malformed error reply"):
            Reply.decode(malformed)


def test_oversized_frame_is_refused_before_buffering_it() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    decoder.receive_data((10_000).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


@pytest.mark.parametrize(
    "frame",
    [[1, "op"], ["x", "op", {}], [1, 2, {}], [1, "op", []], {"a": 1}, "hello"],
)
def test_malformed_requests(frame: object) -> None:
    with pytest.raises(RemoteProtocolError):
        Request.decode(frame)


def test_hello_must_come_first() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        Hello.decode([1, "ping", {}])
    assert info.value.code == ErrorCode.HANDSHAKE_FAILED


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_protocol_errors(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_size=4096)
    decoder.receive_data(data)
    try:
        while (frame := decoder.next_frame()) is not NEED_DATA:
            with contextlib.suppress(ProtocolError):
                Request.decode(frame)
    except ProtocolError:
        pass


def test_uuids_encode_the_same_from_a_bounded_cache() -> None:
    ids = [uuid.UUID(int=n) for n in range(_framing.MAX_CACHED_UUIDS + 100)]
    for _ in range(2):  # the second pass meets cached and evicted ids
        assert _framing.unpack(_framing.pack(ids)) == ids
        assert len(_framing._uuid_exts) <= _framing.MAX_CACHED_UUIDS


def test_uuids_decode_the_same_from_a_bounded_cache() -> None:
    ids = [uuid.UUID(int=n) for n in range(_fields.MAX_INTERNED_IDS + 100)]
    packed = _framing.pack(ids)
    for _ in range(2):  # the second pass meets cached and evicted ids
        decoded = _framing.unpack(packed)
        assert decoded == ids
        assert all(type(found) is uuid.UUID for found in decoded)
        assert len(_fields._interned_ids) <= _fields.MAX_INTERNED_IDS
    again = _framing.unpack(_framing.pack([ids[-1], ids[-1]]))
    assert again[0] is again[1]  # one object for an id read twice


def _depth(value: object) -> int:
    """How deep lists and maps nest in `value` (a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_nested = st.recursive(
    st.one_of(st.integers(), st.binary(max_size=4), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_nested, st.integers(min_value=1, max_value=6))
def test_a_frame_nests_too_deep_exactly_when_its_depth_passes_the_limit(
    value: object, limit: int
) -> None:
    """Levels of lists are looked at all at once, levels with maps map by map: either
    way a frame is too deep exactly when its depth passes the limit."""
    if not isinstance(value, (list, dict)):
        return
    deep = _depth(value) > limit
    if deep:
        with pytest.raises(RemoteProtocolError):
            _framing.check_nesting(value, limit)
    else:
        _framing.check_nesting(value, limit)
    rows = [[k, b"x", [k] * (k % 3)] for k in range(100)]  # rows of values, one level more
    _framing.check_nesting(rows, 3)
    with pytest.raises(RemoteProtocolError):
        _framing.check_nesting(rows, 2)
