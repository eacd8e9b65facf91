"""Users' tables in the store: statements run at once for their answers, and again, in
order, in the batch of their transaction's commit.

Theory of operation. The store is write-behind with group commit (see `commit`): a
transaction's writes join the open batch when it commits and reach the disk with other
transactions' writes in one database transaction. A user's table statement cannot wait
for that: its rows, row count, constraint errors and new identities are its answer. So
each statement runs twice.

1. At once, *provisionally*: on the store thread, on the writer connection, inside a
   database transaction that is never committed. The transaction's earlier statements
   are already applied in it, so the statement sees its own transaction's changes; its
   result is captured and answered. That database transaction stays open while the
   same transaction's statements follow one another (each costs one statement, not all
   of them again) and is rolled back only when the connection is needed for anything
   else: a commit, an idle checkpoint, another transaction's statement (which then
   replays its own transaction's earlier statements first). While a statement is on its
   way to the thread, every commit runs on the store thread, after it (the thread runs
   its work in order).
2. At commit: the transaction's statements join the open batch, in order, with the same
   values (GETDATE() and NEWID() were evaluated once and bound, see `user_sql`), and are
   written atomically with the transaction's RECEIVE, SEND and END CONVERSATION. When
   the writer's open transaction still holds exactly them (nothing used the connection
   since, the usual case), it is *kept*: the batch's commit goes on in that transaction
   and skips them, so they run once. Anything else that needs the connection first rolls
   it back, and the commit replays them from the batch as written.

The second run gives the first run's results because the core locks the tables a
transaction touches until its batch is durable (`_core.tables`): no other transaction's
change to them can come between, and both runs start from the durable rows. A failure
of the second run would be a bug, and is handled as any commit that fails for good.

This module is SQLite's; the PostgreSQL store runs the same model in `postgres_tables`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import itertools
import operator
import re
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from .._core.ports import TableError, TableRuns, TableStatement
from . import user_kinds, user_sql
from .commit import Batch, Committer
from .user_sql import Statement

PROGRESS_STEPS: Final = 10_000  # SQLite steps between looks at a statement's deadline
MAX_ANSWER_ROWS: Final = 1_000_000  # rows one statement may answer (in pages)
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024  # what they may weigh, about
RUNS_TOGETHER: Final = 100  # runs of an INSERT ... VALUES written as one INSERT at most
# (and at most as many run on the event loop rather than the store thread, see `_inline`)
MAX_VARIABLES: Final = 32_766  # parameters of one SQLite statement (its default limit)
_STORE_NAME: Final = re.compile(r'"?u:[^:"\s]+:([^:"\s]+)(?::([^"\s]+))?"?')
# what a foreign key's ON DELETE / ON UPDATE does to the referring rows, when it changes them
_CHANGES_REFERRING: Final = frozenset(("CASCADE", "SET NULL", "SET DEFAULT"))
_SESSION: Final = re.compile(r"(?<=.)#\d+(?=[.`]|\Z)")  # a temporary table's `#session`


@dataclass(slots=True)
class TableAnswer:
    """A statement's answer: rows (with their column names) or a row count."""

    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rowcount: int = 0


def shown(text: str) -> str:
    """A database message in the user's names (the store's names of tables and indexes
    become theirs)."""
    return _STORE_NAME.sub(lambda m: m.group(2) or _SESSION.sub("", m.group(1)), text)


def _said(exc: sqlite3.Error) -> str:
    """A failed statement's error, in SQL Server's words where it has them, in the
    user's names."""
    return shown(user_kinds.said(str(exc)))


_AS_IS: Final = frozenset((type(None), int, float, str, bytes))  # bound as they are
# SQLite's integers are 64 bits; it refuses to bind a larger one (OverflowError)
_TOO_LARGE: Final = (
    "a parameter is an integer beyond 64 bits (-2**63 to 2**63-1, as a bigint); give a larger"
    " number as a Decimal (for a DECIMAL column)"
)


def _bound(value: Any) -> Any:
    """A client's value as SQLite binds it."""
    if value is None or isinstance(value, (int, float, str, bytes)):
        return int(value) if isinstance(value, bool) else value
    if isinstance(value, uuid.UUID):
        return str(value).upper()  # as SQL Server writes a uniqueidentifier
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    raise TableError(
        f"a parameter is a number, text, bytes, a UUID, a time or NULL, not {type(value).__name__}"
    )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _evaluate(function: str) -> Any:
    if function == "newid":
        return str(uuid.uuid4()).upper()
    now = dt.datetime.now(dt.UTC if function == "utcnow" else None)
    return now.replace(tzinfo=None).isoformat(sep=" ", timespec="milliseconds")


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)  # (a ValueError fails the statement, as SQL Server's 245)


