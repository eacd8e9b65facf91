"""Which store a daemon opens: the SQLite file in its data directory, or a PostgreSQL
database that its `store` setting names.

Theory of operation. The SQLite store is the default and needs nothing beyond Python;
the PostgreSQL store needs the psycopg package (the `postgresql` extra), which is
imported only when a database is named, so that a broker on SQLite never loads it.

A PostgreSQL store commits under the broker's lease (see `lease`): a daemon passes the
lease it waited for as a standby; any other caller (a tool, a test) takes it here, at
once, and gives it up when the store closes.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Final

from .errors import StoreUnavailable
from .port import Store
from .sqlite import open_store as open_sqlite_store

if TYPE_CHECKING:
    from .postgres import Fence

DATABASE_SCHEMES: Final = ("postgresql://", "postgres://")  # what a `store` setting may be


def is_database_url(text: str) -> bool:
    """Whether `text` names a PostgreSQL database (a URL of one of DATABASE_SCHEMES)."""
    return text.startswith(DATABASE_SCHEMES)


STANDING_LEASE: Final = 30.0  # seconds of the lease a store opened outside a daemon takes


class _Standing:
    """The lease of a store opened outside a daemon: held until the store closes (the
    database's fence still holds: a daemon that takes it over ends this store)."""

    def __init__(self, epoch: int, node: str) -> None:
        self.epoch = epoch
        self.node = node

    def held(self) -> bool:
        return True


def check_driver() -> None:
    """Raises StoreUnavailable, saying what to install, without the PostgreSQL driver."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "psycopg":
            raise
        raise StoreUnavailable(
            "a PostgreSQL store needs the psycopg package, which is not installed: pip"
            " install 'ssb-broker[postgresql]'"
        ) from None


def open_store(
    data_dir: Path,
    durability: str,
    url: str | None = None,
    fence: Fence | None = None,
    reserve: int = 0,
) -> Store:
    """The broker's store, not yet attached: the PostgreSQL database of `url`, committing
    under `fence` (None: the lease is taken now), or without a URL the SQLite store of
    `data_dir` with a disk reserve of `reserve` bytes (see `sqlite.open_store` and
    `postgres.open_postgres_store`).

    Raises:
        StoreUnavailable: the store cannot be opened (the message says why and what to
            do), the PostgreSQL driver is not installed, or (`DatabaseInUse`) a daemon
            holds the lease on the database.
    """
    if url is None:
        return open_sqlite_store(data_dir, durability, reserve)
    check_driver()
    from .lease import take_now
    from .postgres import open_postgres_store

    if fence is not None:
        return open_postgres_store(url, durability, fence)
    lease, epoch = take_now(url, uuid.uuid4().hex[:12], STANDING_LEASE)
    try:
        store = open_postgres_store(url, durability, _Standing(epoch, lease.node))
    except BaseException:
        lease.release(epoch)
        lease.close()
        raise

    def release() -> None:
        lease.release(epoch)
        lease.close()

    store.on_release = release
    return store
