"""T-SQL's built-in scalar functions on typed values.

The same table serves the interpreter (expressions over variables) and the SQL engine
(registered as SQLite functions, so a query over the views computes LEN, SUBSTRING,
ISNULL, CAST ... with SQL Server's rules rather than SQLite's). Each entry takes the
evaluated arguments as `Value`s and returns a `Value`. Functions that need the session
(DB_NAME, ERROR_MESSAGE, OBJECT_ID ...) are the interpreter's and are not here.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import random
import uuid
from collections.abc import Callable
from decimal import Decimal
from importlib import metadata
from typing import Final

from . import _types as t
from ._errors import SqlError
from ._like import patindex
from ._types import Value

Function = Callable[..., Value]
_DATE: Final = t.SqlType("DATE")

_DATE_PARTS: Final = {
    "YEAR": "year",
    "YY": "year",
    "YYYY": "year",
    "QUARTER": "quarter",
    "QQ": "quarter",
    "Q": "quarter",
    "MONTH": "month",
    "MM": "month",
    "M": "month",
    "DAYOFYEAR": "dayofyear",
    "DY": "dayofyear",
    "Y": "dayofyear",
    "DAY": "day",
    "DD": "day",
    "D": "day",
    "WEEK": "week",
    "WK": "week",
    "WW": "week",
    "WEEKDAY": "weekday",
    "DW": "weekday",
    "HOUR": "hour",
    "HH": "hour",
    "MINUTE": "minute",
    "MI": "minute",
    "N": "minute",
    "SECOND": "second",
    "SS": "second",
    "S": "second",
    "MILLISECOND": "millisecond",
    "MS": "millisecond",
    "MICROSECOND": "microsecond",
    "MCS": "microsecond",
}


def _text(value: Value) -> str | None:
    if value.data is None:
        return None
    return t.to_text(value)


def _string_type(*values: Value) -> t.SqlType:
    """The type of a string function's result that is no longer than its argument: NVARCHAR
    if any argument is, (MAX) if any is (a function of a VARCHAR(8000) stays within 8000
    bytes, so that one of it after that is held to them too, as in SQL Server)."""
    return _result_type(values, any(t.is_lob(v.type) for v in values))


def _int(value: Value) -> int | None:
    if value.data is None:
        return None
    return t.as_int(value)


def _len(value: Value) -> Value:
    if value.data is None:
        return Value(None, t.INT)
    if isinstance(value.data, bytes):
        return Value(len(value.data), t.INT)
    return Value(len(t.to_text(value).rstrip(" ")), t.INT)


def _datalength(value: Value) -> Value:
    if value.data is None:
        return Value(None, t.INT)
    if value.type.family in ("char", "nchar", "binary", "xml"):
        if value.type.family == "char":
            return Value(len(t.encode_single_bytes(t.to_text(value))), t.INT)
        return Value(len(t.to_bytes(value)) - (2 if value.type.family == "xml" else 0), t.INT)
    return Value(len(t.to_bytes(value)) if value.type.family in ("int", "guid") else 8, t.INT)


def _substring(value: Value, start: Value, length: Value) -> Value:
    first, count = _int(start), _int(length)
    if value.data is None or first is None or count is None:
        return Value(None, value.type)
    if count < 0:
        raise SqlError(537, "Invalid length parameter passed to the substring function.")
    begin = max(first, 1)
    end = first + count
    if isinstance(value.data, bytes):
        return Value(value.data[begin - 1 : max(end - 1, 0)], value.type)
    text = t.to_text(value)
    return Value(text[begin - 1 : max(end - 1, 0)], _string_type(value))


def _end_of_text(name: str, take: Callable[[str, int], str]) -> Function:
    """LEFT or RIGHT: `take` cuts a count of characters from one end of the text."""

    def apply(value: Value, count: Value) -> Value:
        n = _int(count)
        if value.data is None or n is None:
            return Value(None, value.type)
        if n < 0:
            raise SqlError(536, f"Invalid length parameter passed to the {name} function.")
        return Value(take(t.to_text(value), n), _string_type(value))

    return apply


_left = _end_of_text("left", lambda text, n: text[:n])
_right = _end_of_text("right", lambda text, n: text[len(text) - n :] if n else "")


def _string_op(fn: Callable[[str], str]) -> Function:
    def apply(value: Value) -> Value:
        if value.data is None:
            return Value(None, _string_type(value))
        return Value(fn(t.to_text(value)), _string_type(value))

    return apply


def _result_type(values: tuple[Value, ...], lob: bool) -> t.SqlType:
    """A string function's result type: NVARCHAR if any argument is, (MAX) when `lob`
    (an argument that decides it is (MAX)), else at most 8000 bytes."""
    nchar = any(v.type.family == "nchar" for v in values)
    if lob:
        return t.NVARCHAR_MAX if nchar else t.VARCHAR_MAX
    return t.NVARCHAR if nchar else t.VARCHAR


def _too_long(length: int, kind: t.SqlType) -> int:
    """The room left for a result of `length` characters, measured before it is made (it
    may not fit in memory): Msg 7119 past (MAX)'s, else the 8000 bytes' worth it is cut to."""
    room = t.text_room(kind)
    if length > room and kind.length == t.MAX:
        raise t.lob_overflow()
    return min(length, room)


def _replace(value: Value, old: Value, new: Value) -> Value:
    # cut at 8000 bytes unless the string searched is (MAX), as SQL Server's REPLACE is
    kind = _result_type((value, old, new), t.is_lob(value.type))
    if value.data is None or old.data is None or new.data is None:
        return Value(None, kind)
    text, pattern, replacement = t.to_text(value), t.to_text(old), t.to_text(new)
    if not pattern:
        return t.fit_text(text, kind)
    # SQL Server's default collation compares without case
    lower, lowered = text.lower(), pattern.lower()
    found: list[int] = []
    i = 0
    while (at := lower.find(lowered, i)) >= 0:
        found.append(at)
        i = at + len(pattern)
    room = _too_long(len(text) + len(found) * (len(replacement) - len(pattern)), kind)
    out: list[str] = []
    i = made = 0
    for at in found:
        if made >= room:
            break
        out += (text[i:at], replacement)
        made += at - i + len(replacement)
        i = at + len(pattern)
    out.append(text[i : i + max(room - made, 0)])
    return Value("".join(out)[:room], kind)


def _charindex(needle: Value, haystack: Value, start: Value | None = None) -> Value:
    if needle.data is None or haystack.data is None:
        return Value(None, t.INT)
    begin = max((_int(start) or 1) if start is not None else 1, 1)
    found = t.to_text(haystack).lower().find(t.to_text(needle).lower(), begin - 1)
    return Value(found + 1, t.INT)


def _replicate(value: Value, count: Value) -> Value:
    n = _int(count)
    if value.data is None or n is None or n < 0:
        return Value(None, _string_type(value))
    text = t.to_text(value)
    room = t.text_room(value.type)
    if len(text) * n > room:  # computed before the text is made: it may not fit in memory
        if value.type.length == t.MAX:
            raise t.lob_overflow()
        n = -(-room // len(text))  # cut at 8000 bytes, as SQL Server cuts a value not (MAX)
    return Value((text * n)[:room], _string_type(value))


def _space(count: Value) -> Value:
    n = _int(count)
    room = t.text_room(t.VARCHAR)  # SPACE's type is VARCHAR: 8000 spaces at most
    return Value(None if n is None or n < 0 else " " * min(n, room), t.VARCHAR)


def _stuff(value: Value, start: Value, length: Value, insert: Value) -> Value:
    kind = _result_type((value, insert), t.is_lob(value.type) or t.is_lob(insert.type))
    first, count = _int(start), _int(length)
    if value.data is None or first is None or count is None:
        return Value(None, kind)
    text = t.to_text(value)
    if first < 1 or first > len(text) or count < 0:
        return Value(None, kind)
    middle = "" if insert.data is None else t.to_text(insert)
    rest = text[first - 1 + count :]
    room = _too_long(first - 1 + len(middle) + len(rest), kind)
    return Value((text[: first - 1] + middle[:room] + rest[:room])[:room], kind)


def _joined(glue: str, parts: list[str], kind: t.SqlType) -> Value:
    """CONCAT's and CONCAT_WS's result: `parts` joined, within the room of `kind`."""
    length = sum(map(len, parts)) + len(glue) * max(len(parts) - 1, 0)
    room = _too_long(length, kind)
    if length <= room:
        return Value(glue.join(parts), kind)
    out: list[str] = []
    made = 0
    for n, part in enumerate(parts):
        piece = (glue if n else "") + part
        out.append(piece[: room - made])
        made += len(out[-1])
        if made >= room:
            break
    return Value("".join(out), kind)


def _concat(*values: Value) -> Value:
    # cut at 8000 bytes unless an argument is (MAX), as SQL Server's CONCAT is
    kind = _result_type(values, any(t.is_lob(v.type) for v in values))
    return _joined("", [t.to_text(v) for v in values if v.data is not None], kind)


def _concat_ws(separator: Value, *values: Value) -> Value:
    kind = _result_type((separator, *values), any(t.is_lob(v.type) for v in (separator, *values)))
    glue = "" if separator.data is None else t.to_text(separator)
    return _joined(glue, [t.to_text(v) for v in values if v.data is not None], kind)


def _quotename(value: Value, quote: Value | None = None) -> Value:
    if value.data is None:
        return Value(None, t.NVARCHAR)
    mark = "[" if quote is None or quote.data is None else t.to_text(quote)
    close = {
        "[": "]",
        "]": "]",
        '"': '"',
        "'": "'",
        "(": ")",
        ")": ")",
        "<": ">",
        ">": ">",
        "{": "}",
        "}": "}",
        "`": "`",
    }.get(mark)
    if close is None:
        return Value(None, t.NVARCHAR)
    opening = {"]": "[", ")": "(", ">": "<", "}": "{"}.get(mark, mark)
    return Value(opening + t.to_text(value).replace(close, close * 2) + close, t.NVARCHAR)


def _char(code: Value) -> Value:
    n = _int(code)
    return Value(
        None if n is None or not 0 <= n <= 255 else bytes((n,)).decode("cp1252", "replace"),
        t.SqlType("CHAR", 1),
    )


def _nchar(code: Value) -> Value:
    n = _int(code)
    return Value(None if n is None or not 0 <= n <= 0x10FFFF else chr(n), t.SqlType("NCHAR", 1))


def _ascii(value: Value) -> Value:
    text = _text(value)
    return Value(None if not text else t.encode_single_bytes(text[0])[0], t.INT)


def _unicode(value: Value) -> Value:
    text = _text(value)
    return Value(None if not text else ord(text[0]), t.INT)


def _coalesce(*values: Value) -> Value:
    for value in values:
        if value.data is not None:
            return value
    return values[-1] if values else t.NULL


def _isnull(value: Value, replacement: Value) -> Value:
    if value.data is not None:
        return value
    return (
        t.assign(replacement, value.type)
        if value.type != t.INT or replacement.data is None
        else replacement
    )


def _nullif(a: Value, b: Value) -> Value:
    from ._operators import compare

    return Value(None, a.type) if compare("=", a, b) else a


def _iif(condition: Value, yes: Value, no: Value) -> Value:
    return yes if condition.data else no


def _number(value: Value) -> Value:
    """A math function's argument: a number as it is, anything else converted to FLOAT, as
    SQL Server converts it (Msg 8114 for text that is not a number)."""
    if value.type.family in ("int", "decimal", "float"):
        return value
    return t.convert(value, t.FLOAT)


def _float_result(number: float) -> Value:
    if not math.isfinite(number):
        raise SqlError(3623, "An invalid floating point operation occurred.")
    return Value(number, t.FLOAT)


def _in_range(number: int | Decimal, kind: t.SqlType) -> Value:
    """An integer function's result in its argument's type, or SQL Server's overflow."""
    if isinstance(number, int) and kind.name != "BIT":
        try:
            t.convert(Value(number, t.DECIMAL), kind)
        except SqlError:
            raise SqlError(
                8115,
                f"Arithmetic overflow error converting expression to data type"
                f" {kind.name.lower()}.",
            ) from None
    return Value(number, kind)


