"""Transactions in T-SQL: BEGIN, COMMIT, ROLLBACK and SAVE TRANSACTION on the broker's.

Theory of operation. The session's transaction is the broker's: BEGIN TRANSACTION begins
one, a nested BEGIN only counts (as `@@TRANCOUNT` does), COMMIT ends the outermost and
ROLLBACK all of it. SAVE TRANSACTION is the broker's savepoint; ROLLBACK TRANSACTION of a
name that is not the transaction's rolls back to the latest savepoint of that name and
leaves `@@TRANCOUNT` as it was, as SQL Server does. A transaction made uncommittable
(`doomed`, XACT_STATE() = -1) can only be rolled back whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol

from ssb import client

from . import _ast as ast
from . import _types as t
from ._errors import SqlError, from_broker
from ._frame import Frame


class Session(Protocol):
    """What the transaction statements need of the session that runs them."""

    trancount: int
    transaction_names: list[str | None]
    doomed: bool
    rowcount: int

    def connection(self) -> client.Connection: ...

    async def broker(self, call: Awaitable[Any]) -> Any: ...


async def transaction(session: Session, statement: ast.Transaction, frame: Frame) -> None:
    action = statement.action
    session.rowcount = 0
    if action == "BEGIN":
        if session.trancount == 0:
            await session.broker(session.connection().begin_transaction())
            session.doomed = False
        session.trancount += 1
        session.transaction_names.append(statement.name)
        return
    if action == "SAVE":
        if session.trancount == 0:
            raise SqlError(
                628, "Cannot issue SAVE TRANSACTION when there is no active transaction."
            )
        name = await _name(statement.name, frame)
        if name is None:
            raise SqlError(102, "Incorrect syntax: SAVE TRANSACTION needs a name.", level=15)
        await session.broker(session.connection().save_transaction(name))
        return
    if action == "COMMIT":
        if session.trancount == 0:
            raise SqlError(
                3902, "The COMMIT TRANSACTION request has no corresponding BEGIN TRANSACTION."
            )
        if session.doomed:
            raise SqlError(
                3930,
                "The current transaction cannot be committed and cannot support operations"
                " that write to the log file. Roll back the transaction.",
            )
        if session.trancount == 1:
            session.trancount = 0
            session.transaction_names.clear()
            await session.broker(session.connection().commit())
        else:
            session.trancount -= 1
            session.transaction_names.pop()
        return
    # ROLLBACK
    if session.trancount == 0:
        raise SqlError(
            3903, "The ROLLBACK TRANSACTION request has no corresponding BEGIN TRANSACTION."
        )
    name = await _name(statement.name, frame)
    if name is not None and name != session.transaction_names[0]:
        if session.doomed:
            raise SqlError(
                3931,
                "The current transaction cannot be committed and cannot be rolled back to"
                " a savepoint. Roll back the entire transaction.",
            )
        try:
            await session.connection().rollback_to_savepoint(name)
        except client.TransactionError:
            raise SqlError(
                6401,
                f"Cannot roll back {name}. No transaction or savepoint of that name was found.",
            ) from None
        except client.BrokerError as exc:
            raise from_broker(exc) from None
        return
    await rollback_all(session)


async def _name(name: str | None, frame: Frame) -> str | None:
    """A transaction or savepoint name as written, or a variable's value."""
    if name is None or not name.startswith("@"):
        return name
    slot = frame.variables.get(name)
    return None if slot is None or slot.value.data is None else t.to_text(slot.value)


async def rollback_all(session: Session) -> None:
    """ROLLBACK: all of the transaction, whatever its depth."""
    session.trancount = 0
    session.transaction_names.clear()
    session.doomed = False
    await session.broker(session.connection().rollback())


Handler = Callable[[Any, Any, Any], Coroutine[Any, Any, None]]
TRANSACTION_STATEMENTS: Final[dict[type, Handler]] = {ast.Transaction: transaction}
