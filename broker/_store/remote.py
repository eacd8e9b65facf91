"""The transport's dialogs with other brokers: `remote_dialogs` and `held_fragments`.

Theory of operation. Each direction of a dialog with another broker has a row per side
(sender, receiver): the peer, the session key (and the key wrapped for the peer), the
next sequence number, the envelope. Fragments of a message not yet complete are held
until its last one arrives. All of it is written in the open batch with the messages it
concerns, so that a fragment is acknowledged only once it is durable; the transport
reads it back only when it starts.
"""

from __future__ import annotations

import uuid
from typing import Final

from .._core.ports import Row
from .commit import UNKNOWN_ROWS, Tables, weight
from .port import HELD_FRAGMENT_COLUMNS, REMOTE_DIALOG_COLUMNS
from .sql import columns, upsert

_PUT_DIALOG: Final = upsert("remote_dialogs", REMOTE_DIALOG_COLUMNS, REMOTE_DIALOG_COLUMNS[:3])
_SET_NEXT_SEQ: Final = (
    "UPDATE remote_dialogs SET next_seq = ? WHERE conversation_id = ? AND direction = ?"
    " AND side = ?"
)
_DELETE_DIALOG: Final = (
    "DELETE FROM remote_dialogs WHERE conversation_id = ? AND direction = ? AND side = ?"
)
_PUT_FRAGMENT: Final = upsert("held_fragments", HELD_FRAGMENT_COLUMNS, HELD_FRAGMENT_COLUMNS[:4])
_DELETE_MESSAGE: Final = (
    "DELETE FROM held_fragments WHERE conversation_id = ? AND direction = ? AND seq = ?"
)
_DELETE_DIRECTION: Final = "DELETE FROM held_fragments WHERE conversation_id = ? AND direction = ?"


class RemoteTables(Tables):
    """The `remote_dialogs` (REMOTE_DIALOG_COLUMNS) and `held_fragments`
    (HELD_FRAGMENT_COLUMNS) tables."""

    def load_remote(self) -> tuple[list[Row], list[Row]]:
        """The dialog directions to other brokers and their held fragments (transport start)."""
        db = self._db
        dialogs = db.execute(
            f"SELECT {columns(REMOTE_DIALOG_COLUMNS)} FROM remote_dialogs"
        ).fetchall()
        fragments = db.execute(
            f"SELECT {columns(HELD_FRAGMENT_COLUMNS)} FROM held_fragments"
            " ORDER BY conversation_id, direction, seq, fragment_index"
        ).fetchall()
        return dialogs, fragments

    def put_remote_dialog(self, row: Row) -> None:
        self._add(_PUT_DIALOG, row)

    def set_remote_next_seq(
        self, conversation_id: uuid.UUID, direction: int, side: str, next_seq: int
    ) -> None:
        self._add(_SET_NEXT_SEQ, (next_seq, conversation_id, direction, side))

    def delete_remote_dialog(self, conversation_id: uuid.UUID, direction: int, side: str) -> None:
        self._add(_DELETE_DIALOG, (conversation_id, direction, side))

    def put_held_fragment(self, row: Row) -> None:
        *_, payload = row
        self._add(_PUT_FRAGMENT, row, weight(len(payload)))

    def delete_held_message(self, conversation_id: uuid.UUID, direction: int, seq: int) -> None:
        self._add(_DELETE_MESSAGE, (conversation_id, direction, seq), UNKNOWN_ROWS)

    def delete_held_direction(self, conversation_id: uuid.UUID, direction: int) -> None:
        self._add(_DELETE_DIRECTION, (conversation_id, direction), UNKNOWN_ROWS)
