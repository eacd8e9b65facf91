"""Users' tables: the `execute` operation, table locks, and table statements committed
with their transaction.

Theory of operation. A table statement (T-SQL: CREATE / ALTER / DROP TABLE, CREATE /
DROP INDEX, INSERT, UPDATE, DELETE, SELECT) runs in the session's transaction, or in a
transaction of its own outside one. The store translates it (refusing what it cannot
run) and runs it at once, provisionally, for its answer; the transaction keeps it, and
its commit writes it again in the commit's batch, with the RECEIVEs, SENDs and ENDs of
the same transaction (see `_store.user_tables`). A rollback forgets it, a rollback to a
savepoint forgets those after the savepoint. A statement whose locks are free (or held
already) and that the store can run on the spot is answered in the same pass as its
request, as most operations are; one that waits, for a lock or for the store's thread,
is answered when it has run.

Isolation is serializable, by table locks: before it runs, a statement locks every
table it names, shared to read, exclusive to change (a shared lock is upgraded when
the same transaction changes the table later). A change also locks the tables its
table's foreign keys connect it to, which it reads or changes without naming them
(`_lock_modes`): those its table refers to, shared (an INSERT or UPDATE checks their
rows), and, unless it only inserts, those that refer to its table, exclusive when the
key cascades or sets null or default (and so on along the cascade), else shared (a
DELETE or UPDATE checks their rows). These are locked, not authorized: the statement
needs no permission on them. The store tells the keys (`table_foreign_keys`), read
once per database and again after a DDL statement commits. Locks are held to the end of
the transaction; a transaction that changed tables keeps its locks until its commit's
batch is durable, so that the next statement on those tables, provisional or at
commit, starts from exactly the rows that batch left (this is what makes the second
run give the first run's results). A lock held by another transaction makes the
statement wait, at most `statement_timeout` seconds (then a timeout error), and a wait
that would close a cycle of waits is a deadlock: the statement fails at once. Either
way the statement fails and the client decides (usually: roll back and try again).
`statement_timeout` also bounds the statement's run on the store.

Who may do what is asked of `authorize` (the daemon's permissions), with the translated
statement; `created` and `dropped` hear of tables once their CREATE or DROP commits.
`names` are the tables that exist, committed (by key, `names.qualify`).

An answer comes in pages (`PAGE_ROWS`, about `PAGE_BYTES`): the rest waits for the
session's `fetch_rows`, until its next statement or its end.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument
from .names import database_of, plain, qualify
from .ports import Clock, Journal, TableError, TableResult, TableRuns, TableStatement
from .transactions import Session, Transaction, Transactions

MAX_PARAMETERS: Final = 2100  # SQL Server's limit on a statement's parameters
MAX_ROWS: Final = 100_000  # rows of parameters of one execute_many
STATEMENT_LOCKS_KEPT: Final = 1024  # statements whose locks are kept (see `_locks_of`)
DEFAULT_STATEMENT_TIMEOUT: Final = 30.0
PAGE_ROWS: Final = 10_000  # rows of an answer in one page at most
PAGE_BYTES: Final = 4 * 1024 * 1024  # about what they weigh at most
SHARED: Final = "S"
EXCLUSIVE: Final = "X"
_VALUE_TYPES: Final = (type(None), bool, int, float, str, bytes, uuid.UUID, Decimal)
_PLAIN: Final = frozenset(_VALUE_TYPES)  # the same, for a quick look at a value's type
_POSITIONAL: Final = tuple(f"p{i}" for i in range(1, MAX_PARAMETERS + 1))  # @p1, @p2...


def table_error(exc: TableError) -> BrokerError:
    return BrokerError(ErrorCode.SQL_ERROR, str(exc))


@dataclass(slots=True, eq=False)
class _Lock:
    """One table's lock: who holds it and how, and who waits for it, in order."""

    holders: dict[Transaction, str] = field(default_factory=dict)
    waiters: deque[tuple[Transaction, str, asyncio.Future[None]]] = field(default_factory=deque)

    def grantable(self, txn: Transaction, mode: str) -> bool:
        others = [m for t, m in self.holders.items() if t is not txn]
        if not others:
            return not self.waiters or txn in self.holders
        return mode == SHARED and EXCLUSIVE not in others and not self.waiters


