"""Variables as SQL Server scopes them: one frame per batch or procedure call.

A frame holds every variable the batch declares, from the start: SQL Server resolves
names at compile time, so a variable DECLAREd inside an IF block exists after the
block (NULL if the block did not run) and a DECLARE without a value inside a loop
does not reset it. The checker (see _compile) has already refused references to
variables declared later in the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._types import SqlType, Value


@dataclass(slots=True)
class TableVariable:
    """A table variable: its columns and rows (as RECEIVE ... INTO fills it)."""

    columns: tuple[tuple[str, SqlType], ...]
    rows: list[list[Value]] = field(default_factory=list)


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
