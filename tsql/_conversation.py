"""The conversation statements, each one client call: BEGIN DIALOG, SEND, RECEIVE and
GET CONVERSATION GROUP (with WAITFOR), END CONVERSATION, BEGIN CONVERSATION TIMER and
MOVE CONVERSATION.

Bodies are bytes as Service Broker makes them: a SEND's body expression is converted to
VARBINARY by SQL Server's rules (NVARCHAR as UTF-16LE, VARCHAR as single bytes, XML as
UTF-16LE with a byte-order mark), and RECEIVE gives `message_body` as VARBINARY(MAX),
which an NVARCHAR variable reads back as UTF-16LE. WAITFOR's TIMEOUT is milliseconds
(-1 or none: wait for ever); a RECEIVE without WAITFOR does not wait.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

from ssb import client
from ssb.protocol import ErrorCode

from . import _ast as ast
from . import _types as t
from ._broker import object_name
from ._errors import SSB_NUMBERS, SqlError
from ._output import ResultSet
from ._types import Value

if TYPE_CHECKING:
    from ._context import Context as Session
    from ._frame import Frame

_NAME: Final = t.SqlType("NVARCHAR", 256)
MESSAGE_COLUMNS: Final = (
    ("status", t.SqlType("TINYINT")),
    ("priority", t.SqlType("TINYINT")),
    ("queuing_order", t.BIGINT),
    ("conversation_group_id", t.GUID),
    ("conversation_handle", t.GUID),
    ("message_sequence_number", t.BIGINT),
    ("service_name", _NAME),
    ("service_id", t.INT),
    ("service_contract_name", _NAME),
    ("service_contract_id", t.INT),
    ("message_type_name", _NAME),
    ("message_type_id", t.INT),
    ("validation", t.SqlType("NCHAR", 2)),
    ("message_body", t.VARBINARY_MAX),
    ("message_enqueue_time", t.DATETIME),
    ("delivery_count", t.INT),
)
# what `RECEIVE *` gives: Service Broker's columns (ssb's own two only when named)
STAR_COLUMNS: Final = MESSAGE_COLUMNS[:-2]
_TYPES: Final = dict(MESSAGE_COLUMNS)
_MILLISECONDS: Final = 1000.0


def _row(message: client.Message) -> dict[str, Value]:
    from ._catalog import object_id

    enqueued = message.message_enqueue_time
    return {
        "status": Value(message.status, _TYPES["status"]),
        "priority": Value(message.priority, _TYPES["priority"]),
        "queuing_order": Value(message.queuing_order, t.BIGINT),
        "conversation_group_id": Value(message.conversation_group_id, t.GUID),
        "conversation_handle": Value(message.conversation_handle, t.GUID),
        "message_sequence_number": Value(message.message_sequence_number, t.BIGINT),
        "service_name": Value(message.service_name, _NAME),
        "service_id": Value(object_id("service", message.service_name), t.INT),
        "service_contract_name": Value(message.service_contract_name, _NAME),
        "service_contract_id": Value(object_id("contract", message.service_contract_name), t.INT),
        "message_type_name": Value(message.message_type_name, _NAME),
        "message_type_id": Value(object_id("message_type", message.message_type_name), t.INT),
        "validation": Value(message.validation, _TYPES["validation"]),
        "message_body": Value(message.message_body, t.VARBINARY_MAX),
        "message_enqueue_time": Value(
            None if enqueued is None else enqueued.replace(tzinfo=None), t.DATETIME
        ),
        "delivery_count": Value(message.delivery_count, t.INT),
    }


async def _handle(
    session: Session, expr: ast.Expr, frame: Frame, *, group: bool = False
) -> uuid.UUID:
    value = await session.value(expr, frame)
    if value.data is None:
        if group:
            raise SqlError(8420, "The conversation group is missing. Specify a conversation group.")
        raise SqlError(8418, "The conversation handle is missing. Specify a conversation handle.")
    converted = t.convert(value, t.GUID).data
    assert isinstance(converted, uuid.UUID)
    return converted


async def _name(session: Session, expr: ast.Expr, frame: Frame, what: str) -> str:
    text = await session.text_value(expr, frame)
    if text is None:
        number, message = _MISSING_NAMES[what]
        raise SqlError(number, message)
    return text


_MISSING_NAMES: Final = {
    "service name": (8421, "The service name is missing. Specify a service name."),
    "target service name": (8421, "The service name is missing. Specify a service name."),
    "contract name": (8417, "The service contract name is NULL. Specify a service contract name."),
    "message type name": (8428, 'The message type "NULL" is not found.'),
}


def body_bytes(value: Value) -> bytes:
    """A SEND's body as Service Broker stores it (VARBINARY)."""
    if value.data is None:
        return b""
    return t.to_bytes(value)


