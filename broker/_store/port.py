"""The storage port: what the broker asks of its store, whichever database holds it.

Theory of operation. The store keeps everything durable: the catalog, conversation
endpoints, messages, the transmission queue, the transport's dialog state, logins and
permissions, transaction outcomes, poison incidents and the scheduler's log. `Store`
is the one interface the rest of the broker uses; it is made of one Protocol per family
of tables, and `SQLiteStore` and `PostgresStore` implement it; both pass the shared
tests (`tests/store/`).

Batches. Every write joins the *open batch* and returns at once; it never fails at the
call (a failure shows when the batch is committed). Batches are numbered from 1 in each
opened store (the numbers are not kept across restarts) and committed in that order,
each atomically: after a crash the store holds every batch up to some number and
nothing of the later ones. Within a batch, writes take effect in the order they were
made. `watermark()` names the newest batch holding a write; `durable` the newest one
on disk; `when_durable(n, callback)` runs the callback once batch `n` is. The broker
answers a request only when everything applied before its answer is durable, so
nothing a client observes can be lost by a crash. Once attached to the event loop, the
store commits by itself, as soon as it can, without being asked (group commit: while a
batch commits, the next one collects writes).

Reads see committed batches only: every batch up to `durable`, never the open batch (a
batch whose commit is under way may or may not be visible yet). The core keeps in
memory whatever it has written and not yet seen durable, and reads the rest on demand
(see `_core.backlog` and `_core.endpoints`). The *start-up reads* (`load_*`, `max_ids`,
`message_summary`, `read_messages_with_status`, `transmission_summary`) are for the
broker's start, before `attach` (the transport's `load_remote` just after it): they see
every durable batch, and may see one whose commit is under way.

Rows are plain tuples in the column order of the `*_COLUMNS` tuples below. A UUID is
written as a `uuid.UUID` and read back as its 16 bytes; a boolean is written as a bool
or an int and read back as 0 or 1; a time is a float, seconds since the epoch. Message
statuses are the core's (`_core.queues.Status`): 0 retained, 1 ready, 6 parked,
7 requeued.

Errors. A failed commit is reported through `attach`'s callbacks; what a caller may
catch is a `StoreError` (see `errors`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from .._core.ports import Row

if TYPE_CHECKING:
    from .._core.ports import Journal

ENDPOINT_COLUMNS: Final = (
    "handle",
    "conversation_id",
    "is_initiator",
    "service",
    "far_service",
    "far_broker_instance",
    "contract",
    "group_id",
    "state",
    "send_seq",
    "receive_seq",
    "priority",
    "lifetime_expiry",
    "timer_at",
    "far_handle",
    "created",
    "extra",
)
# the columns that change as a dialog runs, none of them indexed: an update that names only
# these leaves the endpoint's index entries alone
HOT_ENDPOINT_COLUMNS: Final = (
    "state",
    "send_seq",
    "receive_seq",
    "far_handle",
    "far_broker_instance",
    "extra",
)
MESSAGE_COLUMNS: Final = (
    "queuing_order",
    "queue",
    "handle",
    "seq",
    "message_type",
    "validation",
    "body",
    "enqueue_time",
    "status",
    "delivery_count",
    "extra",
    "size",
)
TRANSMISSION_COLUMNS: Final = (
    "id",
    "handle",
    "conversation_id",
    "to_service",
    "to_broker_instance",
    "from_service",
    "contract",
    "is_initiator",
    "seq",
    "message_type",
    "validation",
    "body",
    "enqueue_time",
    "priority",
    "status",
    "extra",
)
REMOTE_DIALOG_COLUMNS: Final = (
    "conversation_id",
    "direction",
    "side",
    "peer",
    "session_key",
    "wrapped_key",
    "next_seq",
    "envelope",
)
HELD_FRAGMENT_COLUMNS: Final = (
    "conversation_id",
    "direction",
    "seq",
    "fragment_index",
    "fragment_count",
    "message_type",
    "payload",
)
LOGIN_COLUMNS: Final = ("name", "hash", "created")
GRANT_COLUMNS: Final = ("login", "permission", "kind", "name")
OWNER_COLUMNS: Final = ("kind", "name", "login")
EXECUTION_LOG_COLUMNS: Final = (
    "log_id",
    "caller",
    "scheduler_handle",
    "task",
    "queued_time",
    "start_time",
    "end_time",
    "activated_task",
    "pid",
    "session_id",
    "error",
)
POISON_COLUMNS: Final = (
    "id",
    "queue",
    "handle",
    "queuing_order",
    "delivery_count",
    "action",
    "time",
    "error",
    "body",
)
# the tables `count_rows` counts
COUNTED_TABLES: Final = ("endpoints", "transmission_queue", "messages")


class Commits(Protocol):
    """Batches, durability, and the store's life from open to close."""

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

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[BaseException], None],
        on_trouble: Callable[[str | None], None] | None = None,
    ) -> None:
        """Commit in the background from now on, on `loop`: every write is committed
        soon without being asked, and what waited for it runs on the loop.

        Args:
            loop: the event loop the broker runs on.
            on_failure: called once with the error when a commit fails for good (a
                broken constraint: a bug). The store then commits nothing more and
                `failed` holds the error: memory is ahead of disk.
            on_trouble: called with the reason (in words) when commits start failing for
                a cause that may pass (no space, an I/O error, a lock held elsewhere), and
                with None once they succeed again. Meanwhile writes collect, the failed
                batches are tried again every second or so, and nothing waiting for them
                runs.
        """
        ...

    def write_now(self) -> None:
        """Commit everything pending now, synchronously (start-up, before `attach`).

        Raises:
            StoreFailure: the batch could not be committed.
        """
        ...

    async def close(self) -> None:
        """Wait for the commit under way, commit what is pending (unless the store failed
        or is in trouble), and release the database.

        Raises:
            StoreFailure: the last batch could not be written.
        """
        ...

    @property
    def failed(self) -> BaseException | None:
        """The error of a commit that failed for good (None: none did)."""
        ...

    @property
    def trouble(self) -> str | None:
        """Why commits are failing now, in words (None: they are not)."""
        ...

    @property
    def commits(self) -> int:
        """Commits that succeeded since the store was opened."""
        ...

    @property
    def rows_written(self) -> int:
        """Rows those commits wrote (inserted, updated or deleted)."""
        ...

    @property
    def cancelled(self) -> int:
        """Message rows never written: deleted while their insert was still in the open
        batch."""
        ...

    # told (on the event loop) the rows written and the seconds taken by each commit that
    # succeeded; None: nobody listens
    commit_observer: Callable[[int, float], None] | None