def _add(a: Any, b: Any) -> Any:
    """T-SQL's `+`: text and text (or bytes and bytes) join, anything else adds, a text
    taken as its number; NULL with anything is NULL."""
    if a is None or b is None:
        return None
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    if isinstance(a, bytes) and isinstance(b, bytes):
        return a + b
    left: Any = _number(a) if isinstance(a, str) else a
    right: Any = _number(b) if isinstance(b, str) else b
    return left + right


def add_functions(db: sqlite3.Connection) -> None:
    """What users' statements call on the writer connection besides SQLite's own, and
    their FOREIGN KEYs enforced there (the store's own tables have none)."""
    db.create_function(user_sql.ADD, 2, _add, deterministic=True)
    user_kinds.add_functions(db)
    db.execute("PRAGMA foreign_keys=ON")


def bind_runs(statement: Statement, many: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each run's positional parameters, its GETDATE() and NEWID() evaluated once and kept
    in its values (the replay at commit binds the same).

    Raises:
        TableError: see `parameters`.
    """
    if statement.volatile:
        for values in many:
            for name, function in statement.volatile:
                values[name] = _evaluate(function)
    if len(many) == 1:
        return [parameters(statement, many[0])]
    names = statement.parameters  # (as `parameters` does, for all the runs in one pass)
    try:
        if len(names) > 1:
            bound: list[tuple[Any, ...]] = list(map(_take(names), many))
        else:
            bound = [tuple(values[name] for name in names) for values in many]
    except KeyError as exc:
        raise TableError(
            f"the statement uses @{exc.args[0]}, which was not given a value"
        ) from None
    if _AS_IS.issuperset({type(value) for run in bound for value in run}):
        return bound
    return [tuple(_bound(value) for value in run) for run in bound]


def parameters(statement: Statement, values: dict[str, Any]) -> tuple[Any, ...]:
    """The statement's positional parameters from the values by name.

    Raises:
        TableError: a value is missing, or of a type SQLite cannot hold.
    """
    names = statement.parameters
    try:
        bound = tuple(values[name] for name in names) if len(names) < 2 else _take(names)(values)
    except KeyError as exc:
        raise TableError(
            f"the statement uses @{exc.args[0]}, which was not given a value"
        ) from None
    if _AS_IS.issuperset(map(type, bound)):
        return bound
    return tuple(_bound(value) for value in bound)


@functools.lru_cache(maxsize=user_sql.TRANSLATIONS_KEPT)
def _take(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """What takes the values of `names` (at least two), in order, from a dict."""
    return operator.itemgetter(*names)


class UserTables(Committer):
    """The store's users' tables over the writer connection (see the module's comment)."""

    # whose statements the writer holds in an open transaction, and how many of them
    _provisional: tuple[object, int] | None = None
    _table_jobs = 0  # statements on their way to the store thread (commits wait behind)
    # a committed transaction's statements that the writer's open transaction holds:
    # the batch they joined and their parameter lists in it (see `_kept_writes`)
    _kept: tuple[int, list[list[Any]]] | None = None
    # the parameters of each run the provisional transaction holds, in order (None for a
    # query's): what `write_table_statements` would bind again
    _runs: list[tuple[Any, ...] | None]

    def translate_table_statement(self, text: str, database: str, session: int = 0) -> Statement:
        # (a statement without a temporary table is the same in every session)
        return user_sql.translate(text, database, session if "#" in text else 0)

    def load_table_names(self) -> list[tuple[str, str]]:
        return [name for name, _ in self._table_names(self._db)]

    def table_sizes(self) -> list[tuple[str, str, int]]:
        """(database, table, rows) of every table, committed (a read on the loop)."""
        return [
            (*name, int(self._reader.execute(f"SELECT COUNT(*) FROM {_quote(raw)}").fetchone()[0]))
            for name, raw in self._table_names(self._reader)
        ]

    def table_foreign_keys(self, database: str) -> list[tuple[str, str, bool]]:
        """(read on the loop, on the reader: the committed tables)"""
        keys = []
        for (where, table), raw in self._table_names(self._reader):
            if where != database:
                continue
            for row in self._reader.execute(f"PRAGMA foreign_key_list({_quote(raw)})"):
                referred = user_sql.shown_name(row[2]) or (database, row[2].lower())
                keys.append((table, referred[1], bool(_CHANGES_REFERRING & {row[5], row[6]})))
        return keys

    @staticmethod
    def _table_names(db: Any) -> list[tuple[tuple[str, str], str]]:
        rows = db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'u:%' ORDER BY name"
        ).fetchall()
        return [(name, raw) for (raw,) in rows if (name := user_sql.shown_name(raw)) is not None]

    def run_table_statements_now(self, runs: TableRuns) -> TableAnswer | None:
        statement = runs.statement
        assert isinstance(statement, Statement)
        if (
            self._executor is None
            or self._loop is None
            or (len(runs.many) <= RUNS_TOGETHER and self._inline(runs.owner, runs.done, statement))
        ):
            return self._run(runs, bind_runs(statement, runs.many))
        return None

    async def run_table_statements(self, runs: TableRuns) -> TableAnswer:
        answer = self.run_table_statements_now(runs)
        if answer is not None:
            return answer
        assert isinstance(runs.statement, Statement) and self._executor is not None
        bound = bind_runs(runs.statement, runs.many)
        self._table_jobs += 1
        try:
            return await asyncio.wrap_future(self._executor.submit(self._run, runs, bound))
        finally:
            self._table_jobs -= 1

    def forget_table_statements(self, owner: object) -> None:
        # the writer's open transaction is rolled back when the connection is next used
        if self._provisional is not None and self._provisional[0] is owner:
            self._provisional = (None, 0)

    def write_table_statements(
        self,
        statements: Sequence[tuple[TableStatement, dict[str, Any]]],
        owner: object = None,
    ) -> None:
        # the provisional run is kept when it holds exactly `owner`'s statements and the
        # thread is idle (nothing there may roll it back meanwhile)
        keep = (
            owner is not None
            and self._provisional == (owner, len(statements))
            and len(self._runs) == len(statements)
            and self._table_jobs == 0
            and not self._committing
        )
        written: list[list[Any]] = []
        place = 0  # (in `_runs`, which holds the runs of `statements` when `keep`)
        for statement, runs in itertools.groupby(statements, key=operator.itemgetter(0)):
            assert isinstance(statement, Statement)
            values_of = [values for _, values in runs]
            place += len(values_of)
            if statement.kind == "query":  # (a query changed nothing)
                continue
            bound: Sequence[Any] = (
                self._runs[place - len(values_of) : place]
                if keep
                else [parameters(statement, values) for values in values_of]
            )
            for sql, values, weight in _together(statement, bound, statement.replay):
                params = self._add(sql, values, weight)
                if written and params is written[-1]:
                    continue  # (the runs of one statement, one after the other)
                keep = keep and len(params) == 1  # (a list of its own: skipped whole)
                written.append(params)
        if keep and written:
            self._provisional = (None, 0)  # (no statement of any transaction continues it)
            self._kept = (self._open.number, written)

    def _kept_writes(self, batches: Sequence[Batch]) -> frozenset[int] | None:
        """At a commit of `batches`, before it uses the writer: when the writer's open
        transaction holds the kept statements of one of them, the ids of their parameter
        lists (the commit goes on in that transaction and skips them); else None, and the
        open transaction, if any, is rolled back (the commit begins its own and replays
        them)."""
        kept = self._kept
        if kept is None or self.trouble is not None or all(b.number != kept[0] for b in batches):
            self._end_provisional()
            return None
        self._kept = None
        self._provisional = None
        return frozenset(map(id, kept[1]))

    def _inline(self, owner: object, done: Sequence[Any], statement: Statement) -> bool:
        """Whether to run a statement on the event loop rather than the store thread: a
        light one (an INSERT of values) with nothing to replay before it, while the thread
        is idle (the hop there and back would cost more than the statement)."""
        return (
            statement.light
            and not self._committing
            and self._table_jobs == 0
            and (not done or self._provisional == (owner, len(done)))
        )

    def _tables_busy(self) -> bool:
        """A statement is on its way to the thread: commits run there, after it."""
        return self._table_jobs > 0

    def _end_provisional(self) -> None:
        """Roll the writer's provisional transaction back (store thread, or the loop
        when nothing runs on the thread); kept statements are then replayed from their
        batch."""
        if self._provisional is not None:
            self._provisional = None
            self._kept = None
            db: Any = self._db
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")

    def _run(self, runs: TableRuns, bound: Sequence[tuple[Any, ...]]) -> TableAnswer:
        """Run `runs`' statement once per parameters of `bound` in its owner's provisional
        transaction (store thread), as one step, for at most its timeout in all (SQLite's
        progress handler interrupts it then)."""
        owner, done, statement, timeout = runs.owner, runs.done, runs.statement, runs.timeout
        assert isinstance(statement, Statement)
        db: Any = self._db
        if self._provisional != (owner, len(done)):
            self._end_provisional()
            db.execute("BEGIN")
            self._provisional = (owner, 0)
            self._runs = []
            for earlier, values in done:
                assert isinstance(earlier, Statement)
                if earlier.kind == "query":
                    self._runs.append(None)
                    continue
                self._runs.append(parameters(earlier, values))
                try:
                    db.execute(earlier.sql, self._runs[-1]).fetchall()
                except sqlite3.Error as exc:
                    self._end_provisional()
                    raise TableError(f"an earlier statement failed again: {_said(exc)}") from None
            self._provisional = (owner, len(done))
        if (
            statement.light
            and not statement.returns_rows
            and (len(bound) == 1 or len(bound) <= _group_size(statement))
        ):
            # one SQLite statement of values: it cannot run long, and SQLite undoes a
            # failed statement's own changes and goes on with the transaction, so it
            # needs neither a savepoint nor a deadline
            if len(bound) == 1:
                sql, together = statement.sql, bound[0]
            else:
                [(sql, together, _)] = _together(statement, bound, statement.sql)
            try:
                rowcount = db.execute(sql, together).rowcount
            except OverflowError:
                raise TableError(_TOO_LARGE) from None  # (not bound: nothing ran)
            except sqlite3.Error as exc:
                if not db.in_transaction:  # (SQLite rolled all of it back: I/O, space)
                    self._end_provisional()
                raise TableError(_said(exc)) from None
            self._ran(owner, len(done), bound)
            return TableAnswer(rowcount=max(rowcount, 0))
        db.execute("SAVEPOINT statement")
        deadline = time.monotonic() + timeout
        db.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
        try:
            if len(bound) == 1:
                answer = _answer(db.execute(statement.sql, bound[0]), statement)
                if statement.counted is not None:  # (SQLite counts no rows a CREATE makes)
                    answer = TableAnswer(rowcount=db.execute(statement.counted).fetchone()[0])
            else:  # (a change without OUTPUT: its row counts add up)
                answer = TableAnswer(
                    rowcount=sum(
                        max(db.execute(sql, values).rowcount, 0)
                        for sql, values, _ in _together(statement, bound, statement.sql)
                    )
                )
        except (sqlite3.Error, TableError, OverflowError) as exc:
            if db.in_transaction:
                db.execute("ROLLBACK TO statement")
                db.execute("RELEASE statement")
            else:
                # SQLite rolled the whole transaction back (it does for a change it was
                # told to interrupt, and for I/O errors): the earlier statements are run
                # again before the next one, and the commit writes them again
                self._end_provisional()
            if isinstance(exc, TableError):
                raise
            if isinstance(exc, OverflowError):
                raise TableError(_TOO_LARGE) from None
            if time.monotonic() > deadline:
                raise TableError(
                    f"the statement ran longer than statement_timeout ({timeout:g} s) and was"
                    " undone"
                ) from None
            raise TableError(_said(exc)) from None
        finally:
            db.set_progress_handler(None, 0)
        db.execute("RELEASE statement")
        self._ran(owner, len(done), bound)
        return answer

    def _ran(self, owner: object, done: int, bound: Sequence[tuple[Any, ...]]) -> None:
        """The provisional transaction holds `owner`'s `done` runs and those of `bound`."""
        self._provisional = (owner, done + len(bound))
        self._runs += bound


def _together(
    statement: Statement, bound: Sequence[tuple[Any, ...]], sql: str
) -> Iterator[tuple[str, tuple[Any, ...], int]]:
    """The runs of `statement` with the parameters `bound`, as (SQL, parameters, runs)
    to execute: a light INSERT's in groups, each one INSERT of the group's rows
    (`user_sql.inserted_together`: one statement costs less than its runs one by one);
    any other's one by one, as `sql`."""
    if statement.values is None or len(bound) == 1:
        for values in bound:
            yield sql, values, 1
        return
    size = _group_size(statement)
    for first in range(0, len(bound), size):
        group = bound[first : first + size]
        together = user_sql.inserted_together(statement, len(group))
        yield together, tuple(itertools.chain.from_iterable(group)), len(group)


def _group_size(statement: Statement) -> int:
    """How many runs of a light INSERT `_together` writes as one INSERT at most."""
    return max(1, min(RUNS_TOGETHER, MAX_VARIABLES // max(1, len(statement.parameters))))


def _answer(cursor: sqlite3.Cursor, statement: Statement) -> TableAnswer:
    if not statement.returns_rows:
        return TableAnswer(rowcount=max(cursor.rowcount, 0) if statement.kind == "change" else 0)
    rows = bounded_rows(cursor)
    return TableAnswer([d[0] for d in cursor.description or ()], rows, len(rows))


def bounded_rows(cursor: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """An answer's rows, at most MAX_ANSWER_ROWS and about MAX_ANSWER_BYTES.

    Raises:
        TableError: there are more.
    """
    rows: list[tuple[Any, ...]] = []
    weight = 0
    for row in cursor:
        rows.append(row)
        weight += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row) + 8
        if len(rows) > MAX_ANSWER_ROWS or weight > MAX_ANSWER_BYTES:
            raise TableError(
                f"the answer is larger than {MAX_ANSWER_ROWS} rows or"
                f" {MAX_ANSWER_BYTES // (1024 * 1024)} MiB: ask for fewer rows (TOP, WHERE)"
                " at a time"
            )
    return rows
