"""Transaction outcomes: the `outcome_batches` table.

Theory of operation. A client whose COMMIT answer was lost asks whether its transaction
committed (see `_core/outcomes.py`). The ids of the transactions committed in one store
batch are one row, numbered in commit order, with the batch's time; the oldest rows are
pruned as the window the broker keeps moves on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .commit import UNKNOWN_ROWS, Tables, weight

_INSERT: Final = "INSERT INTO outcome_batches (seq, time, count, ids) VALUES (?, ?, ?, ?)"
_DELETE_UPTO: Final = "DELETE FROM outcome_batches WHERE seq <= ?"


class OutcomeTables(Tables):
    """The `outcome_batches` table: (number, time, count, ids)."""

    def insert_outcomes(self, seq: int, at: float, count: int, ids: bytes) -> None:
        self._add(_INSERT, (seq, at, count, ids), weight(len(ids)))

    def delete_outcomes_upto(self, seq: int) -> None:
        self._add(_DELETE_UPTO, (seq,), UNKNOWN_ROWS)

    def read_outcome_batches(self, first: int) -> Iterable[tuple[int, float, bytes]]:
        """(number, time, ids) of every outcome batch from `first` on, newest first."""
        return self._reader.execute(
            "SELECT seq, time, ids FROM outcome_batches WHERE seq >= ? ORDER BY seq DESC",
            (first,),
        )

    def outcome_batch_heads(self, first: int, limit: int) -> list[tuple[int, float, int]]:
        """(number, time, count) of the oldest outcome batches from `first` on."""
        return self._reader.execute(
            "SELECT seq, time, count FROM outcome_batches WHERE seq >= ? ORDER BY seq LIMIT ?",
            (first, limit),
        ).fetchall()

    def outcome_at(self, seq: int) -> float | None:
        """The commit time of outcome batch `seq` (None when it is not kept)."""
        row = self._reader.execute(
            "SELECT time FROM outcome_batches WHERE seq = ?", (seq,)
        ).fetchone()
        return None if row is None else float(row[0])

    def outcome_span(self) -> tuple[int, int, int] | None:
        """The first and last outcome batch numbers kept and how many ids they hold."""
        row = self._reader.execute(
            "SELECT MIN(seq), MAX(seq), SUM(count) FROM outcome_batches"
        ).fetchone()
        return None if row[0] is None else (int(row[0]), int(row[1]), int(row[2]))
