"""SQL Server's errors, as the interpreter raises and prints them.

Every failure of a batch is a `SqlError` carrying SQL Server's message number, severity
(level), state and the line it happened on, counted in the file. `text` is the message
in SQL Server's words where SQL Server has them; `format()` prints it the way sqlcmd
does (`Msg 102, Level 15, State 1, Line 7` and the text below). Errors the broker
reports through the client are translated here, so a script sees SQL Server's numbers
for the Service Broker failures it knows (8426 a conversation handle not found, 9617 a
disabled queue, ...), with the broker's own words kept in the text.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final, TypeVar

from ssb import client
from ssb.protocol import ErrorCode

T = TypeVar("T")

# levels: 0-10 informational, 11-16 user errors, 17+ resources and system
INFORMATIONAL: Final = 10
USER: Final = 16
SYNTAX_LEVEL: Final = 15


class SqlError(Exception):
    """An error a T-SQL batch raises: number, level, state, line and text.

    Attributes:
        number: SQL Server's message number (50000 for RAISERROR with a text).
        level: the severity, 0..25 (11 and above is an error).
        state: 0..255, as RAISERROR and THROW give it.
        line: the line of the statement in the file (0 until the runner places it).
        column: the column of the token a syntax error names (0 when none does).
        procedure: the stored procedure it happened in, if any.
    """

    def __init__(
        self,
        number: int,
        text: str,
        *,
        level: int = USER,
        state: int = 1,
        line: int = 0,
        column: int = 0,
        procedure: str | None = None,
    ) -> None:
        super().__init__(text)
        self.number = number
        self.text = text
        self.level = level
        self.state = state
        self.line = line
        self.column = column
        self.procedure = procedure

    def at(self, line: int, procedure: str | None = None) -> SqlError:
        """Place the error on `line` (of the file, or of the procedure) if not yet placed."""
        if not self.line:
            self.line = line
            if procedure is not None and self.procedure is None:
                self.procedure = procedure
        return self

    def format(self) -> str:
        """The two lines sqlcmd prints for it."""
        where = f", Procedure {self.procedure}" if self.procedure else ""
        head = f"Msg {self.number}, Level {self.level}, State {self.state}{where}, Line {self.line}"
        return f"{head}\n{self.text}"

    def __str__(self) -> str:
        return self.format()


class NotSupported(SqlError):
    """A statement or option ssb does not offer (yet): refused, never ignored.

    SQL Server's own number for a statement option a product does not support (40517)
    with ssb's explanation of what to do instead.
    """

    def __init__(self, what: str, instead: str, *, yet: bool = False) -> None:
        later = "yet " if yet else ""
        super().__init__(40517, f"{what} is not supported {later}by ssb: {instead}")


def syntax_error(near: str, *, keyword: bool, line: int, column: int) -> SqlError:
    """Msg 102 / 156: SQL Server's words for a token the grammar does not expect here."""
    if keyword:
        text = f"Incorrect syntax near the keyword '{near}'."
        number = 156
    else:
        text = f"Incorrect syntax near '{near}'."
        number = 102
    return SqlError(
        number,
        f"{text} (column {column})",
        level=SYNTAX_LEVEL,
        line=line,
        column=column,
    )


def must_declare(name: str) -> SqlError:
    return SqlError(137, f'Must declare the scalar variable "{name}".', level=SYNTAX_LEVEL)


def assignment_with_retrieval() -> SqlError:
    """A SELECT that assigns some variables and returns other columns."""
    return SqlError(
        141,
        "A SELECT statement that assigns a value to a variable must not be combined"
        " with data-retrieval operations.",
    )


def conversion_failed(value: str, from_type: str, to_type: str) -> SqlError:
    return SqlError(
        245,
        f"Conversion failed when converting the {from_type} value '{value}' to data type {to_type}.",
    )


SSB_NUMBERS: Final = 100_000

