"""A received message: the RECEIVE columns as attributes."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from ssb.protocol import MESSAGE_COLUMNS

END_DIALOG = "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"
ERROR = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
DIALOG_TIMER = "http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer"
EVENT_NOTIFICATION = "http://schemas.microsoft.com/SQL/Notifications/EventNotification"
POST_EVENT_NOTIFICATION = "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"


@dataclass(frozen=True, slots=True)
class Message:
    """One row of RECEIVE (or of peeking a queue).

    status is 1 for a ready message and 0 for a received one kept by RETENTION; peeking
    also shows 2 for a message still arriving from another broker (no body, no queuing
    order or enqueue time yet; it cannot be received until complete);
    delivery_count is how many times it has been received, counting this time
    (so 1 on a first delivery, more after rollbacks; not after a rollback that followed
    the broker's refusal of the transaction for want of disk space or queue room).
    dead_letter_reason says why a message in a dead-letter queue was moved there (None
    elsewhere).
    """

    status: int
    priority: int
    queuing_order: int
    conversation_group_id: uuid.UUID
    conversation_handle: uuid.UUID
    message_sequence_number: int
    service_name: str
    service_contract_name: str
    message_type_name: str
    validation: str
    message_body: bytes
    message_enqueue_time: dt.datetime
    delivery_count: int
    dead_letter_reason: str | None = None

    @classmethod
    def from_wire(cls, row: list[Any]) -> Message:
        if len(row) != len(MESSAGE_COLUMNS):
            raise ValueError(f"a message row has {len(MESSAGE_COLUMNS)} columns, got {len(row)}")
        values = list(row)
        stamp = values[11]
        values[11] = (
            None  # a message still arriving from another broker (status 2)
            if stamp is None
            else dt.datetime.fromisoformat(stamp)
            if isinstance(stamp, str)
            else dt.datetime.fromtimestamp(stamp, dt.UTC)
        )
        return cls(*values)

    @property
    def is_end_dialog(self) -> bool:
        return self.message_type_name == END_DIALOG

    @property
    def is_error(self) -> bool:
        return self.message_type_name == ERROR

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text."""
        return self.message_body.decode(encoding)
