"""The functions that read the session's state: @@ROWCOUNT, @@TRANCOUNT, @@ERROR and
the other @@ functions, ERROR_NUMBER() and its siblings in a CATCH block, XACT_STATE(),
DB_NAME(), the login's names; and RAISERROR's and FORMATMESSAGE's printf-style text."""

from __future__ import annotations

import re
from typing import Any, Final, Protocol

from . import _types as t
from ._errors import NotSupported, SqlError
from ._interfaces import DEFAULT_DATABASE, Databases
from ._types import Value


class State(Protocol):
    conn: Any
    rowcount: int
    trancount: int
    last_error: int
    nesting: int
    doomed: bool
    login: str | None
    caught: list[SqlError]
    databases: Databases


def system_function(self: State, name: str) -> Value:
    if name == "@@ROWCOUNT":
        return Value(self.rowcount, t.INT)
    if name == "@@TRANCOUNT":
        return Value(self.trancount, t.INT)
    if name == "@@ERROR":
        return Value(self.last_error, t.INT)
    if name == "@@NESTLEVEL":
        return Value(self.nesting, t.INT)
    if name in ("@@SERVERNAME", "@@SERVICENAME"):
        return Value(getattr(self.conn, "server", None) or "ssb", t.NVARCHAR)
    if name == "@@VERSION":
        return Value("ssb T-SQL (Service Broker's statements on the ssb broker)", t.NVARCHAR)
    if name == "@@SPID":
        return Value(1, t.SqlType("SMALLINT"))
    if name == "@@DATEFIRST":
        return Value(7, t.SqlType("TINYINT"))
    if name in ("@@IDENTITY",):
        return Value(None, t.DECIMAL)
    raise NotSupported(
        name,
        "ssb's T-SQL has @@ROWCOUNT, @@TRANCOUNT, @@ERROR, @@NESTLEVEL,"
        " @@SERVERNAME, @@VERSION and @@SPID",
    )


def session_function(self: State, name: str, args: list[Value]) -> Value:
    error = self.caught[-1] if self.caught else None
    if name.startswith("ERROR_"):
        if error is None:
            return Value(None, t.INT if name != "ERROR_MESSAGE" else t.NVARCHAR)
        found = {
            "ERROR_NUMBER": Value(error.number, t.INT),
            "ERROR_MESSAGE": Value(error.text, t.SqlType("NVARCHAR", 4000)),
            "ERROR_SEVERITY": Value(error.level, t.INT),
            "ERROR_STATE": Value(error.state, t.INT),
            "ERROR_LINE": Value(error.line, t.INT),
            "ERROR_PROCEDURE": Value(error.procedure, t.SYSNAME),
        }.get(name)
        if found is not None:
            return found
    if name == "XACT_STATE":
        return Value(0 if not self.trancount else (-1 if self.doomed else 1), t.SqlType("SMALLINT"))
    if name == "DB_NAME":
        if not args or args[0].data is None:
            return Value(self.databases.current(), t.SYSNAME)
        number = t.as_int(args[0])
        named = next((d.name for d in self.databases.known() if d.database_id == number), None)
        return Value(named, t.SYSNAME)
    if name == "DB_ID":
        wanted = self.databases.current() if not args or args[0].data is None else None
        if wanted is None:
            wanted = t.to_text(args[0])
        folded = wanted.casefold()
        ids = [d.database_id for d in self.databases.known() if d.name.casefold() == folded]
        if not ids and folded == DEFAULT_DATABASE:
            ids = [1]
        return Value(ids[0] if ids else None, t.INT)
    if name in (
        "SUSER_SNAME",
        "SUSER_NAME",
        "USER_NAME",
        "CURRENT_USER",
        "SESSION_USER",
        "SYSTEM_USER",
        "USER",
        "ORIGINAL_LOGIN",
    ):
        return Value(self.login, t.SYSNAME)
    if name in ("SCHEMA_NAME",):
        return Value("dbo", t.SYSNAME)
    if name == "HOST_NAME":
        return Value(None, t.SYSNAME)
    if name == "APP_NAME":
        return Value("ssb sql", t.SYSNAME)
    if name == "FORMATMESSAGE" and args:
        return Value(format_message(t.to_text(args[0]), args[1:]), t.SqlType("NVARCHAR", 2047))
    raise SqlError(195, f"'{name}' is not a recognized built-in function name.")


_FORMAT: Final = re.compile(r"%([-+ 0#]*)(\d+|\*)?(?:\.(\d+|\*))?(?:h|l|I64)?([disuoxXc%])")


def format_message(template: str, args: list[Value]) -> str:
    """RAISERROR's and FORMATMESSAGE's printf-style substitution."""
    remaining = list(args)

    def substitute(m: re.Match[str]) -> str:
        flags, width, precision, kind = m.group(1), m.group(2), m.group(3), m.group(4)
        if kind == "%":
            return "%"
        if width == "*":
            width = str(small_int(remaining.pop(0))) if remaining else ""
        if precision == "*":
            precision = str(small_int(remaining.pop(0))) if remaining else ""
        if not remaining:
            return "(null)"
        value = remaining.pop(0)
        if value.data is None:
            return "(null)"
        spec = f"%{flags}{width or ''}" + (f".{precision}" if precision else "")
        if kind in "diuoxX":
            number = t.as_int(value)
            return (spec + ("d" if kind in "iu" else kind)) % number
        text = t.to_text(value)
        return (spec + "s") % text

    return _FORMAT.sub(substitute, template)


def small_int(value: Value) -> int:
    """A value as an int, NULL as 0 (severities, states, widths)."""
    return 0 if value.data is None else t.as_int(value)
