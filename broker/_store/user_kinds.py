"""SQL Server's types where a user's statement depends on them and the store's database
does not keep them: aggregates whose result takes their argument's type, and columns
that refuse what their type cannot hold.

Theory of operation. SQL Server's SUM and AVG are of their argument's type: AVG of an
INT is an INT (the quotient cut toward zero), SUM of an INT fails past INT's range
(Msg 8115), and of a DECIMAL or a FLOAT both keep their fraction. SQLite knows a value's
storage class only (a DECIMAL 2.00 is stored as the integer 2), so `aggregates` writes
SUM(x) as `ssb_total(SUM(x), kind)` and AVG(x) as `ssb_average(SUM(x), COUNT(x), kind)`,
where `kind` is SQL giving the SQL Server type of x: a column's declared type, read from
its table's schema (pragma_table_info, once per statement), a CAST's type, a number's,
the widest of an arithmetic's operands (`ssb_kind`); NULL for anything else, whose
average then follows its total's storage class (of integers, an integer). The sums and
counts stay SQLite's own: what Python adds runs once per group, never per row. A type
that is no number (text, a time, a UNIQUEIDENTIFIER) fails there (Msg 8117).
PostgreSQL knows every expression's type: `postgresql` writes the same tree's SUM as
`ssb_sum(x)`, an aggregate the store defines for each numeric type with SQL Server's
result type and range (`postgres_schema.AGGREGATES`), and AVG as
`ssb_avg_sum(x) / COUNT(x)` (the same aggregate named for AVG: PostgreSQL's refusal of
a type neither takes, `no_sum`, then names AVG).

REPLICATE's result is cut at 8000 bytes unless its text is of a (MAX) type, which
neither store's text keeps: `replicate` reads the bound from how the text is written
and passes it to the function both stores define, `ssb_replicate`.

Columns. SQLite keeps any value in any column, where SQL Server refuses one its
column's type cannot hold. `checks` gives a column of an integer type a CHECK of its
type's range (of a number) and one that text SQLite did not make a number of fails
(`ssb_unconverted`, in SQL Server's words, Msg 245), and one of a sized text or
binary type a CHECK of its length (trailing spaces of a text do not count, as SQL
Server cuts them). PostgreSQL checks a text's length and its integers' ranges itself,
but for TINYINT (its smallint) and bytea: it keeps the same CHECKs, written without
SQLite's TYPEOF; it converts text to an integer itself (`unconverted` words its
refusal as SQL Server does). Each is named `ssb:<what>:<the column's name's crc32>` (short, unique
in its table), so that `checked` puts its failure in SQL Server's words on both stores:
Msg 8115's for a range, Msg 8152's for a length (as ssb's table variables and RECEIVE
INTO say it). A CAST or CONVERT to an integer type converts as SQL Server's does (text
of a whole number, a number cut toward zero), or fails in its words (Msg 245 of other
text, `unfit`'s past the type's range), on both stores: SQLite's through `ssb_integer`
(`integer_casts`), PostgreSQL's through the store's `ssb_whole` (PostgreSQL's own CAST
rounds a number and refuses empty text).
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
import zlib
from decimal import Decimal
from typing import Final

from sqlglot import exp

from .._core.ports import TableError

UNCONVERTED: Final = "ssb_unconverted"  # fails: the text in an integer column
INTEGER: Final = "ssb_integer"  # CAST(text AS an integer type), see `integer_casts`
WHOLE: Final = "ssb_whole"  # the same, PostgreSQL's (`postgres_schema.WHOLE`)
UNFIT: Final = "ssb_unfit"  # PostgreSQL's failure of `ssb_whole` (see `unfit`)
REPLICATE: Final = "ssb_replicate"  # REPLICATE(text, times, room), see `replicate`
TOTAL: Final = "ssb_total"  # SUM(x), checked against its type's range
AVERAGE: Final = "ssb_average"  # AVG(x) from SUM(x) and COUNT(x), of x's type
KIND: Final = "ssb_kind"  # the type of an arithmetic of two typed operands
# SQL Server's integer types, narrowest first, and their ranges; the sum or average of
# one is an INT at least
INTEGER_RANGES: Final = {
    "TINYINT": (0, 255),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INT": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
}
INTEGER_KINDS: Final = tuple(INTEGER_RANGES)  # narrowest first
# the types SUM and AVG refuse (a BIT is PostgreSQL's smallint: summed on both stores)
_NOT_NUMBERS: Final = frozenset(
    {"CHAR", "VARCHAR", "NCHAR", "NVARCHAR", "TEXT", "NTEXT", "XML", "UNIQUEIDENTIFIER"}
    | {"BINARY", "VARBINARY", "IMAGE", "DATE", "TIME", "DATETIME", "DATETIME2"}
    | {"SMALLDATETIME", "DATETIMEOFFSET"}
)
POSTGRES_SUMS: Final = ("ssb_sum", "ssb_avg_sum")  # SUM's, AVG's (`postgres_schema`)
ROW_BYTES: Final = 8000  # the longest text not of a (MAX) type
LONGEST: Final = 10**9  # bytes of the longest value both stores keep (SQLite's limit)
CHECKED: Final = "ssb:"  # the name of a check of a column's type begins so
_CONVERSION: Final = "text"  # the check's `what` (see `checks`) of text in an integer column
TRUNCATED: Final = "String or binary data would be truncated."  # (Msg 8152)
_TEXTS: Final = frozenset({"CHAR", "VARCHAR", "NCHAR", "NVARCHAR"})
_NATIONAL: Final = frozenset({exp.DataType.Type.NCHAR, exp.DataType.Type.NVARCHAR})
_BINARIES: Final = frozenset({"BINARY", "VARBINARY"})
_SIZE: Final = re.compile(r"\(\s*(\d+)\s*\)")
_CHECK_FAILED: Final = re.compile(r"CHECK constraint failed: (ssb:[a-z]+):[0-9a-f]+")
_FUNCTION_FAILED: Final = "user-defined function raised exception"  # (SQLite's words)
_failed = threading.local()  # what a function of ours raised, for the statement's error


def invalid_operand(kind: str, operator: str) -> str:
    """SQL Server's words for SUM or AVG (`operator`: "sum", "avg") of a type that is no
    number (Msg 8117)."""
    return f"Operand data type {kind.lower()} is invalid for {operator} operator."


# PostgreSQL's words for SUM or AVG of a type `postgres_schema.AGGREGATES` does not take
_NO_SUM: Final = re.compile(
    r"function (ssb_sum|ssb_avg_sum)\((.*)\) (?:does not exist|is not unique)"
)
# PostgreSQL's name of a column's type -> SQL Server's (NCHAR, NVARCHAR: varchar)
_POSTGRES_TYPES: Final = {
    "character varying": "varchar",
    "character": "char",
    "unknown": "varchar",  # (a text written in the statement)
    "bytea": "varbinary",
    "uuid": "uniqueidentifier",
    "time without time zone": "time",
    "timestamp without time zone": "datetime2",
    "timestamp with time zone": "datetimeoffset",
}


def no_sum(message: str) -> str:
    """PostgreSQL's message of a SUM or AVG of a type that is no number in SQL Server's
    words (any other as it is)."""
    failed = _NO_SUM.fullmatch(message)
    if failed is None:
        return message
    kind = _POSTGRES_TYPES.get(failed[2], failed[2])
    return invalid_operand(kind, "sum" if failed[1] == POSTGRES_SUMS[0] else "avg")


def overflow(kind: str) -> str:
    """SQL Server's words for a value past the range of `kind` (Msg 8115)."""
    return f"Arithmetic overflow error converting expression to data type {kind.lower()}."