class Space(Protocol):
    """The room the store takes, and its upkeep while the broker is idle."""

    def free_bytes(self) -> int | None:
        """Bytes the store can still grow into: the file system's free space plus the
        space the store holds free for reuse (None: the store cannot tell, its disk being
        a database server's).

        Raises:
            StoreError: the figure cannot be read.
        """
        ...

    async def checkpoint(self) -> int | None:
        """Upkeep for an idle store (the daemon calls it repeatedly after a quiet spell):
        give a slice of the space the store no longer uses back to the file system and
        shrink its logs and caches. Never raises.

        Returns:
            How much reclaimable space is still left (in the store's own units; 0: none,
            further calls do nothing), or None when it was skipped (a commit was under
            way, or the store failed).
        """
        ...


class CatalogRows(Protocol):
    """The catalog of objects, the broker's meta values, and figures over whole tables."""

    def load_meta(self) -> dict[str, str]:
        """Every meta value by key (start-up read)."""
        ...

    def put_meta(self, key: str, value: str) -> None:
        """Set a meta value, replacing the key's old one."""
        ...

    def load_catalog(self) -> list[tuple[str, str, str]]:
        """(kind, name, body) of every catalog object, in no particular order (start-up
        read)."""
        ...

    def put_catalog(self, kind: str, name: str, body: str) -> None:
        """Store an object's definition, replacing one of the same kind and name."""
        ...

    def delete_catalog(self, kind: str, name: str) -> None:
        """Forget an object (nothing happens if there is none)."""
        ...

    def max_ids(self) -> tuple[int, int, int]:
        """The largest queuing order of a message, id of a transmission-queue entry and id
        of a poison incident stored (0 for an empty table), so that new ones are larger
        (start-up read)."""
        ...

    def count_rows(self, table: str) -> int:
        """How many rows one of `COUNTED_TABLES` holds.

        Raises:
            ValueError: `table` is not one of them.
        """
        ...


