"""Users' tables on the PostgreSQL store: each transaction's statements run at once on a
connection of its own, and again, in order, in the batch of its commit.

Theory of operation. The store keeps SQLite's model (`user_tables`): a statement's
answer (rows, row count, a constraint's error, new identities) comes from a
*provisional* run, inside a PostgreSQL transaction that is never committed; its commit
writes the same statement, with the same values, into the open batch, which the writer
commits with the transaction's RECEIVEs, SENDs and ENDs (and the lease's fence) in one
PostgreSQL transaction. The core's table locks, held until that batch is durable, make
both runs start from the same rows, so the second gives the first's results. Nothing is
written outside the batch, so a commit that fails, is retried or is lost with the
connection is settled as every other commit is (see `postgres`), and a kill -9 leaves
all of a transaction or none of it.

Provisional transactions. A transaction that uses tables takes a connection of its own
(kept open, at most `MAX_CONNECTIONS`, reused afterwards) with its PostgreSQL transaction
open until it commits or rolls back; its statements run one after the other there, each
in a savepoint (a failed one is undone alone, the transaction goes on), on a thread of
their own (never the store thread: a commit does not wait for a statement, nor a
statement for a commit), within `statement_timeout` (PostgreSQL's own setting). Its
commit or rollback rolls that transaction back and frees the connection; a rollback to a
savepoint frees it too, and the next statement runs the statements kept before its own.
So does the next statement after the connection was lost (the one that met the loss
fails, saying so): the statements kept give again what they gave (see Identities).

Identities. A PostgreSQL sequence is not transactional: the provisional run takes the
identity values that the run at commit must give again. So before each INSERT the
provisional run reads where the table's identity sequence stands (`postgres_sql`'s
`"t:identity"`), and whoever runs the INSERT again (the commit's batch, or a re-run after
a savepoint) first sets the sequence back there.

Schemas. Each broker database's tables live in the schema `postgres_sql.schema_name`,
made (empty, committed at once) before a transaction first creates a table in it.

Temporary tables. A session's `#name` is an ordinary table of the schema
`postgres_sql.TEMPORARY_SCHEMA`, named after its session, written and committed as
every table is (so that every connection of the pool sees it): a rollback of its CREATE
leaves nothing, and the core drops it when its session ends (`_core.tables`). Sessions
do not outlive their daemon, so the store drops that schema, and whatever a daemon
before it left there (killed, or taken over from), when it opens: only the daemon that
holds the lease opens the store. They are logged tables: an unlogged one would come
back empty after a crash of the database server, or on its promoted standby, while
the daemon and its sessions go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Protocol, cast

import psycopg
from psycopg import sql as pgsql

from .._core.ports import TableError, TableRuns, TableStatement
from . import postgres_sql, user_kinds, user_sql
from .commit import Committer
from .errors import StoreError, describe_failure
from .user_sql import Statement
from .user_tables import TableAnswer, bind_runs, bounded_rows, parameters

log = logging.getLogger("ssb.store")

MAX_CONNECTIONS: Final = 16  # transactions using tables at once (each holds a connection)
COUNT_LOCK_TIMEOUT: Final = "100ms"  # how long the tables view waits for a table's lock
# how long the store, opening, waits for the locks of the temporary tables left behind
DROP_LOCK_TIMEOUT: Final = "10s"
IDENTITY_KEY: Final = " identity"  # where a statement's values keep its sequence's place
_READ_SEQUENCE: Final = "SELECT pg_sequence_last_value(s) FROM to_regclass($1) AS s"
# the batch's statement that puts a sequence back where the provisional run found it
SET_SEQUENCE: Final = (
    "SELECT setval(s, COALESCE(?::bigint, 1), ?::bigint IS NOT NULL)"
    " FROM to_regclass(?) AS s WHERE s IS NOT NULL"
)
_RAW_SET_SEQUENCE: Final = (
    "SELECT setval(s, COALESCE($1::bigint, 1), $1::bigint IS NOT NULL)"
    " FROM to_regclass($2) AS s WHERE s IS NOT NULL"
)
_TABLES: Final = (
    "SELECT n.nspname, c.relname, c.reltuples FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind = 'r' AND n.nspname LIKE 'u:%' ORDER BY n.nspname, c.relname"
)
# a schema's foreign keys: (referring table, referred table, whether a change of the
# referred rows changes the referring ones: ON DELETE / UPDATE CASCADE, SET NULL, SET DEFAULT)
_FOREIGN_KEYS: Final = (
    "SELECT c.relname, p.relname, k.confdeltype IN ('c', 'n', 'd') OR k.confupdtype IN"
    " ('c', 'n', 'd') FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
    " JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE k.contype = 'f' AND n.nspname = ? AND p.relnamespace = c.relnamespace"
)
# the declared names of columns (`postgres_sql` keeps those not in lower case so)
_DECLARED: Final = (
    "SELECT objoid, objsubid, description FROM pg_description"
    " WHERE classoid = 'pg_class'::regclass AND objoid = ANY($1::oid[]) AND objsubid > 0"
)
_SCHEMAS: Final = "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'u:%' OR nspname = ?"
# a quoted name, qualified or not, and a qualified one unquoted (in 'relation "s.t"')
_QUOTED: Final = re.compile(rf'"(?:(?:u:[^".]+|{postgres_sql.TEMPORARY_SCHEMA})"\.")?([^"]+)"')
_SCHEMA: Final = re.compile(rf"\b(?:u:[^\s.\"]+|{postgres_sql.TEMPORARY_SCHEMA})\.")


class RawSQL(str):
    """A user's statement in the batch: PostgreSQL's own `$n` placeholders, written as
    it is (`postgres.Session` does not rewrite `?` and `%` in it)."""

    __slots__ = ()


class _Reader(Protocol):
    """What the tables use of the store's reader (`postgres.ReadSession`)."""

    conn: psycopg.Connection[Any]

    @property
    def broken(self) -> bool: ...

    def reconnect(self) -> None: ...


