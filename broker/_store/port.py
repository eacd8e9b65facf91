"""The storage port: what the broker asks of its store, whichever database holds it.

Theory of operation. The store keeps everything durable: the catalog, conversation
endpoints, messages, the transmission queue, the transport's dialog state, logins and
permissions, transaction outcomes, poison incidents and the scheduler's log. `Store`
is the one interface the rest of the broker uses; it is made of one Protocol per family
of tables, and `SQLiteStore` and `PostgresStore` implement it; both pass the shared
tests (`tests/store/`).

The families the core writes through are the core's own (`_core.ports`, whose `Journal`
they make up), with their contracts; each family here extends its core family with what
the rest of the broker asks besides (the start-up reads, the store's life, the
transport's and the security tables), so a store is a Journal by construction.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from .._core.ports import (
    Batches,
    CatalogJournal,
    EndpointJournal,
    MessageJournal,
    OutcomeJournal,
    PoisonJournal,
    Row,
    TableJournal,
    TransmissionJournal,
)

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


@dataclass(frozen=True, slots=True)
class CommitHooks:
    """What the broker hears of a store's commits once it is attached (on the loop; any
    may be left out).

    on_failure: called once with the error when a commit fails for good (a broken
        constraint: a bug). The store then commits nothing more and `failed` holds the
        error: memory is ahead of disk.
    on_trouble: called with the reason (in words) when commits start failing for a cause
        that may pass (no space, an I/O error, a lock held elsewhere), and with None once
        they succeed again. Meanwhile writes collect, the failed batches are tried again
        every second or so, and nothing waiting for them runs.
    on_commit: told the rows written and the seconds taken by each commit that succeeds.
    on_abandon: called with the reason once commits have failed for `abandon_after`
        seconds (None: never) and the last attempt surely wrote nothing: every batch not
        yet durable is then given up (`abandoned` holds why), none of it is ever written,
        what waited for it never runs, and the store commits nothing more: memory is
        ahead of disk.
    """

    on_failure: Callable[[BaseException], None] | None = None
    on_trouble: Callable[[str | None], None] | None = None
    on_commit: Callable[[int, float], None] | None = None
    on_abandon: Callable[[str], None] | None = None
    abandon_after: float | None = None


class Commits(Batches, Protocol):
    """The core's batches and durability, and the store's life from open to close."""

    def attach(self, loop: asyncio.AbstractEventLoop, hooks: CommitHooks) -> None:
        """Commit in the background from now on, on `loop`: every write is committed
        soon without being asked, and what waited for it runs on the loop; `hooks` hear
        how commits go."""
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
    def abandoned(self) -> str | None:
        """Why the batches not yet durable were given up (None: they were not)."""
        ...

    def abandon(self) -> None:
        """Give up every batch not yet durable now (see `attach`'s `on_abandon`, which it
        calls)."""
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

    def keep_reserve(self) -> str | None:
        """Keep in place the room the store holds for a full disk (its disk reserve),
        making it again if there is space; None when it is in place (or the store holds
        none), else why it is not and what makes it, in words."""
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


class CatalogRows(CatalogJournal, Protocol):
    """The core's catalog and meta values, with their start-up reads, and figures over
    whole tables."""

    def load_meta(self) -> dict[str, str]:
        """Every meta value by key (start-up read)."""
        ...

    def load_broker_files(self) -> dict[str, str]:
        """The text of every file of the broker kept in the store, by file name (read at
        start, before `attach`)."""
        ...

    def put_broker_file(self, name: str, body: str) -> None:
        """Keep a file of the broker (its name and text), replacing one of that name."""
        ...

    def delete_broker_file(self, name: str) -> None:
        """Forget a file of the broker (nothing happens if there is none)."""
        ...

    def load_catalog(self) -> list[tuple[str, str, str]]:
        """(kind, name, body) of every catalog object, in no particular order (start-up
        read)."""
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


class EndpointRows(EndpointJournal, Protocol):
    """The core's conversation endpoints (ENDPOINT_COLUMNS), and their groups for views."""

    def read_groups(self, limit: int) -> list[Row]:
        """(group id, the smallest service name among its endpoints, how many endpoints)
        per conversation group, by group id, at most `limit`."""
        ...


class MessageRows(MessageJournal, Protocol):
    """The core's messages in queues (MESSAGE_COLUMNS), and when one was enqueued."""

    def message_enqueue_time(self, queuing_order: int) -> float | None:
        """When a message was enqueued (None: there is no such message).

        Raises:
            StoreError: the store cannot be read now.
        """
        ...


class TransmissionRows(TransmissionJournal, Protocol):
    """The core's transmission queue (TRANSMISSION_COLUMNS), as the core uses it."""


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


class OutcomeRows(OutcomeJournal, Protocol):
    """The core's committed transaction ids (see `_core.outcomes`), as the core uses them."""


class LogRows(PoisonJournal, Protocol):
    """Records kept for people to read: the core's poison incidents (POISON_COLUMNS) and
    the seed-000 scheduler's execution log (EXECUTION_LOG_COLUMNS)."""

    def put_execution_log(self, row: Row) -> None:
        """Store a log row, replacing the one of the same log_id."""
        ...

    def delete_execution_log_upto(self, log_id: int) -> None:
        """Forget every log row up to and including `log_id`."""
        ...

    def execution_log(self, limit: int) -> list[Row]:
        """The newest `limit` log rows (by log_id), oldest first."""
        ...


class TableRows(TableJournal, Protocol):
    """Users' tables (see `user_tables`): the core's statements, and their sizes."""

    def table_sizes(self) -> list[tuple[str, str, int]]:
        """(database, table, rows) of every table, committed, by name.

        Raises:
            StoreError: the store cannot be read now.
        """
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
    TableRows,
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