class EndpointRows(Protocol):
    """Conversation endpoints (ENDPOINT_COLUMNS), keyed by handle, and by conversation id
    and side (is_initiator) as well."""

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

    def read_groups(self, limit: int) -> list[Row]:
        """(group id, the smallest service name among its endpoints, how many endpoints)
        per conversation group, by group id, at most `limit`."""
        ...


class MessageRows(Protocol):
    """Messages in queues (MESSAGE_COLUMNS), keyed by queuing order. `size` is the body's
    length, what byte budgets count."""

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

    def set_message_status(self, queuing_order: int, status: int) -> None:
        """Change a message's status."""
        ...

    def set_delivery_count(self, queuing_order: int, count: int) -> None:
        """Change a message's delivery count."""
        ...

    def set_message_extra(self, queuing_order: int, extra: bytes | None) -> None:
        """Change a message's extra column (the core's packed attributes)."""
        ...

    def read_ready_messages(
        self,
        queue: str,
        handle: uuid.UUID,
        first: int,
        before: int | None,
        limit: int,
        max_bytes: int,
    ) -> list[Row]:
        """Ready messages of conversation `handle` in `queue` with `first` <= queuing
        order < `before` (None: no upper bound), in queuing order: at most `limit`, and no
        more once their sizes add up to `max_bytes` (the one that reaches it is
        included)."""
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

    def message_enqueue_time(self, queuing_order: int) -> float | None:
        """When a message was enqueued (None: there is no such message).

        Raises:
            StoreError: the store cannot be read now.
        """
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


class TransmissionRows(Protocol):
    """The transmission queue (TRANSMISSION_COLUMNS): messages on their way to another
    service, keyed by id, and ordered by seq within a dialog direction (a conversation id
    and side)."""

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
        self,
        conversation_id: uuid.UUID,
        is_initiator: bool,
        first: int,
        before: int | None,
        limit: int,
        max_bytes: int,
    ) -> list[Row]:
        """A direction's entries with `first` <= seq < `before` (None: no upper bound), by
        seq: at most `limit`, at least one if there is any, and then no more than fit in
        `max_bytes` counting their bodies' lengths."""
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


class RemoteRows(Protocol):
    """The transport's state of dialogs with other brokers: one row per dialog direction
    and side (REMOTE_DIALOG_COLUMNS), and fragments of messages not yet complete
    (HELD_FRAGMENT_COLUMNS)."""

    def load_remote(self) -> tuple[list[Row], list[Row]]:
        """(every dialog row, every held fragment), the fragments by conversation id,
        direction, seq and fragment index (the transport's start-up read)."""
        ...

    def put_remote_dialog(self, row: Row) -> None:
        """Store a dialog row, replacing the one of its conversation, direction and
        side."""
        ...

    def set_remote_next_seq(
        self, conversation_id: uuid.UUID, direction: int, side: str, next_seq: int
    ) -> None:
        """Change a dialog row's next_seq (nothing happens if there is none)."""
        ...

    def delete_remote_dialog(self, conversation_id: uuid.UUID, direction: int, side: str) -> None:
        """Forget a dialog row (nothing happens if there is none)."""
        ...

    def put_held_fragment(self, row: Row) -> None:
        """Store a fragment, replacing one of the same message and fragment index."""
        ...

    def delete_held_message(self, conversation_id: uuid.UUID, direction: int, seq: int) -> None:
        """Forget every held fragment of one message of a direction."""
        ...

    def delete_held_direction(self, conversation_id: uuid.UUID, direction: int) -> None:
        """Forget every held fragment of a direction."""
        ...


