"""Queries over the broker's views and queues, run on SQLite.

Theory of operation. A SELECT that reads views or queues (or a table variable) is
translated once from T-SQL to SQLite with sqlglot and the translation is kept on its
syntax node. sqlglot reads the T-SQL with a dialect that leaves every scalar function
as a plain call, so that the translation can put SQL Server's own semantics in its
place: scalar functions, CAST/CONVERT, `+` and the XML methods become SQLite functions
backed by this package's library (_functions, _types, _xml); aggregates, joins, WHERE,
GROUP BY, ORDER BY and TOP are SQLite's. Text columns compare with a collation that
ignores case and trailing spaces, as SQL Server's default collation does. Variables
become named parameters. Anything the translation does not know is refused with a
clear error before anything runs; nothing runs half-translated.

Running a query fetches only the views it names (each once), loads their rows into
temporary tables of the session's in-memory SQLite database, runs the statement and
drops the tables.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import itertools
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

import sqlglot
from sqlglot import exp
from sqlglot.dialects.tsql import TSQL
from sqlglot.errors import SqlglotError

from . import _ast as ast
from . import _for_xml as for_xml
from . import _types as t
from ._catalog import QUEUE_COLUMNS, SYS_VIEWS, queue_rows
from ._errors import NotSupported, SqlError, assignment_with_retrieval
from ._eval import typed_value
from ._functions import DATE_PART_FUNCTIONS, SCALARS
from ._lexer import Kind, tokenize
from ._operators import arithmetic, common_type
from ._output import ResultSet
from ._types import Value
from ._xml import parse_xml, xml_exist, xml_query

if TYPE_CHECKING:
    from ._frame import Frame

_AGGREGATES: Final = ("COUNT", "SUM", "MIN", "MAX", "AVG", "COUNT_BIG")


class _Reader(TSQL):
    """T-SQL as sqlglot reads it, but with scalar functions left as plain calls."""

    class Parser(TSQL.Parser):  # type: ignore[valid-type,misc]
        FUNCTIONS = {k: v for k, v in TSQL.Parser.FUNCTIONS.items() if k in _AGGREGATES}
        FUNCTION_PARSERS = {
            k: v
            for k, v in TSQL.Parser.FUNCTION_PARSERS.items()
            if k in ("CAST", "TRY_CAST", "CONVERT", "TRY_CONVERT")
        }


@dataclass(frozen=True, slots=True)
class Source:
    """A table a query reads: a catalog view, a queue or a table variable."""

    kind: str  # view, queue, table, nodes
    name: str  # sys.services / the queue / the variable's key
    table: str  # its name in SQLite
    path: str = ""  # nodes: the XQuery of @x.nodes('...')
    column: str = ""  # nodes: the column of AS T(c)


@dataclass(slots=True)
class Translation:
    sql: str
    sources: list[Source]
    parameters: list[str]  # variable keys, in the order of their :pN names
    assigns: list[tuple[str, str | None, str]] = field(default_factory=list)  # (key, name, op)
    # the SQL type of each column of the result, where the query fixes it (None: not known)
    columns: list[t.SqlType | None] = field(default_factory=list)


Columns = Sequence[tuple[str, t.SqlType]]


@dataclass(frozen=True, slots=True)
class Schema:
    """The types of what a statement names that the views and queues do not fix: a table
    variable's columns and a variable's type, by key (None: not known). SQLite keeps no SQL
    type, so the translation tells the functions that need one (SUM, CONVERT ...) what
    their argument is."""

    table: Callable[[str], Columns | None]
    variable: Callable[[str], t.SqlType | None]


NO_SCHEMA: Final = Schema(lambda key: None, lambda key: None)


def _refuse(what: str) -> SqlError:
    return SqlError(
        40517,
        f"{what} cannot be run in a query by ssb (it reads ssb's views on SQLite); run it"
        " outside the query, on variables",
    )


def translate(select: ast.Select, schema: Schema = NO_SCHEMA) -> Translation:
    """The query's SQLite form (made once per syntax node: `schema`'s types are the same
    for every run of it)."""
    text, assigns = _without_assignments(select)
    if select.into is not None:
        raise _refuse("SELECT ... INTO")
    translation = translate_text(text, schema)
    translation.assigns = assigns
    return translation


def plain_text(select: ast.Select) -> tuple[str, list[str]]:
    """The query's T-SQL without its assignments, and the keys of the variables it
    reads (for the broker, which runs queries of its tables)."""
    text, _ = _without_assignments(select)
    variables = dict.fromkeys(
        token.upper for token in tokenize(text) if token.kind is Kind.VARIABLE
    )
    return text, list(variables)


def _without_assignments(select: ast.Select) -> tuple[str, list[tuple[str, str | None, str]]]:
    text = select.text
    assigns: list[tuple[str, str | None, str]] = [
        (i.target, i.target_name, i.op) for i in select.items if i.target is not None
    ]
    if assigns:
        if len(assigns) != len(select.items):
            raise assignment_with_retrieval()
        items = ", ".join(
            select.text[i.start - select.offset : i.end - select.offset] for i in select.items
        )
        text = text[: select.items_start] + items + text[select.items_end :]
    return text, assigns


def translate_text(text: str, schema: Schema = NO_SCHEMA) -> Translation:
    """A SELECT, or an INSERT / UPDATE / DELETE of a table variable, in SQLite's words."""
    try:
        tree = sqlglot.parse_one(text, read=_Reader)
    except SqlglotError as exc:
        raise SqlError(
            40517,
            f"this query cannot be translated to ssb's SQL engine: {str(exc).splitlines()[0]}",
        ) from None
    sources: list[Source] = []
    parameters: list[str] = []
    ctes = {cte.alias_or_name.upper() for cte in tree.find_all(exp.CTE)}
    names = itertools.count()
    typing = _Typing(tree, ctes, schema)
    columns = (
        [typing.result(e) for e in tree.expressions]
        if isinstance(tree, exp.Select) and tree.args.get("for_") is None
        else []
    )

    def deep(node: exp.Expression) -> exp.Expression:
        # sqlglot does not descend into what a rewrite returns: its children are done here
        return node.transform(rewrite, copy=False)

    def rewrite(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Select) and node.args.get("for_") is not None:
            return for_xml.rewrite(node, deep)
        if isinstance(node, exp.Table):
            return _table(node, sources, ctes, names)
        if isinstance(node, exp.Parameter):
            inner = node.this  # @@NAME, a system function, is a parameter in a parameter
            key = (
                "@@" + inner.name.upper()
                if isinstance(inner, exp.Parameter)
                else "@" + node.name.upper()
            )
            if key not in parameters:
                parameters.append(key)
            return exp.Placeholder(this=f"p{parameters.index(key)}")
        if isinstance(node, (exp.Cast, exp.TryCast)):
            type_name = node.to.sql(dialect="tsql")
            name = "tsql_try_cast" if isinstance(node, exp.TryCast) else "tsql_cast"
            source = typing.name(node.this)  # what SQLite forgot: a DATETIME, a DECIMAL...
            return exp.Anonymous(
                this=name,
                expressions=[deep(node.this), exp.Literal.string(type_name), exp.null(), source],
            )
        if isinstance(node, exp.Convert):
            type_name = node.this.sql(dialect="tsql")
            style = node.args.get("style") or exp.null()
            source = typing.name(node.expression)
            return exp.Anonymous(
                this="tsql_cast",
                expressions=[
                    deep(node.expression),
                    exp.Literal.string(type_name),
                    deep(style),
                    source,
                ],
            )
        if isinstance(node, exp.National):
            return exp.Literal.string(node.this)
        if isinstance(node, exp.Add):
            return exp.Anonymous(
                this="tsql_add", expressions=[deep(node.this), deep(node.expression)]
            )
        if isinstance(node, exp.CurrentTimestamp):
            return exp.Anonymous(this="tsql_getdate", expressions=[])
        if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Anonymous):
            method = node.expression.name.upper()
            if method in ("VALUE", "QUERY", "EXIST"):
                return exp.Anonymous(
                    this=f"tsql_xml_{method.lower()}",
                    expressions=[deep(node.this), *map(deep, node.expression.expressions)],
                )
            raise _refuse(f"the xml {method.lower()}() method")
        if isinstance(node, (exp.Avg, exp.Sum)):  # in the argument's type, as SQL Server's
            name = "tsql_avg" if isinstance(node, exp.Avg) else "tsql_sum"
            argument = node.this
            if isinstance(argument, exp.Distinct) and len(argument.expressions) == 1:
                argument = argument.expressions[0]
            kind = typing.of(argument)  # named in the aggregate's name: DISTINCT takes one
            if kind is not None:
                name += "_" + kind.name.lower()
            return exp.Anonymous(this=name, expressions=[deep(node.this)])
        if isinstance(node, exp.WithinGroup):
            raise NotSupported(
                "STRING_AGG ... WITHIN GROUP (ORDER BY ...)",
                "ssb's SQL engine has no ordered aggregates; build an ordered list with"
                " STUFF((SELECT ',' + x ... ORDER BY ... FOR XML PATH('')), 1, 1, '')",
            )
        if isinstance(node, exp.Anonymous):
            name = node.name.upper()
            if name == "STRING_AGG":  # SQLite's group_concat: NULLs skipped, NULL of no rows
                if len(node.expressions) != 2:
                    raise SqlError(174, "The STRING_AGG function requires 2 argument(s).")
                kind = typing.of(node.expressions[0])
                value, separator = (deep(arg) for arg in node.expressions)
                return exp.Anonymous(
                    this="tsql_string_agg",
                    expressions=[
                        value,
                        separator,
                        exp.Literal.string("" if kind is None else str(kind)),
                    ],
                )
            if name in SCALARS or name in SESSION_IN_QUERIES:
                kinds = [typing.of(arg) for arg in node.expressions]  # before deep() moves them
                args = [deep(arg) for arg in node.expressions]
                if name in DATE_PART_FUNCTIONS and args and isinstance(args[0], exp.Column):
                    args[0] = exp.Literal.string(args[0].name)
                    kinds[0] = None  # a date part, not a column
                if name in SCALARS and any(kinds):  # told the types SQLite forgot
                    types = ";".join("" if kind is None else str(kind) for kind in kinds)
                    return exp.Anonymous(
                        this=f"tsql_typed_{name.lower()}",
                        expressions=[exp.Literal.string(types), *args],
                    )
                return exp.Anonymous(this=f"tsql_{name.lower()}", expressions=args)
            if name.startswith("TSQL_"):
                return node
            raise _refuse(f"the function {name}()")
        if isinstance(node, exp.Join) and isinstance(node.this, exp.Lateral):
            lateral = node.this
            table = _nodes(lateral.this, lateral.args.get("alias"), sources, names)
            if lateral.args.get("cross_apply") is False:  # OUTER APPLY
                return exp.Join(this=table, side="LEFT", on=exp.true())
            return exp.Join(this=table)
        if isinstance(node, exp.Limit) and node.args.get("limit_options"):
            raise _refuse("TOP ... PERCENT / WITH TIES")
        return node

    translated = tree.transform(rewrite, copy=True)
    for node in translated.walk():
        if isinstance(node, exp.Func) and not isinstance(node, _PLAIN):
            raise _refuse(f"{node.sql(dialect='tsql')[:40]}")
    return Translation(translated.sql(dialect="sqlite"), sources, parameters, columns=columns)


