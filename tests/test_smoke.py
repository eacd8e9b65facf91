from __future__ import annotations

import client


async def test_ping(conn: client.Connection) -> None:
    assert await conn.ping() == "pong"