class SecurityRows(Protocol):
    """Logins (LOGIN_COLUMNS: scrypt hashes, never passwords), the permissions granted to
    them (GRANT_COLUMNS; kind and name '' for the broker itself) and who owns each catalog
    object (OWNER_COLUMNS)."""

    def load_logins(self) -> list[tuple[str, str, float]]:
        """Every login row, in no particular order (start-up read)."""
        ...

    def put_login(self, row: Row) -> None:
        """Store a login row, replacing one of the same name."""
        ...

    def delete_login(self, name: str) -> None:
        """Forget a login (its grants stay until `forget_login`)."""
        ...

    def load_permissions(self) -> tuple[list[Row], list[Row]]:
        """(every grant row, every owner row), in no particular order (start-up read)."""
        ...

    def put_grant(self, row: Row) -> None:
        """Store a grant (nothing changes if it is there already)."""
        ...

    def delete_grant(self, row: Row) -> None:
        """Forget a grant (nothing happens if there is none)."""
        ...

    def put_owner(self, row: Row) -> None:
        """Store who owns an object, replacing its previous owner."""
        ...

    def forget_object(self, kind: str, name: str) -> None:
        """A dropped object: forget its owner and every grant on it."""
        ...

    def forget_login(self, login: str) -> None:
        """A dropped login: forget every grant to it."""
        ...


class OutcomeRows(Protocol):
    """Ids of committed transactions, for clients resolving a commit whose answer was
    lost (see `_core.outcomes`): one record per batch, numbered, pruned oldest first."""

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


class LogRows(Protocol):
    """Records kept for people to read: poison incidents (POISON_COLUMNS) and the seed-000
    scheduler's execution log (EXECUTION_LOG_COLUMNS)."""

    def insert_poison(self, row: Row) -> None:
        """Store a new incident (its id is larger than any stored)."""
        ...

    def read_poison(self, limit: int) -> list[Row]:
        """The newest `limit` incidents, oldest first, without the body column."""
        ...

    def put_execution_log(self, row: Row) -> None:
        """Store a log row, replacing the one of the same log_id."""
        ...

    def delete_execution_log_upto(self, log_id: int) -> None:
        """Forget every log row up to and including `log_id`."""
        ...

    def execution_log(self, limit: int) -> list[Row]:
        """The newest `limit` log rows (by log_id), oldest first."""
        ...


class Store(
    Commits,
    Space,
    CatalogRows,
    EndpointRows,
    MessageRows,
    TransmissionRows,
    RemoteRows,
    SecurityRows,
    OutcomeRows,
    LogRows,
    Protocol,
):
    """The storage port: everything the broker asks of its store."""


class ManualCommits(Protocol):
    """What tests need of a store besides the port (the shared store tests and the core's
    unit tests): a store made not to commit by itself commits only in `flush()`."""

    def flush(self) -> None:
        """Commit what is pending now, as the background would; a failure is handled as
        there (kept to retry, or fatal)."""
        ...

    def discard_pending(self) -> None:
        """Forget every write not yet committed, as a crash would."""
        ...

    # the next commit raises this instead of writing (None: commits write)
    fail_next: BaseException | None


class ManualStore(Store, ManualCommits, Protocol):
    """A store that tests drive by hand."""


if TYPE_CHECKING:

    def _a_store_is_a_journal(store: Store) -> Journal:
        """The core's Journal is a part of the port (mypy checks this assignment)."""
        return store