# what sqlglot models as functions and SQLite runs as T-SQL means them
_PLAIN: Final = (exp.Anonymous, exp.AggFunc, exp.Count, exp.Binary, exp.Case, exp.If)


class _Typing:
    """The SQL type of an expression of a query, where the text fixes it: a column of a
    view, a queue or a table variable, a variable, a literal, a CAST, and arithmetic on
    those. None where it does not (the value's own type is taken then)."""

    def __init__(self, tree: exp.Expr, ctes: set[str], schema: Schema) -> None:
        self.schema = schema
        self.tables: dict[str, dict[str, t.SqlType] | None] = {}  # by alias; None: unsure
        for table in tree.find_all(exp.Table):
            columns = self._columns(table, ctes)
            if columns is None:
                continue
            inner = table.this
            alias = (
                table.alias
                or (inner.name if isinstance(inner, exp.Parameter) else "")
                or table.name
            ).upper()
            known = {name.lower(): kind for name, kind in columns}
            # one alias for two tables (in two subqueries): neither is sure
            self.tables[alias] = known if self.tables.get(alias, known) == known else None
        # a column named without its table is looked up in every table, unless a derived
        # table or a CTE may name it too (with a type of its own); nor where an alias names
        # columns (@x.nodes(...) AS T(c))
        self.unqualified = not ctes and not any(
            isinstance(sub.parent, (exp.From, exp.Join)) for sub in tree.find_all(exp.Subquery)
        )
        self.renamed = {
            column.name.lower()
            for alias in tree.find_all(exp.TableAlias)
            for column in alias.columns
        }

    def _columns(self, table: exp.Table, ctes: set[str]) -> Columns | None:
        inner = table.this
        if isinstance(inner, exp.Parameter):
            return self.schema.table("@" + inner.name.upper())
        schema = table.db.lower() if table.db else ""
        if schema == "sys":
            view = SYS_VIEWS.get(f"sys.{table.name.lower()}")
            return None if view is None else view.columns
        if (not schema and table.name.upper() in ctes) or not isinstance(inner, exp.Identifier):
            return None
        return QUEUE_COLUMNS

    def of(self, node: exp.Expression) -> t.SqlType | None:
        try:
            return self._of(node)
        except SqlError:  # a type name SQL Server lacks: its CAST says so when it runs
            return None

    def name(self, node: exp.Expression) -> exp.Expression:
        """The type of `node` as a literal for a function of ours ('' for not known)."""
        kind = self.of(node)
        return exp.Literal.string("" if kind is None else str(kind))

    def _of(self, node: exp.Expression) -> t.SqlType | None:
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, exp.Parameter) and not isinstance(node.this, exp.Parameter):
            return self.schema.variable("@" + node.name.upper())
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return t.parse_type_name(node.to.sql(dialect="tsql"))
        if isinstance(node, exp.Convert):
            return t.parse_type_name(node.this.sql(dialect="tsql"))
        if isinstance(node, (exp.Paren, exp.Neg)):
            return self._of(node.this)
        if isinstance(node, exp.National):
            return t.literal_text_type("NVARCHAR", node.name)
        if isinstance(node, exp.Literal):
            return _literal_type(node)
        if isinstance(node, exp.Anonymous) and node.name.upper() in SCALARS:
            return self._function(node.name.upper(), node.expressions)
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            left, right = self._of(node.this), self._of(node.expression)
            if left is None or right is None:
                return None
            if {left.family, right.family} <= _NUMBERS:
                kind = common_type(left, right)
                return t.INT if kind.name in ("TINYINT", "SMALLINT", "BIT") else kind
            if isinstance(node, exp.Add) and {left.family, right.family} <= {"char", "nchar"}:
                return t.concatenated(left, right)
        return None

    def result(self, node: exp.Expression) -> t.SqlType | None:
        """The type of a column of the result: an expression's, or an aggregate's."""
        if isinstance(node, exp.Alias):
            node = node.this
        if isinstance(node, exp.Count):
            return t.INT
        if isinstance(node, (exp.Sum, exp.Avg, exp.Min, exp.Max)):
            argument = node.this
            if isinstance(argument, exp.Distinct) and len(argument.expressions) == 1:
                argument = argument.expressions[0]
            kind = self.of(argument)
            if kind is None or isinstance(node, (exp.Min, exp.Max)):
                return kind
            if kind.name in ("TINYINT", "SMALLINT", "INT"):
                return t.INT
            if kind.family == "decimal" and kind.name not in ("MONEY", "SMALLMONEY"):
                scale = kind.scale or 0  # as SQL Server's: an average to 6 places at least
                return t.SqlType(
                    "DECIMAL", None, 38, max(scale, 6) if isinstance(node, exp.Avg) else scale
                )
            return kind
        return self.of(node)

    def _function(self, name: str, args: list[exp.Expression]) -> t.SqlType | None:
        """A scalar function's result type, where its arguments' are known: the type it
        gives for NULL arguments of those types (REPLACE of a VARCHAR(8000) is one)."""
        if name in DATE_PART_FUNCTIONS:
            if name == "DATEADD" and len(args) == 3:
                kind = self._of(args[2])
                return kind if kind is not None and kind.family in ("datetime", "date") else None
            return t.INT if name in ("DATEDIFF", "DATEPART") else None
        kinds = [kind for kind in map(self._of, args) if kind is not None]
        if not kinds or len(kinds) < len(args):
            return None
        try:
            return SCALARS[name](*(Value(None, kind) for kind in kinds)).type
        except (SqlError, TypeError, ValueError, ArithmeticError):
            return None

    def _column(self, node: exp.Column) -> t.SqlType | None:
        name = node.name.lower()
        if node.table:
            columns = self.tables.get(node.table.upper())
            return None if columns is None else columns.get(name)
        if not self.unqualified or name in self.renamed:
            return None
        found = {columns[name] for columns in self.tables.values() if columns and name in columns}
        return found.pop() if len(found) == 1 else None