def _numeric(fn: Callable[[float], float], integral: bool = False) -> Function:
    def apply(value: Value) -> Value:
        if value.data is None:
            return value
        value = _number(value)
        data = value.data
        if isinstance(data, (int, Decimal)) and integral:
            return Value(type(data)(fn(data)), value.type)  # type: ignore[arg-type]
        try:
            return _float_result(float(fn(float(data))))  # type: ignore[arg-type]
        except OverflowError:
            raise SqlError(3623, "An invalid floating point operation occurred.") from None

    return apply


def _abs(value: Value) -> Value:
    if value.data is None:
        return value
    value = _number(value)
    return _in_range(abs(value.data), value.type)  # type: ignore[arg-type]


def _sign(value: Value) -> Value:
    if value.data is None:
        return value
    value = _number(value)
    data = value.data
    return Value(type(data)((data > 0) - (data < 0)), value.type)  # type: ignore[operator, call-arg]


_DIGITS: Final = 38  # DECIMAL's most


def _round(value: Value, length: Value, function: Value | None = None) -> Value:
    digits = _int(length)
    if value.data is None or digits is None:
        return value
    value = _number(value)
    data = value.data
    if isinstance(data, float):
        return Value(round(data, digits), value.type)
    number = Decimal(data)  # type: ignore[arg-type]
    truncate = function is not None and _int(function)
    # to more places than the number has, or past DECIMAL's 38 digits, nothing changes
    places = max(0, -number.as_tuple().exponent)  # type: ignore[operator]
    quantum = Decimal(1).scaleb(-max(-_DIGITS, min(digits, places)))
    rounded = number.quantize(
        quantum, rounding="ROUND_DOWN" if truncate else "ROUND_HALF_UP", context=t.DECIMALS
    )
    if isinstance(data, int):
        return Value(int(rounded), value.type)
    scale = Decimal(1).scaleb(-(value.type.scale or 0))
    return Value(rounded.quantize(scale, context=t.DECIMALS), value.type)


