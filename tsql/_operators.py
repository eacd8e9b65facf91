"""T-SQL's operators on typed values: arithmetic, `+` on strings and binaries, and
comparison by data type precedence with the default collation's rules (case-insensitive,
trailing spaces ignored). Comparisons answer True, False or None (unknown, for NULL)."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal, DivisionByZero, InvalidOperation, localcontext
from typing import Any, Final

from . import _types as t
from ._errors import SqlError
from ._types import Value

_TEXT: Final = frozenset(("char", "nchar"))
_NUMBER: Final = frozenset(("int", "decimal", "float"))


def common_type(a: t.SqlType, b: t.SqlType) -> t.SqlType:
    """The type of higher precedence (the one both convert to)."""
    return a if t.PRECEDENCE[a.name] <= t.PRECEDENCE[b.name] else b


def sort_key(value: Value) -> Any:
    """What a value compares by: text as the default collation compares it."""
    data = value.data
    if isinstance(data, str):
        return data.rstrip(" ").lower()
    if isinstance(data, t.Xml):
        raise SqlError(
            305,
            "The XML data type cannot be compared or sorted, except when using the IS NULL"
            " operator.",
        )
    return data


def compare(op: str, a: Value, b: Value) -> bool | None:
    if a.data is None or b.data is None:
        return None
    if (
        a.type.family != b.type.family
        and not (a.type.family in _TEXT and b.type.family in _TEXT)
        and not (a.type.family in _NUMBER and b.type.family in _NUMBER)
    ):
        target = common_type(a.type, b.type)
        a, b = t.convert(a, target), t.convert(b, target)
    x, y = sort_key(a), sort_key(b)
    try:
        if op == "=":
            return bool(x == y)
        if op in ("<>", "!="):
            return bool(x != y)
        if op == "<":
            return bool(x < y)
        if op == ">":
            return bool(x > y)
        if op in ("<=", "!>"):
            return bool(x <= y)
        if op in (">=", "!<"):
            return bool(x >= y)
    except TypeError:
        raise SqlError(
            402,
            f"The data types {a.type.name.lower()} and {b.type.name.lower()} are incompatible"
            f" in the {op} operator.",
        ) from None
    raise AssertionError(op)


def arithmetic(op: str, a: Value, b: Value) -> Value:
    fa, fb = a.type.family, b.type.family
    if op == "+" and fa in _TEXT and fb in _TEXT:
        kind = t.NVARCHAR_MAX if "nchar" in (fa, fb) else t.VARCHAR_MAX
        if a.data is None or b.data is None:
            return Value(None, kind)
        left, right = str(a.data), str(b.data)
        if len(left) + len(right) > t.text_room(kind):
            raise t.lob_overflow()
        return Value(left + right, kind)
    if op == "+" and fa == "binary" and fb == "binary":
        if a.data is None or b.data is None:
            return Value(None, t.VARBINARY_MAX)
        assert isinstance(a.data, bytes) and isinstance(b.data, bytes)
        if len(a.data) + len(b.data) > t.MAX_BYTES:
            raise t.lob_overflow()
        return Value(a.data + b.data, t.VARBINARY_MAX)
    if fa in ("datetime", "date") and fb in _NUMBER | _TEXT and op in ("+", "-"):
        if a.data is None or b.data is None:
            return Value(None, a.type)
        days = t.convert(b, t.FLOAT).data
        assert isinstance(days, float)
        moment = a.data
        assert isinstance(moment, (dt.datetime, dt.date))
        try:
            delta = dt.timedelta(days=days if op == "+" else -days)
            return t.convert(Value(moment + delta, t.DATETIME2), a.type)
        except (OverflowError, SqlError):  # past year 9999, or the type's range
            raise SqlError(
                8115,
                f"Arithmetic overflow error converting expression to data type"
                f" {a.type.name.lower()}.",
            ) from None
    target = common_type(a.type, b.type)
    if target.family not in _NUMBER:
        if target.family in _TEXT | {"binary"}:
            target = t.BIGINT if target.family == "binary" else target
        if target.family not in _NUMBER:
            raise SqlError(
                8117,
                f"Operand data type {target.name.lower()} is invalid for {_OP_NAMES.get(op, op)}"
                " operator.",
            )
    if a.data is None or b.data is None:
        return Value(None, target)
    x = t.convert(a, target).data if a.type.family != target.family else a.data
    y = t.convert(b, target).data if b.type.family != target.family else b.data
    if (
        target.family == "decimal"
        and isinstance(x, (int, Decimal))
        and isinstance(y, (int, Decimal))
    ):
        x, y = Decimal(x), Decimal(y)
    try:
        with localcontext(t.DECIMALS):
            result = _apply(op, x, y, target)
    except (ZeroDivisionError, DivisionByZero, InvalidOperation):
        raise SqlError(8134, "Divide by zero error encountered.") from None
    if target.family == "int" and target.name != "BIT":
        low, high = (-(2**31), 2**31 - 1) if target.name != "BIGINT" else (-(2**63), 2**63 - 1)
        if target.name in ("TINYINT", "SMALLINT"):
            target = t.INT
        if not low <= int(result) <= high:
            raise SqlError(
                8115,
                f"Arithmetic overflow error converting expression to data type {target.name.lower()}.",
            )
    if isinstance(result, float) and not math.isfinite(result):
        raise SqlError(8115, "Arithmetic overflow error converting expression to data type float.")
    if target.name == "BIT":
        target = t.INT
    if target.family == "decimal":
        return Value(
            result,
            t.SqlType(
                "DECIMAL", None, 38, max(target.scale or 0, 6) if op == "/" else target.scale
            ),
        )
    return Value(result, target)


def _apply(op: str, x: Any, y: Any, target: t.SqlType) -> Any:
    integral = target.family == "int"
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if op == "/":
        if integral:
            if y == 0:
                raise ZeroDivisionError
            quotient = abs(x) // abs(y)
            return quotient if (x >= 0) == (y > 0) else -quotient
        if y == 0:
            raise ZeroDivisionError
        return x / y
    if op == "%":
        if y == 0:
            raise ZeroDivisionError
        remainder = abs(x) % abs(y)
        return remainder if x >= 0 else -remainder
    if op in ("&", "|", "^"):
        if not integral:
            raise SqlError(402, f"The data types are incompatible in the '{op}' operator.")
        return {"&": x & y, "|": x | y, "^": x ^ y}[op]
    raise AssertionError(op)


_OP_NAMES: Final = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "%": "modulo"}