_NUMBERS: Final = frozenset(("int", "decimal", "float"))


def _literal_type(node: exp.Literal) -> t.SqlType | None:
    text = node.name
    if node.is_string:
        return t.literal_text_type("VARCHAR", text)
    if text.isdigit():
        number = int(text)
        if number < 2**31:
            return t.INT
        return t.SqlType("NUMERIC", None, len(text), 0) if len(text) <= 38 else None
    if "e" in text.lower():
        return t.FLOAT
    whole, _, fraction = text.partition(".")
    digits = len(whole.lstrip("0")) + len(fraction)
    return t.SqlType("NUMERIC", None, max(digits, len(fraction), 1), len(fraction))


def _table(
    node: exp.Table, sources: list[Source], ctes: set[str], names: itertools.count[int]
) -> exp.Expression:
    inner = node.this
    alias = node.alias
    if isinstance(inner, exp.Parameter):
        key = "@" + inner.name.upper()
        source = Source("table", key, f"tsql_t{next(names)}")
        sources.append(source)
        if not isinstance(node.parent, (exp.From, exp.Join)):
            return exp.Table(this=exp.to_identifier(source.table))  # a DML's target
        return exp.Table(
            this=exp.to_identifier(source.table),
            alias=exp.TableAlias(this=exp.to_identifier(alias or inner.name)),
        )
    if isinstance(inner, exp.Anonymous) and isinstance(node.args.get("db"), exp.Parameter):
        method = exp.Dot(this=node.args["db"].copy(), expression=inner.copy())
        return _nodes(method, node.args.get("alias"), sources, names)
    name = node.name
    schema = node.db.lower() if node.db else ""
    if not schema and name.upper() in ctes:
        return node
    if schema == "sys":
        full = f"sys.{name.lower()}"
        if full not in SYS_VIEWS:
            raise SqlError(
                208,
                f"Invalid object name '{full}'. ssb has these catalog views: "
                + ", ".join(sorted(SYS_VIEWS)),
            )
        source = Source("view", full, f"tsql_t{next(names)}")
    else:
        source = Source("queue", name, f"tsql_t{next(names)}")
    sources.append(source)
    return exp.Table(
        this=exp.to_identifier(source.table),
        alias=exp.TableAlias(this=exp.to_identifier(alias or name)),
    )


