"""What the core needs from the world, as typing.Protocols.

Theory of operation. The core (everything in `_core`) is the Service Broker model and
nothing else: no SQL, no sockets, no asyncio protocol objects, no clock reads. It
reaches the world through these ports, which the daemon fills in:

- `Journal`: the durable store. Writes join the *open batch* and become durable
  together (group commit); `watermark()` names the batch that must be durable before
  an answer that depends on the writes so far may leave. Reads return committed
  state only, so the core never evicts an object from memory before the write that
  made it current is durable (see `backlog` and `endpoints`).
- `Clock`: wall-clock time and timers, so tests drive time by hand.
- `QueueListener`: the queue monitors (activation) hear what happens to queues.
- `OutboundSink`: the broker-to-broker transport hears of transmission-queue work.

And what the core offers the broker-to-broker transport, which is handed these parts
of the core and nothing else: `remote.RemoteDelivery` (the transmission queue's way out,
messages from other brokers in: a part of its own, so no Protocol repeats it here),
`EndpointLookup`, `RouteLookup`, `PeerCatalog` (the certificates and remote service
bindings it trusts) and `CatalogStatements`.

Rows are plain tuples in the column order of the store's tables; `Row` names them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from .catalog import Certificate, RemoteServiceBinding, Route
from .conversations import Endpoint

Row = tuple[Any, ...]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Wall-clock time (seconds since the epoch) and timers on it."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable: ...

    def call_soon(self, callback: Callable[[], None]) -> None: ...

    def create_future(self) -> asyncio.Future[Any]: ...


class Journal(Protocol):
    """The durable store, as the core uses it (a part of the store's port, `_store.Store`)."""

    # ---- batches and durability
    def watermark(self) -> int: ...

    @property
    def durable(self) -> int: ...

    def when_durable(self, batch: int, callback: Callable[[], None]) -> None: ...

    def defer(self, writer: Callable[[], None]) -> None:
        """Call `writer` once just before the open batch is committed (it writes then)."""

    # ---- catalog
    def put_catalog(self, kind: str, name: str, body: str) -> None: ...

    def delete_catalog(self, kind: str, name: str) -> None: ...

    # ---- endpoints
    def insert_endpoint(self, row: Row) -> None: ...

    def update_endpoint(self, row: Row) -> None: ...

    def update_endpoint_hot(self, row: Row) -> None:
        """Only columns no index holds changed: `Endpoint.hot_row()`."""

    def delete_endpoint(self, handle: uuid.UUID) -> None: ...

    def read_endpoint(self, handle: uuid.UUID) -> Row | None: ...

    def read_endpoint_by_conversation(
        self, conversation_id: uuid.UUID, is_initiator: bool
    ) -> Row | None: ...

    def read_endpoints(
        self,
        *,
        group_id: uuid.UUID | None = None,
        service: str | None = None,
        contract: str | None = None,
        after: uuid.UUID | None = None,
        limit: int,
    ) -> list[Row]: ...

    def read_due_endpoints(self, after: float | None, until: float) -> list[Row]: ...

    # ---- messages
    def insert_message(self, row: Row) -> None: ...

    def delete_message(self, queuing_order: int) -> None: ...

    def delete_messages(self, orders: Iterable[int]) -> None: ...

    def delete_conversation_messages(self, queue: str, handle: uuid.UUID) -> None: ...

    def set_message_status(self, queuing_order: int, status: int) -> None: ...

    def set_delivery_count(self, queuing_order: int, count: int) -> None: ...

    def set_message_extra(self, queuing_order: int, extra: bytes | None) -> None: ...

    def read_ready_messages(
        self,
        queue: str,
        handle: uuid.UUID,
        first: int,
        before: int | None,
        limit: int,
        max_bytes: int,
    ) -> list[Row]: ...

    def next_ready_order(
        self, queue: str, handle: uuid.UUID, after: int, before: int | None
    ) -> int | None: ...

    def read_message_bodies(self, orders: Sequence[int]) -> dict[int, bytes]: ...

    def read_message(self, queuing_order: int) -> Row | None: ...

    def read_queue_messages(
        self, queue: str, after: int | None, limit: int, max_bytes: int
    ) -> list[Row]: ...

    def message_summary(self, statuses: Iterable[int]) -> list[Row]: ...

    def read_messages_with_status(self, statuses: Iterable[int]) -> list[Row]: ...

    # ---- transmission queue
    def insert_transmission(self, row: Row) -> None: ...

    def delete_transmission(self, ident: int) -> None: ...

    def delete_transmission_seqs(
        self, conversation_id: uuid.UUID, is_initiator: bool, first: int, last: int
    ) -> None: ...

    def delete_transmission_direction(
        self, conversation_id: uuid.UUID, is_initiator: bool
    ) -> None: ...

    def read_transmission(
        self,
        conversation_id: uuid.UUID,
        is_initiator: bool,
        first: int,
        before: int | None,
        limit: int,
        max_bytes: int,
    ) -> list[Row]: ...

    def next_transmission_seq(
        self, conversation_id: uuid.UUID, is_initiator: bool, after: int, before: int | None
    ) -> int | None: ...

    def transmission_summary(self) -> list[Row]: ...

    def read_transmission_page(self, after: int | None, limit: int) -> list[Row]: ...

    # ---- poison incidents
    def insert_poison(self, row: Row) -> None: ...

    def read_poison(self, limit: int) -> list[Row]: ...

    # ---- transaction outcomes (one record per batch, numbered in commit order)
    def put_meta(self, key: str, value: str) -> None: ...

    def insert_outcomes(self, seq: int, at: float, count: int, ids: bytes) -> None: ...

    def delete_outcomes_upto(self, seq: int) -> None: ...

    def read_outcome_batches(self, first: int) -> Iterable[tuple[int, float, bytes]]: ...

    def outcome_batch_heads(self, first: int, limit: int) -> list[tuple[int, float, int]]: ...

    def outcome_at(self, seq: int) -> float | None: ...

    def outcome_span(self) -> tuple[int, int, int] | None: ...


async def durable(journal: Journal, clock: Clock) -> None:
    """Wait until everything applied so far is durable."""
    if journal.watermark() <= journal.durable:
        return
    future = clock.create_future()

    def done() -> None:
        if not future.done():
            future.set_result(None)

    journal.when_durable(journal.watermark(), done)
    await future


class QueueListener(Protocol):
    """What queue monitors (activation) hear from the core; every hook must be quick."""

    def message_arrived(self, queue: Any) -> None: ...

    def received(self, queue: Any, session: Any, empty: bool) -> None: ...

    def rolled_back(self, queue: Any) -> None: ...

    def altered(self, queue: Any) -> None: ...

    def waiting_changed(self, queue: Any) -> None: ...

    def session_closed(self, session: Any) -> None: ...

    def stopping(self, session: Any) -> bool:
        """Whether this session's RECEIVE should return nothing at once (a reader
        asked to stop by its activator)."""
        ...


class OutboundSink(Protocol):
    """What the broker-to-broker transport hears from the core."""

    def outbound(self, direction: Any) -> None:
        """A dialog direction to another broker has new transmission-queue entries."""

    def endpoint_removed(self, endpoint: Any) -> None: ...

    def routes_changed(self) -> None: ...

    def describe(self, direction: Any) -> str:
        """Why a direction's messages wait, in words (empty when they are moving)."""
        ...


class NoListener:
    """A QueueListener that hears nothing (no activation installed)."""

    def message_arrived(self, queue: Any) -> None: ...
    def received(self, queue: Any, session: Any, empty: bool) -> None: ...
    def rolled_back(self, queue: Any) -> None: ...
    def altered(self, queue: Any) -> None: ...
    def waiting_changed(self, queue: Any) -> None: ...
    def session_closed(self, session: Any) -> None: ...

    def stopping(self, session: Any) -> bool:
        return False


class NoTransport:
    """An OutboundSink for a broker without a broker port (messages wait, with a reason)."""

    def outbound(self, direction: Any) -> None: ...
    def endpoint_removed(self, endpoint: Any) -> None: ...
    def routes_changed(self) -> None: ...

    def describe(self, direction: Any) -> str:
        return "this broker has no broker-to-broker transport running"


# ---- what the core offers the broker-to-broker transport ------------------------------


class EndpointLookup(Protocol):
    """Conversation endpoints, as the transport reads and annotates them (`Endpoints`)."""

    def by_conversation(
        self, conversation_id: uuid.UUID, is_initiator: bool
    ) -> Endpoint | None: ...

    def mark_encrypted(self, conversation_id: uuid.UUID, is_initiator: bool) -> None: ...

    def set_far_broker(
        self, conversation_id: uuid.UUID, is_initiator: bool, broker_instance: str
    ) -> None: ...


class RouteLookup(Protocol):
    """Where a service lives (`routes.Routes`)."""

    def find(self, service: str, broker_instance: object) -> Route | None: ...


class PeerCatalog(Protocol):
    """The catalog objects the transport trusts other brokers by (`catalog.Catalog`)."""

    def peer_certificates(self) -> list[Certificate]: ...

    def remote_service_bindings(self) -> list[RemoteServiceBinding]: ...

    def find_binding(self, service: str) -> RemoteServiceBinding | None: ...

    def binding_for(self, service: str) -> RemoteServiceBinding: ...

    def exists(self, kind: str, name: str) -> bool: ...

    def service_queue(self, service: str) -> str | None: ...


class CatalogStatements(Protocol):
    """Creating and dropping catalog objects, with their rules (`ddl.Ddl`)."""

    def persist(self, kind: str, obj: Any) -> None: ...

    def drop(self, session: Any, kind: object, name: object) -> None: ...