@dataclass(slots=True, eq=False)
class _Provisional:
    """One transaction's connection and what its open PostgreSQL transaction holds."""

    conn: psycopg.Connection[Any]
    applied: int = 0  # statements applied in the open transaction
    busy: bool = False  # a statement runs on it
    dropped: bool = False  # forgotten while busy: roll back and free it afterwards


def shown(text: str) -> str:
    """A database message in the user's names (`"u:db"."t"`, `t:ix` become `t`, `ix`)."""
    text = _QUOTED.sub(lambda m: f'"{postgres_sql.user_name(m.group(1).split(":")[-1])}"', text)
    return _SCHEMA.sub("", text)


def _described(exc: psycopg.Error) -> str:
    """A failed statement's error in SQLite's words (which `tsql` numbers as SQL Server
    does: 2627, 515, 547, 208, 207, 2714), in the user's names."""
    diag = exc.diag
    state = exc.sqlstate or ""
    table = postgres_sql.user_name((diag.table_name or "").split(":")[0])
    primary = shown(diag.message_primary or str(exc).splitlines()[0])
    if state == "23505":
        keys = re.match(r"Key \((.*?)\)=", diag.message_detail or "")
        columns = [c.strip().strip('"') for c in keys.group(1).split(",")] if keys else []
        return "UNIQUE constraint failed: " + ", ".join(f"{table}.{c}" for c in columns)
    if state == "23502":
        return f"NOT NULL constraint failed: {table}.{diag.column_name}"
    if state == "23514":
        return user_kinds.checked(f"CHECK constraint failed: {diag.constraint_name}")
    if state == "22001":  # (a text longer than its VARCHAR(n))
        return user_kinds.TRUNCATED
    if state == "22003":
        return user_kinds.out_of_range(primary)
    if state == "22P02":
        return user_kinds.unconverted(primary)
    if state in ("42883", "42725"):  # (no such function, or no one of its kind)
        return user_kinds.no_sum(primary)
    if state == "23503":
        return f"FOREIGN KEY constraint failed ({primary})"
    if state == "42P01":
        name = re.search(r'(?:relation|table) "([^"]+)"', diag.message_primary or "")
        return f"no such table: {postgres_sql.user_name(shown(name.group(1))) if name else primary}"
    if state == "42703":
        name = re.search(r'column "?([^"\s]+)"?', diag.message_primary or "")
        return f"no such column: {name.group(1) if name else primary}"
    if state == "42P10" and "ON CONFLICT" in primary:  # a MERGE's ON names no key
        return "ON CONFLICT clause does not match any PRIMARY KEY or UNIQUE constraint"
    if state in ("42P07", "42710"):
        return primary  # 'relation "t" already exists'
    return primary