class TableLocks:
    """Every table lock, by table key (see the module's comment)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._locks: dict[str, _Lock] = {}
        self._held: dict[Transaction, set[str]] = {}
        self._waiting: dict[Transaction, str] = {}  # the table each waiter waits for

    def held(self, txn: Transaction) -> set[str]:
        return self._held.get(txn, set())

    def take(self, txn: Transaction, table: str, mode: str) -> bool:
        """Take the lock if that needs no wait (or `txn` holds it so already): whether
        `txn` holds it now."""
        lock = self._locks.setdefault(table, _Lock())
        held = lock.holders.get(txn)
        if held in (EXCLUSIVE, mode):
            return True
        if lock.grantable(txn, mode):
            self._grant(lock, txn, table, mode)
            return True
        return False

    async def acquire(self, txn: Transaction, table: str, mode: str, timeout: float) -> None:
        if self.take(txn, table, mode):
            return
        lock = self._locks[table]
        if self._closes_cycle(txn, table):
            raise BrokerError(
                ErrorCode.LOCK_TIMEOUT,
                f"deadlock: table {table} is locked by a transaction that waits for one this"
                " transaction holds; roll back and try again",
            )
        future: asyncio.Future[None] = self.clock.create_future()
        lock.waiters.append((txn, mode, future))
        self._waiting[txn] = table

        def expire() -> None:
            if not future.done():
                future.set_exception(
                    BrokerError(
                        ErrorCode.LOCK_TIMEOUT,
                        f"table {table} stayed locked by another transaction for {timeout:g} s"
                        " (statement_timeout); the statement did not run",
                    )
                )

        timer = self.clock.call_at(self.clock.time() + timeout, expire)
        try:
            await future
        finally:
            timer.cancel()
            self._waiting.pop(txn, None)
            if not future.done():
                future.cancel()
            lock.waiters = deque(w for w in lock.waiters if w[2] is not future)
            self._wake(table)

    def _grant(self, lock: _Lock, txn: Transaction, table: str, mode: str) -> None:
        lock.holders[txn] = EXCLUSIVE if EXCLUSIVE in (mode, lock.holders.get(txn)) else mode
        self._held.setdefault(txn, set()).add(table)

    def _closes_cycle(self, txn: Transaction, table: str) -> bool:
        """Whether `txn` waiting for `table` would wait, through others, for itself."""
        seen: set[Transaction] = set()
        pending = [t for t in self._locks[table].holders if t is not txn]
        while pending:
            other = pending.pop()
            if other is txn:
                return True
            if other in seen:
                continue
            seen.add(other)
            waits_for = self._waiting.get(other)
            if waits_for is not None:
                pending += [t for t in self._locks[waits_for].holders if t is not other]
        return False

    def locked(self, table: str) -> bool:
        """Whether a transaction holds or waits for `table`'s lock."""
        return table in self._locks

    def release(self, txn: Transaction) -> None:
        for table in self._held.pop(txn, set()):
            lock = self._locks[table]
            lock.holders.pop(txn, None)
            self._wake(table)

    def _wake(self, table: str) -> None:
        lock = self._locks.get(table)
        if lock is None:
            return
        while lock.waiters:
            txn, mode, future = lock.waiters[0]
            if future.done():
                lock.waiters.popleft()
                continue
            others = [m for t, m in lock.holders.items() if t is not txn]
            if others and not (mode == SHARED and EXCLUSIVE not in others):
                break
            lock.waiters.popleft()
            self._grant(lock, txn, table, mode)
            future.set_result(None)
        if not lock.holders and not lock.waiters:
            del self._locks[table]


