"""What the transport needs beyond the core's ports, as typing.Protocols.

- `Clock`: monotonic time and timers on it. The asyncio event loop is one as it stands
  (`loop.time()`, `call_at`, `call_later`, `call_soon`); tests drive a fake one by hand.
  Unlike the core's wall-clock `Clock`, it never jumps: the dialog layer's retransmission
  and ack timers are set on it.
- `Connector`: opens a connection to another broker (the event loop's
  `create_connection`; an in-memory network in tests).
- `RemoteDialogStore`: the store's tables of dialog directions to other brokers and of
  held fragments, and the batches the transport waits on before it acknowledges.
- `SendPermission`: whether the login another broker's certificate maps to may SEND to
  a service of this broker (the broker's permissions).
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ssb.protocol import Direction, Envelope, unpack

from .._core.ports import Cancellable, Row


class Clock(Protocol):
    """Monotonic seconds and timers on them."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Cancellable: ...

    def call_later(
        self, delay: float, callback: Callable[..., object], *args: Any
    ) -> Cancellable: ...

    def call_soon(self, callback: Callable[..., object], *args: Any) -> object: ...


class Connector(Protocol):
    """Opens a connection to `host`:`port` and runs the protocol `factory` makes on it."""

    def create_connection(
        self,
        protocol_factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        *,
        ssl: ssl.SSLContext | None = None,
    ) -> Awaitable[object]: ...


class SendPermission(Protocol):
    """The broker's permissions, as messages from other brokers meet them."""

    def is_principal(self, name: str) -> bool:
        """Whether a certificate may name `name`: a login, or PUBLIC."""

    def may_send(self, login: str | None, service: str) -> bool:
        """Whether `login` (None: PUBLIC) holds SEND on `service` (a service key of this
        broker, or the name a new dialog from another broker gives; a name no service
        here has yet passes: its messages wait for the service)."""


@dataclass(frozen=True, slots=True)
class RemoteDialog:
    """A dialog direction's persisted state on this broker's side of a peer (a
    `remote_dialogs` row): the sender's ("send") or the receiver's ("recv")."""

    conversation_id: uuid.UUID
    direction: Direction
    side: str
    peer_id: uuid.UUID
    session_key: bytes
    wrapped_key: bytes | None
    next_seq: int
    envelope: Envelope | None

    @classmethod
    def from_row(cls, row: Row) -> RemoteDialog:
        conversation, direction, side, peer_id, key, wrapped, next_seq, envelope = row
        return cls(
            uuid.UUID(bytes=conversation),
            Direction(direction),
            side,
            uuid.UUID(peer_id),
            key,
            wrapped,
            next_seq,
            Envelope.decode(unpack(envelope)) if envelope else None,
        )


class RemoteDialogStore(Protocol):
    """The store as the transport uses it: writes join the open batch, and
    `when_durable(watermark(), ...)` says when everything written so far is on disk.

    Rows of `remote_dialogs`: (conversation id, direction, side "send"/"recv", peer,
    session key, wrapped key, next seq, packed envelope). Rows of `held_fragments`:
    (conversation id, direction, seq, fragment index, fragment count, message type,
    payload)."""

    def load_remote(self) -> tuple[list[Row], list[Row]]: ...

    def put_remote_dialog(self, row: Row) -> None: ...

    def set_remote_next_seq(
        self, conversation_id: uuid.UUID, direction: int, side: str, next_seq: int
    ) -> None: ...

    def delete_remote_dialog(
        self, conversation_id: uuid.UUID, direction: int, side: str
    ) -> None: ...

    def put_held_fragment(self, row: Row) -> None: ...

    def delete_held_message(self, conversation_id: uuid.UUID, direction: int, seq: int) -> None: ...

    def delete_held_direction(self, conversation_id: uuid.UUID, direction: int) -> None: ...

    def watermark(self) -> int: ...

    def defer(self, writer: Callable[[], None]) -> None:
        """Call `writer` once, just before the open batch is taken for commit; what it
        writes goes into that batch (which counts as holding a write from now on)."""

    def when_durable(self, batch: int, callback: Callable[[], None]) -> None: ...
