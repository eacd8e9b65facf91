"""Statements on the broker's tables: run by the broker, in the session's transaction.

Theory of operation. The broker holds the tables and reads T-SQL itself (see the
broker's `execute`), so a statement on a table is sent as written, with the values of
the variables it names as its parameters (`@name`). A SELECT is one too when it reads
the broker's tables only: the session first runs it as a query over views, queues and
table variables, and sends it to the broker when a name it reads is none of those (a
SELECT that joins a table with a view, a queue or a table variable is refused by the
broker: it cannot see them). A SELECT that assigns variables is sent without its
assignments, and the session assigns them from the rows, the last row winning, as SQL
Server does.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final

from ssb import client

from . import _ast as ast
from . import _types as t
from ._errors import SqlError
from ._output import ResultSet
from ._query import from_sqlite, plain_text, to_sqlite

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


async def table_statement(session: Session, statement: ast.TableStatement, frame: Frame) -> None:
    result = await _run(session, statement.text, statement.variables, frame)
    if result.columns:
        session.output.result(result_set(result), session.nocount)
    elif statement.text.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
        count = result.rowcount
        if not session.nocount:
            session.output.message(f"({count} row{'s' if count != 1 else ''} affected)")
    session.rowcount = result.rowcount
    if statement.creates is not None and frame.procedure is not None:
        frame.temporary.append(statement.creates)


async def table_query(session: Session, select: ast.Select, frame: Frame) -> ResultSet:
    """A SELECT of the broker's tables, run by the broker (assignments left out: the
    caller makes them from the rows)."""
    text, variables = plain_text(select)
    return result_set(await _run(session, text, variables, frame))


async def select_into(session: Session, select: ast.Select, frame: Frame) -> None:
    """SELECT ... INTO #name: the broker makes the temporary table from the rows."""
    text, variables = plain_text(select)
    await _run(session, text, variables, frame)
    session.rowcount = 0
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
