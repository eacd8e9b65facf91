"""Statements on the broker's tables: run by the broker, in the session's transaction.

Theory of operation. The broker holds the tables and reads T-SQL itself (see the
broker's `execute`), so a statement on a table is sent as written, with the values of
the variables it names as its parameters (`@name`). A SELECT is one too when it reads
the broker's tables only: the session first runs it as a query over views, queues and
table variables, and sends it to the broker when a name it reads is none of those. A
SELECT that joins the broker's tables with catalog views (sys.conversation_endpoints...)
is sent too, each view's rows first written into a temporary table of the session on
the broker for the statement's time (the broker cannot read the views, which the
session builds); one that joins tables with a queue or a table variable is refused by
the broker, which cannot see them. A SELECT that assigns variables is sent without its
assignments, and the session assigns them from the rows, the last row winning, as SQL
Server does.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from ssb import client

from . import _ast as ast
from . import _types as t
from ._catalog import SYS_VIEWS
from ._errors import SqlError
from ._output import ResultSet
from ._query import Source, from_sqlite, plain_text, to_sqlite

if TYPE_CHECKING:
    from ._context import Context as Session
    from ._frame import Frame


def _parameters(variables: Sequence[str], frame: Frame) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in variables:
        slot = frame.variables.get(key)
        if slot is None or slot.table is not None:
            raise SqlError(137, f'Must declare the scalar variable "{key}".', level=15)
        values[key[1:].lower()] = to_sqlite(slot.value.data)
    return values


async def _run(
    session: Session, text: str, variables: Sequence[str], frame: Frame
) -> client.Result:
    conn = session.connection()
    first: client.Result = await session.broker(conn.execute(text, **_parameters(variables, frame)))
    rows, page = list(first.rows), first
    while page.more:  # an answer larger than a page: the rest comes page by page
        page = await session.broker(conn.fetch_rows())
        rows += page.rows
    return client.Result(first.columns, rows, first.rowcount)


def result_set(result: client.Result) -> ResultSet:
    """The broker's rows as a result set (each column typed by its first value)."""
    rows = [[from_sqlite(v) for v in row] for row in result.rows]
    types = [
        next((row[i].type for row in rows if row[i].data is not None), t.INT)
        for i in range(len(result.columns))
    ]
    return ResultSet(list(result.columns), types, rows)


def _affected(session: Session, count: int) -> None:
    """A statement changed `count` rows: @@ROWCOUNT, and the message unless NOCOUNT."""
    session.rowcount = count
    if not session.nocount:
        session.output.message(f"({count} row{'s' if count != 1 else ''} affected)")


async def table_statement(session: Session, statement: ast.TableStatement, frame: Frame) -> None:
    result = await _run(session, statement.text, statement.variables, frame)
    if result.columns:
        session.output.result(result_set(result), session.nocount)
    elif statement.text.split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE", "MERGE"):
        _affected(session, result.rowcount)
    session.rowcount = result.rowcount
    if statement.creates is not None and frame.procedure is not None:
        frame.temporary.append(statement.creates)


async def table_query(session: Session, select: ast.Select, frame: Frame) -> ResultSet:
    """A SELECT of the broker's tables, run by the broker (assignments left out: the
    caller makes them from the rows)."""
    text, variables = plain_text(select)
    return result_set(await _run(session, text, variables, frame))


_LONG: Final = frozenset(("NVARCHAR", "VARBINARY"))  # declared (MAX) in a view's copy


def _copy_type(kind: t.SqlType) -> str:
    """A view's column's type in its copy (a text's or a binary's with its length)."""
    if kind.name in _LONG:
        return f"{kind.name}(MAX)"
    return f"{kind.name}({kind.length})" if kind.name in t.SIZED else kind.name


def _view_table(view: str) -> str:
    """The temporary table a catalog view's rows are copied into: #ssb_sys_<name>."""
    return "#ssb_" + view.replace(".", "_")


def _with_copies(text: str, views: list[Source]) -> str:
    """The query with each catalog view read from its temporary copy (its alias, or
    its own name as one, kept)."""
    try:
        tree = sqlglot.parse_one(text, read="tsql")
    except SqlglotError as exc:
        raise SqlError(40517, f"this query cannot be read: {str(exc).splitlines()[0]}") from None
    names = {view.name for view in views}
    for table in list(tree.find_all(exp.Table)):
        name = f"{table.db}.{table.name}".lower()
        if name in names:
            alias = table.args.get("alias") or exp.TableAlias(this=exp.to_identifier(table.name))
            copy = exp.Identifier(this=_view_table(name)[1:], temporary=True)
            table.replace(exp.Table(this=copy, alias=alias))
    return tree.sql("tsql")


async def joined_query(
    session: Session, select: ast.Select, frame: Frame, views: list[Source]
) -> ResultSet:
    """A SELECT of the broker's tables joined with catalog views: each view's rows go
    into a temporary table on the broker for the statement (in the session's
    transaction), the broker runs it on those, and the tables go."""
    conn = session.connection()
    text, variables = plain_text(select)
    query = _with_copies(text, views)
    fetched: dict[str, list[Any]] = {}
    made: list[str] = []
    try:
        for view in {v.name: v for v in views}.values():
            columns = SYS_VIEWS[view.name].columns
            table = _view_table(view.name)
            declared = ", ".join(f"[{name}] {_copy_type(kind)}" for name, kind in columns)
            await session.broker(conn.execute(f"CREATE TABLE {table} ({declared})"))
            made.append(table)
            rows = await session.catalog_rows(view, fetched)
            marks = ", ".join(f"@p{i}" for i in range(1, len(columns) + 1))
            await session.broker(
                conn.executemany(
                    f"INSERT INTO {table} VALUES ({marks})",
                    [[to_sqlite(value) for value in row] for row in rows],
                )
            )
        return result_set(await _run(session, query, variables, frame))
    finally:
        for table in made:
            await session.broker(conn.execute(f"DROP TABLE IF EXISTS {table}"))


async def select_into(session: Session, select: ast.Select, frame: Frame) -> None:
    """SELECT ... INTO #name: the broker makes the temporary table from the rows."""
    text, variables = plain_text(select)
    result = await _run(session, text, variables, frame)
    _affected(session, result.rowcount)
    if frame.procedure is not None:
        assert select.into is not None
        frame.temporary.append(select.into)


async def drop_temporary(session: Session, frame: Frame) -> None:
    """A procedure returns: the temporary tables it made go, as SQL Server drops them."""
    conn = session.connection()
    while frame.temporary:
        name = frame.temporary.pop()
        await session.broker(conn.execute(f"DROP TABLE IF EXISTS {name}"))


Handler = Callable[[Any, Any, Any], Coroutine[Any, Any, None]]
TABLE_STATEMENTS: Final[dict[type, Handler]] = {ast.TableStatement: table_statement}
