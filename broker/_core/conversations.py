"""Conversation endpoints and their state machine.

Each dialog has two endpoints sharing a conversation id: the initiator's, created by
BEGIN DIALOG, and the target's, created when the first message reaches the target
service. Each endpoint belongs to exactly one conversation group of its service's
queue. States are Service Broker's: SO (begun, nothing sent), SI (inbound, first
message incomplete), CO (conversing), DI (the far side ended), DO (we ended, the far
side has not yet acknowledged), ER (an Error arrived or the lifetime expired),
CD (closed). Transitions happen only through `TRANSITIONS`, keyed by
(state, event); a pair that is not in the table is a bug and raises.

An endpoint is removed as soon as it is closed: after our END CONVERSATION once the
far side knows (local dialogs: at once), or after END CONVERSATION on an endpoint
whose far side already ended or failed. Nothing is left behind by normal use.

Endpoints live in the store; `endpoints.Endpoints` keeps in memory the ones in use.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final


class State(Enum):
    __hash__ = object.__hash__  # members are singletons: identity hashing, at C speed

    SO = "STARTED_OUTBOUND"
    SI = "STARTED_INBOUND"
    CO = "CONVERSING"
    DI = "DISCONNECTED_INBOUND"
    DO = "DISCONNECTED_OUTBOUND"
    ER = "ERROR"
    CD = "CLOSED"


class Event(Enum):
    __hash__ = object.__hash__

    SENT = "sent"  # we sent a sequenced message
    RECEIVED_MESSAGE = "received_message"  # a complete user message arrived
    RECEIVED_PARTIAL = "received_partial"  # a fragment of an incomplete first message
    RECEIVED_END = "received_end"  # far side ended
    RECEIVED_ERROR = "received_error"  # far side ended with error / lifetime expired
    END = "end"  # we issued END CONVERSATION
    END_ACKED = "end_acked"  # far side acknowledged our EndDialog / Error


S, E = State, Event
TRANSITIONS: Final[dict[tuple[State, Event], State]] = {
    (S.SO, E.SENT): S.CO,
    (S.SO, E.RECEIVED_MESSAGE): S.CO,
    (S.SO, E.RECEIVED_END): S.DI,
    (S.SO, E.RECEIVED_ERROR): S.ER,
    (S.SO, E.END): S.DO,
    (S.SI, E.RECEIVED_PARTIAL): S.SI,
    (S.SI, E.RECEIVED_MESSAGE): S.CO,
    (S.SI, E.RECEIVED_END): S.DI,
    (S.SI, E.RECEIVED_ERROR): S.ER,
    (S.SI, E.END): S.DO,
    (S.CO, E.SENT): S.CO,
    (S.CO, E.RECEIVED_MESSAGE): S.CO,
    (S.CO, E.RECEIVED_PARTIAL): S.CO,
    (S.CO, E.RECEIVED_END): S.DI,
    (S.CO, E.RECEIVED_ERROR): S.ER,
    (S.CO, E.END): S.DO,
    (S.DI, E.RECEIVED_ERROR): S.ER,
    (S.DI, E.END): S.CD,
    (S.DO, E.RECEIVED_MESSAGE): S.DO,
    (S.DO, E.RECEIVED_PARTIAL): S.DO,
    (S.DO, E.RECEIVED_END): S.CD,
    (S.DO, E.RECEIVED_ERROR): S.CD,
    (S.DO, E.END_ACKED): S.CD,
    (S.ER, E.RECEIVED_MESSAGE): S.ER,
    (S.ER, E.RECEIVED_END): S.ER,
    (S.ER, E.RECEIVED_ERROR): S.ER,
    (S.ER, E.END): S.CD,
}

_ENCRYPTED: Final = b"\x01"  # the flags of `extra`; more would make it a bit set

CAN_SEND: Final = frozenset({S.SO, S.SI, S.CO})
ENDED_BY_FAR_SIDE: Final = frozenset({S.DI, S.ER})


class TransitionError(RuntimeError):
    """An event that the endpoint's state does not allow (a bug in the caller)."""


@dataclass(slots=True, eq=False, weakref_slot=True)
class Endpoint:
    handle: uuid.UUID
    conversation_id: uuid.UUID
    is_initiator: bool
    service: str
    far_service: str
    far_broker_instance: str | None
    contract: str
    group_id: uuid.UUID
    queue: str
    state: State = State.SO
    send_seq: int = 0
    receive_seq: int = 0
    priority: int = 5
    lifetime_expiry: float | None = None
    timer_at: float | None = None
    far_handle: uuid.UUID | None = None
    created: float = 0.0
    encrypted: bool = False  # ENCRYPTION = ON: bodies to other brokers are encrypted
    committed: bool = True  # False while the BEGIN DIALOG's transaction is open
    # the registry's bookkeeping (see endpoints.Endpoints), not stored
    gone: bool = False  # removed: no longer this broker's endpoint
    cached: bool = False  # held by the registry's recently-used list
    dirty: bool = False  # to be written with the open batch
    written: tuple[Any, ...] | None = None  # its indexed columns as last written

    def indexed(self) -> tuple[Any, ...]:
        """The columns the store indexes besides the key: what makes an update not hot."""
        return (self.group_id, self.timer_at, self.lifetime_expiry)

    def hot_row(self) -> tuple[Any, ...]:
        """What changes as a dialog runs, then the key (the store's HOT_ENDPOINT_COLUMNS)."""
        return (
            self.state.name,
            self.send_seq,
            self.receive_seq,
            self.far_handle,
            self.far_broker_instance,
            self.extra(),
            self.conversation_id,
            int(self.is_initiator),
        )

    def apply(self, event: Event) -> State:
        try:
            self.state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise TransitionError(
                f"endpoint {self.handle} in state {self.state.name} cannot take {event.value}"
            ) from None
        return self.state

    def row(self) -> tuple[Any, ...]:
        return (
            self.handle,
            self.conversation_id,
            int(self.is_initiator),
            self.service,
            self.far_service,
            self.far_broker_instance,
            self.contract,
            self.group_id,
            self.state.name,
            self.send_seq,
            self.receive_seq,
            self.priority,
            self.lifetime_expiry,
            self.timer_at,
            self.far_handle,
            self.created,
            self.extra(),
        )

    def extra(self) -> bytes | None:
        """The store's `extra` column: the endpoint's flags (None: none set)."""
        return _ENCRYPTED if self.encrypted else None

    @classmethod
    def from_row(cls, row: tuple[Any, ...], queue: str) -> Endpoint:
        (
            handle,
            conversation_id,
            is_initiator,
            service,
            far_service,
            far_broker_instance,
            contract,
            group_id,
            state,
            send_seq,
            receive_seq,
            priority,
            lifetime_expiry,
            timer_at,
            far_handle,
            created,
            extra,
        ) = row
        ep = cls(
            handle=uuid.UUID(bytes=handle),
            conversation_id=uuid.UUID(bytes=conversation_id),
            is_initiator=bool(is_initiator),
            service=service,
            far_service=far_service,
            far_broker_instance=far_broker_instance,
            contract=contract,
            group_id=uuid.UUID(bytes=group_id),
            queue=queue,
            state=State[state],
            send_seq=send_seq,
            receive_seq=receive_seq,
            priority=priority,
            lifetime_expiry=lifetime_expiry,
            timer_at=timer_at,
            far_handle=None if far_handle is None else uuid.UUID(bytes=far_handle),
            created=created,
            encrypted=extra == _ENCRYPTED,
        )
        ep.written = ep.indexed()
        return ep