def _nodes(
    method: exp.Expression,
    alias: exp.Expression | None,
    sources: list[Source],
    names: itertools.count[int],
) -> exp.Table:
    """@x.nodes('path') AS T(c), as a table of one XML column loaded from the variable."""
    if not (
        isinstance(method, exp.Dot)
        and isinstance(method.this, exp.Parameter)
        and isinstance(method.expression, exp.Anonymous)
        and method.expression.name.upper() == "NODES"
        and len(method.expression.expressions) == 1
        and isinstance(method.expression.expressions[0], exp.Literal)
        and isinstance(alias, exp.TableAlias)
        and len(alias.columns) == 1
    ):
        raise _refuse("APPLY of anything but @variable.nodes('path') AS T(c)")
    key = "@" + method.this.name.upper()
    path = str(method.expression.expressions[0].this)
    source = Source("nodes", key, f"tsql_t{next(names)}", path, alias.columns[0].name)
    sources.append(source)
    return exp.Table(
        this=exp.to_identifier(source.table),
        alias=exp.TableAlias(this=exp.to_identifier(alias.name)),
    )


# ---- SQLite values ----------------------------------------------------------------------


class _Total:
    """SUM as SQL Server computes it, in the type of its argument (`kind`, when the query
    fixes it): of TINYINT, SMALLINT and INT an INT, of BIGINT a BIGINT, of MONEY a MONEY,
    each overflowing as SQL Server's does (Msg 8115), the total of DECIMAL and FLOAT as a
    float (as SQLite holds them); of what is no number Msg 8117. AVG is the total over the
    count (an integer's average an integer, the quotient cut toward zero)."""

    operator = "sum"

    def __init__(self, engine: Engine, kind: t.SqlType | None) -> None:
        self.engine = engine  # where an error goes, for the statement to raise
        self.kind = kind
        self.total: int | float = 0
        self.count = 0
        self.integral = True
        self.range = _TOTAL_RANGES.get(kind.name) if kind is not None else None
        if kind is not None and (kind.family not in _NUMBERS or kind.name == "BIT"):
            self._fail(kind.name.lower())

    def _fail(self, kind: str) -> None:
        self.engine.failure = SqlError(
            8117, f"Operand data type {kind} is invalid for {self.operator} operator."
        )
        raise self.engine.failure

    def step(self, value: object) -> None:
        if value is None:
            return
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self._fail(t.infer(value).name.lower())
        self.total += value  # type: ignore[operator]
        self.count += 1
        self.integral = self.integral and isinstance(value, int)
        if self.range is not None:
            name, low, high = self.range
            if not low <= self.total <= high:
                self.engine.failure = SqlError(
                    8115, f"Arithmetic overflow error converting expression to data type {name}."
                )
                raise self.engine.failure

    def finalize(self) -> int | float | None:
        if not self.count:
            return None
        if self.integral and self.kind is None and not -(2**63) <= self.total < 2**63:
            self.engine.failure = SqlError(
                8115, "Arithmetic overflow error converting expression to data type bigint."
            )
            raise self.engine.failure
        return self.total


