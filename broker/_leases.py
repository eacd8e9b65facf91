"""Leases: what a detached transaction holds, for readers in other processes.

Theory of operation. A detached transaction that received messages keeps them
leased: neither redelivered nor deleted until it commits, rolls back or expires.
The Spark streaming source receives a micro-batch's messages in one such
transaction while Spark plans the batch, and reads them later, in another process
(a Spark task), possibly after a restart of the query: `transaction_messages`
returns the messages a detached transaction received, as RECEIVE rows in the order
they were received, without changing anything. Reading them again gives the same
rows, so a re-run micro-batch sees exactly what the first run saw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ssb.protocol import ErrorCode

from ._daemon import START_HOOKS
from ._engine import _as_uuid
from ._errors import not_found
from ._transactions import Session

if TYPE_CHECKING:
    from ._daemon import Broker
    from ._engine import Engine


def transaction_messages(engine: Engine, transaction_id: object) -> list[list[Any]]:
    """The messages detached transaction `transaction_id` received, in receive order."""
    ident = _as_uuid(transaction_id, "transaction_id")
    txn = engine.detached.get(ident)
    if txn is None:
        raise not_found(
            ErrorCode.NO_TRANSACTION,
            "transaction",
            ident,
            "it was committed, rolled back, or expired (its messages went back to their queue)",
        )
    return [m.wire() for _, _, messages in txn.received for m in messages]


async def start(broker: Broker) -> None:
    """Start hook: install the lease operations."""
    engine = broker.engine

    def operation(session: Session, transaction_id: object) -> list[list[Any]]:
        return transaction_messages(engine, transaction_id)

    broker.operations.add("transaction_messages", operation)


START_HOOKS.append(start)
