"""Which store a daemon opens: the SQLite file in its data directory, or a PostgreSQL
database that its `store` setting names.

Theory of operation. The SQLite store is the default and needs nothing beyond Python;
the PostgreSQL store needs the psycopg package (the `postgresql` extra), which is
imported only when a database is named, so that a broker on SQLite never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from .errors import StoreUnavailable
from .port import Store
from .sqlite import open_store as open_sqlite_store

DATABASE_SCHEMES: Final = ("postgresql://", "postgres://")  # what a `store` setting may be


def is_database_url(text: str) -> bool:
    """Whether `text` names a PostgreSQL database (a URL of one of DATABASE_SCHEMES)."""
    return text.startswith(DATABASE_SCHEMES)


def open_store(data_dir: Path, durability: str, url: str | None = None) -> Store:
    """The broker's store, not yet attached: the PostgreSQL database of `url`, or without
    one the SQLite store of `data_dir` (see `sqlite.open_store` and
    `postgres.open_postgres_store`).

    Raises:
        StoreUnavailable: the store cannot be opened (the message says why and what to
            do), or the PostgreSQL driver is not installed.
    """
    if url is None:
        return open_sqlite_store(data_dir, durability)
    try:
        from .postgres import open_postgres_store
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "psycopg":
            raise
        raise StoreUnavailable(
            "a PostgreSQL store needs the psycopg package, which is not installed: pip"
            " install 'ssb-broker[postgresql]'"
        ) from None
    return open_postgres_store(url, durability)