class _Average(_Total):
    operator = "avg"

    def finalize(self) -> int | float | None:
        total = super().finalize()
        if total is None:
            return None
        if self.integral and (self.kind is None or self.kind.family == "int"):
            quotient = abs(int(total)) // self.count
            return quotient if total >= 0 else -quotient
        return total / self.count


# SUM's result type and its range, by its argument's type
_TOTAL_RANGES: Final = {
    **dict.fromkeys(("TINYINT", "SMALLINT", "INT"), ("int", *t.INT_RANGES["INT"])),
    "BIGINT": ("bigint", *t.INT_RANGES["BIGINT"]),
    "MONEY": ("money", -922337203685477.5808, 922337203685477.5807),
    "SMALLMONEY": ("smallmoney", -214748.3648, 214748.3647),
}


class _StringAgg:
    """STRING_AGG(value, separator) as SQL Server's: NULLs skipped, NULL of no values; the
    result within 8000 bytes (Msg 9829) unless the value is (MAX), or the value's type is
    not known here, within 2 GB then (Msg 7119)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.parts: list[str] = []
        self.length = 0
        self.kind: t.SqlType | None = None

    def step(self, value: object, separator: object, kind: str) -> None:
        if value is None:
            return
        if self.kind is None:
            given = t.parse_type_name(kind) if kind else None
            nchar = given is None or given.family != "char"
            lob = given is None or t.is_lob(given)
            self.kind = (
                (t.NVARCHAR_MAX if lob else t.NVARCHAR)
                if nchar
                else (t.VARCHAR_MAX if lob else t.VARCHAR)
            )
        text = t.to_text(Value(value, t.infer(value)))
        if self.parts and separator is not None:
            text = t.to_text(Value(separator, t.infer(separator))) + text
        self.length += len(text)
        if self.length > t.text_room(self.kind):
            self.engine.failure = (
                t.lob_overflow()
                if self.kind.length == t.MAX
                else SqlError(
                    9829,
                    "STRING_AGG aggregation result exceeded the limit of 8000 bytes. Use LOB"
                    " types to avoid result truncation.",
                )
            )
            raise self.engine.failure
        self.parts.append(text)

    def finalize(self) -> str | None:
        return "".join(self.parts) if self.parts else None


def to_sqlite(data: object) -> object:
    if data is None or isinstance(data, (int, float, str, bytes)):
        return int(data) if isinstance(data, bool) else data
    if isinstance(data, uuid.UUID):
        return str(data).upper()
    if isinstance(data, Decimal):
        return float(data)
    if isinstance(data, dt.datetime):
        return data.isoformat(sep=" ", timespec="milliseconds")
    if isinstance(data, (dt.date, dt.time)):
        return data.isoformat()
    if isinstance(data, t.Xml):
        return data.text
    return str(data)


def from_sqlite(data: object, kind: t.SqlType | None = None) -> Value:
    """A value SQLite gives back, as `kind` (what the column or the query makes it) where
    SQLite's own form would tell it wrong: a time or a GUID kept as text, a DECIMAL as a
    float, a BIGINT or a TINYINT as an integer."""
    if kind is not None and data is not None and kind.family in _RETYPED:
        if kind.family == "int" and isinstance(data, int):
            return Value(data, kind)
        try:
            return _as(Value(data, t.infer(data)), kind)
        except SqlError:
            pass
    return Value(data, t.infer(data))


_RETYPED: Final = frozenset(("guid", "datetime", "date", "time", "decimal", "int"))


def _as(value: Value, kind: t.SqlType) -> Value:
    """`value` as `kind`; a time as the broker's views give it, ISO 8601 with its offset
    from UTC (2024-05-06T07:08:09.123+00:00), as the UTC time it names."""
    if isinstance(value.data, str) and kind.family in ("datetime", "date", "time"):
        try:
            moment = dt.datetime.fromisoformat(value.data.strip())
        except ValueError:
            moment = None
        if moment is not None:
            if moment.tzinfo is not None:
                moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
            return t.convert(Value(moment, t.DATETIME2), kind)
    return t.convert(value, kind)


def typed(data: object, type_name: str) -> Value:
    """A value SQLite gives back, as the SQL type the query fixed for it (`type_name`, ''
    when it fixes none: the type of the data then), e.g. a DATETIME SQLite keeps as text."""
    found = Value(data, t.infer(data))
    if not type_name:
        return found
    kind = t.parse_type_name(type_name)
    if data is None:
        return Value(None, kind)
    if found.type.family == kind.family and kind.family not in ("decimal", "datetime"):
        return Value(data, kind)
    try:
        return _as(found, kind)
    except SqlError:  # not what the query said after all: as it is
        return found


def _collate(a: str, b: str) -> int:
    x, y = a.rstrip(" ").lower(), b.rstrip(" ").lower()
    return (x > y) - (x < y)


# the session's functions a query may call (the session answers them)
SESSION_IN_QUERIES: Final = ("DB_ID", "DB_NAME")


class Engine:
    """One session's SQLite database and its T-SQL functions; `session` answers the
    session's own (DB_ID, DB_NAME)."""

    def __init__(self, session: Callable[[str, list[Value]], Value] | None = None) -> None:
        self.db = sqlite3.connect(":memory:", isolation_level=None)
        self.db.create_collation("tsql", _collate)
        self.failure: SqlError | None = None
        for name, function in SCALARS.items():
            self._register(f"tsql_{name.lower()}", function)
            self._register_typed(f"tsql_typed_{name.lower()}", function)
        if session is not None:
            for name in SESSION_IN_QUERIES:
                self._register(f"tsql_{name.lower()}", lambda *a, name=name: session(name, list(a)))
        self._register("tsql_add", lambda a, b: arithmetic("+", a, b))
        self.db.create_aggregate("tsql_for_xml", -1, self._for_xml)  # type: ignore[arg-type]
        kinds: list[str | None] = [None, *t.FAMILIES]
        for average, kind_name in itertools.product((False, True), kinds):
            aggregate = _Average if average else _Total
            kind = None if kind_name is None else t.make_type(kind_name)
            self.db.create_aggregate(  # SUM and AVG of an argument of each type
                f"tsql_{aggregate.operator}"
                + ("" if kind_name is None else f"_{kind_name.lower()}"),
                1,
                functools.partial(aggregate, self, kind),  # type: ignore[arg-type]
            )
        self.db.create_aggregate("tsql_string_agg", 3, functools.partial(_StringAgg, self))  # type: ignore[arg-type]
        self.db.create_function("tsql_cast", 4, self._guard(self._cast), deterministic=True)
        self.db.create_function("tsql_try_cast", 4, self._guard(self._try_cast), deterministic=True)
        self.db.create_function(
            "tsql_xml_value", 3, self._guard(self._xml_value), deterministic=True
        )
        self.db.create_function(
            "tsql_xml_query", 2, self._guard(self._xml_query), deterministic=True
        )
        self.db.create_function(
            "tsql_xml_exist", 2, self._guard(self._xml_exist), deterministic=True
        )

    def _for_xml(self) -> for_xml.ForXml:
        def failed(exc: SqlError) -> None:
            self.failure = exc

        return for_xml.ForXml(failed)

    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            try:
                return fn(*args)
            except SqlError as exc:
                self.failure = exc
                raise

        return call

    def _register(self, name: str, function: Callable[..., Value]) -> None:
        def call(*args: Any) -> Any:
            return to_sqlite(function(*(Value(a, t.infer(a)) for a in args)).data)

        self.db.create_function(name, -1, self._guard(call))

    def _register_typed(self, name: str, function: Callable[..., Value]) -> None:
        """`function` called with the SQL types of its arguments first, as 'type;type...'
        ('' where the query does not fix one)."""

        def call(types: str, *args: Any) -> Any:
            kinds = types.split(";")
            return to_sqlite(
                function(*(typed(a, k) for a, k in zip(args, kinds, strict=True))).data
            )

        self.db.create_function(name, -1, self._guard(call))

    @staticmethod
    def _cast(value: object, type_name: str, style: object, source: str) -> object:
        target = t.parse_type_name(type_name)
        converted = t.convert(
            typed(value, source),
            target,
            None if style is None else t.as_int(Value(style, t.infer(style))),
        )
        return to_sqlite(converted.data)

    @classmethod
    def _try_cast(cls, value: object, type_name: str, style: object, source: str) -> object:
        try:
            return cls._cast(value, type_name, style, source)
        except SqlError:
            return None

    @staticmethod
    def _document(value: object) -> t.Xml | None:
        if value is None:
            return None
        return parse_xml(value if isinstance(value, (str, bytes)) else str(value))

    def _xml_value(self, document: object, path: str, type_name: str) -> object:
        found = self._document(document)
        return None if found is None else to_sqlite(typed_value(found, path, type_name).data)

    def _xml_query(self, document: object, path: str) -> object:
        found = self._document(document)
        return None if found is None else xml_query(found, path).text

    def _xml_exist(self, document: object, path: str) -> object:
        found = self._document(document)
        return None if found is None else xml_exist(found, path)

    def load(
        self, source: Source, columns: Sequence[tuple[str, t.SqlType]], rows: list[Sequence[object]]
    ) -> None:
        declared = ", ".join(
            f'"{name}"' + (" TEXT COLLATE tsql" if kind.family in ("char", "nchar", "guid") else "")
            for name, kind in columns
        )
        self.db.execute(f'CREATE TEMP TABLE "{source.table}" ({declared})')
        if rows:
            marks = ", ".join("?" * len(columns))
            self.db.executemany(
                f'INSERT INTO "{source.table}" VALUES ({marks})',
                [[to_sqlite(v) for v in row] for row in rows],
            )

    @contextlib.contextmanager
    def _running(self, translation: Translation, what: str) -> Iterator[None]:
        """Around running `translation`: SQLite's error becomes a SqlError (or the error a
        function of ours raised inside it, kept in `failure`), and the tables it loaded
        are dropped after, failed or not."""
        self.failure = None
        try:
            yield
        except sqlite3.Error as exc:
            if self.failure is not None:
                raise self.failure from None
            raise SqlError(40517, f"the {what} failed on ssb's SQL engine: {exc}") from None
        finally:
            for source in translation.sources:
                self.db.execute(f'DROP TABLE IF EXISTS temp."{source.table}"')

    def modify(
        self, translation: Translation, parameters: dict[str, object], target: Source
    ) -> tuple[int, list[tuple[object, ...]]]:
        """Run an INSERT / UPDATE / DELETE of a loaded table variable: how many rows it
        touched, and the table's rows after it."""
        with self._running(translation, "statement"):
            count = self.db.execute(translation.sql, parameters).rowcount
            rows = self.db.execute(f'SELECT * FROM "{target.table}"').fetchall()
        return count, rows

    def run(
        self, translation: Translation, parameters: dict[str, object], kinds: dict[str, t.SqlType]
    ) -> ResultSet:
        with self._running(translation, "query"):
            cursor = self.db.execute(translation.sql, parameters)
            names = [d[0] for d in cursor.description or ()]
            raw = cursor.fetchall()
        fixed = translation.columns if len(translation.columns) == len(names) else []
        column_kinds = [
            (fixed[i] if fixed and fixed[i] is not None else kinds.get(n.lower()))
            for i, n in enumerate(names)
        ]
        rows = [[from_sqlite(v, k) for v, k in zip(row, column_kinds, strict=True)] for row in raw]
        types = [
            next((r[i].type for r in rows if r[i].data is not None), column_kinds[i] or t.INT)
            for i in range(len(names))
        ]
        columns = [
            n if not n.startswith(("tsql_", '"tsql_')) and "(" not in n else "" for n in names
        ]
        return ResultSet(columns, types, rows)


def queue_columns() -> tuple[tuple[str, t.SqlType], ...]:
    return QUEUE_COLUMNS


def queue_table(rows: list[dict[str, Any]]) -> list[Sequence[object]]:
    return queue_rows(rows)


def column_kinds() -> dict[str, t.SqlType]:
    kinds: dict[str, t.SqlType] = {}
    for view in SYS_VIEWS.values():
        for name, kind in view.columns:
            kinds.setdefault(name, kind)
    for name, kind in QUEUE_COLUMNS:
        kinds.setdefault(name, kind)
    return kinds


def frame_parameters(
    translation: Translation, frame: Frame, system: Callable[[str], Value]
) -> dict[str, object]:
    """The statement's parameters: its variables' values, and its @@ functions' (`system`)."""
    values: dict[str, object] = {}
    for n, key in enumerate(translation.parameters):
        if key.startswith("@@"):
            values[f"p{n}"] = to_sqlite(system(key).data)
            continue
        slot = frame.variables.get(key)
        if slot is None or slot.table is not None:
            raise SqlError(137, f'Must declare the scalar variable "{key}".', level=15)
        values[f"p{n}"] = to_sqlite(slot.value.data)
    return values
