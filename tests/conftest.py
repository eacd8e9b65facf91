from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from daemon import BrokerProcess

from ssb import client


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    """How `broker` starts its daemon (BrokerProcess's arguments); a test module or folder
    whose tests need another broker overrides this fixture."""
    return {}


@pytest.fixture
def broker(tmp_path: Path, broker_settings: dict[str, Any]) -> Iterator[BrokerProcess]:
    """A fresh broker daemon on free ports (durability fsync unless the settings say
    otherwise), killed after the test."""
    process = BrokerProcess(tmp_path / "data", **broker_settings).start()
    yield process
    process.kill()


@pytest.fixture
async def conn(broker: BrokerProcess) -> AsyncIterator[client.Connection]:
    connection = await client.connect(broker.url)
    yield connection
    await connection.close()
