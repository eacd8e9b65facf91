"""T-SQL's operators on typed values: arithmetic, `+` on strings and binaries, and
comparison by data type precedence with the default collation's rules (case-insensitive,
trailing spaces ignored). Comparisons answer True, False or None (unknown, for NULL)."""

from __future__ import annotations

import datetime as dt
import math
from decimal import (
    ROUND_DOWN,
    ROUND_HALF_UP,
    Context,
    Decimal,
    DivisionByZero,
    InvalidOperation,
    localcontext,
)
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
        # cut at 8000 bytes, silently, unless an operand is (MAX), as SQL Server's + is
        kind = t.concatenated(a.type, b.type)
        lob = t.is_lob(kind)
        if a.data is None or b.data is None:
            return Value(None, kind)
        left, right = str(a.data), str(b.data)
        room = t.text_room(kind)
        if len(left) + len(right) > room:
            if lob:
                raise t.lob_overflow()
            return Value((left + right[:room])[:room], kind)
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
    if target.name in ("DECIMAL", "NUMERIC"):
        return _decimal(op, a, b, target)
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
    if target.family == "decimal":  # MONEY: four places, and its range
        try:
            return t.convert(Value(result, t.SqlType("DECIMAL", None, _DIGITS + 4, 4)), target)
        except SqlError:
            raise SqlError(
                8115,
                f"Arithmetic overflow error converting expression to data type"
                f" {target.name.lower()}.",
            ) from None
    return Value(result, target)


_MONEY: Final = frozenset(("MONEY", "SMALLMONEY"))
# the precision and scale of what meets a DECIMAL in arithmetic
_SHAPES: Final = {
    "BIT": (1, 0),
    "TINYINT": (3, 0),
    "SMALLINT": (5, 0),
    "INT": (10, 0),
    "BIGINT": (19, 0),
    "MONEY": (19, 4),
    "SMALLMONEY": (10, 4),
}
_WIDE: Final = Context(prec=100)  # exact for any two DECIMALs' sum, product or remainder


def _shape(kind: t.SqlType) -> tuple[int, int]:
    if kind.name in ("DECIMAL", "NUMERIC"):
        return kind.precision or 18, kind.scale or 0
    return _SHAPES[kind.name]


def decimal_type(op: str, first: t.SqlType, second: t.SqlType) -> t.SqlType:
    """The DECIMAL an operator gives of two operands, by SQL Server's rules: its precision
    and scale from theirs, at most 38 digits, the scale given up first (down to 6 for `*`
    and `/` when the integral part needs it)."""
    (p1, s1), (p2, s2) = _shape(first), _shape(second)
    if op in ("+", "-"):
        scale = max(s1, s2)
        integral = max(p1 - s1, p2 - s2) + 1
        precision = scale + integral
        if precision > _DIGITS:
            precision, scale = _DIGITS, max(_DIGITS - integral, 0)
    elif op == "%":
        scale = max(s1, s2)
        precision = min(p1 - s1, p2 - s2) + scale
    else:
        if op == "*":
            precision, scale = p1 + p2 + 1, s1 + s2
        else:
            scale = max(6, s1 + p2 + 1)
            precision = p1 - s1 + s2 + scale
        integral = precision - scale
        if precision > _DIGITS:
            precision = _DIGITS
            scale = min(scale, _DIGITS - integral) if integral < 32 else min(scale, 6)
    return t.SqlType("DECIMAL", None, precision, scale)


_DIGITS: Final = 38


def _decimal(op: str, a: Value, b: Value, target: t.SqlType) -> Value:
    """`a op b` where the result is a DECIMAL (SQL Server's precision and scale): exact, then
    rounded to the result's scale (a quotient cut, as SQL Server cuts it)."""
    if op in ("&", "|", "^"):
        raise SqlError(402, f"The data types are incompatible in the '{op}' operator.")
    operands = []
    for value in (a, b):
        if value.type.family not in ("int", "decimal"):  # text: as the DECIMAL it meets
            value = t.convert(value, a.type if value is b else b.type)
        operands.append(value)
    kind = decimal_type(op, operands[0].type, operands[1].type)
    if a.data is None or b.data is None:
        return Value(None, kind)
    x, y = (Decimal(v.data) for v in operands)  # type: ignore[arg-type]
    try:
        with localcontext(_WIDE):
            exact = _apply(op, x, y, kind)
    except (ZeroDivisionError, DivisionByZero, InvalidOperation):
        raise SqlError(8134, "Divide by zero error encountered.") from None
    result = exact.quantize(
        Decimal(1).scaleb(-(kind.scale or 0)),
        rounding=ROUND_DOWN if op == "/" else ROUND_HALF_UP,
        context=_WIDE,
    )
    if result and result.adjusted() >= (kind.precision or 0) - (kind.scale or 0):
        raise SqlError(
            8115, "Arithmetic overflow error converting expression to data type numeric."
        )
    return Value(result, kind)


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