def _power(value: Value, exponent: Value) -> Value:
    if value.data is None or exponent.data is None:
        return Value(None, value.type)
    value, exponent = _number(value), _number(exponent)
    try:
        result = float(value.data) ** float(exponent.data)  # type: ignore[arg-type]
    except OverflowError:
        result = math.inf
    except ZeroDivisionError:  # 0 to a negative power
        raise SqlError(3623, "An invalid floating point operation occurred.") from None
    if isinstance(value.data, int) and math.isfinite(result):
        return _in_range(int(result), value.type)
    if not math.isfinite(result):
        kind = value.type if isinstance(value.data, int) else t.FLOAT
        raise SqlError(
            8115,
            f"Arithmetic overflow error converting expression to data type {kind.name.lower()}.",
        )
    return Value(result, t.FLOAT)


def _sqrt(value: Value) -> Value:
    if value.data is None:
        return Value(None, t.FLOAT)
    number = float(_number(value).data)  # type: ignore[arg-type]
    if number < 0:
        raise SqlError(3623, "An invalid floating point operation occurred.")
    return Value(math.sqrt(number), t.FLOAT)


def _newid() -> Value:
    return Value(uuid.uuid4(), t.GUID)


def _getdate() -> Value:
    return Value(t.round_datetime(dt.datetime.now()), t.DATETIME)