# the broker's codes, as SQL Server numbers its Service Broker errors; the broker's
# text follows SQL Server's where the two say the same thing
_BROKER_NUMBERS: Final = {
    ErrorCode.UNKNOWN_MESSAGE_TYPE: 8428,
    ErrorCode.UNKNOWN_CONTRACT: 8425,
    ErrorCode.UNKNOWN_QUEUE: 208,
    ErrorCode.UNKNOWN_SERVICE: 8423,
    ErrorCode.UNKNOWN_ROUTE: 15151,
    ErrorCode.UNKNOWN_PRIORITY: 15151,
    ErrorCode.UNKNOWN_EVENT_NOTIFICATION: 15151,
    ErrorCode.UNKNOWN_CERTIFICATE: 15151,
    ErrorCode.UNKNOWN_LOGIN: 15151,
    ErrorCode.UNKNOWN_REMOTE_SERVICE_BINDING: 15151,
    ErrorCode.UNKNOWN_DATABASE: 911,
    ErrorCode.UNKNOWN_PROCEDURE: 2812,
    ErrorCode.UNKNOWN_SAVEPOINT: 6401,
    ErrorCode.ALREADY_EXISTS: 2714,
    ErrorCode.IN_USE: 3729,
    ErrorCode.SYSTEM_OBJECT: 15247,
    ErrorCode.UNKNOWN_CONVERSATION: 8426,
    ErrorCode.CONVERSATION_ENDED: 8429,
    ErrorCode.MESSAGE_TYPE_NOT_IN_CONTRACT: 8431,
    ErrorCode.WRONG_DIRECTION: 8432,
    ErrorCode.CONTRACT_NOT_ACCEPTED: 8408,
    ErrorCode.VALIDATION_FAILED: 8430,
    ErrorCode.UNKNOWN_CONVERSATION_GROUP: 8436,
    ErrorCode.QUEUE_DISABLED: 9617,
    ErrorCode.LOCK_TIMEOUT: 1222,
    ErrorCode.PERMISSION_DENIED: 229,
    ErrorCode.NO_TRANSACTION: 3902,
    ErrorCode.TRANSACTION_ACTIVE: 3902,
}


# what a failed table statement says -> SQL Server's number for that failure (scripts
# catch 2627 to find a row that is there already)
_TABLE_NUMBERS: Final = (
    ("UNIQUE constraint failed", 2627),
    ("NOT NULL constraint failed", 515),
    ("CHECK constraint failed", 547),
    ("FOREIGN KEY constraint failed", 547),
    ("no such table", 208),
    ("no such column", 207),
    ("already exists", 2714),
    ("PRIMARY KEY constraint on nullable column", 8111),
    ("String or binary data would be truncated", 8152),
    ("Arithmetic overflow error for data type", 220),  # (a cast of an int, with its value)
    ("Arithmetic overflow error", 8115),
    ("overflowed an int column", 248),  # (a cast of text past INT's range)
    ("overflowed an INT", 244),  # (TINYINT's, SMALLINT's)
    ("Error converting data type varchar to bigint", 8114),
    ("Attempting to grow LOB beyond maximum allowed size", 7119),
    ("Conversion failed when converting", 245),
    ("Operand data type", 8117),
)


async def found(call: Awaitable[T], missing: SqlError) -> T:
    """Await a client call on a named object: `missing` where the broker has no such
    object, any other refusal in SQL Server's terms (`from_broker`)."""
    try:
        return await call
    except client.NotFoundError:
        raise missing from None
    except client.BrokerError as exc:
        raise from_broker(exc) from None


def from_broker(exc: client.BrokerError) -> SqlError:
    """The client's error as the SqlError a script sees (the broker's words kept)."""
    if exc.code is None:
        return SqlError(10054, f"the connection to the broker was lost: {exc.message}", level=20)
    # what SQL Server has no number for carries ssb's own code, above 100000
    number = _BROKER_NUMBERS.get(exc.code, SSB_NUMBERS + int(exc.code))
    if exc.code is ErrorCode.WRONG_DIRECTION and "is the target side" in exc.message:
        number = 8434  # SENT BY INITIATOR, sent by the target
    if exc.code is ErrorCode.SQL_ERROR:  # a table statement: SQL Server's number for it
        number = next((n for said, n in _TABLE_NUMBERS if said in exc.message), number)
    level = 20 if int(exc.code) >= 9000 else USER
    return SqlError(number, exc.message, level=level)
