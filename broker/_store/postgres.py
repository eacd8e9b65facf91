"""The store on PostgreSQL: the port's implementation through psycopg 3.

Theory of operation. `PostgresStore` is the families of tables (`tables`) over the group
commit (`commit`), on one PostgreSQL database (`postgres_schema`), with two connections
of its own: the *reader*, on which the event loop makes the port's reads (synchronous
calls, in autocommit mode: each read sees every transaction committed before it, never
the one being committed), and the *writer*, on which the store thread commits. psycopg's
blocking API serves both: a read is one round trip with the loop waiting, as a read of
SQLite's page cache is a wait, and a commit blocks only the store thread.

A commit is one transaction sent as one pipeline (psycopg's pipeline mode: BEGIN, the
batches' statements, the commit mark, COMMIT, then one wait for all their results), so a
batch of hundreds of rows costs one round trip; consecutive rows of one statement are
one executemany, which the pipeline sends as many executions of one prepared statement.
"Committed" is PostgreSQL's: with durability "fsync" the server's own
`synchronous_commit` decides what a COMMIT waits for (its WAL on disk by default, a
standby's too under synchronous replication); with "os" the writer sets
`synchronous_commit = off`, and an acknowledged message survives a daemon crash but
perhaps not a crash of the database server.

Several daemons may share a database, one of them serving: the one that holds the
broker's lease (see `lease`). The store is opened only by the holder, and is *fenced* by
it: every commit's transaction begins with `ssb_fence(epoch)`, which fails once the
lease has passed to another daemon, and the store commits nothing (and acknowledges
nothing) while the holder's own clock says that its lease may have lapsed (`Fence`).
Either is `LeaseLost`, which no retry helps: the daemon stops.

A lost connection is a failure that may pass: the batches are tried again (see
`commit`) on a new connection, which libpq makes to whichever host of the URL accepts
it (several hosts with `target_session_attrs=read-write` follow a primary's failover).
A commit whose answer was lost with the connection may or may not have committed: each
commit writes a new random token into `commit_marks` in its own transaction, and before
anything else the next attempt makes sure the lost session has ended on the server (its
transaction then committed or rolled back for good), reads the token back, and drops the
batches that did commit: no batch is applied twice, none is lost. A read on a lost
connection is made once more on a new one (on the event loop, waiting at most
`CONNECT_TIMEOUT`), and otherwise raises `StoreError`.

Space is the database server's: `free_bytes` is None (the broker cannot see the server's
disk, so `min_free_disk` and `disk_reserve` do not apply; a full disk there fails
commits, which are retried while new messages are refused, and abandoned after
`disk_full_timeout` when the server answered that they failed: a commit whose answer was
lost is never abandoned, it waits until its mark settles it) and `checkpoint` has
nothing to do (the server's autovacuum returns the space of deleted rows).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import struct
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import psycopg
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format

from . import postgres_schema
from .commit import Batch, Committer, Cursor, apply_statements
from .errors import LeaseLost, StoreError, StoreUnavailable, describe_failure, lease_lost
from .postgres_tables import PostgresUserTables, RawSQL
from .tables import ROW_COUNTS, AllTables

if TYPE_CHECKING:
    from .port import ManualStore

log = logging.getLogger("ssb.store")

CONNECT_TIMEOUT: Final = 10  # seconds a connection attempt waits, unless the URL says
SESSION_END_TIMEOUT: Final = 30.0  # seconds to wait for a lost session to end on the server
_FENCE: Final = "SELECT ssb_fence(?)"
_MARK: Final = "UPDATE commit_marks SET token = ? WHERE id = 1"
_READ_MARK: Final = "SELECT token FROM commit_marks WHERE id = 1"
_BACKEND: Final = "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
_END_BACKEND: Final = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ? AND backend_start = ?"
)
_HAS_BACKEND: Final = "SELECT 1 FROM pg_stat_activity WHERE pid = ? AND backend_start = ?"
_BYTEA: Final = psycopg.postgres.types["bytea"].oid
_INT2: Final = psycopg.postgres.types["int2"].oid
_SMALLINT: Final = struct.Struct("!h")


class _UUIDAsBytes(Dumper):
    """A UUID is written as its 16 bytes (the port's rule; SQLite's store does the same)."""

    format = Format.BINARY
    oid = _BYTEA

    def dump(self, obj: uuid.UUID) -> bytes:
        return obj.bytes


class _BoolAsSmallint(Dumper):
    """A boolean is written as 0 or 1 (the port reads booleans back as ints)."""

    format = Format.BINARY
    oid = _INT2

    def dump(self, obj: bool) -> bytes:
        return _SMALLINT.pack(int(obj))


@functools.cache
def _driver_sql(sql: str) -> str:
    """The families' SQL (`?` placeholders) as psycopg takes it (`%s`)."""
    return sql.replace("%", "%%").replace("?", "%s")


