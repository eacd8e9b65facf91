"""The store tests: the storage port's contract, run against every implementation.

`storage` is a store of each implementation made to commit only when the test calls
`flush()` (a `ManualStore`); `background` is one opened as the daemon opens it, which
commits by itself once attached to the running loop. A second implementation joins
the suite by adding its makers to `MANUAL` and `BACKGROUND`. Tests of one
implementation's own machinery live in `test_<implementation>_*.py` and make their
stores themselves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ssb.broker._store import ManualStore, SQLiteStore, Store, open_store

# name -> a store in an empty directory, committing only in flush()
MANUAL: dict[str, Callable[[Path], ManualStore]] = {
    "sqlite": lambda data_dir: SQLiteStore(data_dir / "broker.db", "os", threaded=False),
    "sqlite-memory": lambda data_dir: SQLiteStore(":memory:", threaded=False),
}
# name -> the store of a data directory as the daemon opens it (not yet attached)
BACKGROUND: dict[str, Callable[[Path], Store]] = {
    "sqlite": lambda data_dir: open_store(data_dir, "fsync"),
}


@pytest.fixture(params=sorted(MANUAL))
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ManualStore]:
    store = MANUAL[request.param](tmp_path)
    yield store
    await store.close()


@pytest.fixture(params=sorted(BACKGROUND))
def open_background(request: pytest.FixtureRequest) -> Callable[[Path], Store]:
    """Opens the store of a data directory as the daemon does (call it again to reopen)."""
    return BACKGROUND[request.param]
