"""The store tests: the storage port's contract, run against every implementation.

`storage` is a store of each implementation made to commit only when the test calls
`flush()` (a `ManualStore`); `background` is one opened as the daemon opens it, which
commits by itself once attached to the running loop. An implementation joins the suite
by adding its makers to `MANUAL` and `BACKGROUND`; each maker gets the test's `Place`: a
directory, and a PostgreSQL database of its own, made (on the session's server) the
first time it is asked for. Tests of one implementation's own machinery live in
`test_<implementation>_*.py` and make their stores themselves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from pg_server import PostgresServer, fresh_database

from ssb.broker._store import ManualStore, SQLiteStore, Store, open_store

from .rows import FirstLease


class Place:
    """Where one test's stores live: `data_dir`, and `database`, the URL of a database
    made for the test on first use (the same one every time after)."""

    def __init__(self, data_dir: Path, server: PostgresServer | None) -> None:
        self.data_dir = data_dir
        self._server = server
        self._database: str | None = None

    @property
    def database(self) -> str:
        if self._database is None:
            assert self._server is not None, "a PostgreSQL store needs the session's server"
            self._database = fresh_database(self._server.url)
        return self._database


def _postgres_store(place: Place) -> ManualStore:
    from ssb.broker._store.postgres import PostgresStore

    return PostgresStore(place.database, "os", FirstLease(), threaded=False)


# name -> a store in an empty place, committing only in flush()
MANUAL: dict[str, Callable[[Place], ManualStore]] = {
    "sqlite": lambda place: SQLiteStore(place.data_dir / "broker.db", "os", threaded=False),
    "sqlite-memory": lambda place: SQLiteStore(":memory:", threaded=False),
    "postgresql": _postgres_store,
}
# name -> the store of a place as the daemon opens it (not yet attached)
BACKGROUND: dict[str, Callable[[Place], Store]] = {
    "sqlite": lambda place: open_store(place.data_dir, "fsync"),
    "postgresql": lambda place: open_store(place.data_dir, "fsync", place.database),
}


def _place(request: pytest.FixtureRequest, data_dir: Path) -> Place:
    """The test's place for the implementation `request.param` (which starts the
    session's PostgreSQL server when it needs one)."""
    server = request.getfixturevalue("postgres_server") if request.param == "postgresql" else None
    return Place(data_dir, server)


@pytest.fixture(params=sorted(MANUAL))
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ManualStore]:
    store = MANUAL[request.param](_place(request, tmp_path))
    yield store
    await store.close()


@pytest.fixture(params=sorted(BACKGROUND))
def open_background(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """Opens the store of this test's place as the daemon does (call it again to
    reopen)."""
    place = _place(request, tmp_path)
    return lambda: BACKGROUND[request.param](place)
