"""TLS on the client port: ssbs:// with a pinned fingerprint or a CA file, both clients,
nothing in clear on the wire, the wrong certificate refused, and plain TCP refused beyond
loopback unless the config allows it."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import BrokerProcess

from ssb import client

HOST = "127.0.0.1"


async def _round_trip(url: str) -> bytes:
    async with await client.connect(url) as conn:
        await conn.create_queue("Q")
        await conn.create_service("S", queue="Q", contracts=["DEFAULT"])
        async with conn.transaction():
            handle = await conn.begin_dialog("S", "S")
            await conn.send(handle, "DEFAULT", b"top secret body")
        (message,) = await conn.receive("Q", top=1)
        return message.message_body


async def test_tls_with_a_pinned_fingerprint_carries_everything(broker: BrokerProcess) -> None:
    assert len(broker.tls_fingerprint) == 64
    info = json.loads((broker.data_dir / "broker.json").read_text())
    assert info["tls_fingerprint"] == broker.tls_fingerprint
    assert await _round_trip(broker.tls_url) == b"top secret body"
    with client.connect_sync(broker.tls_url) as conn:
        assert conn.ping()


async def test_tls_with_the_certificate_as_ca(broker: BrokerProcess) -> None:
    cert = broker.data_dir / "tls-cert.pem"
    url = f"ssbs://admin:{broker.admin_password()}@127.0.0.1:{broker.client_port}?ca={cert}"
    async with await client.connect(url) as conn:
        assert await conn.ping()
    with client.connect_sync(url) as sync:
        assert sync.ping()


async def test_the_wrong_certificate_is_refused_before_the_login(broker: BrokerProcess) -> None:
    wrong = broker.tls_url.replace(broker.tls_fingerprint, "0" * 64)
    with pytest.raises(client.TLSError, match="fingerprint"):
        await client.connect(wrong)
    with pytest.raises(client.TLSError, match="fingerprint"):
        client.connect_sync(wrong)
    # no pin and no CA: the system's CAs do not know a self-signed broker
    unpinned = broker.tls_url.split("?")[0]
    with pytest.raises(client.TLSError, match="certificate"):
        await client.connect(unpinned)
    assert "login failed" not in broker.log_text()  # refused before any login


async def test_nothing_crosses_in_clear(broker: BrokerProcess) -> None:
    captured = bytearray()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            captured.extend(data)
            writer.write(data)
        writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(HOST, broker.client_port)
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    proxy = await asyncio.start_server(relay, HOST, 0)
    port = proxy.sockets[0].getsockname()[1]
    url = broker.tls_url.replace(f":{broker.client_port}?", f":{port}?")
    assert await _round_trip(url) == b"top secret body"
    proxy.close()
    assert len(captured) > 1000
    assert b"top secret body" not in captured
    assert broker.admin_password().encode() not in captured


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker listening on every interface (tests still connect to 127.0.0.1 only)."""
    process = BrokerProcess(tmp_path / "data", durability="os", extra_args=["--host", "0.0.0.0"])
    process.start()
    yield process
    process.kill()


async def test_beyond_loopback_plain_tcp_is_refused(wide: BrokerProcess) -> None:
    with pytest.raises(client.BrokerError, match="accepts only TLS"):
        await client.connect(wide.url)
    assert "refusing plain TCP" in wide.log_text()
    async with await client.connect(wide.tls_url) as conn:
        assert await conn.ping()


def test_allow_plain_lets_plain_tcp_in_beyond_loopback(tmp_path: Path) -> None:
    process = BrokerProcess(
        tmp_path / "data",
        durability="os",
        config={"allow_plain": True},
        extra_args=["--host", "0.0.0.0"],
    ).start()
    try:
        with client.connect_sync(process.url) as conn:
            assert conn.ping()
    finally:
        process.kill()


def test_a_tls_hello_that_never_finishes_is_closed(tmp_path: Path) -> None:
    process = BrokerProcess(
        tmp_path / "data", durability="os", config={"limits": {"login_timeout": 0.5}}
    ).start()
    try:
        with socket.create_connection((HOST, process.client_port), timeout=10) as sock:
            sock.sendall(b"\x16\x03\x01")  # the start of a TLS record, then nothing
            assert sock.recv(1024) == b""  # closed by the broker
        with client.connect_sync(process.tls_url) as conn:
            assert conn.ping()
    finally:
        process.kill()