def _value(value: Any) -> Any:
    """A value of an answer as SQLite's store answers it (a time is text, a UUID its
    upper-case text, a decimal a number)."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, uuid.UUID):
        return str(value).upper()
    if isinstance(value, dt.datetime):
        spec = "milliseconds" if value.microsecond % 1000 == 0 else "microseconds"
        return value.isoformat(sep=" ", timespec=spec)
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def _inserts_into(statement: Statement) -> str | None:
    """The sequence an INSERT may take identities from (qualified), or None."""
    for table, permission in statement.writes.items():
        if permission == "INSERT":
            return postgres_sql.sequence_name(statement.database, table)
    return None


class PostgresUserTables(Committer):
    """Users' tables of `postgres.PostgresStore` (see the module's comment). The store
    sets `_tables_connect` (a new connection in autocommit mode, made as its own are) and
    calls `_close_tables` when it closes."""

    _tables_connect: Callable[[], psycopg.Connection[Any]]
    _tables_ready = False

    def _start_tables(self) -> None:
        self._tables_ready = True
        # by id of the owner (which may not be hashable): the owner, its connection
        self._provisional: dict[int, tuple[object, _Provisional]] = {}
        self._idle: list[psycopg.Connection[Any]] = []
        self._connections = 0
        self._free = asyncio.Semaphore(MAX_CONNECTIONS)
        self._schemas: set[str] = set()
        self._table_pool = ThreadPoolExecutor(
            max_workers=MAX_CONNECTIONS, thread_name_prefix="ssb-tables"
        )
        self._drop_temporary_tables()

    def _close_tables(self) -> None:
        if not self._tables_ready:
            return
        self._table_pool.shutdown(wait=True)
        for _, ctx in self._provisional.values():
            ctx.conn.close()
        for conn in self._idle:
            conn.close()
        self._provisional.clear()
        self._idle.clear()

    # ---- the port -------------------------------------------------------------------------

    def translate_table_statement(self, text: str, database: str, session: int = 0) -> Statement:
        # (a statement without a temporary table is the same in every session)
        return user_sql.translate(text, database, session if "#" in text else 0, postgres_sql.write)

    def load_table_names(self) -> list[tuple[str, str]]:
        return [(d, t) for d, t, _ in self._tables(self._db)]

    def table_sizes(self) -> list[tuple[str, str, int]]:
        """(database, table, rows) of every table, committed (reads on the loop; a table
        a transaction's ALTER or DROP holds is given PostgreSQL's estimate, not waited for)."""
        sizes = []
        for database, table, estimate in self._tables(self._reader):
            name = pgsql.Identifier(postgres_sql.schema_name(database), table)
            try:
                rows = self._count(name)
            except psycopg.errors.LockNotAvailable:
                rows = max(int(estimate), 0)
            sizes.append((database, table, rows))
        return sizes

    def _count(self, name: pgsql.Identifier) -> int:
        conn = self._reader_conn()
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{COUNT_LOCK_TIMEOUT}'")
                row = conn.execute(pgsql.SQL("SELECT COUNT(*) FROM {}").format(name)).fetchone()
        except psycopg.errors.LockNotAvailable:
            raise
        except psycopg.Error as exc:
            raise StoreError(describe_failure(exc)) from exc
        return int(row[0]) if row else 0

    def _reader_conn(self) -> psycopg.Connection[Any]:
        """The reader's connection (connected again if it was lost), for what the
        families' SQL cannot say: a transaction, a composed name."""
        reader = cast(_Reader, self._reader)
        if reader.broken:
            try:
                reader.reconnect()
            except psycopg.Error as exc:
                raise StoreError(describe_failure(exc)) from exc
        return reader.conn

    def table_foreign_keys(self, database: str) -> list[tuple[str, str, bool]]:
        """(read on the loop, by the reader: the committed tables)"""
        rows = self._reader.execute(_FOREIGN_KEYS, (postgres_sql.schema_name(database),))
        return [(str(a), str(b), bool(changes)) for a, b, changes in rows.fetchall()]

    @staticmethod
    def _tables(db: Any) -> list[tuple[str, str, float]]:
        found = []
        for schema, table, estimate in db.execute(_TABLES).fetchall():
            database = postgres_sql.database_of(schema)
            if database is not None and ":" not in table:
                found.append((database, str(table), float(estimate)))
        return found

    def run_table_statements_now(self, runs: TableRuns) -> TableAnswer | None:
        return None  # (a statement runs on its transaction's connection, on a thread)

    async def run_table_statements(self, runs: TableRuns) -> TableAnswer:
        owner, statement = runs.owner, runs.statement
        assert isinstance(statement, Statement)
        bound = bind_runs(statement, runs.many)
        for table, permission in statement.writes.items():
            if permission == "CREATE":
                self._make_schema(postgres_sql.qualified(statement.database, table)[0])
        held = self._provisional.get(id(owner))
        ctx = (
            held[1]
            if held is not None and held[0] is owner
            else await self._take(owner, runs.timeout)
        )
        if ctx.conn.broken or ctx.conn.closed:  # lost: the next runs `done` again on a new one
            ctx.conn.close()
            ctx.conn = await asyncio.to_thread(self._connect)
            ctx.applied = 0
        ctx.busy = True
        loop = asyncio.get_running_loop()
        job = self._table_pool.submit(self._run, ctx, runs, bound)
        # the connection is the thread's until the statement ends, even when the caller
        # stops waiting for it (this callback comes before the answer's)
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._statement_ended, ctx))
        return await asyncio.wrap_future(job)

    def _statement_ended(self, ctx: _Provisional) -> None:
        """A statement ended on `ctx`'s connection (on the loop)."""
        ctx.busy = False
        if ctx.dropped:
            self._free_connection(ctx)

    def forget_table_statements(self, owner: object) -> None:
        """The transaction ended, or went back to a savepoint: its PostgreSQL transaction
        is rolled back (at once: its commit's batch must not wait for its locks)."""
        held = self._provisional.get(id(owner))
        if held is None or held[0] is not owner:
            return
        del self._provisional[id(owner)]
        ctx = held[1]
        if ctx.busy:  # a statement runs: stop it, and free the connection when it ends
            ctx.dropped = True
            with contextlib.suppress(psycopg.Error):
                ctx.conn.cancel_safe()
            return
        self._free_connection(ctx)

    def write_table_statements(
        self,
        statements: Sequence[tuple[TableStatement, dict[str, Any]]],
        owner: object = None,
    ) -> None:
        for statement, values in statements:
            assert isinstance(statement, Statement)
            if statement.kind == "query":
                continue
            place = values.get(IDENTITY_KEY)
            if place is not None:
                sequence, last = place
                self._add(SET_SEQUENCE, (last, last, sequence))
            self._add(RawSQL(statement.replay), parameters(statement, values))

    # ---- connections ----------------------------------------------------------------------

    async def _take(self, owner: object, timeout: float) -> _Provisional:
        try:
            await asyncio.wait_for(self._free.acquire(), timeout)
        except TimeoutError:
            raise TableError(
                f"{MAX_CONNECTIONS} transactions use tables already, for longer than"
                f" statement_timeout ({timeout:g} s); commit some of them first"
            ) from None
        try:
            conn = self._idle.pop() if self._idle else await asyncio.to_thread(self._connect)
        except BaseException:
            self._free.release()
            raise
        ctx = _Provisional(conn)
        self._provisional[id(owner)] = (owner, ctx)
        return ctx

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            conn = self._tables_connect()
        except psycopg.Error as exc:
            raise TableError(f"cannot connect to the store for a table statement: {exc}") from None
        conn.cursor_factory = psycopg.RawCursor  # users' statements have their own placeholders
        return conn

    def _free_connection(self, ctx: _Provisional) -> None:
        """Roll `ctx`'s transaction back and keep its connection for the next one."""
        conn = ctx.conn
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        if not conn.closed and not conn.broken and len(self._idle) < MAX_CONNECTIONS:
            self._idle.append(conn)
        else:
            conn.close()
        self._free.release()

    def _make_schema(self, schema: str) -> None:
        """Make a database's schema, or the temporary tables', committed at once (an
        empty schema is no one's change; made inside a transaction, it would hold up the
        others that make it)."""
        if schema in self._schemas:
            return
        if not self._schemas:
            found = self._reader.execute(_SCHEMAS, (postgres_sql.TEMPORARY_SCHEMA,))
            self._schemas = {str(s) for (s,) in found.fetchall()}
        if schema not in self._schemas:
            make = pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema))
            try:
                with contextlib.suppress(psycopg.errors.UniqueViolation):  # made meanwhile
                    self._reader_conn().execute(make)
            except (psycopg.Error, StoreError) as exc:
                what = (
                    "the temporary tables' schema"
                    if schema == postgres_sql.TEMPORARY_SCHEMA
                    else "the database's schema"
                )
                needs = (
                    ": the store's PostgreSQL user needs CREATE on its database"
                    if isinstance(exc, psycopg.errors.InsufficientPrivilege)
                    else ""
                )
                raise TableError(
                    f"cannot make {what} on the store ({shown(str(exc))}){needs}"
                ) from None
            self._schemas.add(schema)

    def _drop_temporary_tables(self) -> None:
        """Drop the schema of the temporary tables, with every table in it: the sessions
        that made them have ended with their daemon (the store opens once this daemon
        holds the lease, and another's sessions on the server were ended when it took
        it). Those a lock keeps are left, and said so: the next start drops them."""
        schema = pgsql.Identifier(postgres_sql.TEMPORARY_SCHEMA)
        conn = self._reader_conn()
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
                conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
        except psycopg.Error as exc:
            log.warning(
                "the temporary tables an earlier daemon left in schema %s stay: %s",
                postgres_sql.TEMPORARY_SCHEMA,
                describe_failure(exc),
            )

    # ---- a statement, on a thread of the pool ---------------------------------------------

    def _run(
        self, ctx: _Provisional, runs: TableRuns, bound: Sequence[tuple[Any, ...]]
    ) -> TableAnswer:
        """Run `runs`' statement once for each of its values in `ctx`'s transaction (a
        thread of the pool), after the statements it follows."""
        statement = runs.statement
        assert isinstance(statement, Statement)
        try:
            self._begin(ctx, runs.done, runs.timeout)
            return self._statement(ctx, statement, runs.many, bound, runs.timeout)
        except psycopg.Error as exc:
            if not (ctx.conn.broken or ctx.conn.closed):
                raise TableError(_described(exc)) from None
            raise TableError(
                f"the connection to the store was lost ({exc.sqlstate or 'no answer'}) and the"
                " statement did not run; the transaction's earlier statements stand (they run"
                " again on a new connection): run it again"
            ) from None

    def _begin(
        self,
        ctx: _Provisional,
        done: Sequence[tuple[TableStatement, dict[str, Any]]],
        timeout: float,
    ) -> None:
        """Make `ctx`'s transaction hold `done` (and no more)."""
        conn = ctx.conn
        idle = psycopg.pq.TransactionStatus.IDLE
        if ctx.applied != len(done) and conn.info.transaction_status != idle:
            conn.execute("ROLLBACK")  # a savepoint's rollback: start again from `done`
        if conn.info.transaction_status == idle:
            ctx.applied = 0
            conn.execute("BEGIN")
            conn.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}")
            for earlier, earlier_values in done:
                assert isinstance(earlier, Statement)
                if earlier.kind == "query":
                    continue
                try:
                    place = earlier_values.get(IDENTITY_KEY)
                    if place is not None:
                        conn.execute(_RAW_SET_SEQUENCE, (place[1], place[0]))
                    conn.execute(earlier.sql, parameters(earlier, earlier_values))
                except psycopg.Error as exc:
                    conn.execute("ROLLBACK")
                    raise TableError(
                        f"an earlier statement failed again: {_described(exc)}"
                    ) from None
            ctx.applied = len(done)

    @staticmethod
    def _statement(
        ctx: _Provisional,
        statement: Statement,
        many: Sequence[dict[str, Any]],
        bound: Sequence[tuple[Any, ...]],
        timeout: float,
    ) -> TableAnswer:
        """Run `statement`'s runs in one savepoint of `ctx`'s transaction (all or none)."""
        conn = ctx.conn
        sequence = _inserts_into(statement)
        conn.execute("SAVEPOINT statement")
        try:
            rowcount = 0
            for values, run in zip(many, bound, strict=True):
                if sequence is not None:
                    row = conn.execute(_READ_SEQUENCE, (sequence,)).fetchone()
                    values[IDENTITY_KEY] = (sequence, None if row is None else row[0])
                answer = _answer(conn.execute(statement.sql, run), statement)
                rowcount += answer.rowcount
            if len(many) != 1:
                answer = TableAnswer(rowcount=rowcount)
        except (psycopg.Error, TableError) as exc:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK TO SAVEPOINT statement")
                conn.execute("RELEASE SAVEPOINT statement")
            for values in many:
                values.pop(IDENTITY_KEY, None)
            if isinstance(exc, TableError):
                raise
            if isinstance(exc, psycopg.errors.QueryCanceled) and not ctx.dropped:
                raise TableError(
                    f"the statement ran longer than statement_timeout ({timeout:g} s) and was"
                    " undone"
                ) from None
            raise TableError(_described(exc)) from None
        conn.execute("RELEASE SAVEPOINT statement")
        ctx.applied += len(many)
        return answer


