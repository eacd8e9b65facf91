"""Message sizes are limited consistently, and nothing is lost at the limits.

A RECEIVE (or peek) answer never exceeds the 64 MiB frame: with three 30 MiB messages
queued it returns fewer than asked for and the rest stay queued, in and outside
explicit transactions, with every body intact. One message of the largest allowed size
always fits. A body over `max_message_size` (or a request over the frame) raises
MessageTooLargeError, a BrokerError, before anything is sent; the broker itself refuses
an oversized body from a client that ignores the limit it announced. The session goes
on after every refusal.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from daemon import one_error_line, serve_once
from setup_objects import initiator_and_target

from ssb import client
from ssb.protocol import MAX_FRAME_SIZE, MAX_MESSAGE_SIZE_LIMIT, ErrorCode

MIB = 1024 * 1024
BIG = 30 * MIB


def _big(n: int) -> bytes:
    """A distinct 30 MiB body: its number, then a fill byte of its own."""
    return f"big {n}:".encode().ljust(16, b".") + bytes([n % 251 + 1]) * (BIG - 16)


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


async def _ready(conn: client.Connection, queue: str = "BigQ") -> int:
    (row,) = [q for q in await conn.view("service_queues") if q["name"] == queue]
    return int(row["messages_ready"])


def _fits_a_frame(got: list[client.Message]) -> None:
    assert 1 <= len(got) < 3, f"an answer carried {len(got)} messages of 30 MiB"
    assert sum(len(m.message_body) for m in got) < MAX_FRAME_SIZE


@pytest.mark.slow
async def test_three_30_mib_messages_come_in_answers_that_fit_a_frame(
    conn: client.Connection,
) -> None:
    await initiator_and_target(conn, "BigQ", "BigSvc")
    h = await conn.begin_dialog("InitSvc", "BigSvc")
    digests = {}
    for n in range(3):
        body = _big(n)
        digests[n] = _digest(body)
        await conn.send(h, "DEFAULT", body)
    del body

    # outside a transaction: each RECEIVE takes what fits, the rest stays queued
    seen: list[tuple[int, str]] = []
    for _ in range(3):  # bounded: three messages need at most three RECEIVEs
        if len(seen) == 3:
            break
        got = await conn.receive("BigQ", top=10, timeout=5)
        _fits_a_frame(got)
        seen += [(m.message_sequence_number, _digest(m.message_body)) for m in got]
        assert await _ready(conn) == 3 - len(seen)
    del got
    assert seen == [(n, digests[n]) for n in range(3)]
    assert await conn.receive("BigQ", timeout=0) == []

    # in explicit transactions: a rolled-back answer comes back whole, then commits take all
    for n in range(3, 6):
        body = _big(n)
        digests[n] = _digest(body)
        await conn.send(h, "DEFAULT", body)
    del body
    await conn.begin_transaction()
    got = await conn.receive("BigQ", top=10, timeout=5)
    _fits_a_frame(got)
    first_answer = [m.message_sequence_number for m in got]
    await conn.rollback()
    seen = []
    for _ in range(3):  # bounded
        if len(seen) == 3:
            break
        async with conn.transaction():
            got = await conn.receive("BigQ", top=10, timeout=5)
            _fits_a_frame(got)
        seen += [(m.message_sequence_number, _digest(m.message_body)) for m in got]
        if len(seen) <= len(first_answer):
            assert all(m.delivery_count == 2 for m in got)
        assert await _ready(conn) == 3 - len(seen)
    del got
    assert seen == [(n, digests[n]) for n in range(3, 6)]
    assert await conn.receive("BigQ", timeout=0) == []


async def test_peeking_at_three_30_mib_messages_fits_a_frame(conn: client.Connection) -> None:
    await initiator_and_target(conn, "BigQ", "BigSvc")
    h = await conn.begin_dialog("InitSvc", "BigSvc")
    digests = []
    for n in range(3):
        body = _big(n)
        digests.append(_digest(body))
        await conn.send(h, "DEFAULT", body)
    del body
    seen: list[str] = []
    after = None
    for _ in range(3):  # bounded: three messages need at most three pages
        if len(seen) == 3:
            break
        page = await conn.peek("BigQ", after=after)
        _fits_a_frame(page)
        seen += [_digest(m.message_body) for m in page]
        after = page[-1].queuing_order
    del page
    assert seen == digests
    assert await _ready(conn) == 3  # peeking takes nothing


@pytest.mark.parametrize(
    "broker_settings",
    [{"config": {"max_message_size": MAX_MESSAGE_SIZE_LIMIT}}],
    ids=["max_message_size=limit"],
)
async def test_one_message_of_the_largest_size_fits_an_answer(conn: client.Connection) -> None:
    await initiator_and_target(conn, "BigQ", "BigSvc")
    assert conn.max_message_size == MAX_MESSAGE_SIZE_LIMIT
    h = await conn.begin_dialog("InitSvc", "BigSvc")
    body = b"L" * MAX_MESSAGE_SIZE_LIMIT
    digest = _digest(body)
    await conn.send(h, "DEFAULT", body)
    await conn.send(h, "DEFAULT", b"small")
    del body
    (peeked,) = await conn.peek("BigQ")
    assert _digest(peeked.message_body) == digest
    del peeked
    (got,) = await conn.receive("BigQ", top=10, timeout=5)
    assert (got.message_sequence_number, _digest(got.message_body)) == (0, digest)
    del got
    assert [m.message_body for m in await conn.receive("BigQ", timeout=5)] == [b"small"]


async def test_a_200_mb_body_is_refused_and_nothing_is_sent(conn: client.Connection) -> None:
    await initiator_and_target(conn, "BigQ", "BigSvc")
    h = await conn.begin_dialog("InitSvc", "BigSvc")
    huge = bytes(200 * 1000 * 1000)
    caught: client.BrokerError | None = None
    try:
        await conn.send(h, "DEFAULT", huge)
    except client.BrokerError as exc:  # the root class catches it
        caught = exc
    assert isinstance(caught, client.MessageTooLargeError)
    assert isinstance(caught, client.InvalidArgumentError)
    assert caught.code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.FRAME_TOO_LARGE)
    assert "nothing was sent" in caught.message
    with pytest.raises(client.MessageTooLargeError):
        await conn.send_many(h, "DEFAULT", [b"small", huge])
    del huge

    assert await conn.ping() == "pong"
    assert await conn.peek("BigQ") == []
    assert await _ready(conn) == 0
    await conn.send(h, "DEFAULT", b"next")
    (m,) = await conn.receive("BigQ", timeout=5)
    assert (m.message_body, m.message_sequence_number) == (b"next", 0)


async def test_send_many_over_the_frame_is_refused_whole(conn: client.Connection) -> None:
    await initiator_and_target(conn, "BigQ", "BigSvc")
    h = await conn.begin_dialog("InitSvc", "BigSvc")
    bodies = [_big(n) for n in range(3)]  # each allowed, together more than a frame
    assert all(len(b) <= conn.max_message_size for b in bodies)
    with pytest.raises(client.MessageTooLargeError) as info:
        await conn.send_many(h, "DEFAULT", bodies)
    del bodies
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert await conn.ping() == "pong"
    assert await _ready(conn) == 0
    await conn.send_many(h, "DEFAULT", [b"a", b"b"])
    got = await conn.receive("BigQ", timeout=5)
    assert [(m.message_body, m.message_sequence_number) for m in got] == [(b"a", 0), (b"b", 1)]


@pytest.mark.parametrize(
    "broker_settings", [{"config": {"max_message_size": 1000}}], ids=["max_message_size=1000"]
)
async def test_max_message_size_bounds_every_body(conn: client.Connection) -> None:
    await initiator_and_target(conn, "BigQ", "BigSvc")
    assert conn.max_message_size == 1000  # announced in the handshake
    h = await conn.begin_dialog("InitSvc", "BigSvc")
    await conn.send(h, "DEFAULT", b"x" * 1000)
    with pytest.raises(client.MessageTooLargeError, match="max_message_size") as info:
        await conn.send(h, "DEFAULT", b"x" * 1001)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE

    # the broker checks too: a client that ignores the announced limit is refused
    conn.max_message_size = MIB
    with pytest.raises(client.MessageTooLargeError, match="max_message_size") as info:
        await conn.send(h, "DEFAULT", b"y" * 1001)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert "1000" in info.value.message
    with pytest.raises(client.MessageTooLargeError):  # atomic: the small one is not sent
        await conn.send_many(h, "DEFAULT", [b"small", b"y" * 5000])
    assert await conn.ping() == "pong"

    got = await conn.receive("BigQ", timeout=5)
    assert [(m.message_body, m.message_sequence_number) for m in got] == [(b"x" * 1000, 0)]
    await conn.send(h, "DEFAULT", b"z")
    (m,) = await conn.receive("BigQ", timeout=5)
    assert (m.message_body, m.message_sequence_number) == (b"z", 1)


def test_max_message_size_above_the_frame_limit_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "ssb.toml"
    config.write_text(f"max_message_size = {MAX_MESSAGE_SIZE_LIMIT + 1}\n")
    done = serve_once(tmp_path / "data", "--config", str(config), timeout=30.0)
    line = one_error_line(done)
    assert "max_message_size" in line and str(MAX_MESSAGE_SIZE_LIMIT) in line
