"""What the core needs from the world, as typing.Protocols.

Theory of operation. The core (everything in `_core`) is the Service Broker model and
nothing else: no SQL, no sockets, no asyncio protocol objects, no clock reads. It
reaches the world through these ports, which the daemon fills in:

- `Journal`: the durable store. Writes join the *open batch* and become durable
  together (group commit); `watermark()` names the batch that must be durable before
  an answer that depends on the writes so far may leave. Reads return committed
  state only, so the core never evicts an object from memory before the write that
  made it current is durable (see `backlog` and `endpoints`). It is made of one
  Protocol per family of tables, each with its contract; the store's port
  (`_store.port`) extends each family with what the rest of the broker asks.
- `Clock`: wall-clock time and timers, so tests drive time by hand.
- `QueueListener`: the queue monitors (activation) hear what happens to queues.
- `OutboundSink`: the broker-to-broker transport hears of transmission-queue work
  (through an `OutboundRelay`, as the transport is built after the core).

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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .catalog import Certificate, RemoteServiceBinding, Route
from .conversations import Endpoint

Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Span:
    """A read of a keyed sequence (a conversation's messages, a direction's transmission
    entries): keys `first` <= key < `before` (None: no upper bound), in key order, at most
    `limit` of them, and no more once their sizes add up to `max_bytes`."""

    first: int
    before: int | None
    limit: int
    max_bytes: int


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Wall-clock time (seconds since the epoch) and timers on it."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable: ...

    def call_soon(self, callback: Callable[[], None]) -> None: ...

    def create_future(self) -> asyncio.Future[Any]: ...


class Batches(Protocol):
    """Batches and durability: every write joins the open batch (see the store's port,
    `_store.port`, for the rules of batches and reads)."""

    def watermark(self) -> int:
        """The number of the newest batch holding a write: the batch that must be durable
        before an answer that depends on the writes made so far may leave. With nothing
        written since the last batch was taken for commit, the number of that batch (0
        before the first)."""
        ...

    @property
    def durable(self) -> int:
        """The number of the newest batch on disk; every batch up to it is durable (0
        before the first commit)."""
        ...

    def when_durable(self, batch: int, callback: Callable[[], None]) -> None:
        """Call `callback` (on the event loop) once batch `batch` is durable: at once,
        before returning, if it is already. Callbacks run in the order they were given,
        none before its batch is durable; one that writes, writes into the open batch."""
        ...

    def defer(self, writer: Callable[[], None]) -> None:
        """Call `writer` once, just before the open batch is taken for commit; what it
        writes goes into that batch. From now on the open batch counts as holding a
        write (`watermark()` names it)."""
        ...


class CatalogJournal(Protocol):
    """The catalog of objects and the broker's meta values, as the core writes them."""

    def put_meta(self, key: str, value: str) -> None:
        """Set a meta value, replacing the key's old one."""
        ...

    def put_catalog(self, kind: str, name: str, body: str) -> None:
        """Store an object's definition, replacing one of the same kind and name."""
        ...

    def delete_catalog(self, kind: str, name: str) -> None:
        """Forget an object (nothing happens if there is none)."""
        ...


class EndpointJournal(Protocol):
    """Conversation endpoints (the store's ENDPOINT_COLUMNS), keyed by handle, and by
    conversation id and side (is_initiator) as well."""

    def insert_endpoint(self, row: Row) -> None:
        """Store a new endpoint (its handle, and its conversation and side, are new)."""
        ...

    def update_endpoint(self, row: Row) -> None:
        """Write an endpoint's whole state (the endpoint of the row's conversation and
        side). After `insert_endpoint` in the same batch, the endpoint is inserted with
        this state instead, where the insert was among the batch's writes; after another
        `update_endpoint`, only this one is written."""
        ...

    def update_endpoint_hot(self, row: Row) -> None:
        """Write only the columns of HOT_ENDPOINT_COLUMNS, the row being those values then
        the conversation id and is_initiator (`Endpoint.hot_row()`); it takes effect after
        every earlier write of the endpoint in the batch."""
        ...

    def delete_endpoint(self, handle: uuid.UUID) -> None:
        """Forget an endpoint. One inserted in the open batch is then never written."""
        ...

    def read_endpoint(self, handle: uuid.UUID) -> Row | None:
        """The endpoint with this handle (None: there is none)."""
        ...

    def read_endpoint_by_conversation(
        self, conversation_id: uuid.UUID, is_initiator: bool
    ) -> Row | None:
        """The endpoint of a conversation's side (None: there is none)."""
        ...

    def read_endpoints(
        self,
        *,
        group_id: uuid.UUID | None = None,
        service: str | None = None,
        contract: str | None = None,
        after: uuid.UUID | None = None,
        limit: int,
    ) -> list[Row]:
        """The endpoints that match every filter given (None: no filter), with a handle
        greater than `after` (bytewise), by handle, at most `limit`."""
        ...

    def read_due_endpoints(self, after: float | None, until: float) -> list[Row]:
        """(handle, timer_at, lifetime_expiry) of each endpoint whose conversation timer
        or lifetime falls in (`after`, `until`] (None: no lower bound); one row for each
        of the two that does, in no particular order."""
        ...