class Tables:
    """The `execute` operation and its transactions' table statements."""

    def __init__(
        self,
        journal: Journal,
        clock: Clock,
        transactions: Transactions,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
    ) -> None:
        self.journal = journal
        self.transactions = transactions
        self.statement_timeout = statement_timeout
        self.locks = TableLocks(clock)
        self.names: set[str] = set()
        # by database: its tables' foreign keys, committed (see `_lock_modes`)
        self._foreign_keys: dict[str, list[tuple[str, str, bool]]] = {}
        # by statement's id: the statement and the locks it takes (see `_locks_of`)
        self._statement_locks: dict[int, tuple[TableStatement, list[tuple[str, str]]]] = {}
        # by session: the columns and rows of its last answer left to fetch
        self._pages: dict[int, tuple[list[str], deque[tuple[Any, ...]]]] = {}
        # by session: its temporary tables (#name) that exist, committed
        self._temporary: dict[int, set[str]] = {}
        # the daemon's permissions: raise PERMISSION_DENIED, or return
        self.authorize: Callable[[Session, TableStatement], None] = lambda s, st: None
        self.created: Callable[[str, str], None] = lambda key, login: None
        self.dropped: Callable[[str], None] = lambda key: None

    def load(self, names: list[tuple[str, str]]) -> None:
        """The tables that exist, (database, table), at start."""
        self.names = {qualify(database, table) for database, table in names}

    def operations(self) -> dict[str, Callable[..., Any]]:
        return {
            "execute": self.execute,
            "execute_many": self.execute_many,
            "fetch_rows": self.fetch_rows,
        }

    def execute(
        self, session: Session, sql: object, parameters: object = None
    ) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Operation: run one table statement in the session's transaction (outside one,
        in its own). `parameters`: a list (@p1, @p2, ...) or a dict by name (without @).
        It is answered at once unless it waits (for a lock, or for the store).

        Returns:
            {"columns": [...], "rows": [[...], ...], "rowcount": n, "more": bool}: the
            first page of the rows; "more" when `fetch_rows` has further pages.
        """
        values = _values(parameters)
        statement = self._translate(session, sql)
        txn = self._transaction(session, statement)
        answer = self._run_now(txn, statement, [values])
        if answer is None:
            return self._later(
                self._first_page, session, self._run(session, txn, statement, [values])
            )
        return self._first_page(session, answer)

    def _first_page(self, session: Session, answer: TableResult) -> dict[str, Any]:
        """`execute`'s answer: the first page of the rows, the rest kept for `fetch_rows`."""
        self._pages.pop(session.ident, None)
        if not answer.rows:
            return {
                "columns": list(answer.columns),
                "rows": [],
                "rowcount": answer.rowcount,
                "more": False,
            }
        rows = deque(answer.rows)
        page = self._page(rows)
        if rows:
            self._pages[session.ident] = (list(answer.columns), rows)
        return {
            "columns": list(answer.columns),
            "rows": page,
            "rowcount": answer.rowcount,
            "more": bool(rows),
        }

    def execute_many(
        self, session: Session, sql: object, rows: object
    ) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Operation: run one INSERT, UPDATE or DELETE (without OUTPUT) once for each row
        of parameters, in order, as one step of the session's transaction (outside one,
        in its own): when one run fails, none of them stays. `rows`: a list of what
        `execute` takes as `parameters` (at most `MAX_ROWS`). Answered at once unless it
        waits, as `execute`.

        Returns:
            {"columns": [], "rows": [], "rowcount": n, "more": false}: n, the rows the
            runs changed in all.
        """
        if not isinstance(rows, list) or len(rows) > MAX_ROWS:
            raise bad_argument(f"rows must be a list of at most {MAX_ROWS} rows of parameters")
        many = _many_values(rows)
        statement = self._translate(session, sql)
        if statement.kind != "change" or statement.returns_rows:
            raise BrokerError(
                ErrorCode.SQL_ERROR,
                "execute_many runs an INSERT, UPDATE or DELETE without OUTPUT; run this"
                " statement with execute",
            )
        if not many:
            return self._changed(session, None)
        txn = self._transaction(session, statement)
        answer = self._run_now(txn, statement, many)
        if answer is None:
            return self._later(self._changed, session, self._run(session, txn, statement, many))
        return self._changed(session, answer)

    def _changed(self, session: Session, answer: TableResult | None) -> dict[str, Any]:
        """`execute_many`'s answer."""
        self._pages.pop(session.ident, None)
        return {
            "columns": [],
            "rows": [],
            "rowcount": answer.rowcount if answer else 0,
            "more": False,
        }

    @staticmethod
    async def _later(
        then: Callable[[Session, TableResult], dict[str, Any]],
        session: Session,
        pending: Awaitable[TableResult],
    ) -> dict[str, Any]:
        return then(session, await pending)

    def _translate(self, session: Session, sql: object) -> TableStatement:
        """The statement, translated and allowed to the session's login."""
        if not isinstance(sql, str) or not sql.strip():
            raise bad_argument("sql must be the text of one table statement")
        try:
            statement = self.journal.translate_table_statement(sql, session.database, session.ident)
        except TableError as exc:
            raise table_error(exc) from None
        self.authorize(session, statement)
        return statement

    def _transaction(self, session: Session, statement: TableStatement) -> Transaction:
        """The transaction the statement runs in: the session's, or one of its own."""
        txn = self.transactions.current(session)
        if txn.ident is not None and any(is_temporary(t) for t in statement.tables):
            raise BrokerError(
                ErrorCode.SQL_ERROR,
                "a temporary table (#name) is its connection's own: a detached transaction"
                " (begun with detached=True) cannot use one; use a table",
            )
        if not txn.login:
            txn.login = session.user
        return txn

    def _run_now(
        self, txn: Transaction, statement: TableStatement, many: list[dict[str, Any]]
    ) -> TableResult | None:
        """`_run` when nothing makes it wait: its locks are free (or held already) and the
        store runs it at once. None when something would (what ran: the locks it could
        take; `_run` goes on from there)."""
        with self._failing_ends(txn):
            for key, mode in self._locks_of(statement):
                if not self.locks.take(txn, key, mode):
                    return None
            answer = self.journal.run_table_statements_now(self._runs(txn, statement, many))
        if answer is not None:
            self._ran(txn, statement, many)
        return answer

    async def _run(
        self,
        session: Session,
        txn: Transaction,
        statement: TableStatement,
        many: list[dict[str, Any]],
    ) -> TableResult:
        """Run the statement once per values of `many` in `txn`, `session`'s transaction,
        after taking its locks; the transaction keeps each run."""
        with self._failing_ends(txn):
            for key, mode in self._locks_of(statement):
                await self.locks.acquire(txn, key, mode, self.statement_timeout)
            if txn.explicit and session.txn is not txn:
                raise BrokerError(ErrorCode.NO_TRANSACTION, "the transaction ended meanwhile")
            answer = await self.journal.run_table_statements(self._runs(txn, statement, many))
        self._ran(txn, statement, many)
        return answer

    def _runs(
        self, txn: Transaction, statement: TableStatement, many: list[dict[str, Any]]
    ) -> TableRuns:
        """The statement's runs in `txn`, after the ones it ran before."""
        return TableRuns(txn, txn.table_statements, statement, many, self.statement_timeout)

    def _ran(self, txn: Transaction, statement: TableStatement, many: list[dict[str, Any]]) -> None:
        """The statement ran: the transaction keeps each run (one of its own commits)."""
        txn.table_statements += [(statement, values) for values in many]
        if not txn.explicit:
            self.transactions.finish(txn)

    def _locks_of(self, statement: TableStatement) -> list[tuple[str, str]]:
        """The locks the statement takes, (table key, mode), in key order (kept for the
        statement until a table, or its keys, comes or goes)."""
        kept = self._statement_locks.get(id(statement))
        if kept is not None and kept[0] is statement:  # (kept alive: its id is its own)
            return kept[1]
        modes = self._lock_modes(statement)
        locks = [(qualify(statement.database, table), modes[table]) for table in sorted(modes)]
        if len(self._statement_locks) >= STATEMENT_LOCKS_KEPT:
            self._statement_locks.clear()
        self._statement_locks[id(statement)] = (statement, locks)
        return locks

    def _keys_changed(self, database: str | None = None) -> None:
        """Tables or their foreign keys came or went (in `database`; None: any): what was
        read of them is read again."""
        if database is None:
            self._foreign_keys.clear()
        else:
            self._foreign_keys.pop(database, None)
        self._statement_locks.clear()

    def _lock_modes(self, statement: TableStatement) -> dict[str, str]:
        """The tables the statement locks, and how: those it names, and those its
        changed tables' foreign keys connect them to (see the module's comment)."""
        modes = dict.fromkeys(statement.reads, SHARED)
        modes.update(dict.fromkeys(statement.writes, EXCLUSIVE))
        changed = [t for t, p in statement.writes.items() if p != "CREATE" and not is_temporary(t)]
        if not changed:
            return modes
        keys = self._foreign_keys.get(statement.database)
        if keys is None:
            keys = self.journal.table_foreign_keys(statement.database)
            self._foreign_keys[statement.database] = keys
        # (table, whether the statement deletes or updates its rows): a changed table
        # checks the rows it refers to; a DELETE or UPDATE checks or changes those
        # referring to its rows, and so on along a cascade
        pending = [(t, statement.writes[t] != "INSERT") for t in changed]
        seen = set(changed)
        while pending:
            table, removes = pending.pop()
            for referring, referred, cascades in keys:
                if referring == table:
                    modes.setdefault(referred, SHARED)
                elif referred == table and removes and not cascades:
                    modes.setdefault(referring, SHARED)
                elif referred == table and removes:
                    modes[referring] = EXCLUSIVE
                    if referring not in seen:
                        seen.add(referring)
                        pending.append((referring, True))
        return modes

    def fetch_rows(self, session: Session) -> dict[str, Any]:
        """Operation: the next page of the session's last answer that did not fit one
        (its "more" was true).

        Returns:
            {"columns": [...], "rows": [[...], ...], "rowcount": rows in this page,
            "more": whether pages are left after this one}.
        """
        pending = self._pages.get(session.ident)
        if pending is None:
            raise bad_argument(
                "no rows are waiting: fetch_rows follows an answer whose 'more' was true, on"
                " the same connection, before its next statement"
            )
        columns, rows = pending
        page = self._page(rows)
        if not rows:
            del self._pages[session.ident]
        return {"columns": columns, "rows": page, "rowcount": len(page), "more": bool(rows)}

    def session_closed(self, session: Session) -> None:
        """The session's temporary tables go with it (in the open batch; no detached
        transaction uses them, see `_run`)."""
        self._pages.pop(session.ident, None)
        temporary = self._temporary.pop(session.ident, set())
        self.journal.write_table_statements(
            [
                (
                    self.journal.translate_table_statement(
                        f"DROP TABLE IF EXISTS #{name}", session.database, session.ident
                    ),
                    {},
                )
                for name in sorted(temporary)
            ]
        )

    @staticmethod
    def _page(rows: deque[tuple[Any, ...]]) -> list[list[Any]]:
        """Take the first page off `rows`: at most PAGE_ROWS, about PAGE_BYTES."""
        page: list[list[Any]] = []
        weight = 0
        while rows and len(page) < PAGE_ROWS and (not page or weight < PAGE_BYTES):
            row = rows.popleft()
            weight += sum(len(v) if isinstance(v, (str, bytes)) else 9 for v in row) + 4
            page.append(list(row))
        return page

    @contextmanager
    def _failing_ends(self, txn: Transaction) -> Iterator[None]:
        """Around a statement's run: if it fails, a transaction of its own ends with it
        (its locks go), and the store's TableError becomes the statement's error."""
        try:
            yield
        except BaseException as exc:
            if not txn.explicit:
                self.undo(txn)
            if isinstance(exc, TableError):
                raise table_error(exc) from None
            raise

    # ---- the transaction's end ----------------------------------------------------------

    def apply_commit(self, txn: Transaction) -> None:
        """Commit: the statements join the open batch; the locks go once it is durable
        (at once when nothing was changed)."""
        statements = txn.table_statements
        if not statements:
            self.locks.release(txn)
            return
        self.journal.write_table_statements(statements, txn)
        self.journal.forget_table_statements(txn)
        previous = None
        ddl = changed = False
        for statement, _ in statements:
            if statement is previous:  # (the runs of one executemany: the same effect)
                continue
            previous = statement
            ddl = ddl or statement.kind == "ddl"
            changed = changed or statement.kind != "query"
            for table, permission in statement.writes.items():
                if is_temporary(table):
                    self._note_temporary(txn.session, table, permission)
                    continue
                key = qualify(statement.database, table)
                if permission == "CREATE":
                    self.names.add(key)
                    self.created(key, txn.login or txn.session.user)
                elif permission == "DROP":
                    self.names.discard(key)
                    self.dropped(key)
        txn.table_statements = []
        if ddl:  # (a table, or its keys, came or went: the store tells it once it is durable)
            self.journal.when_durable(self.journal.watermark(), self._keys_changed)
        if changed:
            self.journal.when_durable(self.journal.watermark(), lambda: self.locks.release(txn))
        else:
            self.locks.release(txn)

    def _note_temporary(self, session: Session, table: str, permission: str) -> None:
        """A temporary table's CREATE or DROP committed."""
        name = table.rsplit("#", 1)[0].lstrip("#")  # (#name#session)
        if permission == "CREATE":
            self._temporary.setdefault(session.ident, set()).add(name)
        elif permission == "DROP":
            self._temporary.get(session.ident, set()).discard(name)

    def undo(self, txn: Transaction) -> None:
        """Rollback: the statements are forgotten, the locks go."""
        txn.table_statements = []
        self.journal.forget_table_statements(txn)
        self.locks.release(txn)

    def drop_database(self, database: str) -> None:
        """DROP DATABASE: its tables go in the open batch (IN_USE while one is locked)."""
        keys = sorted(k for k in self.names if database_of(k) == database)
        locked = [plain(k) for k in keys if self.locks.locked(k)]
        if locked:
            raise BrokerError(
                ErrorCode.IN_USE,
                f"cannot drop database '{database}': a transaction uses its table"
                f" {locked[0]}; commit or roll it back first",
            )
        statements: list[tuple[TableStatement, dict[str, Any]]] = [
            (self.journal.translate_table_statement(f"DROP TABLE [{table}]", database, 0), {})
            for table in self._referring_first(database, [plain(k) for k in keys])
        ]
        self.journal.write_table_statements(statements)
        self.names.difference_update(keys)
        self._keys_changed(database)

    def _referring_first(self, database: str, tables: list[str]) -> list[str]:
        """`tables` in an order that drops each before the tables it refers to (a
        store refuses to drop a table a FOREIGN KEY refers to).

        Raises:
            BrokerError: some refer to each other.
        """
        keys = [(a, b) for a, b, _ in self.journal.table_foreign_keys(database) if a != b]
        order: list[str] = []
        left = list(tables)
        while left:
            first = [t for t in left if not any(b == t and a in left for a, b in keys)]
            if not first:
                raise BrokerError(
                    ErrorCode.IN_USE,
                    f"cannot drop database '{database}': its tables {', '.join(left)} refer to"
                    " each other by FOREIGN KEY; drop them first",
                )
            order += first
            left = [t for t in left if t not in first]
        return order

    def undo_to(self, txn: Transaction, statements: int) -> None:
        """Rollback to a savepoint that came after `statements` statements (locks stay)."""
        del txn.table_statements[statements:]
        self.journal.forget_table_statements(txn)


