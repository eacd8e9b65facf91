from __future__ import annotations

from ssb import client


async def test_ping(conn: client.Connection) -> None:
    assert await conn.ping() == "pong"