def _getutcdate() -> Value:
    return Value(t.round_datetime(dt.datetime.now(dt.UTC).replace(tzinfo=None)), t.DATETIME)


def _sysdatetime() -> Value:
    return Value(dt.datetime.now(), t.DATETIME2)


def _sysutcdatetime() -> Value:
    return Value(dt.datetime.now(dt.UTC).replace(tzinfo=None), t.DATETIME2)


def _part(name: Value) -> str:
    part = _DATE_PARTS.get(t.to_text(name).upper()) if name.data is not None else None
    if part is None:
        raise SqlError(155, f"'{name.data}' is not a recognized datepart option.")
    return part


def _moment(value: Value) -> dt.datetime | None:
    if value.data is None:
        return None
    if value.type.family in ("int", "decimal", "float"):  # days since 1900-01-01
        value = t.convert(value, t.DATETIME)  # (DATEDIFF(day, 0, @d))
    converted = t.convert(value, t.DATETIME2).data
    assert isinstance(converted, dt.datetime)
    return converted


# the length of a date part of a fixed length (DATEADD, DATEDIFF), in seconds
_SECONDS_IN: Final[dict[str, float]] = {
    "dayofyear": 86400,
    "day": 86400,
    "weekday": 86400,
    "week": 604800,
    "hour": 3600,
    "minute": 60,
    "second": 1,
    "millisecond": 0.001,
    "microsecond": 0.000001,
}