async def begin_dialog(session: Session, statement: ast.BeginDialog, frame: Frame) -> None:
    from_service = await _name(session, statement.from_service, frame, "service name")
    to_service = await _name(session, statement.to_service, frame, "target service name")
    instance = None
    if statement.broker_instance is not None:
        given = await session.text_value(statement.broker_instance, frame)
        if given is not None and given.strip().upper() != "CURRENT DATABASE":
            instance = _broker_instance(given)
    contract = "DEFAULT"
    if statement.contract is not None:
        contract = await _name(session, statement.contract, frame, "contract name")
    options: dict[str, Any] = {}
    if statement.related_conversation is not None:
        options["related_conversation"] = await _handle(
            session, statement.related_conversation, frame
        )
    if statement.related_group is not None:
        options["related_conversation_group"] = await _handle(
            session, statement.related_group, frame, group=True
        )
    if statement.lifetime is not None:
        lifetime = await session.value(statement.lifetime, frame)
        if lifetime.data is not None:
            options["lifetime"] = float(t.as_int(lifetime))
    handle = await session.broker(
        session.connection().begin_dialog(
            from_service,
            to_service,
            contract,
            broker_instance=instance,
            encryption=bool(statement.encryption),
            **options,
        )
    )
    session.assign(frame, statement.handle, Value(handle, t.GUID))
    session.rowcount = 0


def _broker_instance(text: str) -> str:
    """A broker instance id as the broker's routes keep it: a GUID in lower case, however
    it was written (SQL Server prints them in upper case), with or without braces.

    Raises:
        SqlError: for text that is not a GUID (SQL Server would take it and find no route).
    """
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise SqlError(
            SSB_NUMBERS + int(ErrorCode.BAD_ARGUMENT),
            f"the broker instance '{text}' of BEGIN DIALOG is not a GUID: name the far"
            " broker's service_broker_guid, as sys.databases shows it, or 'CURRENT DATABASE'",
        ) from None


async def send(session: Session, statement: ast.Send, frame: Frame) -> None:
    handles = [await _handle(session, h, frame) for h in statement.handles]
    message_type = "DEFAULT"
    if statement.message_type is not None:
        message_type = await _name(session, statement.message_type, frame, "message type name")
    body = b""
    if statement.body is not None:
        body = body_bytes(await session.value(statement.body, frame))
    await session.broker(
        session.connection().send(handles if len(handles) > 1 else handles[0], message_type, body)
    )
    session.rowcount = 0


async def end_conversation(session: Session, statement: ast.EndConversation, frame: Frame) -> None:
    handle = await _handle(session, statement.handle, frame)
    if statement.cleanup:
        await session.broker(session.connection().end_conversation(handle, cleanup=True))
    elif statement.error is not None:
        code = await session.value(statement.error, frame)
        assert statement.description is not None
        description = await session.text_value(statement.description, frame)
        if code.data is None or description is None:
            raise SqlError(
                8419,
                "Both the error code and the description must be provided for END CONVERSATION"
                " WITH ERROR. Neither value can be NULL.",
            )
        number = t.as_int(code)
        if number <= 0:
            raise SqlError(
                8419,
                f"The error code of END CONVERSATION WITH ERROR must be greater than 0, not {number}.",
            )
        await session.broker(
            session.connection().end_conversation(handle, error=number, description=description)
        )
    else:
        await session.broker(session.connection().end_conversation(handle))
    session.rowcount = 0


async def conversation_timer(
    session: Session, statement: ast.ConversationTimer, frame: Frame
) -> None:
    handle = await _handle(session, statement.handle, frame)
    seconds = await session.value(statement.timeout, frame)
    if seconds.data is None:
        raise SqlError(8439, "The TIMEOUT of BEGIN CONVERSATION TIMER is NULL; give seconds.")
    timeout = float(t.as_int(seconds))
    await session.broker(session.connection().begin_conversation_timer(handle, timeout))


async def move_conversation(
    session: Session, statement: ast.MoveConversation, frame: Frame
) -> None:
    handle = await _handle(session, statement.handle, frame)
    group = await _handle(session, statement.group, frame, group=True)
    await session.broker(session.connection().move_conversation(handle, group))


async def _timeout(session: Session, statement: ast.Receive, frame: Frame) -> float | None:
    if not statement.waitfor:
        return 0.0
    if statement.timeout is None:
        return None
    value = await session.value(statement.timeout, frame)
    if value.data is None:
        return None
    milliseconds = t.as_int(value)
    return None if milliseconds < 0 else milliseconds / _MILLISECONDS


