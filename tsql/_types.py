"""SQL Server's data types, typed values and the conversions between them.

Theory of operation. A `Value` is Python data with its SQL type: int for the integer
types and BIT, Decimal for DECIMAL/NUMERIC/MONEY, float for FLOAT/REAL, str for the
character types, bytes for the binary types, uuid.UUID, datetime/date/time, and `Xml`
for XML. NULL is data None of any type. `convert` follows SQL Server's rules for the
conversions scripts make, explicit (CAST, CONVERT) and implicit (assignment, SET,
comparison by data type precedence):

- NVARCHAR <-> VARBINARY reinterprets the bytes as UTF-16LE, as SQL Server stores
  NVARCHAR; VARCHAR <-> VARBINARY uses single bytes (code page 1252, the default
  collation's). So a message body sent from an NVARCHAR travels as UTF-16LE.
- XML -> VARBINARY is the document in UTF-16LE with a byte-order mark, as SQL Server
  serialises it; VARBINARY -> XML detects the encoding as SQL Server's XML parser does
  (byte-order mark, UTF-16 without one, an encoding declaration, else UTF-8).
- UNIQUEIDENTIFIER <-> BINARY(16) uses SQL Server's byte order (the first three groups
  little-endian); as text it is upper case.
- Character data assigned to a variable is cut to the variable's length, silently, as
  SQL Server does; a failed conversion raises SQL Server's error (245, 8169, 241, 9400...).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation
from typing import Final

from ._errors import NotSupported, SqlError
from ._xml import Xml as Xml
from ._xml import parse_xml

MAX: Final = -1  # the length of (MAX) types
MAX_BYTES: Final = 2**31 - 1  # what a (MAX) value holds at most, as in SQL Server
_ROW_BYTES: Final = 8000  # what a character or binary value of a declared length holds
# DECIMAL's arithmetic: its 38 digits (Python's default context keeps 28)
DECIMALS: Final = Context(prec=38)


@dataclass(frozen=True, slots=True)
class SqlType:
    name: str  # upper case, e.g. NVARCHAR
    length: int | None = None  # characters or bytes; MAX; None where none applies
    precision: int | None = None
    scale: int | None = None

    def __str__(self) -> str:
        if self.name in SIZED:
            size = "max" if self.length == MAX else str(self.length)
            return f"{self.name.lower()}({size})"
        if self.name in ("DECIMAL", "NUMERIC") and self.precision is not None:
            return f"{self.name.lower()}({self.precision},{self.scale or 0})"
        return self.name.lower()

    @property
    def family(self) -> str:
        return FAMILIES[self.name]


@dataclass(frozen=True, slots=True)
class Value:
    data: object
    type: SqlType

    @property
    def is_null(self) -> bool:
        return self.data is None


FAMILIES: Final = {
    **dict.fromkeys(("BIT", "TINYINT", "SMALLINT", "INT", "BIGINT"), "int"),
    **dict.fromkeys(("DECIMAL", "NUMERIC", "MONEY", "SMALLMONEY"), "decimal"),
    **dict.fromkeys(("FLOAT", "REAL"), "float"),
    **dict.fromkeys(("VARCHAR", "CHAR", "TEXT"), "char"),
    **dict.fromkeys(("NVARCHAR", "NCHAR", "NTEXT", "SYSNAME"), "nchar"),
    **dict.fromkeys(("VARBINARY", "BINARY", "IMAGE", "ROWVERSION", "TIMESTAMP"), "binary"),
    "UNIQUEIDENTIFIER": "guid",
    **dict.fromkeys(("DATETIME", "DATETIME2", "SMALLDATETIME", "DATETIMEOFFSET"), "datetime"),
    "DATE": "date",
    "TIME": "time",
    "XML": "xml",
    "SQL_VARIANT": "variant",
}
SIZED: Final = frozenset(("VARCHAR", "CHAR", "NVARCHAR", "NCHAR", "VARBINARY", "BINARY"))
# data type precedence: the lower a type's rank, the higher its precedence
PRECEDENCE: Final = {
    name: rank
    for rank, name in enumerate(
        [
            "SQL_VARIANT",
            "XML",
            "DATETIMEOFFSET",
            "DATETIME2",
            "DATETIME",
            "SMALLDATETIME",
            "DATE",
            "TIME",
            "FLOAT",
            "REAL",
            "DECIMAL",
            "NUMERIC",
            "MONEY",
            "SMALLMONEY",
            "BIGINT",
            "INT",
            "SMALLINT",
            "TINYINT",
            "BIT",
            "NTEXT",
            "TEXT",
            "IMAGE",
            "TIMESTAMP",
            "ROWVERSION",
            "UNIQUEIDENTIFIER",
            "NVARCHAR",
            "SYSNAME",
            "NCHAR",
            "VARCHAR",
            "CHAR",
            "VARBINARY",
            "BINARY",
        ]
    )
}
INT_RANGES: Final = {
    "BIT": (0, 1),
    "TINYINT": (0, 255),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INT": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
}
_INT_BYTES: Final = {"TINYINT": 1, "SMALLINT": 2, "INT": 4, "BIGINT": 8, "BIT": 1}

INT: Final = SqlType("INT")
BIGINT: Final = SqlType("BIGINT")
BIT: Final = SqlType("BIT")
FLOAT: Final = SqlType("FLOAT")
DECIMAL: Final = SqlType("DECIMAL", precision=38, scale=10)
NVARCHAR: Final = SqlType("NVARCHAR", 4000)
NVARCHAR_MAX: Final = SqlType("NVARCHAR", MAX)
VARCHAR: Final = SqlType("VARCHAR", 8000)
VARCHAR_MAX: Final = SqlType("VARCHAR", MAX)
VARBINARY_MAX: Final = SqlType("VARBINARY", MAX)
SYSNAME: Final = SqlType("NVARCHAR", 128)
GUID: Final = SqlType("UNIQUEIDENTIFIER")
DATETIME: Final = SqlType("DATETIME")
DATETIME2: Final = SqlType("DATETIME2", precision=7)
XML: Final = SqlType("XML")
NULL: Final = Value(None, INT)  # an untyped NULL is an INT NULL, as in SQL Server
TRUE: Final = Value(1, BIT)
FALSE: Final = Value(0, BIT)


def make_type(name: str, args: tuple[int, ...] = (), *, declared: bool = True) -> SqlType:
    """The type a name and its arguments give; a sized type without a size is 1 long in a
    declaration and 30 in CAST/CONVERT, as in SQL Server.

    Raises:
        SqlError: Msg 2715 for a type SQL Server does not have.
    """
    upper = name.upper()
    if upper == "SYSNAME":
        return SYSNAME
    if upper in ("INTEGER",):
        upper = "INT"
    if upper in ("DOUBLE",):
        upper = "FLOAT"
    if upper not in FAMILIES:
        raise SqlError(2715, f"Column, parameter, or variable #1: Cannot find data type {name}.")
    if upper in SIZED:
        length = args[0] if args else (1 if declared else 30)
        limit = 4000 if upper in ("NVARCHAR", "NCHAR") else 8000
        if length != MAX and not 1 <= length <= limit:
            raise SqlError(
                131,
                f"The size ({length}) given to the type '{name.lower()}' exceeds the maximum"
                f" allowed for any data type ({limit}).",
            )
        return SqlType(upper, length)
    if upper in ("DECIMAL", "NUMERIC"):
        precision = args[0] if args else 18
        scale = args[1] if len(args) > 1 else 0
        return SqlType(upper, None, precision, scale)
    if upper in ("DATETIME2", "TIME", "DATETIMEOFFSET"):
        return SqlType(upper, None, args[0] if args else 7)
    if upper in _MONEY_RANGES:  # four decimal places, as SQL Server keeps them
        return SqlType(upper, None, 19 if upper == "MONEY" else 10, 4)
    return SqlType(upper)


_TYPE_NAME: Final = re.compile(
    r"^\s*\[?([A-Za-z_][A-Za-z0-9_]*)\]?\s*(?:\(\s*(max|\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*$",
    re.IGNORECASE,
)


def parse_type_name(text: str) -> SqlType:
    """A type written as text, as `.value(path, 'nvarchar(100)')` names it."""
    m = _TYPE_NAME.match(text)
    if m is None:
        raise SqlError(2715, f"Column, parameter, or variable #1: Cannot find data type {text}.")
    args: tuple[int, ...] = ()
    if m.group(2):
        args = (MAX if m.group(2).upper() == "MAX" else int(m.group(2)),)
        if m.group(3):
            args += (int(m.group(3)),)
    return make_type(m.group(1), args, declared=False)


# ---- conversions ---------------------------------------------------------------------


def convert(value: Value, target: SqlType, style: int | None = None) -> Value:
    """`value` as `target`, by SQL Server's rules for CAST / CONVERT.

    Raises:
        SqlError: the conversion SQL Server refuses, with its number and text.
    """
    if style is not None:
        _check_style(value.type, target, style)
    if value.data is None:
        return Value(None, target)
    source = value.type
    if source == target:
        return value
    family = FAMILIES[target.name]
    data = value.data
    if family in ("nchar", "char"):
        return Value(_fit_text(to_text(value, style, target), target), target)
    if family == "binary":
        if style in (1, 2) and isinstance(data, str):
            return Value(_fit_binary(_hex_bytes(value, style), target), target)
        return Value(_fit_binary(to_bytes(value), target), target)
    if family == "int":
        return Value(_to_int(value, target), target)
    if family == "decimal":
        return Value(_to_decimal(value, target), target)
    if family == "float":
        return Value(_to_float(value, target), target)
    if family == "guid":
        return Value(_to_guid(value), target)
    if family in ("datetime", "date", "time"):
        return Value(_to_datetime(value, target, style), target)
    if family == "xml":
        if isinstance(data, Xml):
            return Value(data, target)
        if isinstance(data, bytes):
            return Value(parse_xml(data), target)
        if isinstance(data, str):
            return Value(parse_xml(data), target)
        raise _explicit(source, target)
    if family == "variant":
        return Value(data, source)
    raise _explicit(source, target)


# CONVERT's styles: those SQL Server has for dates and times, and those ssb applies
_DATE_STYLES: Final = frozenset(
    (*range(15), *range(20, 26), *range(100, 115), 120, 121, 126, 127, 130, 131)
)
_DATETIME_STYLES: Final = frozenset((0, 100, 101, 103, 108, 112, 20, 120, 21, 25, 121, 126, 127))
_STYLES_APPLIED: Final = {
    ("datetime", "text"): _DATETIME_STYLES,
    ("date", "text"): frozenset((101, 103, 112)),
    ("time", "text"): frozenset((108,)),
    ("text", "datetime"): _DATETIME_STYLES,
    ("text", "date"): _DATETIME_STYLES,
    ("text", "time"): _DATETIME_STYLES,
    ("binary", "text"): frozenset((0, 1, 2)),
    ("text", "binary"): frozenset((0, 1, 2)),
    ("float", "text"): frozenset((0,)),
    ("money", "text"): frozenset((0,)),
}
# the styles SQL Server has for the conversions ssb applies fewer of
_STYLES: Final = {
    "datetime": _DATE_STYLES,
    "date": _DATE_STYLES,
    "time": _DATE_STYLES,
    "binary": frozenset((0, 1, 2)),
    "float": frozenset((0, 1, 2, 3, 126, 128, 129)),
    "money": frozenset((0, 1, 2, 126)),
}


def _style_family(kind: SqlType) -> str:
    if kind.name in ("MONEY", "SMALLMONEY"):
        return "money"
    family = kind.family
    return "text" if family in ("char", "nchar") else family


def _check_style(source: SqlType, target: SqlType, style: int) -> None:
    """Refuse a CONVERT style SQL Server does not have for the conversion (Msg 281) or
    ssb does not apply (Msg 40517); where SQL Server ignores a style, so does ssb."""
    pair = (_style_family(source), _style_family(target))
    applied = _STYLES_APPLIED.get(pair)
    if applied is None or style in applied:
        return
    other = pair[1] if pair[0] == "text" else pair[0]
    if style not in _STYLES[other]:
        towards = (
            f"from {source.name.lower()} to a character string"
            if pair[1] == "text"
            else f"from a character string to {target.name.lower()}"
        )
        raise SqlError(281, f"{style} is not a valid style number when converting {towards}.")
    raise NotSupported(
        f"CONVERT style {style} from {source.name.lower()} to {target.name.lower()}",
        f"use one of the styles {', '.join(map(str, sorted(applied)))}",
    )


def _hex_bytes(value: Value, style: int) -> bytes:
    """CONVERT(VARBINARY, text, 1 | 2): the hex digits as bytes (style 1 with its 0x)."""
    text = str(value.data).strip()
    prefixed = text[:2].lower() == "0x"
    digits = text[2:] if prefixed else text
    if prefixed != (style == 1) or len(digits) % 2 or not _HEX_TEXT.fullmatch(digits):
        raise SqlError(8114, f"Error converting data type {value.type.name.lower()} to varbinary.")
    return bytes.fromhex(digits)


_HEX_TEXT: Final = re.compile(r"[0-9a-fA-F]*")


def assign(value: Value, target: SqlType) -> Value:
    """`value` stored in a variable or parameter of type `target` (implicit conversion:
    the same as CAST, except that XML never converts to the numeric types)."""
    if value.type == target or value.data is None:
        return Value(value.data, target) if value.type != target else value
    return convert(value, target)


def to_text(value: Value, style: int | None = None, target: SqlType | None = None) -> str:
    """A value as character data, as CAST/CONVERT to NVARCHAR gives it."""
    data = value.data
    family = value.type.family
    if isinstance(data, str):
        return data
    if isinstance(data, bool):
        return "1" if data else "0"
    if isinstance(data, int):
        return str(data)
    if isinstance(data, Decimal):
        scale = value.type.scale
        if value.type.name in ("MONEY", "SMALLMONEY"):
            return f"{data:.2f}"
        return f"{data:.{scale}f}" if scale is not None else str(data)
    if isinstance(data, float):
        return _float_text(data)
    if isinstance(data, uuid.UUID):
        return str(data).upper()
    if isinstance(data, Xml):
        return data.text
    if isinstance(data, bytes):
        if style in (1, 2):
            text = data.hex().upper()
            return "0x" + text if style == 1 else text
        if target is not None and target.family == "char":
            return decode_single_bytes(data)
        return data[: len(data) - len(data) % 2].decode("utf-16-le", "replace")
    if isinstance(data, dt.datetime):
        return datetime_text(data, value.type, style)
    if isinstance(data, dt.date):
        if style in (101, 103, 112):
            return datetime_text(dt.datetime(data.year, data.month, data.day), value.type, style)
        return data.isoformat()
    if isinstance(data, dt.time):
        if style == 108:
            return f"{data:%H:%M:%S}"
        return data.isoformat()
    raise AssertionError(f"no text for {family} {data!r}")


def to_bytes(value: Value) -> bytes:
    """A value as VARBINARY, as SQL Server converts it."""
    data = value.data
    name = value.type.name
    family = value.type.family
    if isinstance(data, bytes):
        return data
    if family == "nchar":
        assert isinstance(data, str)
        return data.encode("utf-16-le", "surrogatepass")
    if family == "char":
        assert isinstance(data, str)
        return encode_single_bytes(data)
    if isinstance(data, Xml):
        return b"\xff\xfe" + data.text.encode("utf-16-le", "surrogatepass")
    if isinstance(data, uuid.UUID):
        return data.bytes_le
    if isinstance(data, int):
        size = _INT_BYTES.get(name, 4)
        return (data & ((1 << (8 * size)) - 1)).to_bytes(size, "big")
    raise SqlError(
        529, f"Explicit conversion from data type {value.type} to varbinary is not allowed."
    )


def as_int(value: Value) -> int:
    """A value that is not NULL as a Python int (BIGINT's range)."""
    converted = convert(value, BIGINT).data
    assert isinstance(converted, int)
    return converted


def top_count(value: Value) -> int | None:
    """TOP's row count as SQL Server takes it: converted to BIGINT (Msg 245 for text that
    is not a number), never negative (Msg 1014); None for NULL."""
    if value.data is None:
        return None
    count = as_int(value)
    if count < 0:
        raise SqlError(1014, "A TOP N or FETCH rows count value may not be negative.")
    return count


def text_room(kind: SqlType) -> int:
    """The characters a text value of `kind` holds at most: 8000 bytes' worth, or
    MAX_BYTES' for (MAX)."""
    per_character = 2 if kind.family == "nchar" else 1
    return (MAX_BYTES if kind.length == MAX else _ROW_BYTES) // per_character


def literal_text_type(name: str, text: str) -> SqlType:
    """A string literal's type: as long as the text, (MAX) past 8000 bytes (4000 characters
    of N'...'), as SQL Server types it."""
    limit = _ROW_BYTES // (2 if name == "NVARCHAR" else 1)
    return SqlType(name, max(1, len(text)) if len(text) <= limit else MAX)


def is_lob(kind: SqlType) -> bool:
    """Whether a value of `kind` is (MAX): a large value, not held to 8000 bytes."""
    return kind.length == MAX and kind.family in ("char", "nchar", "binary")


def concatenated(first: SqlType, second: SqlType) -> SqlType:
    """The type of `+` of two texts: NVARCHAR when either is national, (MAX) when either
    is (else held to 8000 bytes)."""
    lob = is_lob(first) or is_lob(second)
    if "nchar" in (first.family, second.family):
        return NVARCHAR_MAX if lob else NVARCHAR
    return VARCHAR_MAX if lob else VARCHAR


def fit_text(text: str, kind: SqlType) -> Value:
    """A string function's result of type `kind`: cut at 8000 bytes when `kind` is not
    (MAX), as SQL Server cuts it.

    Raises:
        SqlError: Msg 7119 when a (MAX) result would grow past MAX_BYTES.
    """
    room = text_room(kind)
    if len(text) > room:
        if kind.length == MAX:
            raise lob_overflow()
        text = text[:room]
    return Value(text, kind)


def lob_overflow() -> SqlError:
    """Msg 7119: a (MAX) value grown past MAX_BYTES."""
    return SqlError(
        7119, f"Attempting to grow LOB beyond maximum allowed size of {MAX_BYTES} bytes."
    )


def truthy(value: Value) -> bool | None:
    """A BIT's truth (None for NULL)."""
    if value.data is None:
        return None
    return bool(value.data)


def encode_single_bytes(text: str) -> bytes:
    """VARCHAR's bytes: code page 1252, '?' for what it cannot hold (as SQL Server does)."""
    return text.encode("cp1252", "replace")


def decode_single_bytes(data: bytes) -> str:
    """Code page 1252 text; the five bytes 1252 leaves undefined map to the same code point."""
    return data.decode("latin-1").translate(_CP1252)


def _cp1252_table() -> dict[int, str]:
    table = {}
    for byte in range(0x80, 0xA0):
        try:
            table[byte] = bytes((byte,)).decode("cp1252")
        except UnicodeDecodeError:
            continue
    return table


_CP1252: Final = _cp1252_table()


def _fit_text(text: str, target: SqlType) -> str:
    length = target.length
    if length is not None and length != MAX and len(text) > length:
        return text[:length]
    if target.name in ("CHAR", "NCHAR") and length is not None and length != MAX:
        return text.ljust(length)
    return text


def _fit_binary(data: bytes, target: SqlType) -> bytes:
    length = target.length
    if length is not None and length != MAX and len(data) > length:
        return data[:length]
    if target.name == "BINARY" and length is not None and length != MAX:
        return data.ljust(length, b"\0")
    return data


# numbers written as SQL Server reads them (Python's int(), float() and Decimal() also take
# underscores, other scripts' digits, nan and inf)
_INTEGER_TEXT: Final = re.compile(r"[+-]?[0-9]+")
_NUMBER_TEXT: Final = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def is_number_text(text: str) -> bool:
    """Whether `text` is a number as SQL Server reads one (signs, a point, an exponent)."""
    return _NUMBER_TEXT.fullmatch(text.strip()) is not None


def _to_int(value: Value, target: SqlType) -> int:
    data = value.data
    name = target.name
    if isinstance(data, str):
        text = data.strip()
        if name == "BIT" and text.upper() in ("TRUE", "FALSE"):
            return 1 if text.upper() == "TRUE" else 0
        if text and not _INTEGER_TEXT.fullmatch(text):
            raise conversion(value, target)
        number = int(text) if text else 0
    elif isinstance(data, bool):
        number = int(data)
    elif isinstance(data, int):
        number = data
    elif isinstance(data, (Decimal, float)):
        if isinstance(data, float) and not math.isfinite(data):
            raise _overflow(value, target)
        number = int(data)
    elif isinstance(data, bytes):
        number = int.from_bytes(data[-_INT_BYTES.get(name, 4) :] or b"\0", "big", signed=True)
    elif isinstance(data, dt.datetime) and value.type.name in _DAY_COUNTED:
        # the days since 1900-01-01, rounded: a time after noon counts as the next day
        number = int(Decimal(repr(days_since_1900(data))).to_integral_value("ROUND_HALF_UP"))
    else:
        raise _explicit(value.type, target)
    if name == "BIT":
        return 1 if number else 0
    low, high = INT_RANGES[name]
    if not low <= number <= high:
        raise _overflow(value, target)
    return number


_MONEY_RANGES: Final = {
    "MONEY": (Decimal("-922337203685477.5808"), Decimal("922337203685477.5807")),
    "SMALLMONEY": (Decimal("-214748.3648"), Decimal("214748.3647")),
}


def _to_decimal(value: Value, target: SqlType) -> Decimal:
    data = value.data
    try:
        if isinstance(data, str):
            if not _NUMBER_TEXT.fullmatch(data.strip()):
                raise InvalidOperation
            number = Decimal(data.strip())
        elif isinstance(data, (int, float, Decimal)):
            number = Decimal(str(data)) if isinstance(data, float) else Decimal(data)
        elif isinstance(data, dt.datetime) and value.type.name in _DAY_COUNTED:
            number = Decimal(repr(days_since_1900(data)))
        else:
            raise _explicit(value.type, target)
    except InvalidOperation:
        raise SqlError(
            8114,
            f"Error converting data type {value.type.name.lower()} to {target.name.lower()}.",
        ) from None
    if not number.is_finite():
        raise _overflow(value, target)
    scale = target.scale if target.scale is not None else 2
    quantum = Decimal(1).scaleb(-scale)
    if number and number.adjusted() >= (target.precision or 38) - scale:  # too many to fit
        raise _overflow(value, target)
    rounded = number.quantize(quantum, context=DECIMALS)
    if target.precision is not None and len(rounded.as_tuple().digits) > target.precision:
        raise _overflow(value, target)
    low, high = _MONEY_RANGES.get(target.name, (rounded, rounded))
    if not low <= rounded <= high:
        raise _overflow(value, target)
    return rounded


def _to_float(value: Value, target: SqlType) -> float:
    data = value.data
    if isinstance(data, str):
        number = float(data.strip()) if _NUMBER_TEXT.fullmatch(data.strip()) else math.inf
        if not math.isfinite(number):
            raise SqlError(
                8114,
                f"Error converting data type {value.type.name.lower()} to {target.name.lower()}.",
            )
        return number
    if isinstance(data, (int, float, Decimal)):
        return float(data)
    if isinstance(data, dt.datetime) and value.type.name in _DAY_COUNTED:
        return days_since_1900(data)
    raise _explicit(value.type, target)


def _to_guid(value: Value) -> uuid.UUID:
    data = value.data
    if isinstance(data, uuid.UUID):
        return data
    if isinstance(data, str):
        text = data.strip()
        if text.startswith("{") and text.endswith("}"):
            text = text[1:-1]
        if len(text) >= 36:
            try:
                return uuid.UUID(text[:36])
            except ValueError:
                pass
        raise SqlError(
            8169, "Conversion failed when converting from a character string to uniqueidentifier."
        )
    if isinstance(data, bytes):
        return uuid.UUID(bytes_le=data[:16].ljust(16, b"\0"))
    raise _explicit(value.type, GUID)


# the types narrower than Python's datetime (DATETIME2 and DATE span years 1 to 9999 as it does)
_DATE_RANGES: Final = {
    "DATETIME": (dt.datetime(1753, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 997000)),
    "SMALLDATETIME": (dt.datetime(1900, 1, 1), dt.datetime(2079, 6, 6, 23, 59)),
}


def _to_datetime(value: Value, target: SqlType, style: int | None = None) -> object:
    data = value.data
    family = target.family
    moment: dt.datetime
    if isinstance(data, dt.datetime):
        moment = data
    elif isinstance(data, dt.date):
        moment = dt.datetime(data.year, data.month, data.day)
    elif isinstance(data, str):
        moment = _parse_datetime(data, value, target, style)
    elif isinstance(data, (int, float, Decimal)) and target.name in _DAY_COUNTED:
        try:
            moment = _EPOCH + dt.timedelta(days=float(data))
        except OverflowError:
            raise SqlError(
                8115,
                f"Arithmetic overflow error converting expression to data type"
                f" {target.name.lower()}.",
            ) from None
    else:
        raise _explicit(value.type, target)
    low, high = _DATE_RANGES.get(target.name, (dt.datetime.min, dt.datetime.max))
    try:
        if target.name == "DATETIME":
            moment = round_datetime(moment)
        elif target.name == "SMALLDATETIME":  # to the minute: 29.999 seconds go up
            moment = round_datetime(moment)
            up = dt.timedelta(minutes=1) if moment.second >= 30 else dt.timedelta()
            moment = moment.replace(second=0, microsecond=0) + up
    except OverflowError:  # rounded past 9999-12-31
        moment = dt.datetime.max
    if not low <= moment <= high:
        raise SqlError(
            242,
            f"The conversion of a {value.type.name.lower()} data type to a"
            f" {target.name.lower()} data type resulted in an out-of-range value.",
        )
    if family == "date":
        return moment.date()
    if family == "time":
        return moment.time()
    return moment


_EPOCH: Final = dt.datetime(1900, 1, 1)
# the types that convert to and from numbers, as days since 1900-01-01 (DATETIME2, DATE
# and TIME do not: Msg 529)
_DAY_COUNTED: Final = frozenset(("DATETIME", "SMALLDATETIME"))


def round_datetime(moment: dt.datetime) -> dt.datetime:
    """`moment` as a DATETIME holds it: in ticks of 1/300 second, each shown as the nearest
    millisecond (.000, .003, .007), as SQL Server rounds it (.999 is the next second).

    Raises:
        OverflowError: rounded past 9999-12-31.
    """
    ticks = (moment.microsecond * 6 + 10_000) // 20_000  # 1/300 s, rounded half up
    millis = (ticks * 20 + 3) // 6  # the nearest millisecond of the tick
    return moment.replace(microsecond=0) + dt.timedelta(milliseconds=millis)


def days_since_1900(moment: dt.datetime) -> float:
    """A DATETIME as a number: days since 1900-01-01, the time of day the fraction (in
    DATETIME's ticks of 1/300 second), as CAST(datetime AS FLOAT) gives it."""
    ticks = (moment.microsecond * 6 + 10_000) // 20_000
    since = moment.replace(microsecond=0) - _EPOCH
    return since.days + (since.seconds * 300 + ticks) / (86_400 * 300)


def _parse_datetime(
    text: str, value: Value, target: SqlType, style: int | None = None
) -> dt.datetime:
    cleaned = text.strip().replace("T", " ")
    if style == 103:  # dd/mm/yyyy (ISO forms are read whatever the style)
        cleaned = _DAY_FIRST.sub(r"\2/\1/\3", cleaned)
    if cleaned.endswith("Z"):
        cleaned = cleaned[:-1]
    for form in (
        "%Y-%m-%d %H:%M:%S.%f",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d",
        "%Y%m%d %H:%M:%S",
        "%Y%m%d",
        "%H:%M:%S.%f",
        "%H:%M:%S",
        "%H:%M",
        "%m/%d/%Y %H:%M:%S",
        "%m/%d/%Y",
        "%b %d %Y %I:%M%p",
    ):
        try:
            fraction = cleaned
            if ".%f" in form and "." in cleaned:
                head, _, tail = cleaned.rpartition(".")
                fraction = f"{head}.{tail[:6]}"
            parsed = dt.datetime.strptime(" ".join(fraction.split()), form)
        except ValueError:
            continue
        if form.startswith("%H"):
            parsed = parsed.replace(year=1900)
        return parsed
    kind = "date and/or time" if target.family == "datetime" else target.name.lower()
    raise SqlError(241, f"Conversion failed when converting {kind} from character string.")


_DAY_FIRST: Final = re.compile(r"^(\d{1,2})/(\d{1,2})/(\d{4})")


def datetime_text(moment: dt.datetime, source: SqlType, style: int | None = None) -> str:
    """A datetime as CONVERT(NVARCHAR, ..., style) gives it (a few common styles)."""
    if style in (0, 100) or (style is None and source.name in ("DATETIME", "SMALLDATETIME")):
        hour = moment.hour % 12 or 12
        suffix = "AM" if moment.hour < 12 else "PM"
        return f"{moment:%b} {moment.day:2d} {moment.year} {hour:2d}:{moment:%M}{suffix}"
    if style == 101:
        return f"{moment:%m/%d/%Y}"
    if style == 103:
        return f"{moment:%d/%m/%Y}"
    if style == 112:
        return f"{moment:%Y%m%d}"
    if style == 108:
        return f"{moment:%H:%M:%S}"
    if style in (20, 120):
        return f"{moment:%Y-%m-%d %H:%M:%S}"
    if style in (126, 127):
        return moment.isoformat(timespec="milliseconds")
    if style in (21, 25, 121) or source.name in ("DATETIME", "SMALLDATETIME"):
        return f"{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond // 1000:03d}"
    return f"{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond:06d}0"


def display(value: Value) -> str:
    """A value as sqlcmd shows it in a result set."""
    data = value.data
    if data is None:
        return "NULL"
    if isinstance(data, bytes):
        return "0x" + data.hex().upper()
    if isinstance(data, dt.datetime):
        if value.type.name == "DATETIME2":
            return f"{data:%Y-%m-%d %H:%M:%S}.{data.microsecond:06d}0"
        return f"{data:%Y-%m-%d %H:%M:%S}.{data.microsecond // 1000:03d}"
    if isinstance(data, Decimal) and value.type.name in _MONEY_RANGES:
        return f"{data:.4f}"  # sqlcmd shows money's four places (CONVERT gives two)
    return to_text(value)


def plain(value: Value) -> object:
    """A value as JSON or CSV carry it: numbers as numbers, the rest as displayed."""
    data = value.data
    if data is None or isinstance(data, (int, float)):
        return data
    if isinstance(data, Decimal):
        return float(data) if data != data.to_integral_value() else int(data)
    return display(value)


def _float_text(number: float) -> str:
    if number == int(number) and abs(number) < 1e15:
        return str(int(number))
    text = f"{number:.6g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        sign = exponent[0]
        return f"{mantissa}e{sign}{int(exponent[1:]):03d}"
    return text


def conversion(value: Value, target: SqlType) -> SqlError:
    return SqlError(
        245,
        f"Conversion failed when converting the {value.type.name.lower()} value"
        f" '{value.data}' to data type {target.name.lower()}.",
    )


def _overflow(value: Value, target: SqlType) -> SqlError:
    return SqlError(
        8115,
        f"Arithmetic overflow error converting {value.type.name.lower()} to data type"
        f" {target.name.lower()}.",
    )


def _explicit(source: SqlType, target: SqlType) -> SqlError:
    return SqlError(
        529,
        f"Explicit conversion from data type {source.name.lower()} to"
        f" {target.name.lower()} is not allowed.",
    )


def infer(data: object) -> SqlType:
    """The SQL type of a Python value (what the broker's views and the SQL engine give)."""
    if data is None:
        return INT
    if isinstance(data, bool):
        return BIT
    if isinstance(data, int):
        return INT if -(2**31) <= data < 2**31 else BIGINT
    if isinstance(data, float):
        return FLOAT
    if isinstance(data, Decimal):
        return DECIMAL
    if isinstance(data, str):
        return NVARCHAR_MAX
    if isinstance(data, bytes):
        return VARBINARY_MAX
    if isinstance(data, uuid.UUID):
        return GUID
    if isinstance(data, dt.datetime):
        return DATETIME2
    if isinstance(data, Xml):
        return XML
    return SqlType("SQL_VARIANT")
