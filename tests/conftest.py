from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from daemon import BrokerProcess
from pg_server import DATABASE_ENV, PostgresMissing, PostgresServer

from ssb import client


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="the store of the daemons the tests start: sqlite (default) or postgresql,"
        " a database of their own each on a server this session starts",
    )


# tests of the SQLite store's own file and disk (its online copy, a full disk under it or
# min_free_disk, migrations of old files, what its bytes hold), which a PostgreSQL store
# does not have
SQLITE_FILE_TESTS = (
    "test_backup.py",
    "test_disk_full.py",
    "test_migration.py",
    "test_logins.py::test_first_start_writes_the_admin_password_privately",
    "test_logins.py::test_logins_are_added_changed_and_dropped_and_outlive_a_restart",
    "test_observability.py::test_healthz_says_not_ready_while_messages_are_refused",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--store") != "postgresql":
        return
    skip = pytest.mark.skip(reason="about the SQLite store's file or disk: not with PostgreSQL")
    for item in items:
        if any(f"/{name}" in f"/{item.nodeid}" for name in SQLITE_FILE_TESTS):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the whole session (see tests/pg_server.py); a test that
    needs one fails, saying what to install, where PostgreSQL cannot be started."""
    root = Path(tempfile.mkdtemp(prefix="ssb-postgres-"))
    server = PostgresServer(root)
    try:
        server.start()
    except PostgresMissing as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def daemon_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """With --store postgresql, every daemon a test starts keeps its state in PostgreSQL."""
    store = str(request.config.getoption("--store"))
    if store == "postgresql":
        os.environ[DATABASE_ENV] = request.getfixturevalue("postgres_server").url
    try:
        yield store
    finally:
        os.environ.pop(DATABASE_ENV, None)


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
