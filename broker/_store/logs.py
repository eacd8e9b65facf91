"""Records kept for people to read: `poison_messages` and `execution_log`.

Theory of operation. A poison incident is written when a queue's poison policy acts on
a message (see `_core/poison.py`); the seed-000 scheduler's execution log keeps one row
per task run, the newest `execution_log_rows` (see `_activation/execution_log.py`).
Both are read newest first, a page at a time, and shown oldest first.
"""

from __future__ import annotations

from typing import Final

from .._core.ports import Row
from .commit import UNKNOWN_ROWS, Tables
from .port import EXECUTION_LOG_COLUMNS, POISON_COLUMNS
from .sql import columns, insert, upsert

_INSERT_POISON: Final = insert("poison_messages", POISON_COLUMNS)
_READ_POISON: Final = (
    f"SELECT {columns(POISON_COLUMNS[:-1])} FROM poison_messages ORDER BY id DESC LIMIT ?"
)
_PUT_EXECUTION_LOG: Final = upsert("execution_log", EXECUTION_LOG_COLUMNS, ("log_id",))
_DELETE_EXECUTION_LOG_UPTO: Final = "DELETE FROM execution_log WHERE log_id <= ?"
_READ_EXECUTION_LOG: Final = (
    f"SELECT {columns(EXECUTION_LOG_COLUMNS)} FROM execution_log ORDER BY log_id DESC LIMIT ?"
)


class LogTables(Tables):
    """The `poison_messages` (POISON_COLUMNS) and `execution_log` (EXECUTION_LOG_COLUMNS)
    tables."""

    def insert_poison(self, row: Row) -> None:
        self._add(_INSERT_POISON, row)

    def read_poison(self, limit: int) -> list[Row]:
        return self._newest(_READ_POISON, limit)

    def put_execution_log(self, row: Row) -> None:
        """Insert or replace one row, in EXECUTION_LOG_COLUMNS order."""
        self._add(_PUT_EXECUTION_LOG, row)

    def delete_execution_log_upto(self, log_id: int) -> None:
        """Forget every execution log row up to and including `log_id`."""
        self._add(_DELETE_EXECUTION_LOG_UPTO, (log_id,), UNKNOWN_ROWS)

    def execution_log(self, limit: int) -> list[Row]:
        """The newest `limit` rows, oldest first."""
        return self._newest(_READ_EXECUTION_LOG, limit)

    def _newest(self, sql: str, limit: int) -> list[Row]:
        """The rows of `sql` (newest first, LIMIT ?) oldest first."""
        rows: list[Row] = self._reader.execute(sql, (limit,)).fetchall()
        rows.reverse()
        return rows
