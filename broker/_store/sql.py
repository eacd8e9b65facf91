"""SQL that both databases run as written: column lists, inserts and upserts.

Theory of operation. The families of tables write SQL once, with `?` placeholders, in
the dialect SQLite and PostgreSQL share (an upsert is `INSERT ... ON CONFLICT`, which
both have); the PostgreSQL session rewrites the placeholders into its driver's. Nothing
here knows which database runs it.
"""

from __future__ import annotations

from typing import Final

# the indexes both databases make as written (each adds its own index of messages)
INDEXES: Final = (
    "CREATE UNIQUE INDEX IF NOT EXISTS endpoints_by_handle ON endpoints (handle)",
    "CREATE INDEX IF NOT EXISTS endpoints_by_group ON endpoints (group_id)",
    "CREATE INDEX IF NOT EXISTS endpoints_by_timer ON endpoints (timer_at)"
    " WHERE timer_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS endpoints_by_lifetime ON endpoints (lifetime_expiry)"
    " WHERE lifetime_expiry IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS transmission_by_direction"
    " ON transmission_queue (conversation_id, is_initiator, seq)",
)


def columns(names: tuple[str, ...]) -> str:
    """A column list for SQL."""
    return ", ".join(names)


def insert(table: str, names: tuple[str, ...]) -> str:
    """A one-row INSERT of `names` into `table`."""
    marks = ", ".join("?" for _ in names)
    return f"INSERT INTO {table} ({columns(names)}) VALUES ({marks})"


def upsert(table: str, names: tuple[str, ...], key: tuple[str, ...]) -> str:
    """A one-row INSERT of `names` into `table` that replaces the other columns of the
    row with the same `key` (the table's primary key), if there is one."""
    rest = [n for n in names if n not in key]
    if not rest:
        return insert_new(table, names, key)
    changes = ", ".join(f"{n} = excluded.{n}" for n in rest)
    return f"{insert(table, names)} ON CONFLICT ({columns(key)}) DO UPDATE SET {changes}"


def insert_new(table: str, names: tuple[str, ...], key: tuple[str, ...]) -> str:
    """A one-row INSERT of `names` into `table` that does nothing when a row with the
    same `key` (the table's primary key) is there already."""
    return f"{insert(table, names)} ON CONFLICT ({columns(key)}) DO NOTHING"
