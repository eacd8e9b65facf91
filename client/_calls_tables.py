"""The broker operation of users' tables, as a request builder.

A table lives in a database of the broker, beside its queues; its statements are T-SQL
(CREATE / ALTER / DROP TABLE, CREATE / DROP INDEX, INSERT, UPDATE, DELETE, SELECT) and
run in the session's transaction, so they commit or roll back together with its
RECEIVEs, SENDs and END CONVERSATIONs (see "Tables" in the documentation).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._calls import Call


@dataclass(frozen=True, slots=True)
class Result:
    """A table statement's answer.

    Attributes:
        columns: the names of the columns of `rows` (a SELECT, or a change with OUTPUT).
        rows: the rows, as tuples.
        rowcount: the rows the statement changed (INSERT, UPDATE, DELETE), made (SELECT
            ... INTO #name) or answered.
        more: the answer has more rows than one page holds (10,000, or about 4 MiB):
            `fetch_rows()` returns the next page, until one's `more` is False.
    """

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    rowcount: int
    more: bool = False

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def scalar(self) -> Any:
        """The first column of the first row (None when there is no row)."""
        return self.rows[0][0] if self.rows else None


def _result(value: Any) -> Result:
    return Result(
        tuple(value.get("columns") or ()),
        [tuple(row) for row in value.get("rows") or ()],
        int(value.get("rowcount", 0)),
        bool(value.get("more")),
    )


def execute(sql: str, /, *parameters: Any, **named: Any) -> Call[Result]:
    """Run one T-SQL table statement in the session's transaction (outside one, it
    commits on its own).

    Args:
        sql: the statement; its parameters are @p1, @p2, ... (given in order) or @name
            (given by name).
        parameters: the values of @p1, @p2, ...
        named: the values of @name parameters (not with positional ones).
    Returns:
        The statement's `Result`: rows and columns of a SELECT (or of OUTPUT), the
        rows changed of an INSERT, UPDATE or DELETE.
    Raises:
        SqlError: the statement is not supported, cannot be translated or failed (a
            constraint, a missing table): nothing of it was applied.
    """
    if not isinstance(sql, str):
        raise TypeError(f"sql is a str, got {type(sql).__name__}")
    if parameters and named:
        raise TypeError("give the parameters in order (@p1, ...) or by name, not both")
    arguments: dict[str, Any] = {"sql": sql}
    if parameters:
        arguments["parameters"] = list(parameters)
    elif named:
        arguments["parameters"] = dict(named)
    return Call("execute", arguments, _result)


def executemany(sql: str, rows: Iterable[Sequence[Any] | Mapping[str, Any]], /) -> Call[Result]:
    """Run one INSERT, UPDATE or DELETE (without OUTPUT) once for each row of `rows`, in
    order, in one request: what a loop of `execute` calls does, without a round trip per
    row. The runs are one step of the session's transaction (outside one, they commit
    on their own, together): when one fails, none of them is applied.

    Args:
        sql: the statement; its parameters are @p1, @p2, ... or @name.
        rows: the parameters of each run: a sequence (the values of @p1, @p2, ...) or a
            mapping (the values of @name by name); at most 100,000 rows.
    Returns:
        A `Result` whose `rowcount` is the rows the runs changed in all.
    Raises:
        SqlError: the statement is not an INSERT, UPDATE or DELETE without OUTPUT, is not
            supported, or a run failed (a constraint, a missing value): nothing of it
            was applied.
    """
    if not isinstance(sql, str):
        raise TypeError(f"sql is a str, got {type(sql).__name__}")
    wire: list[Any] = []
    for row in rows:
        if type(row) is tuple or type(row) is list:  # (the usual rows, seen at once)
            wire.append(list(row))
        elif isinstance(row, Mapping):
            wire.append(dict(row))
        elif isinstance(row, Sequence) and not isinstance(row, (str, bytes)):
            wire.append(list(row))
        else:
            raise TypeError(f"each row is a sequence or a mapping of values, got {row!r:.40}")
    return Call("execute_many", {"sql": sql, "rows": wire}, _result)


def fetch_rows() -> Call[Result]:
    """The next page of this connection's last `execute` answer whose `more` was True
    (before its next statement): a `Result` of the same columns, `more` when pages are
    left."""
    return Call("fetch_rows", {}, _result)
