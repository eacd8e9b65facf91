"""The transmission queue: the `transmission_queue` table.

Theory of operation. An entry waits here from SEND until the far end has it (a local
target's queue, or another broker's acknowledgement). Entries are keyed by id and
ordered by seq within a dialog direction (conversation id and side), which an index
covers: a direction's entries are read in order from a seq on, within a byte budget,
and acknowledged ones are deleted as one range of seqs. Inserts go many rows to a
statement (see `commit`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Final

from .._core.ports import Row, Span
from .commit import UNKNOWN_ROWS, Tables, weight
from .port import TRANSMISSION_COLUMNS
from .sql import columns, insert

_BODY: Final = TRANSMISSION_COLUMNS.index("body")
_NO_LIMIT: Final = 1 << 62  # above every seq
_SELECT: Final = f"SELECT {columns(TRANSMISSION_COLUMNS)} FROM transmission_queue"
INSERT_TRANSMISSION: Final = insert("transmission_queue", TRANSMISSION_COLUMNS)
_DELETE: Final = "DELETE FROM transmission_queue WHERE id = ?"
_DELETE_SEQS: Final = (
    "DELETE FROM transmission_queue WHERE conversation_id = ? AND is_initiator = ?"
    " AND seq BETWEEN ? AND ?"
)
_DELETE_DIRECTION: Final = (
    "DELETE FROM transmission_queue WHERE conversation_id = ? AND is_initiator = ?"
)


def _seqs(row: Row) -> int:
    return int(row[3]) - int(row[2]) + 1


# for the commit: the inserts written many rows to a statement, and the deletes that
# touch more rows than one per parameter row
MULTI_ROW: Final[Mapping[str, int]] = {INSERT_TRANSMISSION: len(TRANSMISSION_COLUMNS)}
ROW_COUNTS: Final[Mapping[str, Callable[[Row], int]]] = {_DELETE_SEQS: _seqs}


def _transmission_size(row: Row) -> int:
    return len(row[_BODY])


class TransmissionTables(Tables):
    """The `transmission_queue` table (TRANSMISSION_COLUMNS)."""

    # ---- writes ------------------------------------------------------------------------

    def insert_transmission(self, row: Row) -> None:
        self._add(INSERT_TRANSMISSION, row, weight(_transmission_size(row)))

    def delete_transmission(self, ident: int) -> None:
        self._add(_DELETE, (ident,))

    def delete_transmission_seqs(
        self, conversation_id: uuid.UUID, is_initiator: bool, first: int, last: int
    ) -> None:
        """Messages `first`..`last` of a direction (one statement for the range)."""
        self._add(_DELETE_SEQS, (conversation_id, int(is_initiator), first, last), last - first + 1)

    def delete_transmission_direction(self, conversation_id: uuid.UUID, is_initiator: bool) -> None:
        self._add(_DELETE_DIRECTION, (conversation_id, int(is_initiator)), UNKNOWN_ROWS)

    # ---- reads -------------------------------------------------------------------------

    def read_transmission(
        self, conversation_id: uuid.UUID, is_initiator: bool, span: Span
    ) -> list[Row]:
        sql = (
            f"{_SELECT} WHERE conversation_id = ? AND is_initiator = ?"
            " AND seq >= ? AND seq < ? ORDER BY seq LIMIT ?"
        )
        top = _NO_LIMIT if span.before is None else span.before
        params = (conversation_id, int(is_initiator), span.first, top, span.limit)
        return self._bounded(sql, params, _transmission_size, span.max_bytes)

    def next_transmission_seq(
        self, conversation_id: uuid.UUID, is_initiator: bool, after: int, before: int | None
    ) -> int | None:
        row = self._reader.execute(
            "SELECT seq FROM transmission_queue WHERE conversation_id = ? AND is_initiator = ?"
            " AND seq > ? AND seq < ? ORDER BY seq LIMIT 1",
            (conversation_id, int(is_initiator), after, _NO_LIMIT if before is None else before),
        ).fetchone()
        return None if row is None else int(row[0])

    def transmission_summary(self) -> list[Row]:
        return self._db.execute(
            "SELECT conversation_id, is_initiator, COUNT(*), MIN(seq) FROM transmission_queue"
            " GROUP BY conversation_id, is_initiator"
        ).fetchall()

    def read_transmission_page(self, after: int | None, limit: int) -> list[Row]:
        return self._reader.execute(
            f"{_SELECT} WHERE id > ? ORDER BY id LIMIT ?", (after or 0, limit)
        ).fetchall()