def is_temporary(table: str) -> bool:
    """Whether a statement's table is a temporary table (#name: its session's own)."""
    return table.startswith("#")


def _many_values(rows: list[Any]) -> list[dict[str, Any]]:
    """`_values` of each row of `execute_many` (rows of plain values in order, the usual
    case, in one pass)."""
    width = len(rows[0]) if rows and isinstance(rows[0], list) else -1
    if (
        0 <= width <= MAX_PARAMETERS
        and all(type(row) is list and len(row) == width for row in rows)
        and _PLAIN.issuperset({type(value) for row in rows for value in row})
    ):
        names = _POSITIONAL[:width]
        # (rows of `width`, checked: zip without strict= builds the dicts in half the time)
        return [dict(zip(names, row)) for row in rows]  # noqa: B905
    return [_values(row) for row in rows]


def _values(parameters: object) -> dict[str, Any]:
    """A statement's values by parameter name (lower case, without @)."""
    if parameters is None:
        return {}
    if isinstance(parameters, (list, tuple)):
        if len(parameters) > MAX_PARAMETERS:
            raise bad_argument(f"a statement takes at most {MAX_PARAMETERS} parameters")
        named = dict(zip(_POSITIONAL, parameters))  # noqa: B905 (they are fewer; faster without)
    elif isinstance(parameters, dict):
        named = {}
        for key, value in parameters.items():
            if not isinstance(key, str) or not key.lstrip("@"):
                raise bad_argument(f"a parameter's name is a text, got {key!r}")
            named[key.lstrip("@").lower()] = value
    else:
        raise bad_argument("parameters are a list (@p1, @p2, ...) or a dict by name")
    if len(named) > MAX_PARAMETERS:
        raise bad_argument(f"a statement takes at most {MAX_PARAMETERS} parameters")
    if _PLAIN.issuperset(map(type, named.values())):
        return named
    for name, value in named.items():
        if not isinstance(value, _VALUE_TYPES):
            raise bad_argument(
                f"parameter @{name} is a {type(value).__name__}; values are numbers, text,"
                " bytes, UUIDs or None"
            )
    return named
