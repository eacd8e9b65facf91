from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from daemon import BrokerProcess

from ssb import client


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh broker daemon (durability fsync) on free ports."""
    process = BrokerProcess(tmp_path / "data").start()
    yield process
    process.kill()


@pytest.fixture
async def conn(broker: BrokerProcess) -> AsyncIterator[client.Connection]:
    connection = await client.connect(broker.url)
    yield connection
    await connection.close()