class MessageJournal(Protocol):
    """Messages in queues (the store's MESSAGE_COLUMNS), keyed by queuing order. `size` is
    the body's length, what byte budgets count."""

    def insert_message(self, row: Row) -> None:
        """Store a new message (its queuing order is larger than any stored)."""
        ...

    def delete_message(self, queuing_order: int) -> None:
        """Forget a message (nothing happens if there is none). One whose insert is still
        in the open batch is never written, and counted in `cancelled`."""
        ...

    def delete_messages(self, orders: Iterable[int]) -> None:
        """`delete_message` of each of `orders` (distinct), in one go."""
        ...

    def delete_conversation_messages(self, queue: str, handle: uuid.UUID) -> None:
        """Forget every retained, ready, parked or requeued message of the conversation
        `handle` in `queue`, as of this point in the batch."""
        ...

    def delete_queue_messages(self, queue: str) -> None:
        """Forget every message of `queue`, whatever its status, as of this point in the
        batch (DROP QUEUE)."""
        ...

    def set_message_status(self, queuing_order: int, status: int) -> None:
        """Change a message's status."""
        ...

    def set_delivery_count(self, queuing_order: int, count: int) -> None:
        """Change a message's delivery count."""
        ...

    def set_message_extra(self, queuing_order: int, extra: bytes | None) -> None:
        """Change a message's extra column (the core's packed attributes)."""
        ...

    def read_ready_messages(self, queue: str, handle: uuid.UUID, span: Span) -> list[Row]:
        """Ready messages of conversation `handle` in `queue` in `span` of queuing orders;
        the one whose size reaches its bytes is included."""
        ...

    def next_ready_order(
        self, queue: str, handle: uuid.UUID, after: int, before: int | None
    ) -> int | None:
        """The smallest queuing order of a ready message of the conversation in `queue`
        between `after` and `before` (both excluded; None: no upper bound), or None."""
        ...

    def read_message_bodies(self, orders: Sequence[int]) -> dict[int, bytes]:
        """The bodies of the messages of `orders` that are stored, by queuing order."""
        ...

    def read_message(self, queuing_order: int) -> Row | None:
        """A message, whatever its status (None: there is none)."""
        ...

    def read_queue_messages(
        self, queue: str, after: int | None, limit: int, max_bytes: int
    ) -> list[Row]:
        """Retained, ready and requeued messages of `queue` with a queuing order greater
        than `after` (None: all), in queuing order: at most `limit`, at least one if there
        is any, and then no more than fit in `max_bytes` counting each message's size
        plus `ssb.protocol.ROW_OVERHEAD`."""
        ...

    def message_summary(self, statuses: Iterable[int]) -> list[Row]:
        """Per (status, queue, conversation handle) among messages of `statuses`: (status,
        queue, handle, count, bytes (sum of sizes), smallest queuing order, and the
        service, group id, priority and contract of the endpoint with that handle: four
        Nones without one), in no particular order (start-up read)."""
        ...

    def read_messages_with_status(self, statuses: Iterable[int]) -> list[Row]:
        """Every message of `statuses`, in no particular order (start-up read)."""
        ...


class TransmissionJournal(Protocol):
    """The transmission queue (the store's TRANSMISSION_COLUMNS): messages on their way to
    another service, keyed by id, and ordered by seq within a dialog direction (a
    conversation id and side)."""

    def insert_transmission(self, row: Row) -> None:
        """Store a new entry (its id is larger than any stored, its seq larger than any of
        its direction)."""
        ...

    def delete_transmission(self, ident: int) -> None:
        """Forget an entry (nothing happens if there is none)."""
        ...

    def delete_transmission_seqs(
        self, conversation_id: uuid.UUID, is_initiator: bool, first: int, last: int
    ) -> None:
        """Forget a direction's entries with `first` <= seq <= `last`."""
        ...

    def delete_transmission_direction(self, conversation_id: uuid.UUID, is_initiator: bool) -> None:
        """Forget every entry of a direction, as of this point in the batch."""
        ...

    def read_transmission(
        self, conversation_id: uuid.UUID, is_initiator: bool, span: Span
    ) -> list[Row]:
        """A direction's entries in `span` of seqs, counting their bodies' lengths: at
        least one if there is any, and then no more than fit in its bytes."""
        ...

    def next_transmission_seq(
        self, conversation_id: uuid.UUID, is_initiator: bool, after: int, before: int | None
    ) -> int | None:
        """The smallest seq of a direction's entries between `after` and `before` (both
        excluded; None: no upper bound), or None."""
        ...

    def transmission_summary(self) -> list[Row]:
        """(conversation id, is_initiator, count, smallest seq) per direction with entries,
        in no particular order (start-up read)."""
        ...

    def read_transmission_page(self, after: int | None, limit: int) -> list[Row]:
        """Entries with an id greater than `after` (None: all), by id, at most `limit`."""
        ...


