"""Messages in queues: the `messages` table, the hottest of the store.

Theory of operation. A message is inserted when it is enqueued and deleted when a
RECEIVE commits; under load most of them live for less than a batch. So a message
deleted before the batch that inserts it has started committing is neither inserted nor
deleted: the insert is cancelled in the open batch (`cancelled` counts them). Inserts
go many rows to a statement (see `commit`). Deletes of many messages at once (one
RECEIVE of many) are cheap in bulk: a run of consecutive queuing orders (what one
RECEIVE of one conversation usually takes) is one range, one descent of the table's
tree instead of one per row, and the rest go in lists of a few fixed sizes, padded with
repeats, so that the statements stay few and cached.

Reads of ready messages step through the rows one at a time and stop at the byte
budget: nothing is read past it. The start-up summary reads every message's index entry
once; on a deep backlog that scan is most of the time to ready, so it runs in slices of
the handle range, which an implementation may read in parallel (`_run_slices`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from ssb.protocol import ROW_OVERHEAD

from .._core.ports import Row, Span
from .commit import CANCELLED, UNKNOWN_ROWS, Connection, Tables, weight
from .errors import READ_ERRORS, StoreError, describe_failure
from .port import MESSAGE_COLUMNS
from .sql import columns, insert

READ_CHUNK: Final = 500  # parameters per IN (...) read
# many rows in one statement cost about half as much as one statement each; a few sizes,
# the list padded with repeats, keep the statements few (and cached)
DELETE_LISTS: Final = (8, 32, 128, 512)
MIN_RANGE: Final = 4  # consecutive orders deleted as one range
# the start-up summary's slices of the handle range (handles are random UUIDs)
_HANDLE_SLICES: Final = ((b"", bytes([0x80])), (bytes([0x80]), None))
_NO_LIMIT: Final = 1 << 62  # above every queuing order

_SIZE: Final = MESSAGE_COLUMNS.index("size")
_SELECT: Final = f"SELECT {columns(MESSAGE_COLUMNS)} FROM messages"
INSERT_MESSAGE: Final = insert("messages", MESSAGE_COLUMNS)
_DELETE: Final = "DELETE FROM messages WHERE queuing_order = ?"
_DELETE_LIST: Final = {
    n: f"DELETE FROM messages WHERE queuing_order IN ({', '.join('?' * n)})" for n in DELETE_LISTS
}
_DELETE_RANGE: Final = "DELETE FROM messages WHERE queuing_order BETWEEN ? AND ?"
_DELETE_CONVERSATION: Final = (
    "DELETE FROM messages WHERE status IN (0, 1, 6, 7) AND queue = ? AND handle = ?"
)
_DELETE_QUEUE: Final = "DELETE FROM messages WHERE queue = ?"
_SET_STATUS: Final = "UPDATE messages SET status = ? WHERE queuing_order = ?"
_SET_DELIVERY_COUNT: Final = "UPDATE messages SET delivery_count = ? WHERE queuing_order = ?"
_SET_EXTRA: Final = "UPDATE messages SET extra = ? WHERE queuing_order = ?"


def _distinct(row: Row) -> int:
    return len(set(row))


def _range(row: Row) -> int:
    return int(row[1]) - int(row[0]) + 1


# for the commit: the inserts written many rows to a statement, and the deletes that
# touch more rows than one per parameter row
MULTI_ROW: Final[Mapping[str, int]] = {INSERT_MESSAGE: len(MESSAGE_COLUMNS)}
ROW_COUNTS: Final[Mapping[str, Callable[[Row], int]]] = {
    **{sql: _distinct for sql in _DELETE_LIST.values()},
    _DELETE_RANGE: _range,
}


def _message_size(row: Row) -> int:
    """What a message row adds to an answer: its body and its other columns."""
    return int(row[_SIZE]) + ROW_OVERHEAD


class MessageTables(Tables):
    """The `messages` table (MESSAGE_COLUMNS)."""

    # ---- writes ------------------------------------------------------------------------

    def insert_message(self, row: Row) -> None:
        params = self._open.add(INSERT_MESSAGE, row, weight(int(row[_SIZE])))
        self._inserts[row[0]] = (params, len(params) - 1)
        if self._wake:
            self._schedule()

    def _cancel_insert(self, queuing_order: int) -> bool:
        """Cancel the message's insert if it is in the open batch (then it is never written)."""
        pending = self._inserts.pop(queuing_order, None)
        if pending is None:
            return False
        pending[0][pending[1]] = CANCELLED
        self.cancelled += 1
        return True

    def delete_message(self, queuing_order: int) -> None:
        if not self._cancel_insert(queuing_order):
            self._add(_DELETE, (queuing_order,))

    def delete_messages(self, orders: Iterable[int]) -> None:
        """Delete many message rows: runs of consecutive orders as ranges (exactly those
        rows, the orders being unique integers), the rest a list of them per statement."""
        written = sorted(order for order in orders if not self._cancel_insert(order))
        if len(written) >= MIN_RANGE:
            written = self._delete_runs(written)
        largest = DELETE_LISTS[-1]
        while len(written) >= DELETE_LISTS[0]:
            part, written = written[:largest], written[largest:]
            size = next(n for n in DELETE_LISTS if n >= len(part))
            self._add(_DELETE_LIST[size], (*part, *([part[-1]] * (size - len(part)))), len(part))
        for order in written:
            self._add(_DELETE, (order,))

    def _delete_runs(self, orders: list[int]) -> list[int]:
        """Add a range delete per run of at least MIN_RANGE consecutive orders (sorted,
        distinct); returns the orders outside such runs."""
        rest: list[int] = []
        start = 0
        count = len(orders)
        for end in range(1, count + 1):
            if end < count and orders[end] == orders[end - 1] + 1:
                continue
            if end - start >= MIN_RANGE:
                self._add(_DELETE_RANGE, (orders[start], orders[end - 1]), end - start)
            else:
                rest.extend(orders[start:end])
            start = end
        return rest

    def delete_conversation_messages(self, queue: str, handle: uuid.UUID) -> None:
        self._add(_DELETE_CONVERSATION, (queue, handle), UNKNOWN_ROWS)

    def delete_queue_messages(self, queue: str) -> None:
        self._add(_DELETE_QUEUE, (queue,), UNKNOWN_ROWS)

    def set_message_status(self, queuing_order: int, status: int) -> None:
        self._add(_SET_STATUS, (status, queuing_order))

    def set_delivery_count(self, queuing_order: int, count: int) -> None:
        self._add(_SET_DELIVERY_COUNT, (count, queuing_order))

    def set_message_extra(self, queuing_order: int, extra: bytes | None) -> None:
        self._add(_SET_EXTRA, (extra, queuing_order))

    # ---- reads -------------------------------------------------------------------------

    def read_ready_messages(self, queue: str, handle: uuid.UUID, span: Span) -> list[Row]:
        top = _NO_LIMIT if span.before is None else span.before
        rows: list[Row] = []
        used = 0
        cursor = self._reader.execute(
            f"{_SELECT} WHERE status = 1 AND queue = ? AND handle = ?"
            " AND queuing_order >= ? AND queuing_order < ? ORDER BY queuing_order LIMIT ?",
            (queue, handle, span.first, top, span.limit),
        )
        try:
            for row in cursor:  # stepped one row at a time: nothing is read past the budget
                rows.append(row)
                used += row[_SIZE]
                if used >= span.max_bytes:
                    break
        finally:
            cursor.close()
        return rows

    def next_ready_order(
        self, queue: str, handle: uuid.UUID, after: int, before: int | None
    ) -> int | None:
        row = self._reader.execute(
            "SELECT queuing_order FROM messages WHERE status = 1 AND queue = ? AND handle = ?"
            " AND queuing_order > ? AND queuing_order < ? ORDER BY queuing_order LIMIT 1",
            (queue, handle, after, _NO_LIMIT if before is None else before),
        ).fetchone()
        return None if row is None else int(row[0])

    def read_message_bodies(self, orders: Sequence[int]) -> dict[int, bytes]:
        found: dict[int, bytes] = {}
        for start in range(0, len(orders), READ_CHUNK):
            chunk = list(orders[start : start + READ_CHUNK])
            marks = ", ".join("?" for _ in chunk)
            for order, body in self._reader.execute(
                f"SELECT queuing_order, body FROM messages WHERE queuing_order IN ({marks})", chunk
            ):
                found[order] = body
        return found

    def read_message(self, queuing_order: int) -> Row | None:
        row: Row | None = self._reader.execute(
            f"{_SELECT} WHERE queuing_order = ?", (queuing_order,)
        ).fetchone()
        return row

    def message_enqueue_time(self, queuing_order: int) -> float | None:
        """When the message was enqueued (None: no such durable message)."""
        try:
            row = self._reader.execute(
                "SELECT enqueue_time FROM messages WHERE queuing_order = ?", (queuing_order,)
            ).fetchone()
        except READ_ERRORS as exc:
            raise StoreError(describe_failure(exc)) from exc
        return None if row is None else float(row[0])

    def read_queue_messages(
        self, queue: str, after: int | None, limit: int, max_bytes: int
    ) -> list[Row]:
        sql = (
            f"{_SELECT} WHERE queuing_order > ? AND queue = ? AND status IN (0, 1, 7)"
            " ORDER BY queuing_order LIMIT ?"
        )
        return self._bounded(sql, (after or 0, queue, limit), _message_size, max_bytes)

    # ---- start-up reads ----------------------------------------------------------------

    def message_summary(self, statuses: Iterable[int]) -> list[Row]:
        """Per (status, queue, conversation): count, bytes, first queuing order, and the
        endpoint's service, group, priority and contract (NULL without an endpoint), read
        in slices of the handle range (see the module's comment)."""
        chosen = sorted({int(s) for s in statuses})
        parts = [
            (status, queue, lo, hi)
            for status, queue in self._status_queues(chosen)
            for lo, hi in _HANDLE_SLICES
        ]
        return self._run_slices(_summary_slice, parts)

    def _status_queues(self, statuses: Sequence[int]) -> list[tuple[int, str]]:
        """The distinct (status, queue) pairs among `statuses`, one index seek each."""
        found: list[tuple[int, str]] = []
        for status in statuses:
            queue = ""
            while True:
                row = self._db.execute(
                    "SELECT queue FROM messages WHERE status = ? AND queue > ?"
                    " ORDER BY queue LIMIT 1",
                    (status, queue),
                ).fetchone()
                if row is None:
                    break
                queue = row[0]
                found.append((status, queue))
        return found

    def read_messages_with_status(self, statuses: Iterable[int]) -> list[Row]:
        chosen = sorted({int(s) for s in statuses})
        marks = ", ".join("?" for _ in chosen)
        return self._db.execute(f"{_SELECT} WHERE status IN ({marks})", chosen).fetchall()


def _summary_slice(db: Connection, part: tuple[int, str, bytes, bytes | None]) -> list[Row]:
    status, queue, lo, hi = part
    upper = "" if hi is None else " AND handle < ?"
    params: tuple[Any, ...] = (status, queue, lo) if hi is None else (status, queue, lo, hi)
    return db.execute(
        "SELECT s.status, s.queue, s.handle, s.n, s.bytes, s.first,"
        " e.service, e.group_id, e.priority, e.contract FROM"
        " (SELECT status, queue, handle, COUNT(*) AS n, SUM(size) AS bytes,"
        " MIN(queuing_order) AS first FROM messages"
        f" WHERE status = ? AND queue = ? AND handle >= ?{upper}"
        " GROUP BY status, queue, handle) AS s"
        " LEFT JOIN endpoints AS e ON e.handle = s.handle",
        params,
    ).fetchall()
