"""Variables as SQL Server scopes them: one frame per batch or procedure call.

A frame holds every variable the batch declares, from the start: SQL Server resolves
names at compile time, so a variable DECLAREd inside an IF block exists after the
block (NULL if the block did not run) and a DECLARE without a value inside a loop
does not reset it (nor does a table variable's DECLARE empty it: its rows stay from one
pass to the next). The checker (see _compile) has already refused references to
variables declared later in the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _types as t
from ._ast import NO_CONSTRAINTS, TableConstraints
from ._errors import SqlError
from ._operators import sort_key
from ._types import SqlType, Value


@dataclass(slots=True)
class TableVariable:
    """A table variable: its columns, rows and the constraints its declaration keeps."""

    columns: tuple[tuple[str, SqlType], ...]
    rows: list[list[Value]] = field(default_factory=list)
    constraints: TableConstraints = NO_CONSTRAINTS
    name: str = ""  # as declared, for errors

    def admit(self, rows: list[list[Value]]) -> None:
        """Make `rows` (each value as the statement made it) the table's rows, whole or
        not at all: each value fitted to its column, as SQL Server stores it in a table.

        Raises:
            SqlError: 8152 for text or bytes longer than the column, 515 for a NULL in a
                column that takes none, 2627 for a key that is there already.
        """
        fitted = [
            [_fit(value, kind) for value, (_, kind) in zip(row, self.columns, strict=True)]
            for row in rows
        ]
        for position in self.constraints.not_null:
            if any(row[position].data is None for row in fitted):
                raise SqlError(
                    515,
                    f"Cannot insert the value NULL into column '{self.columns[position][0]}',"
                    f" table '{self.name}'; column does not allow nulls. INSERT fails.",
                )
        keys = [(self.constraints.primary, "PRIMARY KEY")] if self.constraints.primary else []
        for key, kind in keys + [(key, "UNIQUE KEY") for key in self.constraints.unique]:
            seen: set[tuple[object, ...]] = set()
            for row in fitted:
                values = tuple(sort_key(row[position]) for position in key)
                if values in seen:
                    shown = ", ".join(t.display(row[position]) for position in key)
                    raise SqlError(
                        2627,
                        f"Violation of {kind} constraint. Cannot insert duplicate key in object"
                        f" '{self.name}'. The duplicate key value is ({shown}).",
                    )
                seen.add(values)
        self.rows = fitted


def _fit(value: Value, kind: SqlType) -> Value:
    """`value` as a column of type `kind` holds it; text or bytes cut short is an error
    (trailing spaces may go), as in SQL Server with ANSI_WARNINGS ON."""
    fitted = t.assign(value, kind)
    data = fitted.data
    if isinstance(data, str):
        whole = t.convert(value, t.NVARCHAR_MAX if kind.family == "nchar" else t.VARCHAR_MAX).data
        cut = isinstance(whole, str) and len(whole.rstrip(" ")) > len(data.rstrip(" "))
    elif isinstance(data, bytes):
        whole = t.convert(value, t.VARBINARY_MAX).data
        cut = isinstance(whole, bytes) and len(whole) > len(data)
    else:
        cut = False
    if cut:
        raise SqlError(8152, "String or binary data would be truncated.")
    return fitted


@dataclass(slots=True)
class Slot:
    type: SqlType
    value: Value
    table: TableVariable | None = None


@dataclass(slots=True)
class Frame:
    variables: dict[str, Slot] = field(default_factory=dict)
    row: dict[str, Value] | None = None  # the message a RECEIVE column list reads
    procedure: str | None = None
    nesting: int = 0
    # the temporary tables (#name) a procedure call made: dropped when it returns
    temporary: list[str] = field(default_factory=list)


class Break(Exception):
    """BREAK, on its way to the WHILE it ends."""


class Continue(Exception):
    """CONTINUE, on its way to the WHILE it restarts."""


class Return(Exception):
    """RETURN, on its way out of the batch or procedure (with the procedure's status)."""

    def __init__(self, value: int | None) -> None:
        super().__init__(value)
        self.value = value