class PoisonJournal(Protocol):
    """Poison incidents (the store's POISON_COLUMNS), kept for people to read."""

    def insert_poison(self, row: Row) -> None:
        """Store a new incident (its id is larger than any stored)."""
        ...

    def read_poison(self, limit: int) -> list[Row]:
        """The newest `limit` incidents, oldest first, without the body column."""
        ...


class OutcomeJournal(Protocol):
    """Ids of committed transactions, for clients resolving a commit whose answer was
    lost (see `outcomes`): one record per batch, numbered, pruned oldest first."""

    def insert_outcomes(self, seq: int, at: float, count: int, ids: bytes) -> None:
        """Store record `seq` (a new number): its commit time, how many ids, the ids."""
        ...

    def delete_outcomes_upto(self, seq: int) -> None:
        """Forget every record numbered `seq` or less."""
        ...

    def read_outcome_batches(self, first: int) -> Iterable[tuple[int, float, bytes]]:
        """(number, time, ids) of every record from number `first` on, newest first; to
        be consumed at once."""
        ...

    def outcome_batch_heads(self, first: int, limit: int) -> list[tuple[int, float, int]]:
        """(number, time, count) of the oldest `limit` records from number `first` on,
        oldest first."""
        ...

    def outcome_at(self, seq: int) -> float | None:
        """The commit time of record `seq` (None: it is not kept)."""
        ...

    def outcome_span(self) -> tuple[int, int, int] | None:
        """(the first number, the last, how many ids in all) of the records kept (None:
        there are none)."""
        ...


class TableError(Exception):
    """A user's table statement that cannot run: refused before it ran, or failed (a
    constraint, a missing table); the message says what was wrong, in the user's names."""


class TableResult(Protocol):
    """What a table statement answered: its rows (a SELECT, a change with OUTPUT) or the
    rows it changed."""

    @property
    def columns(self) -> list[str]: ...

    @property
    def rows(self) -> list[tuple[Any, ...]]: ...

    @property
    def rowcount(self) -> int: ...


class TableStatement(Protocol):
    """A translated table statement (see `_store.user_sql.Statement`)."""

    @property
    def kind(self) -> str:
        """ "query", "change" or "ddl"."""
        ...

    @property
    def database(self) -> str: ...

    @property
    def reads(self) -> frozenset[str]:
        """The tables it reads."""
        ...

    @property
    def writes(self) -> dict[str, str]:
        """The tables it changes (or creates, alters, drops) -> the permission needed."""
        ...

    @property
    def returns_rows(self) -> bool:
        """A SELECT, or a change with OUTPUT."""
        ...

    @property
    def tables(self) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class TableRuns:
    """A statement to run once with each values of `many`, in order, after `owner`'s
    earlier statements `done` (its transaction's, which it ran before), for at most
    `timeout` seconds in all."""

    owner: object
    done: Sequence[tuple[TableStatement, dict[str, Any]]]
    statement: TableStatement
    many: Sequence[dict[str, Any]]
    timeout: float


class TableJournal(Protocol):
    """Users' tables (see `_store.user_tables`): statements are translated, run
    provisionally at once (their results are answered then), and run again, in order,
    in the batch of their transaction's commit. Callers lock the tables so that the two
    runs see the same rows."""

    def load_table_names(self) -> list[tuple[str, str]]:
        """(database, table) of every table (start-up read)."""
        ...

    def translate_table_statement(self, text: str, database: str, session: int) -> TableStatement:
        """The statement of session number `session` (its temporary tables, #name, are
        its own) in `database`.

        Raises:
            TableError: it cannot be translated, or is not supported."""
        ...

    def run_table_statements(self, runs: TableRuns) -> Awaitable[TableResult]:
        """Run `runs` changing nothing durable; fills each values with what the statement
        evaluates once per run (GETDATE(), NEWID()). The answer is the one run's (of
        several: their row counts added, no rows).

        Raises (from the awaitable):
            TableError: a run failed; nothing of any of them stays.
        """
        ...

    def run_table_statements_now(self, runs: TableRuns) -> TableResult | None:
        """`run_table_statements` at once, when the store can run it without waiting
        (for its thread, a connection); None when it cannot (nothing ran: call
        `run_table_statements`).

        Raises:
            TableError: as `run_table_statements`.
        """
        ...

    def table_foreign_keys(self, database: str) -> list[tuple[str, str, bool]]:
        """The foreign keys between `database`'s tables, committed: (the referring
        table, the table it refers to, whether a DELETE or UPDATE of the second changes
        the first: ON DELETE / ON UPDATE CASCADE, SET NULL or SET DEFAULT), by their
        names in the database (lower case)."""
        ...

    def forget_table_statements(self, owner: object) -> None:
        """`owner`'s provisional statements are void (a rollback): they are not kept."""
        ...

    def write_table_statements(
        self,
        statements: Sequence[tuple[TableStatement, dict[str, Any]]],
        owner: object = None,
    ) -> None:
        """A transaction's statements join the open batch, in order (its commit);
        `owner`: the transaction that ran them (the store may keep their provisional
        run rather than run them again), None for statements that did not run."""
        ...