async def receive(session: Session, statement: ast.Receive, frame: Frame) -> None:
    conn = session.connection()
    queue = object_name(statement.queue, conn.database)
    timeout = await _timeout(session, statement, frame)
    if statement.group_variable is not None:
        group = await session.broker(conn.get_conversation_group(queue, timeout))
        session.assign(frame, statement.group_variable, Value(group, t.GUID))
        session.rowcount = 0 if group is None else 1
        return
    top = None
    if statement.top is not None:
        top = t.top_count(await session.value(statement.top, frame))
        if top == 0:  # asks for no message: none taken, none waited for
            await _deliver(session, statement, frame, [])
            return
    where: dict[str, uuid.UUID] = {}
    if statement.where_value is not None and statement.where_column is not None:
        where[statement.where_column] = await _handle(session, statement.where_value, frame)
    # a column list that can fail after the messages were taken: outside a transaction the
    # RECEIVE runs in one of its own, inside one after a savepoint, so that a failure puts
    # its messages back and leaves the rest of the transaction as it was
    risky = _may_fail(statement, frame)
    alone = risky and session.trancount == 0
    if alone:
        await session.broker(conn.begin_transaction())
    elif risky:
        await session.broker(conn.save_transaction(STATEMENT_SAVEPOINT))
    try:
        messages = await session.broker(conn.receive(queue, top, timeout, **where))
        await _deliver(session, statement, frame, messages)
    except SqlError:
        if alone:
            await session.broker(conn.rollback())
        elif risky:
            await session.broker(conn.rollback_to_savepoint(STATEMENT_SAVEPOINT))
        raise
    if alone:
        await session.broker(conn.commit())


STATEMENT_SAVEPOINT: Final = "ssb: a RECEIVE"  # the savepoint a risky RECEIVE takes
_SAFE_COLUMNS: Final = frozenset(
    (
        "conversation_handle",
        "conversation_group_id",
        "priority",
        "status",
        "queuing_order",
        "message_sequence_number",
        "delivery_count",
        "message_enqueue_time",
    )
)


def _may_fail(statement: ast.Receive, frame: Frame) -> bool:
    """Whether evaluating the column list can fail after the messages were taken: an
    expression, a column read into a variable of a type it may not convert to, or rows
    put INTO a table variable, which its columns and constraints may refuse."""
    if statement.into is not None:
        return True
    for item in statement.items:
        expr = item.expr
        if isinstance(expr, ast.Star):
            continue
        if not isinstance(expr, ast.Column):
            return True
        if item.target is None or expr.name.lower() in _SAFE_COLUMNS:
            continue
        if frame.variables[item.target].type.family not in ("char", "nchar", "binary", "variant"):
            return True
    return False


async def _deliver(
    session: Session, statement: ast.Receive, frame: Frame, messages: list[client.Message]
) -> None:
    items = statement.items
    assigns = [item for item in items if item.target is not None]
    if assigns and len(assigns) != len(items):
        raise SqlError(
            8447,
            "A RECEIVE statement that assigns a value to a variable must not be combined with"
            " data retrieval operations.",
        )
    if assigns and statement.into is not None:
        raise SqlError(
            8450,
            "Assignments in the RECEIVE projection are not allowed in conjunction with the INTO"
            " clause.",
        )
    if assigns:
        for message in messages:
            frame.row = _row(message)
            try:
                for item in items:
                    assert item.target is not None
                    session.assign(frame, item.target, session.sync(item.expr, frame), item.op)
            finally:
                frame.row = None
        session.rowcount = len(messages)
        return
    columns: list[str] = []
    types: list[t.SqlType] = []
    for item in items:
        if isinstance(item.expr, ast.Star):
            columns += [name for name, _ in STAR_COLUMNS]
            types += [kind for _, kind in STAR_COLUMNS]
        else:
            columns.append(
                item.alias or (item.expr.name if isinstance(item.expr, ast.Column) else "")
            )
            types.append(_TYPES.get(columns[-1], t.NVARCHAR_MAX))
    rows: list[list[Value]] = []
    for message in messages:
        frame.row = row = _row(message)
        try:
            values: list[Value] = []
            for item in items:
                if isinstance(item.expr, ast.Star):
                    values += [row[name] for name, _ in STAR_COLUMNS]
                else:
                    values.append(session.sync(item.expr, frame))
            rows.append(values)
        finally:
            frame.row = None
    session.rowcount = len(messages)
    if statement.into is not None:
        slot = frame.variables[statement.into]
        if slot.table is None:
            raise SqlError(1087, f'Must declare the table variable "{statement.into}".')
        width = len(slot.table.columns)
        if width != len(columns):
            raise SqlError(
                213,
                "Column name or number of supplied values does not match table definition.",
            )
        slot.table.admit(slot.table.rows + rows)
        return
    if rows:
        types = [
            next((r[i].type for r in rows if r[i].data is not None), types[i])
            for i in range(len(columns))
        ]
    session.output.result(ResultSet(columns, types, rows), session.nocount)


Handler = Callable[[Any, Any, Any], Coroutine[Any, Any, None]]
CONVERSATION_STATEMENTS: Final[dict[type, Handler]] = {
    ast.BeginDialog: begin_dialog,
    ast.Send: send,
    ast.Receive: receive,
    ast.EndConversation: end_conversation,
    ast.ConversationTimer: conversation_timer,
    ast.MoveConversation: move_conversation,
}