def _dateadd(part: Value, number: Value, date: Value) -> Value:
    unit, n, moment = _part(part), _int(number), _moment(date)
    kind = date.type if date.type.family in ("datetime", "date") else t.DATETIME
    if n is None or moment is None:
        return Value(None, kind)
    try:
        if unit in ("year", "quarter", "month"):
            months = n * {"year": 12, "quarter": 3, "month": 1}[unit]
            total = moment.year * 12 + moment.month - 1 + months
            year, month = divmod(total, 12)
            day = min(moment.day, _days_in(year, month + 1))
            result = moment.replace(year=year, month=month + 1, day=day)
        else:
            result = moment + dt.timedelta(seconds=n * _SECONDS_IN[unit])
        return t.convert(Value(result, t.DATETIME2), kind)
    except (ValueError, OverflowError, SqlError):  # past year 9999, or the type's range
        raise _date_overflow(kind) from None


def _date_overflow(kind: t.SqlType) -> SqlError:
    return SqlError(517, f"Adding a value to a '{kind.name.lower()}' column caused an overflow.")


def _days_in(year: int, month: int) -> int:
    following = dt.date(year + (month == 12), month % 12 + 1, 1)
    return (following - dt.timedelta(days=1)).day


def _datediff(part: Value, start: Value, end: Value) -> Value:
    unit, a, b = _part(part), _moment(start), _moment(end)
    if a is None or b is None:
        return Value(None, t.INT)
    if unit == "year":
        result = b.year - a.year
    elif unit == "quarter":
        result = (b.year - a.year) * 4 + (b.month - 1) // 3 - (a.month - 1) // 3
    elif unit == "month":
        result = (b.year - a.year) * 12 + b.month - a.month
    elif unit in ("day", "dayofyear", "weekday"):
        result = (b.date() - a.date()).days
    elif unit == "week":
        result = ((b.date() - a.date()).days + (a.isoweekday() % 7) - (b.isoweekday() % 7)) // 7
    else:
        size = _SECONDS_IN[unit]
        floor_a = math.floor(a.timestamp() / size) if unit != "microsecond" else a.timestamp() * 1e6
        floor_b = math.floor(b.timestamp() / size) if unit != "microsecond" else b.timestamp() * 1e6
        result = int(floor_b - floor_a)
    if not -(2**31) <= result < 2**31:
        raise SqlError(
            535,
            "The datediff function resulted in an overflow. The number of dateparts separating"
            " two date/time instances is too large. Try to use datediff with a less precise"
            " datepart.",
        )
    return Value(result, t.INT)


def _datepart(part: Value, date: Value) -> Value:
    unit, moment = _part(part), _moment(date)
    if moment is None:
        return Value(None, t.INT)
    values = {
        "year": moment.year,
        "quarter": (moment.month - 1) // 3 + 1,
        "month": moment.month,
        "dayofyear": moment.timetuple().tm_yday,
        "day": moment.day,
        "week": int(moment.strftime("%U")) + 1,
        "weekday": moment.isoweekday() % 7 + 1,
        "hour": moment.hour,
        "minute": moment.minute,
        "second": moment.second,
        "millisecond": moment.microsecond // 1000,
        "microsecond": moment.microsecond,
    }
    return Value(values[unit], t.INT)


def _datename(part: Value, date: Value) -> Value:
    unit, moment = _part(part), _moment(date)
    if moment is None:
        return Value(None, t.NVARCHAR)
    if unit == "month":
        return Value(moment.strftime("%B"), t.NVARCHAR)
    if unit == "weekday":
        return Value(moment.strftime("%A"), t.NVARCHAR)
    return Value(str(_datepart(part, date).data), t.NVARCHAR)


