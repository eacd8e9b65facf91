"""Sessions and their transactions.

A session is one client connection. It runs at most one transaction at a time:
explicit (BEGIN TRANSACTION ... COMMIT/ROLLBACK) or implicit (one statement that
commits on its own). A transaction owns the conversation-group locks it took, the
messages it received (to put back on rollback), the endpoints it began (to forget on
rollback) and its deferred actions: SEND, END CONVERSATION, timers and moves take
effect, in statement order, only when it commits. Nothing a transaction does is
visible to other sessions before commit except the locks themselves.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Final

from ._conversations import Endpoint
from ._queues import Group, Message, Queue

_session_ids: Final = count(1)


@dataclass(slots=True, eq=False)
class Send:
    endpoint: Endpoint
    message_type: str
    validation: str
    bodies: list[bytes]


@dataclass(slots=True, eq=False)
class End:
    endpoint: Endpoint
    error: int | None = None
    description: str = ""
    cleanup: bool = False


@dataclass(slots=True, eq=False)
class Timer:
    endpoint: Endpoint
    timeout: float


@dataclass(slots=True, eq=False)
class Move:
    endpoint: Endpoint
    group: Group


Action = Send | End | Timer | Move


@dataclass(slots=True, eq=False)
class Transaction:
    session: Session
    explicit: bool
    locks: dict[uuid.UUID, tuple[Queue, Group]] = field(default_factory=dict)
    received: list[tuple[Queue, Group, list[Message]]] = field(default_factory=list)
    new_endpoints: list[Endpoint] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    ended: set[uuid.UUID] = field(default_factory=set)
    # a detached transaction has an id, outlives its session and can be finished by any
    ident: uuid.UUID | None = None
    expires: float | None = None
    error: str = ""

    def holds(self, group: Group) -> bool:
        return group.owner is self


@dataclass(slots=True, eq=False)
class Session:
    user: str = ""
    peer: str = ""
    ident: int = field(default_factory=lambda: next(_session_ids))
    txn: Transaction | None = None
    closed: bool = False
    waiting: Any = None  # the Waiter this session is blocked in, for views
    # an activated task's identity (queue, task id) when a worker connects as one
    task: Any = None
