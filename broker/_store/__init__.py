"""The store: every SQL statement of the broker lives in this package.

`port.Store` is the interface the rest of the broker uses (one Protocol per family of
tables); `sqlite.SQLiteStore` implements it on SQLite (`schema`: its tables and
migrations), `postgres.PostgresStore` on PostgreSQL (`postgres_schema`), and
`open_store` opens the daemon's (`stores`). Inside: `commit` (batches and group commit,
whatever the database), `sql` (SQL both databases run), and one module per family of
tables (`catalog`, `endpoints`, `messages`, `transmission`, `remote`, `security`,
`outcomes`, `logs`; `tables` is them all). Callers catch `StoreError`, never the
database's own exceptions.

Users' tables (`user_sql`, `user_tables`; on PostgreSQL `postgres_sql` and
`postgres_tables`). The store writes behind, with group commit,
yet a user's table statement needs its result at once, its effects committed in the
same store commit as its transaction's RECEIVE and SEND, and isolation from other
transactions. The design: a statement is translated from T-SQL with sqlglot (refused
before anything runs when it cannot be), run at once on the writer connection inside a
database transaction that is never committed (kept open while the same transaction's
statements follow one another, rolled back when the connection is needed for anything
else), and run again, in order and with the same values, in the batch of its
transaction's commit. Table locks held by the core until that batch is durable
(`_core.tables`) make the second run give the first run's results: isolation is
serializable. The PostgreSQL store runs the provisional statements on a connection per
transaction instead of the writer (see `postgres_tables`).
"""

from __future__ import annotations

from .errors import (
    LeaseLost,
    StoreError,
    StoreFailure,
    StoreUnavailable,
    describe_failure,
    lease_lost,
)
from .port import (
    ENDPOINT_COLUMNS,
    EXECUTION_LOG_COLUMNS,
    HOT_ENDPOINT_COLUMNS,
    MESSAGE_COLUMNS,
    POISON_COLUMNS,
    TRANSMISSION_COLUMNS,
    CommitHooks,
    ManualStore,
    Store,
)
from .sqlite import RESERVE_FILE, STORE_FILE, STORE_FILES, SQLiteStore, copy_store
from .stores import is_database_url, open_store

__all__ = [
    "ENDPOINT_COLUMNS",
    "EXECUTION_LOG_COLUMNS",
    "HOT_ENDPOINT_COLUMNS",
    "MESSAGE_COLUMNS",
    "POISON_COLUMNS",
    "RESERVE_FILE",
    "STORE_FILE",
    "STORE_FILES",
    "TRANSMISSION_COLUMNS",
    "CommitHooks",
    "LeaseLost",
    "ManualStore",
    "SQLiteStore",
    "Store",
    "StoreError",
    "StoreFailure",
    "StoreUnavailable",
    "copy_store",
    "describe_failure",
    "is_database_url",
    "lease_lost",
    "open_store",
]