def _answer(cursor: psycopg.Cursor[Any], statement: Statement) -> TableAnswer:
    if not statement.returns_rows:
        # (a SELECT ... INTO's CREATE TABLE AS answers the rows it made)
        counts = statement.kind == "change" or statement.counted is not None
        return TableAnswer(rowcount=max(cursor.rowcount, 0) if counts else 0)
    rows = bounded_rows(tuple(map(_value, row)) for row in cursor)
    return TableAnswer(_column_names(cursor, statement), rows, len(rows))


def _column_names(cursor: psycopg.Cursor[Any], statement: Statement) -> list[str]:
    """The names of an answer's columns: a `*`'s named as their table declares them
    (`postgres_sql` keeps the names in lower case, a declared one in a COMMENT), the
    others as the query gave them."""
    names = [d.name for d in cursor.description or ()]
    result = cursor.pgresult
    if statement.named is None or result is None:
        return names
    origins = [(result.ftable(i), result.ftablecol(i)) for i in range(len(names))]
    tables = sorted({table for table, _ in origins if table})
    if not tables:
        return names
    found = cursor.connection.cursor().execute(_DECLARED, (tables,)).fetchall()
    declared = {(int(table), int(column)): str(name) for table, column, name in found}
    for i, origin in enumerate(origins):
        name = declared.get(origin)
        if name is not None and names[i] == name.lower() and names[i] not in statement.named:
            names[i] = name
    return names