def _date_field(unit: str) -> Function:
    def apply(date: Value) -> Value:
        return _datepart(Value(unit, t.VARCHAR), date)

    return apply


def _isnumeric(value: Value) -> Value:
    if value.data is None:
        return Value(0, t.INT)
    if value.type.family in ("int", "decimal", "float"):
        return Value(1, t.INT)
    text = t.to_text(value).strip()
    if text in _NUMERIC_ALONE:
        return Value(1, t.INT)
    body = text.removeprefix("$").replace(",", "")
    return Value(1 if body and t.is_number_text(body) else 0, t.INT)


# what ISNUMERIC counts as numeric on its own, as SQL Server documents (signs, currency)
_NUMERIC_ALONE: Final = frozenset(("+", "-", "$", "."))


def _hashbytes(algorithm: Value, data: Value) -> Value:
    if algorithm.data is None or data.data is None:
        return Value(None, t.VARBINARY_MAX)
    name = {
        "MD2": None,
        "MD4": None,
        "MD5": "md5",
        "SHA": "sha1",
        "SHA1": "sha1",
        "SHA2_256": "sha256",
        "SHA2_512": "sha512",
    }.get(t.to_text(algorithm).upper())
    if name is None:
        raise SqlError(8142, f"Invalid algorithm '{algorithm.data}' for HASHBYTES.")
    return Value(hashlib.new(name, t.to_bytes(data)).digest(), t.SqlType("VARBINARY", 8000))


def _choose(index: Value, *values: Value) -> Value:
    n = _int(index)
    if n is None or not 1 <= n <= len(values):
        return Value(None, values[0].type if values else t.INT)
    return values[n - 1]


def _patindex(pattern: Value, value: Value) -> Value:
    if pattern.data is None or value.data is None:
        return Value(None, t.INT)
    return Value(patindex(t.to_text(pattern), t.to_text(value)), t.INT)


def _str(value: Value, length: Value | None = None, decimals: Value | None = None) -> Value:
    if value.data is None:
        return Value(None, t.VARCHAR)
    value = _number(value)
    width = 10 if length is None else _int(length) or 0
    places = 0 if decimals is None else min(max(_int(decimals) or 0, 0), 16)
    if not 1 <= width <= 8000:
        return Value(None, t.VARCHAR)
    text = f"{float(value.data):.{places}f}"  # type: ignore[arg-type]
    if len(text) > width:  # the decimals give way first, then it does not fit
        text = f"{float(value.data):.{max(0, places - (len(text) - width))}f}"  # type: ignore[arg-type]
    return Value(text.rjust(width) if len(text) <= width else "*" * width, t.VARCHAR)


def _rand(seed: Value | None = None) -> Value:
    source = random.Random(_int(seed)) if seed is not None and seed.data is not None else random
    return Value(source.random(), t.FLOAT)


def _log(value: Value, base: Value | None = None) -> Value:
    if value.data is None or (base is not None and base.data is None):
        return Value(None, t.FLOAT)
    number = float(_number(value).data)  # type: ignore[arg-type]
    radix = None if base is None else float(_number(base).data)  # type: ignore[arg-type]
    if number <= 0 or (radix is not None and (radix <= 0 or radix == 1)):
        raise SqlError(3623, "An invalid floating point operation occurred.")
    return Value(math.log(number) if radix is None else math.log(number, radix), t.FLOAT)


def _log10(value: Value) -> Value:
    result = _log(value)
    if result.data is None:
        return result
    return Value(math.log10(float(_number(value).data)), t.FLOAT)  # type: ignore[arg-type]


def _datefromparts(year: Value, month: Value, day: Value) -> Value:
    parts = [_int(year), _int(month), _int(day)]
    if None in parts:
        return Value(None, _DATE)
    try:
        return Value(dt.date(*parts), _DATE)  # type: ignore[arg-type]
    except ValueError:
        raise SqlError(
            289,
            "Cannot construct data type date, some of the arguments have values which are not valid.",
        ) from None


