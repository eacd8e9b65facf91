"""The catalog and the broker's meta values: the `catalog`, `meta` and `broker_files`
tables, and figures over whole tables.

Theory of operation. Every catalog object (queue, service, contract, message type,
route, certificate, ...) is one row of its kind, name and definition, read whole when
the broker starts and rewritten whole when it changes. Meta holds a few named values:
the broker's instance id, how far transaction outcomes are pruned. `broker_files` holds
the text of the files the broker's first start made (its keys and certificates,
admin.password), so that the store alone is the broker (see `broker/_identity.py`).
"""

from __future__ import annotations

from typing import Final

from .commit import Tables
from .port import COUNTED_TABLES
from .sql import upsert

_PUT_META: Final = upsert("meta", ("key", "value"), ("key",))
_PUT_CATALOG: Final = upsert("catalog", ("kind", "name", "body"), ("kind", "name"))
_DELETE_CATALOG: Final = "DELETE FROM catalog WHERE kind = ? AND name = ?"
_PUT_FILE: Final = upsert("broker_files", ("name", "body"), ("name",))
_DELETE_FILE: Final = "DELETE FROM broker_files WHERE name = ?"


class CatalogTables(Tables):
    """The `catalog`, `meta` and `broker_files` tables."""

    def load_meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def put_meta(self, key: str, value: str) -> None:
        self._add(_PUT_META, (key, value))

    def load_broker_files(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT name, body FROM broker_files").fetchall())

    def put_broker_file(self, name: str, body: str) -> None:
        self._add(_PUT_FILE, (name, body))

    def delete_broker_file(self, name: str) -> None:
        self._add(_DELETE_FILE, (name,))

    def load_catalog(self) -> list[tuple[str, str, str]]:
        return self._db.execute("SELECT kind, name, body FROM catalog").fetchall()

    def put_catalog(self, kind: str, name: str, body: str) -> None:
        self._add(_PUT_CATALOG, (kind, name, body))

    def delete_catalog(self, kind: str, name: str) -> None:
        self._add(_DELETE_CATALOG, (kind, name))

    def max_ids(self) -> tuple[int, int, int]:
        """Largest queuing order, transmission id and poison incident id on disk."""
        db = self._db
        q = db.execute("SELECT COALESCE(MAX(queuing_order), 0) FROM messages").fetchone()[0]
        t = db.execute("SELECT COALESCE(MAX(id), 0) FROM transmission_queue").fetchone()[0]
        p = db.execute("SELECT COALESCE(MAX(id), 0) FROM poison_messages").fetchone()[0]
        return int(q), int(t), int(p)

    def count_rows(self, table: str) -> int:
        """How many rows a table holds (endpoints, transmission_queue, messages)."""
        if table not in COUNTED_TABLES:
            raise ValueError(f"no count for table {table!r}")
        return int(self._reader.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