def aggregates(node: exp.Expression) -> None:
    """Write each SUM and AVG of the translated statement `node` (its tables already the
    store's) as its argument's type has it (see the module's comment)."""
    for aggregate in list(node.find_all(exp.Sum, exp.Avg)):
        window = aggregate.parent if isinstance(aggregate.parent, exp.Window) else None
        argument = aggregate.this
        typed = argument.expressions[0] if isinstance(argument, exp.Distinct) else argument
        text = isinstance(typed, exp.Literal) and typed.is_string
        kind = exp.Literal.string("VARCHAR") if text else _kind(typed) or exp.null()
        total = exp.Sum(this=argument.copy())
        if isinstance(aggregate, exp.Sum):
            call = exp.Anonymous(this=TOTAL, expressions=[_over(total, window), kind])
        else:
            count = _over(exp.Count(this=argument.copy()), window)
            call = exp.Anonymous(this=AVERAGE, expressions=[_over(total, window), count, kind])
        (window or aggregate).replace(call)


def replicate(node: exp.Expression) -> None:
    """Write each REPLICATE(text, times) of `node` as the stores' `ssb_replicate(text,
    times, room)`: its text repeated, NULL for a negative count, cut at `room`
    characters, SQL Server's 8000 bytes (4000 characters of an N'...' text or a cast to
    NCHAR or NVARCHAR; a column's text counts as 8000), None for a cast to a (MAX) type.

    Raises:
        TableError: REPLICATE in a column's definition.
    """
    for call in list(node.find_all(exp.Repeat)):
        if call.find_ancestor(exp.ColumnDef, exp.ColumnConstraint) is not None:
            raise TableError("REPLICATE in a column's definition is not supported by ssb's tables")
        value = call.this
        cast = value.to if isinstance(value, exp.Cast) else None
        room: exp.Expression = exp.Literal.number(ROW_BYTES)
        if cast is not None and cast.sql("tsql").upper().endswith("(MAX)"):
            room = exp.null()
        elif isinstance(value, exp.National) or (cast is not None and cast.this in _NATIONAL):
            room = exp.Literal.number(ROW_BYTES // 2)
        text = exp.Cast(this=value, to=exp.DataType.build("TEXT"))
        times = call.args["times"]
        call.replace(exp.Anonymous(this=REPLICATE, expressions=[text, times, room]))


def integer_casts(node: exp.Expression) -> None:
    """Write each CAST or CONVERT of `node` to an integer type, of a value that may be
    text or past the type's range, as a cast of `ssb_integer(value, type, safe)`: the
    number SQL Server makes of it (see `_integer_of`), or its failure (NULL of a `safe`
    one, TRY_CAST's or TRY_CONVERT's). A number written in the
    statement is cut toward zero here (PostgreSQL's CAST would round 4.5 to 5; SQLite's
    cuts it, as SQL Server's does) and goes to the function only when past the range. A
    column's value goes to it only where it is not a number in the range (`CASE WHEN
    typeof(column) IN ('integer', 'real') AND column BETWEEN low AND high ...`): a column
    of such numbers costs no call a row. Not in a table's schema, which outlives the
    function."""
    for cast in list(node.find_all(exp.Cast, exp.Convert)):
        if cast.find_ancestor(exp.ColumnDef) is not None:
            continue
        safe = exp.Literal.number(1 if cast.args.get("safe") else 0)
        kind, key = (cast.to, "this") if isinstance(cast, exp.Cast) else (cast.this, "expression")
        base = kind.sql("tsql").upper() if isinstance(kind, exp.DataType) else ""
        base = "INT" if base == "INTEGER" else base
        value = cast.args.get(key)
        if base not in INTEGER_RANGES or value is None or isinstance(value, exp.Null):
            continue
        low, high = INTEGER_RANGES[base]
        if isinstance(value, exp.Literal) and not value.is_string:
            whole = int(Decimal(value.this))  # (4.5: 4)
            value = value.replace(exp.Literal.number(whole))
            if low <= whole <= high:
                continue
        call = exp.Anonymous(
            this=INTEGER, expressions=[value.copy(), exp.Literal.string(base), safe]
        )
        if isinstance(value, exp.Column):
            kinds = [exp.Literal.string("integer"), exp.Literal.string("real")]
            number = exp.In(this=exp.Typeof(this=value.copy()), expressions=kinds)
            within = exp.Between(
                this=value.copy(), low=exp.Literal.number(low), high=exp.Literal.number(high)
            )
            fits = exp.Or(
                this=exp.And(this=number, expression=within),
                expression=exp.Is(this=value.copy(), expression=exp.null()),
            )
            cast.set(key, exp.Case(ifs=[exp.If(this=fits, true=value.copy())], default=call))
        else:
            cast.set(key, call)


def postgresql(node: exp.Expression) -> None:
    """`aggregates`' SUM and AVG in `node` as PostgreSQL's store writes them (see the
    module's comment), and `integer_casts`' values as the store's `ssb_whole(value,
    type, low, high, safe)` of them (`postgres_schema.WHOLE`)."""
    for call in list(node.find_all(exp.Anonymous)):
        if call.name == INTEGER:
            value, kind, safe = call.expressions
            bounds = [
                exp.Cast(this=exp.Literal.number(end), to=exp.DataType.build("BIGINT"))
                for end in INTEGER_RANGES[kind.name]
            ]
            safely = exp.Boolean(this=safe.name == "1")
            whole = exp.Anonymous(this=WHOLE, expressions=[value, kind, *bounds, safely])
            (call.parent if isinstance(call.parent, exp.Case) else call).replace(whole)
            continue
        if call.name not in (TOTAL, AVERAGE):  # (REPLICATE is the store's function too)
            continue
        total = _typed_sum(call.expressions[0], call.name)
        if call.name == TOTAL:
            call.replace(total)
            continue
        count = exp.Nullif(this=call.expressions[1], expression=exp.Literal.number(0))
        call.replace(exp.Div(this=total, expression=count, typed=True))


def _typed_sum(total: exp.Expression, aggregate: str) -> exp.Expression:
    """SUM(x) (in its window, if any) as the store's `ssb_sum(x)`, or `ssb_avg_sum(x)`,
    the same, where it is AVG's (a refusal of x's type then names AVG)."""
    plain = total.this if isinstance(total, exp.Window) else total
    name = POSTGRES_SUMS[0] if aggregate == TOTAL else POSTGRES_SUMS[1]
    argument = plain.this
    if isinstance(argument, exp.Literal) and argument.is_string:  # (else taken as a number)
        argument = exp.Cast(this=argument, to=exp.DataType.build("VARCHAR"))
    typed = exp.Anonymous(this=name, expressions=[argument])
    if isinstance(total, exp.Window):
        total.set("this", typed)
        return total
    return typed


def _over(aggregate: exp.Expression, window: exp.Window | None) -> exp.Expression:
    if window is None:
        return aggregate
    copy = window.copy()
    copy.set("this", aggregate)
    return copy


def _kind(node: exp.Expression) -> exp.Expression | None:
    """SQL giving the SQL Server type of `node`'s value (its name, as a column declares
    it), or None where it is not known here."""
    if isinstance(node, exp.Paren | exp.Neg | exp.Abs):
        return _kind(node.this)
    if isinstance(node, exp.Column):
        return _declared(node)
    if isinstance(node, exp.Cast):
        return exp.Literal.string(node.to.sql("tsql").upper())
    if isinstance(node, exp.Literal) and not node.is_string:
        text = str(node.this)
        low, high = INTEGER_RANGES["INT"]
        whole = text.lstrip("-").isdigit() and low <= int(text) <= high
        return exp.Literal.string("INT" if whole else "DECIMAL")
    operands: list[exp.Expression]
    if isinstance(node, exp.Sub | exp.Mul | exp.Div | exp.Mod):
        operands = [node.this, node.expression]
    elif isinstance(node, exp.Anonymous) and node.name == "ssb_add":  # (T-SQL's +)
        operands = list(node.expressions)
    elif isinstance(node, exp.Case):
        operands = [i.args["true"] for i in node.args.get("ifs") or ()]
        operands += [node.args["default"]] if node.args.get("default") is not None else []
    elif isinstance(node, exp.Coalesce):
        operands = [node.this, *node.expressions]
    else:
        return None
    kinds = [_kind(operand) for operand in operands]
    if not kinds or any(kind is None for kind in kinds):
        return None
    combined = kinds[0]
    for kind in kinds[1:]:
        combined = exp.Anonymous(this=KIND, expressions=[combined, kind])
    return combined


def _declared(column: exp.Column) -> exp.Expression | None:
    """The declared type of `column`, read from the schema of the table it is in: the
    one its qualifier names, or the first of its query's tables that has it (a column
    two of them have is an error of SQLite's)."""
    select = column.find_ancestor(exp.Select)
    if select is None:
        return None
    sources = [select.args.get("from_") or select.args.get("from")]
    sources += select.args.get("joins") or []
    tables = {}
    for source in sources:
        table = source.this if source is not None else None
        if isinstance(table, exp.Table) and table.name.startswith("u:"):
            tables[table.alias_or_name.lower()] = table.name
    qualifier = column.table.lower()
    if qualifier:
        names = [tables[qualifier]] if qualifier in tables else []
    else:
        names = list(tables.values())
    found = [_schema_type(name, column.name) for name in names]
    if not found:
        return None
    return found[0] if len(found) == 1 else exp.Coalesce(this=found[0], expressions=found[1:])


def _schema_type(table: str, column: str) -> exp.Expression:
    """`(SELECT type FROM pragma_table_info('table') WHERE name = 'column' COLLATE NOCASE)`:
    the column's declared type, NULL when the table has no such column."""
    schema = exp.Table(
        this=exp.Anonymous(this="pragma_table_info", expressions=[exp.Literal.string(table)])
    )
    name = exp.Collate(this=exp.Literal.string(column), expression=exp.var("NOCASE"))
    query = exp.select("type").from_(schema).where(exp.EQ(this=exp.column("name"), expression=name))
    return exp.Subquery(this=query)


def checks(column: exp.ColumnDef, declared: str) -> None:
    """Add to `column`, of the SQL Server type `declared`, the CHECKs of what its type
    holds (see the module's comment)."""
    base = declared.split("(")[0].strip().upper()
    size = _SIZE.search(declared)
    name = exp.column(column.name, quoted=True)
    if base in INTEGER_RANGES:
        low, high = (exp.Literal.number(end) for end in INTEGER_RANGES[base])
        text = exp.Not(
            this=exp.In(
                this=exp.Typeof(this=name.copy()),
                expressions=[exp.Literal.string("integer"), exp.Literal.string("real")],
            )
        )
        _check(
            column,
            base.lower(),
            exp.Or(this=text, expression=exp.Between(this=name.copy(), low=low, high=high)),
        )
        # text SQLite did not make a number of (SQL Server converts '42', refuses 'abc')
        not_text = exp.NEQ(this=exp.Typeof(this=name.copy()), expression=exp.Literal.string("text"))
        failed = exp.Anonymous(this=UNCONVERTED, expressions=[name, exp.Literal.string(base)])
        _check(column, _CONVERSION, exp.Or(this=not_text, expression=failed))
    if size is not None and base in _TEXTS | _BINARIES:
        value = exp.Trim(this=name, expression=exp.Literal.string(" "), position="TRAILING")
        length = exp.Length(this=value if base in _TEXTS else name)
        _check(column, "length", exp.LTE(this=length, expression=exp.Literal.number(size[1])))


def _check(column: exp.ColumnDef, what: str, holds: exp.Expression) -> None:
    crc = zlib.crc32(column.name.lower().encode())
    constraint = exp.ColumnConstraint(
        this=exp.to_identifier(f"{CHECKED}{what}:{crc:08x}", quoted=True),
        kind=exp.CheckColumnConstraint(this=holds),
    )
    column.append("constraints", constraint)


def checked(message: str) -> str:
    """A store's message of a failed check of `checks`, in SQL Server's words (any other
    as it is)."""
    failed = _CHECK_FAILED.search(message)
    if failed is None:
        return message
    what = failed[1][len(CHECKED) :]
    return overflow(what) if what.upper() in INTEGER_RANGES else TRUNCATED


# PostgreSQL's words for a value past an integer type's range (SQLSTATE 22003)
_OUT_OF_RANGE: Final = {
    "smallint out of range": "SMALLINT",
    "integer out of range": "INT",
    "bigint out of range": "BIGINT",
}


def out_of_range(message: str) -> str:
    """PostgreSQL's message of an integer past its range in SQL Server's words (any
    other as it is)."""
    kind = _OUT_OF_RANGE.get(message)
    return message if kind is None else overflow(kind)


def for_postgresql(check: exp.ColumnConstraint) -> bool:
    """A check of `checks`, written for PostgreSQL: its column's type holds nothing but
    numbers (SQLite's TYPEOF goes). False: PostgreSQL needs none (it converts text to
    its column's type itself, see `unconverted`)."""
    if check.name.startswith(f"{CHECKED}{_CONVERSION}:"):
        return False
    holds = check.kind.this if isinstance(check.kind, exp.CheckColumnConstraint) else None
    if isinstance(holds, exp.Or) and isinstance(holds.expression, exp.Between):
        check.kind.set("this", holds.expression)
    return True


def conversion_failed(value: str, kind: str) -> str:
    """SQL Server's words for text that is no number of the integer type `kind` (Msg 245)."""
    return f"Conversion failed when converting the varchar value '{value}' to data type {kind.lower()}."


# SQL Server's short names of the narrow integer types, in Msg 244
_SHORT_NAMES: Final = {"TINYINT": "INT1", "SMALLINT": "INT2"}


def unfit(value: str, kind: str, source: str) -> str:
    """SQL Server's words for a cast of `value` (as text) past the range of the integer
    type `kind`: of text (`source` "varchar": Msg 248 for an int, 244 for a tinyint or
    smallint, 8114 for a bigint), of an integer ("int": Msg 220 for a tinyint or
    smallint, where it is an int itself), of any other number (Msg 8115)."""
    if source == "varchar":
        if kind == "INT":
            return f"The conversion of the varchar value '{value}' overflowed an int column."
        if kind == "BIGINT":
            return "Error converting data type varchar to bigint."
        return (
            f"The conversion of the varchar value '{value}' overflowed an"
            f" {_SHORT_NAMES[kind]} column. Use a larger integer column."
        )
    low, high = INTEGER_RANGES["INT"]
    if source == "int" and kind in _SHORT_NAMES and low <= int(value) <= high:
        return number_overflowed(value, kind)
    return overflow(kind)


def number_overflowed(value: str, kind: str) -> str:
    """SQL Server's words for an int `value` past the range of a tinyint or smallint
    `kind` (Msg 220)."""
    return f"Arithmetic overflow error for data type {kind.lower()}, value = {value}."


# PostgreSQL's words for text that is no integer (SQLSTATE 22P02)
_NOT_CONVERTED: Final = re.compile(
    r'invalid input syntax for type (smallint|integer|bigint): "(.*)"'
)
_POSTGRES_INTEGERS: Final = {"smallint": "SMALLINT", "integer": "INT", "bigint": "BIGINT"}


def unconverted(message: str) -> str:
    """PostgreSQL's message of text that is no integer in SQL Server's words (any other
    as it is)."""
    failed = _NOT_CONVERTED.fullmatch(message)
    if failed is None:
        return message
    return conversion_failed(failed[2], _POSTGRES_INTEGERS[failed[1]])


# ---- the functions SQLite's store registers ---------------------------------------------


def _integer(kind: str | None) -> str | None:
    """The SQL Server integer type of a declared type, or None (not an integer)."""
    if kind is None:
        return None
    base = kind.split("(")[0].strip().upper()
    if base == "INTEGER":  # (an identity column, INT or BIGINT: SQLite's rowid)
        return "BIGINT"
    return base if base in INTEGER_RANGES else None


def _kind_of(left: str | None, right: str | None) -> str | None:
    """`ssb_kind`: the type of an arithmetic of operands of these types (None: unknown)."""
    if left is None or right is None:
        return None
    first, second = _integer(left), _integer(right)
    if first is None or second is None:
        return "FLOAT"
    return max(first, second, key=INTEGER_KINDS.index)


def _fail(message: str) -> None:
    _failed.message = message
    raise ArithmeticError(message)


def _total(
    total: int | float | None, kind: str | None, operator: str = "sum"
) -> int | float | None:
    """`ssb_total`: SUM's total, in the range of its type (an INT at least); of a type
    that is no number, a failure (AVG's `operator` is "avg")."""
    base = (kind or "").split("(")[0].strip().upper()
    if base in _NOT_NUMBERS:
        _fail(invalid_operand(base, operator))
    integer = _integer(kind)
    if isinstance(total, int) and integer in ("TINYINT", "SMALLINT", "INT"):
        low, high = INTEGER_RANGES["INT"]
        if not low <= total <= high:
            _fail(overflow("INT"))
    return total


def _average(total: int | float | None, count: int, kind: str | None) -> int | float | None:
    """`ssb_average`: AVG from its SUM and COUNT: of integers an integer, the quotient cut
    toward zero (a kind not known: when the total is one), else a float."""
    total = _total(total, kind, "avg")
    if total is None or not count:
        return None
    integral = _integer(kind) is not None if kind is not None else isinstance(total, int)
    if integral and isinstance(total, int):
        quotient = abs(total) // count
        return quotient if total >= 0 else -quotient
    return total / count


def _replicate(text: str | None, times: int | None, room: int | None) -> str | None:
    """`ssb_replicate`: see `replicate`."""
    if text is None or times is None or times < 0:
        return None
    if room is not None:  # (counted first: the whole would not fit in memory)
        times = min(times, room // max(len(text), 1) + 1)
    elif len(text.encode()) * times > LONGEST:
        _fail(grown())
    return (text * times)[:room]


def grown() -> str:
    """SQL Server's words for a (MAX) value grown past what the store keeps (Msg 7119)."""
    return f"Attempting to grow LOB beyond maximum allowed size of {LONGEST} bytes."


def _unconverted(value: object, kind: str) -> bool:
    """`ssb_unconverted`: the text `value` went into an integer column of type `kind`."""
    _fail(conversion_failed(str(value), kind))
    return False


# the text of a whole number as SQL Server converts it: spaces around it, a sign, no
# digits at all being 0
_WHOLE: Final = re.compile(r" *([+-]?)([0-9]*) *")
WHOLE_TEXT: Final = "^ *[+-]?[0-9]* *$"  # the same, as PostgreSQL's store matches it


def _integer_of(
    value: int | float | str | bytes | None, kind: str, safe: int
) -> int | bytes | None:
    """`ssb_integer`: the whole number `value` is (text converted, a number cut toward
    zero), for a cast to the integer type `kind`; where it is no whole number or past
    the type's range, a failure in SQL Server's words, or NULL where the cast is `safe`
    (TRY_CAST, TRY_CONVERT); bytes or NULL as they are."""
    if value is None or isinstance(value, bytes):
        return value
    failed: str | None = None
    if isinstance(value, str):
        whole = _WHOLE.fullmatch(value)
        if whole is None:
            failed = conversion_failed(value, kind)
        else:
            number = int(whole[2] or 0)
            number = -number if whole[1] == "-" else number
    elif isinstance(value, float) and not math.isfinite(value):
        failed = overflow(kind)
    else:
        number = int(value)
    if failed is None and not INTEGER_RANGES[kind][0] <= number <= INTEGER_RANGES[kind][1]:
        source = "varchar" if isinstance(value, str) else type(value).__name__
        failed = unfit(str(value), kind, source)
    if failed is None:
        return number
    if not safe:
        _fail(failed)
    return None


def add_functions(db: sqlite3.Connection) -> None:
    """Register `aggregates`', `replicate`'s and `checks`' functions on a SQLite
    connection."""
    db.create_function(UNCONVERTED, 2, _unconverted, deterministic=True)
    db.create_function(INTEGER, 3, _integer_of, deterministic=True)
    db.create_function(REPLICATE, 3, _replicate, deterministic=True)
    db.create_function(KIND, 2, _kind_of, deterministic=True)
    db.create_function(TOTAL, 2, _total, deterministic=True)
    db.create_function(AVERAGE, 3, _average, deterministic=True)


def said(message: str) -> str:
    """A SQLite error's message, as SQL Server words it where one of ours failed."""
    raised: str | None = getattr(_failed, "message", None)
    _failed.message = None
    if raised is not None and _FUNCTION_FAILED in message:
        return raised
    if message == "integer overflow":  # (SQLite's SUM of integers, past 64 bits)
        return overflow("BIGINT")
    return checked(message)