def _eomonth(date: Value, months: Value | None = None) -> Value:
    moment = _moment(date)
    if moment is None:
        return Value(None, _DATE)
    shift = 0 if months is None else _int(months) or 0
    index = moment.year * 12 + moment.month - 1 + shift
    year, month = divmod(index, 12)
    try:
        following = dt.date(year + (month + 1) // 12, (month + 1) % 12 + 1, 1)
        return Value(following - dt.timedelta(days=1), _DATE)
    except (ValueError, OverflowError):
        raise _date_overflow(_DATE) from None


def _version() -> str:
    try:
        return metadata.version("ssb-broker")
    except metadata.PackageNotFoundError:
        return "unknown"


def _serverproperty(name: Value) -> Value:
    """What ssb can say of itself; NULL for what SQL Server knows and ssb has not, as
    SQL Server answers a property it does not know."""
    known = {
        "PRODUCTVERSION": _version(),
        "PRODUCTLEVEL": "RTM",
        "EDITION": "ssb",
        "SERVERNAME": "ssb",
        "MACHINENAME": "ssb",
        "COLLATION": "SQL_Latin1_General_CP1_CI_AS",
    }.get(t.to_text(name).upper() if name.data is not None else "")
    return Value(known, t.SqlType("NVARCHAR", 128))


SCALARS: Final[dict[str, Function]] = {
    "LEN": _len,
    "DATALENGTH": _datalength,
    "SUBSTRING": _substring,
    "LEFT": _left,
    "RIGHT": _right,
    "UPPER": _string_op(str.upper),
    "LOWER": _string_op(str.lower),
    "LTRIM": _string_op(lambda s: s.lstrip(" ")),
    "RTRIM": _string_op(lambda s: s.rstrip(" ")),
    "TRIM": _string_op(lambda s: s.strip(" ")),
    "REVERSE": _string_op(lambda s: s[::-1]),
    "REPLACE": _replace,
    "CHARINDEX": _charindex,
    "REPLICATE": _replicate,
    "SPACE": _space,
    "STUFF": _stuff,
    "CONCAT": _concat,
    "CONCAT_WS": _concat_ws,
    "QUOTENAME": _quotename,
    "CHAR": _char,
    "NCHAR": _nchar,
    "ASCII": _ascii,
    "UNICODE": _unicode,
    "ISNULL": _isnull,
    "COALESCE": _coalesce,
    "NULLIF": _nullif,
    "IIF": _iif,
    "ABS": _abs,
    "SIGN": _sign,
    "CEILING": _numeric(math.ceil, integral=True),
    "FLOOR": _numeric(math.floor, integral=True),
    "ROUND": _round,
    "POWER": _power,
    "SQRT": _sqrt,
    "NEWID": _newid,
    "GETDATE": _getdate,
    "CURRENT_TIMESTAMP": _getdate,
    "GETUTCDATE": _getutcdate,
    "SYSDATETIME": _sysdatetime,
    "SYSUTCDATETIME": _sysutcdatetime,
    "DATEADD": _dateadd,
    "DATEDIFF": _datediff,
    "DATEPART": _datepart,
    "DATENAME": _datename,
    "YEAR": _date_field("year"),
    "MONTH": _date_field("month"),
    "DAY": _date_field("day"),
    "ISNUMERIC": _isnumeric,
    "HASHBYTES": _hashbytes,
    "CHOOSE": _choose,
    "PATINDEX": _patindex,
    "STR": _str,
    "RAND": _rand,
    "PI": lambda: Value(math.pi, t.FLOAT),
    "EXP": _numeric(math.exp),
    "LOG": _log,
    "LOG10": _log10,
    "SQUARE": _numeric(lambda x: x * x),
    "DATEFROMPARTS": _datefromparts,
    "EOMONTH": _eomonth,
    "SERVERPROPERTY": _serverproperty,
}
# functions whose first argument is a date part written as a bare word (DATEADD(day, ...))
DATE_PART_FUNCTIONS: Final = frozenset(("DATEADD", "DATEDIFF", "DATEPART", "DATENAME"))