def describe_url(url: str) -> str:
    """The database a URL names, for messages and logs: without its password.

    Raises:
        StoreUnavailable: it is not a connection URL (the message says what is wrong).
    """
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = describe_failure(exc).replace(url, "...")  # never its password
        raise StoreUnavailable(
            f"the store URL is not one PostgreSQL understands ({reason}); give one like"
            " postgresql://USER@HOST:PORT/DATABASE"
        ) from None
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host', '')}{port}/{parts.get('dbname', '')}"


class DatabaseInUse(StoreUnavailable):
    """Another daemon holds the broker's lease on the database."""


class Fence(Protocol):
    """The lease a store commits under (see `lease`): its epoch, the node holding it, and
    whether the holder's own clock says it still holds it (called on the store thread)."""

    epoch: int
    node: str

    def held(self) -> bool: ...


@dataclass(eq=False, repr=False)  # (no repr: the URL may hold a password)
class Session:
    """One connection to the database that speaks the families' SQL, in autocommit mode;
    `reconnect` replaces a lost one and remembers which server session it was. Its
    `role` names it on the server (application_name "ssb ROLE"); with `keepalive`, a
    connection whose server stops answering is found lost within about that many
    seconds (TCP keepalives and user timeout), not the system's two hours."""

    url: str
    role: str
    settings: Sequence[str] = ()
    keepalive: float | None = None
    # (pid, start) of a session lost unended
    lost: tuple[int, Any] | None = field(default=None, init=False)
    conn: psycopg.Connection[Any] = field(init=False)
    backend: tuple[int, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.conn, self.backend = self._connect()

    def _connect(self) -> tuple[psycopg.Connection[Any], tuple[int, Any]]:
        options: dict[str, Any] = {"application_name": f"ssb {self.role}"}
        given = conninfo_to_dict(self.url)
        if "connect_timeout" not in given:
            options["connect_timeout"] = CONNECT_TIMEOUT
        if self.keepalive is not None:
            seconds = max(1, int(self.keepalive))
            for key, value in (
                ("keepalives_idle", max(1, seconds // 3)),
                ("keepalives_interval", max(1, seconds // 6)),
                ("keepalives_count", 3),
                ("tcp_user_timeout", seconds * 1000),
            ):
                options.setdefault(key, given.get(key, value))
        conn = psycopg.connect(self.url, autocommit=True, **options)
        try:
            conn.adapters.register_dumper(uuid.UUID, _UUIDAsBytes)
            conn.adapters.register_dumper(bool, _BoolAsSmallint)
            conn.prepared_max = 512  # every statement shape of the families, prepared
            for setting in self.settings:
                conn.execute(setting)
            row = conn.execute(_BACKEND).fetchone()
        except BaseException:
            conn.close()
            raise
        assert row is not None
        return conn, (int(row[0]), row[1])

    @property
    def broken(self) -> bool:
        """Whether the connection is lost (or closed)."""
        return self.conn.closed or self.conn.broken

    def reconnect(self) -> None:
        """A new connection in place of a lost one (the lost session is remembered in
        `lost` until `end_lost`)."""
        with contextlib.suppress(psycopg.Error):
            self.conn.close()
        self.conn, backend = self._connect()
        if self.lost is None:
            self.lost = self.backend
        self.backend = backend

    def end_lost(self) -> None:
        """Make sure the session lost before the last reconnect has ended on the server:
        end it if it still runs, and wait until it is gone (its transaction then
        committed or rolled back, for good).

        Raises:
            TimeoutError: it is still there after SESSION_END_TIMEOUT.
        """
        if self.lost is None:
            return
        self.execute(_END_BACKEND, self.lost).fetchall()
        deadline = time.monotonic() + SESSION_END_TIMEOUT
        while self.execute(_HAS_BACKEND, self.lost).fetchone() is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the database session {self.lost[0]} lost with its connection has not"
                    f" ended after {SESSION_END_TIMEOUT:g} s"
                )
            time.sleep(0.05)
        self.lost = None

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        if type(sql) is RawSQL:  # a user's table statement, with its own placeholders
            return psycopg.RawCursor(self.conn).execute(sql, parameters)
        return self.conn.execute(_driver_sql(sql), parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> None:
        if type(sql) is RawSQL:
            psycopg.RawCursor(self.conn).executemany(sql, parameters)
            return
        self.conn.cursor().executemany(_driver_sql(sql), parameters)

    def close(self) -> None:
        self.conn.close()


class ReadSession(Session):
    """The reader: a read on a lost connection is made once more on a new one; what the
    database refuses is a StoreError."""

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        try:
            if self.broken:
                self.reconnect()
            return super().execute(sql, parameters)
        except psycopg.OperationalError as exc:
            if not self.broken:
                raise StoreError(describe_failure(exc)) from exc
        except psycopg.Error as exc:
            raise StoreError(describe_failure(exc)) from exc
        try:
            self.reconnect()
            return super().execute(sql, parameters)
        except psycopg.Error as exc:
            raise StoreError(describe_failure(exc)) from exc


def _transient(exc: BaseException) -> bool:
    """Whether a failed commit may succeed later: a lost connection, a server shutting
    down or out of space, a lock or a conflict, a server that is a standby for now (but
    never a lease that has passed to another daemon)."""
    if lease_lost(exc):
        return False
    if isinstance(exc, (OSError, psycopg.OperationalError, psycopg.InterfaceError)):
        return True
    return getattr(exc, "sqlstate", None) == "25006"  # read-only: not the primary (yet)


class PostgresStore(AllTables, PostgresUserTables, Committer):
    """The storage port on a PostgreSQL database (see the module's comment).

    `PostgresStore(url, durability, fence, threaded=True)`: `url` is libpq's (a URL or a
    key=value string); `fence` the lease its commits are made under; `threaded=False`
    makes a store that commits only in `flush()` (tests).
    """

    # no multi-row inserts: a pipelined executemany of a prepared INSERT costs less here
    row_counts = ROW_COUNTS
    _reader: ReadSession

    def __init__(self, url: str, durability: str, fence: Fence, *, threaded: bool = True) -> None:
        super().__init__(durability, threaded=threaded)
        self.where = describe_url(url)
        self.fence = fence
        synchronous = ("SET synchronous_commit = off",) if durability == "os" else ()
        self._writer = Session(url, f"writer {fence.node}", synchronous)
        try:
            postgres_schema.create(self._writer.conn, self.where)
            self._reader = self._db = ReadSession(url, f"reader {fence.node}")
        except BaseException:
            self._writer.close()
            raise
        self._tables_connect = lambda: Session(url, f"tables {fence.node}").conn
        self._start_tables()
        self.on_release: Callable[[], None] | None = None  # run when the store closes
        # the token of a commit whose outcome was not seen, and its last batch's number
        self._unseen: tuple[bytes, int] | None = None

    # ---- commits --------------------------------------------------------------------------

    def _transient(self, exc: BaseException) -> bool:
        return _transient(exc)

    def _abandonable(self, exc: BaseException) -> bool:
        """Only a commit the server answered as failed for want of resources (class 53:
        out of disk, memory or connections) or for an I/O error (class 58) is given up:
        a lost connection may have taken a commit's answer (the next attempt settles it
        by its mark), the server may be restarting or a standby for now (25006), and a
        lock or a conflict passes."""
        sqlstate = getattr(exc, "sqlstate", None) or ""
        return sqlstate[:2] in ("53", "58") and self._unseen is None and not self._writer.broken

    def _commit(self, batches: list[Batch], checkpoint: bool = True) -> None:
        self._injected_failure()
        started = time.perf_counter()
        fence = self.fence
        self._check_lease()
        writer = self._writer
        if writer.broken:
            writer.reconnect()
        batches = self._settle_unseen(batches)
        rows = 0
        if batches:
            token = os.urandom(16)
            self._unseen = (token, batches[-1].number)
            conn = writer.conn
            try:
                with conn.pipeline():
                    conn.execute("BEGIN")
                    writer.execute(_FENCE, (fence.epoch,))  # first: see `lease`
                    rows = apply_statements(writer, batches, {}, self.row_counts)
                    writer.execute(_MARK, (token,))
                    conn.execute("COMMIT")
            except psycopg.Error as exc:
                if not writer.broken:  # the server answered: nothing was committed
                    self._unseen = None
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                    raise
                try:  # the answer was lost: did it commit?
                    writer.reconnect()
                    left = self._settle_unseen(batches)
                except (psycopg.Error, OSError):
                    raise exc from None  # settled by the next attempt
                if left:
                    raise
            self._unseen = None
        self._check_lease()  # committed, but acknowledged only by a daemon that holds it
        self._committed(rows, started)

    def _check_lease(self) -> None:
        if not self.fence.held():
            raise LeaseLost(
                "this daemon's lease on the database may have lapsed (its own clock says so):"
                " it commits and acknowledges nothing more"
            )

    def _settle_unseen(self, batches: list[Batch]) -> list[Batch]:
        """`batches` without those a commit whose outcome was not seen wrote (on the
        writer, connected again)."""
        if self._unseen is None:
            return batches
        token, last = self._unseen
        writer = self._writer
        writer.end_lost()
        row = writer.execute(_READ_MARK).fetchone()
        self._unseen = None
        if row is None or bytes(row[0]) != token:
            log.info("a commit whose answer was lost with the connection did not commit")
            return batches
        log.info("a commit whose answer was lost with the connection had committed")
        return [batch for batch in batches if batch.number > last]

    def _release(self) -> None:
        self._close_tables()
        self._reader.close()
        self._writer.close()
        if self.on_release is not None:
            self.on_release()

    # ---- space ----------------------------------------------------------------------------

    def free_bytes(self) -> int | None:
        """None: the room is the database server's (see the module's comment)."""
        return None

    def keep_reserve(self) -> str | None:
        """None: the room is the database server's, this store holds none."""
        return None

    async def checkpoint(self) -> int | None:
        """Nothing to do: the server's autovacuum returns the space of deleted rows."""
        return 0


def open_postgres_store(url: str, durability: str, fence: Fence) -> PostgresStore:
    """The store in the PostgreSQL database of `url`, committing under `fence` (the lease
    the caller holds), not yet attached.

    Args:
        url: libpq's connection URL (several hosts and `target_session_attrs` are
            libpq's).
        durability: "fsync" (the server's synchronous_commit) or "os" (off).
        fence: the lease (see `lease`): its schema and identity are made already.

    Raises:
        StoreUnavailable: the store cannot be opened; the message says why and what to
            do, in one line, without the URL's password.
    """
    try:
        return PostgresStore(url, durability, fence)
    except psycopg.Error as exc:
        raise StoreUnavailable(cannot_open(describe_url(url), exc)) from None


def cannot_open(where: str, exc: psycopg.Error) -> str:
    """One line for a database that cannot be opened: what the server said, and what to
    do where that is clear."""
    primary = exc.diag.message_primary  # the server's words, without the statement
    text = f"{primary} ({exc.sqlstate})" if primary and exc.sqlstate else describe_failure(exc)
    lowered = text.lower()
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        hint = (
            "the user may not create the broker's tables: grant it CREATE on the schema"
            " (GRANT CREATE ON SCHEMA public TO ...) or start once as the database's owner"
        )
    elif "database" in lowered and "does not exist" in lowered:
        hint = "create the database (createdb), or name one that exists"
    elif "authentication failed" in lowered or ("role" in lowered and "does not exist" in lowered):
        hint = "check the user and password of the store URL"
    elif "is the server running" in lowered:
        hint = ""  # libpq asked already
    elif "connection refused" in lowered or "timeout" in lowered or "could not" in lowered:
        hint = "is PostgreSQL running there and accepting connections?"
    else:
        hint = ""
    return f"cannot open the store {where}: {text}" + (f"; {hint}" if hint else "")


if TYPE_CHECKING:

    def _made_for_tests(store: PostgresStore) -> ManualStore:
        """A store made with threaded=False is what the shared store tests drive (mypy
        checks this assignment; `open_postgres_store` checks the port itself)."""
        return store
