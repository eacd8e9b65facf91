"""Conversation endpoints: the `endpoints` table.

Theory of operation. The table is keyed by conversation and side, so both endpoints of
a local dialog share a page and a commit that changes both writes one; a unique index
finds an endpoint by handle, others by group, timer and lifetime. An endpoint written
several times in one open batch is written once, with its last state: an update
replaces the batch's earlier insert or update of the same endpoint in place, and a
delete cancels them (an endpoint inserted and deleted in one batch is never written).
Most updates change only the columns no index holds (`HOT_ENDPOINT_COLUMNS`); naming
only those leaves the endpoint's index entries alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

from .._core.ports import Row
from .commit import CANCELLED, Tables
from .port import ENDPOINT_COLUMNS, HOT_ENDPOINT_COLUMNS
from .sql import columns, insert

_KEY: Final = ("conversation_id", "is_initiator")
_SELECT: Final = f"SELECT {columns(ENDPOINT_COLUMNS)} FROM endpoints"
INSERT_ENDPOINT: Final = insert("endpoints", ENDPOINT_COLUMNS)
_UPDATE: Final = (
    "UPDATE endpoints SET "
    + ", ".join(f"{c} = ?" for c in ENDPOINT_COLUMNS if c not in _KEY)
    + " WHERE conversation_id = ? AND is_initiator = ?"
)
_UPDATE_HOT: Final = (
    "UPDATE endpoints SET "
    + ", ".join(f"{c} = ?" for c in HOT_ENDPOINT_COLUMNS)
    + " WHERE conversation_id = ? AND is_initiator = ?"
)
_KEY_AT: Final = (ENDPOINT_COLUMNS.index(_KEY[0]), ENDPOINT_COLUMNS.index(_KEY[1]))
_FULL_AT: Final = tuple(i for i, c in enumerate(ENDPOINT_COLUMNS) if c not in _KEY)
_DELETE: Final = "DELETE FROM endpoints WHERE handle = ?"
_DUE: Final = tuple(
    f"SELECT handle, timer_at, lifetime_expiry FROM endpoints"
    f" WHERE {c} IS NOT NULL AND {c} > ? AND {c} <= ?"
    for c in ("timer_at", "lifetime_expiry")
)

# for the commit: the inserts written many rows to a statement
MULTI_ROW: Final[Mapping[str, int]] = {INSERT_ENDPOINT: len(ENDPOINT_COLUMNS)}


class EndpointTables(Tables):
    """The `endpoints` table (ENDPOINT_COLUMNS)."""

    # ---- writes ------------------------------------------------------------------------

    def insert_endpoint(self, row: Row) -> None:
        params, index = self._add_tracked(INSERT_ENDPOINT, row)
        self._endpoint_rows[row[0].bytes] = (params, index, True)

    def update_endpoint(self, row: Row) -> None:
        """Write an endpoint's whole state (ENDPOINT_COLUMNS order)."""
        key = row[0].bytes
        pending = self._endpoint_rows.get(key)
        if pending is not None and pending[2]:
            pending[0][pending[1]] = row  # inserted in this batch: insert the last state
            return
        if pending is not None:
            pending[0][pending[1]] = CANCELLED
        params = [row[i] for i in _FULL_AT]
        params += (row[_KEY_AT[0]], row[_KEY_AT[1]])
        self._endpoint_rows[key] = (*self._add_tracked(_UPDATE, tuple(params)), False)

    def update_endpoint_hot(self, row: Row) -> None:
        """Write the columns of `HOT_ENDPOINT_COLUMNS` (no index holds them), then the
        endpoint's conversation id and is_initiator, in that order. It goes after any
        earlier write of the endpoint in this batch."""
        self._open.add(_UPDATE_HOT, row)
        if self._wake:
            self._schedule()

    def delete_endpoint(self, handle: uuid.UUID) -> None:
        pending = self._endpoint_rows.pop(handle.bytes, None)
        if pending is not None and pending[2]:
            pending[0][pending[1]] = CANCELLED  # inserted in this batch: never written
            return
        if pending is not None:
            pending[0][pending[1]] = CANCELLED
        self._add(_DELETE, (handle,))

    # ---- reads -------------------------------------------------------------------------

    def read_endpoint(self, handle: uuid.UUID) -> Row | None:
        row: Row | None = self._reader.execute(f"{_SELECT} WHERE handle = ?", (handle,)).fetchone()
        return row

    def read_endpoint_by_conversation(
        self, conversation_id: uuid.UUID, is_initiator: bool
    ) -> Row | None:
        row: Row | None = self._reader.execute(
            f"{_SELECT} WHERE conversation_id = ? AND is_initiator = ?",
            (conversation_id, int(is_initiator)),
        ).fetchone()
        return row

    def read_endpoints(
        self,
        *,
        group_id: uuid.UUID | None = None,
        service: str | None = None,
        contract: str | None = None,
        after: uuid.UUID | None = None,
        limit: int,
    ) -> list[Row]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("group_id", group_id), ("service", service), ("contract", contract)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if after is not None:
            where.append("handle > ?")
            params.append(after)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._reader.execute(
            f"{_SELECT}{clause} ORDER BY handle LIMIT ?", (*params, limit)
        ).fetchall()

    def read_due_endpoints(self, after: float | None, until: float) -> list[Row]:
        low = float("-inf") if after is None else after
        rows: list[Row] = []
        for sql in _DUE:  # the timers, then the lifetimes
            rows += self._reader.execute(sql, (low, until)).fetchall()
        return rows

    def read_groups(self, limit: int) -> list[Row]:
        """(group id, a service of it, endpoints) per conversation group, by group id."""
        return self._reader.execute(
            "SELECT group_id, MIN(service), COUNT(*) FROM endpoints GROUP BY group_id"
            " ORDER BY group_id LIMIT ?",
            (limit,),
        ).fetchall()