class Journal(
    Batches,
    CatalogJournal,
    EndpointJournal,
    MessageJournal,
    TransmissionJournal,
    PoisonJournal,
    OutcomeJournal,
    TableJournal,
    Protocol,
):
    """The durable store, as the core uses it: a part of the store's port (`_store.Store`),
    whose families extend these."""


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
    """What queue monitors (activation) hear from the core; every hook must be quick.
    Each hook hears nothing unless an implementation says otherwise."""

    def message_arrived(self, queue: Any) -> None:
        """A message was put on `queue`."""
        return None

    def received(self, queue: Any, session: Any, empty: bool) -> None:
        """`session` received from `queue` (`empty`: it found nothing)."""
        return None

    def rolled_back(self, queue: Any) -> None:
        """A transaction that received from `queue` rolled back (what it took is back,
        unless its conversation ended meanwhile)."""
        return None

    def altered(self, queue: Any) -> None:
        """`queue` was made, or its definition or event notifications changed."""
        return None

    def waiting_changed(self, queue: Any) -> None:
        """The number of sessions waiting in a RECEIVE on `queue` changed."""
        return None

    def session_closed(self, session: Any) -> None:
        """`session` ended."""
        return None

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

    def may_deliver(self, from_broker: str, service: str) -> bool:
        """Whether what broker `from_broker` sent may go to this broker's service (the
        key `service`): its login holds SEND on it."""
        ...


class NoListener(QueueListener):
    """A QueueListener that hears nothing (no activation installed)."""

    def stopping(self, session: Any) -> bool:
        return False


class NoTransport:
    """An OutboundSink for a broker without a broker port (messages wait, with a reason)."""

    def outbound(self, direction: Any) -> None: ...
    def endpoint_removed(self, endpoint: Any) -> None: ...
    def routes_changed(self) -> None: ...

    def describe(self, direction: Any) -> str:
        return "this broker has no broker-to-broker transport running"

    def may_deliver(self, from_broker: str, service: str) -> bool:
        return False  # no certificates to map the broker to a login: nothing to allow


class OutboundRelay:
    """The core's OutboundSink when the transport is built after the core.

    The core and the transport call each other at once: the transport reads and changes
    the core's parts as frames arrive, and the core tells the transport of an ended
    conversation, whose dialog rows must leave in the batch that removes its endpoint
    (so the call cannot wait for a later turn of the loop, as activation's queue
    monitors do). The relay cuts the cycle: made first and needing nothing, the core
    takes it at construction, and the transport, built after the core on its parts,
    connects to it at its own construction, once. Until then it answers as NoTransport
    (messages wait, with a reason). It holds the transport's own bound methods, so the
    core's calls go straight to them.
    """

    outbound: Callable[[Any], None]
    endpoint_removed: Callable[[Any], None]
    routes_changed: Callable[[], None]
    describe: Callable[[Any], str]
    may_deliver: Callable[[str, str], bool]

    def __init__(self) -> None:
        self.connected = False
        self._take(NoTransport())

    def connect(self, transport: OutboundSink) -> None:
        """From now on the core's calls go to `transport`.

        Raises: RuntimeError: a transport is connected already.
        """
        if self.connected:
            raise RuntimeError("a transport is connected to this relay already")
        self.connected = True
        self._take(transport)

    def _take(self, sink: OutboundSink) -> None:
        self.outbound = sink.outbound
        self.endpoint_removed = sink.endpoint_removed
        self.routes_changed = sink.routes_changed
        self.describe = sink.describe
        self.may_deliver = sink.may_deliver


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

    def is_local(self, service: str, broker_instance: object) -> bool: ...

    def mirrors(self) -> dict[str, str]:
        """Address -> mirror address (tcp://host:port each) of the live routes that
        have a mirror."""
        ...


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

    def drop(self, session: Any, kind: object, name: object) -> object:
        """None, or an awaitable when it waits for locks (a service's conversations)."""
