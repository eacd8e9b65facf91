"""Sessions, transactions, detached transactions and conversation-group locks.

Theory of operation. A session is one client connection. It runs at most one
transaction at a time: explicit (BEGIN TRANSACTION ... COMMIT/ROLLBACK) or implicit
(one statement that commits on its own). A transaction owns the conversation-group
locks it took, the messages it received (to put back on rollback), the endpoints it
began (to forget on rollback) and its deferred actions: SEND, END CONVERSATION, timers
and moves take effect, in statement order, only when it commits. Nothing a transaction
does is visible to other sessions before commit except the locks themselves.

What commit and rollback *do* belongs to the rest of the core; this module calls it
through `TransactionHooks`: `check_commit` may refuse an explicit transaction's commit
before anything is applied (a quota filled meanwhile; a one-statement transaction was
checked at its statement), `apply_commit` applies it, `undo` puts received
messages back, `after_rollback` runs once the locks are free (poison detection), and
`released` hears of every queue whose lock was let go (its waiters may now proceed).

Locks. A statement that touches a conversation group locks it for the transaction; a
group locked by another transaction makes the statement wait up to `lock_timeout`
(then LockTimeoutError). Waiting statements return a coroutine; the rest return
their value at once, so the common case costs no task.

A detached transaction has an id, outlives its session (a dropped connection does not
roll it back), can be attached, committed or rolled back from any session, and rolls
back by itself when nobody finishes it within its timeout.

Outcomes. A transaction may carry an id its client chose (`txn_id` at BEGIN, or `txn`
on a statement outside a transaction); a detached one carries its own. Committing a
named transaction records its id in the same batch (see `outcomes`), and
`transaction_outcome` tells a reconnected client whether it committed. Before it
answers, the id is fenced: another session of the login still running that
transaction or statement (a connection the broker has not yet seen drop) is aborted,
and the id can never begin again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Final, Protocol, TypeAlias, TypeVar, Union

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument, not_found
from .conversations import Endpoint
from .names import DEFAULT_DATABASE
from .outcomes import Outcome, Outcomes
from .ports import Cancellable, Clock, durable
from .queues import Group, Message, Queue

log = logging.getLogger("ssb.core")

T = TypeVar("T")
MaybeAwaitable: TypeAlias = Union[T, Awaitable[T]]  # noqa: UP007 - a generic alias

DETACHED_TIMEOUT: Final = 300.0
DEFAULT_MAX_LOCKS: Final = 100_000
DEFAULT_MAX_DETACHED: Final = 1_000
MAX_TIMEOUT: Final = 366 * 24 * 3600.0  # a year and a day: any wait or timer beyond is a typo

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
    group: uuid.UUID


Action = Send | End | Timer | Move
MAX_SAVEPOINT_NAME: Final = 32  # SQL Server's limit on a savepoint's name
MAX_SAVEPOINTS: Final = 10_000


@dataclass(frozen=True, slots=True)
class Savepoint:
    """SAVE TRANSACTION: how much of its transaction came before it."""

    name: str
    received: int  # RECEIVEs (entries of `received`)
    new_endpoints: int
    actions: int
    ended: frozenset[uuid.UUID]
    table_statements: int = 0


@dataclass(slots=True, eq=False)
class Transaction:
    session: Session
    explicit: bool
    locks: dict[uuid.UUID, tuple[Queue, Group]] = field(default_factory=dict)
    received: list[tuple[Queue, list[Message]]] = field(default_factory=list)
    new_endpoints: list[Endpoint] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    ended: set[uuid.UUID] = field(default_factory=set)
    # a detached transaction has an id, outlives its session and can be finished by any
    ident: uuid.UUID | None = None
    expires: float | None = None
    # what a rollback put back, by queue, for the poison rules that run after it
    restored: list[tuple[Queue, list[Message]]] = field(default_factory=list)
    # the id its commit is recorded under (the client's, or the detached id) and whose
    txn_id: uuid.UUID | None = None
    login: str = ""
    savepoints: list[Savepoint] = field(default_factory=list)
    # its statements on users' tables, with their values (see `tables`)
    table_statements: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    # a statement or its COMMIT was refused for want of room (disk space, a queue's
    # quota): its rollback is no sign of a poison message
    refused_for_room: bool = False

    def received_messages(self) -> list[Message]:
        return [m for _, messages in self.received for m in messages]


@dataclass(slots=True, eq=False)
class Session:
    user: str = ""
    peer: str = ""
    database: str = DEFAULT_DATABASE  # the current database (USE), its canonical name
    ident: int = field(default_factory=lambda: next(_session_ids))
    txn: Transaction | None = None
    closed: bool = False
    waiting: Any = None  # the Waiter this session is blocked in, for views
    task: Any = None  # an activated task's identity, when a worker connects as one
    statement: uuid.UUID | None = None  # the named statement running outside a transaction
    # set by an operation whose answer shows only rows of store batches up to this one
    # (RECEIVE in a transaction, BEGIN): the answer need not wait for everything applied
    # since. None: it may show anything applied so far. The client port clears it.
    answer_after: int | None = None
    # closes the session's connection at once (set by the client port); None: just close
    abort: Callable[[str], None] | None = None


class TransactionHooks(Protocol):
    def check_commit(self, txn: Transaction) -> None: ...

    def apply_commit(self, txn: Transaction) -> None: ...

    def undo(self, txn: Transaction, error: str) -> None: ...

    def undo_to(self, txn: Transaction, savepoint: Savepoint) -> None:
        """Undo what `txn` did after `savepoint` (its locks stay)."""

    def after_rollback(self, txn: Transaction, error: str) -> None: ...

    def released(self, queue: Queue) -> None: ...

    def session_closed(self, session: Session) -> None: ...


def as_uuid(value: object, what: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    if isinstance(value, bytes) and len(value) == 16:
        return uuid.UUID(bytes=value)
    raise bad_argument(f"{what} must be a UUID, got {value!r}")


def as_seconds(value: object, what: str, allow_none: bool = False) -> float | None:
    """A duration from a client: a finite number of seconds, 0..MAX_TIMEOUT."""
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value <= MAX_TIMEOUT
    ):
        raise bad_argument(
            f"{what} must be a number of seconds from 0 to {MAX_TIMEOUT:g}, got {value!r}"
        )
    return float(value)


@dataclass(eq=False)
class Transactions:
    """Every session and transaction of the broker, and the locks they hold."""

    clock: Clock
    hooks: TransactionHooks
    lock_timeout: float
    outcomes: Outcomes
    # bounds on what one client can hold ([limits] in the config)
    max_locks: int = DEFAULT_MAX_LOCKS  # conversation-group locks per transaction
    max_detached: int = DEFAULT_MAX_DETACHED  # open detached transactions per login
    sessions: dict[int, Session] = field(init=False, default_factory=dict)
    detached: dict[uuid.UUID, Transaction] = field(init=False, default_factory=dict)
    _expiry: dict[uuid.UUID, Cancellable] = field(init=False, default_factory=dict)

    def taken(self) -> dict[int, Message]:
        """Messages received by open transactions (attached or detached), by queuing
        order: what a look at a queue leaves out."""
        txns = [s.txn for s in self.sessions.values() if s.txn is not None]
        txns += [t for t in self.detached.values() if t not in txns]
        return {
            m.queuing_order: m for txn in txns for _, messages in txn.received for m in messages
        }

    # ---- sessions ----------------------------------------------------------------------

    def open_session(self, user: str, peer: str) -> Session:
        session = Session(user=user, peer=peer)
        self.sessions[session.ident] = session
        return session

    def close_session(self, session: Session) -> None:
        """A dropped connection rolls back whatever it had open (not a detached one)."""
        session.closed = True
        txn = session.txn
        session.txn = None
        if txn is not None and txn.ident is None:
            self.rollback_now(txn, "the connection was closed with the transaction open")
        self.sessions.pop(session.ident, None)
        self.hooks.session_closed(session)

    # ---- the statement's transaction ----------------------------------------------------------

    def current(self, session: Session) -> Transaction:
        """The session's open transaction, or a new implicit one for this statement."""
        return session.txn if session.txn is not None else Transaction(session, explicit=False)

    def finish(self, txn: Transaction) -> None:
        """End a statement: an implicit transaction commits on its own."""
        if not txn.explicit:
            self.commit_now(txn)

    def commit_now(self, txn: Transaction) -> None:
        if txn.explicit:  # a one-statement transaction checked everything at its statement
            try:
                self.hooks.check_commit(txn)
            except BrokerError:
                self.rollback_now(txn, "")
                raise
        self.hooks.apply_commit(txn)
        if txn.txn_id is not None:
            self.outcomes.record(txn.login, txn.txn_id)
        self.release(txn)

    def rollback_now(self, txn: Transaction, error: str) -> None:
        self.hooks.undo(txn, error)
        self.release(txn)
        self.hooks.after_rollback(txn, error)

    # ---- BEGIN / COMMIT / ROLLBACK -----------------------------------------------------------------

    def begin_transaction(
        self,
        session: Session,
        detached: object = False,
        timeout: object = None,
        txn_id: object = None,
    ) -> uuid.UUID | None:
        if session.txn is not None:
            raise BrokerError(
                ErrorCode.TRANSACTION_ACTIVE,
                "a transaction is already open on this connection; commit or roll it back first",
            )
        if not isinstance(detached, bool):
            raise bad_argument("detached must be True or False")
        seconds = as_seconds(timeout, "timeout", allow_none=True)
        if seconds is not None and not detached:
            raise bad_argument(
                "timeout is how long a detached transaction may stay open: give it with"
                " detached=True (an ordinary transaction has none)"
            )
        if detached:
            mine = sum(1 for t in self.detached.values() if t.session.user == session.user)
            if mine >= self.max_detached:
                raise BrokerError(
                    ErrorCode.TOO_MANY_TRANSACTIONS,
                    f"login '{session.user}' has {mine} open detached transactions, the limit"
                    " ([limits] detached_per_login); commit or roll some back first",
                )
        name = None if txn_id is None else as_uuid(txn_id, "txn_id")
        if name is not None:
            if detached:
                raise bad_argument("a detached transaction is named by the broker; drop txn_id")
            self._check_unresolved(session, name)
        txn = Transaction(session, explicit=True, txn_id=name, login=session.user)
        if detached:
            seconds = DETACHED_TIMEOUT if seconds is None else seconds
            ident = txn.ident = txn.txn_id = uuid.uuid4()
            txn.expires = self.clock.time() + seconds
            self.detached[ident] = txn
            self._expiry[ident] = self.clock.call_at(txn.expires, lambda: self._expire(ident))
        session.txn = txn
        session.answer_after = 0  # a new transaction shows nothing stored
        return txn.ident

    def commit(self, session: Session) -> None:
        txn = self._explicit(session, "commit")
        session.txn = None
        self._forget_detached(txn)
        self.commit_now(txn)

    def rollback(self, session: Session, error: object = None) -> None:
        txn = self._explicit(session, "roll back")
        text = self._error_text(error)
        session.txn = None
        self._forget_detached(txn)
        self.rollback_now(txn, text)

    @staticmethod
    def _error_text(error: object) -> str:
        if error is not None and not isinstance(error, str):
            raise bad_argument("rollback error must be a text saying what went wrong")
        return (error or "")[:4000]

    def _explicit(self, session: Session, verb: str) -> Transaction:
        if session.txn is None:
            raise BrokerError(
                ErrorCode.NO_TRANSACTION,
                f"there is no open transaction to {verb}; call begin_transaction() first",
            )
        return session.txn

    # ---- savepoints ------------------------------------------------------------------------------

    def save_transaction(self, session: Session, name: object) -> None:
        """SAVE TRANSACTION: a point of the open transaction to roll back to."""
        txn = self._explicit(session, "save")
        if not isinstance(name, str) or not 0 < len(name) <= MAX_SAVEPOINT_NAME:
            raise bad_argument(
                f"a savepoint's name has 1 to {MAX_SAVEPOINT_NAME} characters, got {name!r}"
            )
        if len(txn.savepoints) >= MAX_SAVEPOINTS:
            raise bad_argument(
                f"this transaction already has {MAX_SAVEPOINTS} savepoints; commit it and go"
                " on in a new one"
            )
        savepoint = Savepoint(
            name,
            len(txn.received),
            len(txn.new_endpoints),
            len(txn.actions),
            frozenset(txn.ended),
            len(txn.table_statements),
        )
        if txn.savepoints and txn.savepoints[-1].name == name:
            # the one it hides could never be rolled back to again: it goes
            txn.savepoints[-1] = savepoint
        else:
            txn.savepoints.append(savepoint)

    def rollback_to_savepoint(self, session: Session, name: object) -> None:
        """ROLLBACK TRANSACTION savepoint: undo what the transaction did since its latest
        savepoint of that name, which stays (later ones go); the transaction, and every
        lock it holds, stay."""
        txn = self._explicit(session, "roll back to a savepoint")
        found = next(
            (i for i in range(len(txn.savepoints) - 1, -1, -1) if txn.savepoints[i].name == name),
            None,
        )
        if found is None:
            raise BrokerError(
                ErrorCode.UNKNOWN_SAVEPOINT,
                f"there is no savepoint {name!r} in this transaction; save_transaction(name)"
                " makes one",
            )
        savepoint = txn.savepoints[found]
        del txn.savepoints[found + 1 :]
        self.hooks.undo_to(txn, savepoint)
        del txn.actions[savepoint.actions :]
        txn.ended = set(savepoint.ended)

    # ---- outcomes --------------------------------------------------------------------------------

    def _check_unresolved(self, session: Session, name: uuid.UUID) -> None:
        if self.outcomes.fenced(session.user, name):
            log.info(
                "refusing transaction %s of '%s' from %s: its outcome was already given;"
                " closing that connection",
                name,
                session.user,
                session.peer,
            )
            raise BrokerError(
                ErrorCode.TRANSACTION_RESOLVED,
                f"transaction {name} was already resolved as not committed for a reconnecting"
                " client; it cannot run now (this connection is closed)",
            )

    def begin_statement(self, session: Session, txn: object) -> uuid.UUID:
        """A statement outside a transaction, named `txn`, starts."""
        if session.txn is not None:
            raise bad_argument(
                "txn names a statement outside a transaction; inside one, the transaction's"
                " id (begin_transaction txn_id) names it"
            )
        name = as_uuid(txn, "txn")
        self._check_unresolved(session, name)
        session.statement = name
        return name

    def end_statement(self, session: Session, name: uuid.UUID, done: bool) -> None:
        """The named statement ended; `done`: it succeeded, and its effects are in the
        open batch (its record joins them)."""
        session.statement = None
        if done:
            self.outcomes.record(session.user, name)

    async def transaction_outcome(
        self, session: Session, txn_id: object, age: object = None
    ) -> list[Any]:
        """Operation: [outcome, why] for the login's transaction or statement `txn_id`.

        `age`: at most how many seconds ago the client sent its commit (None: unknown).
        """
        name = as_uuid(txn_id, "txn_id")
        seconds = as_seconds(age, "age", allow_none=True)
        detached = self.detached.get(name)
        if detached is not None and detached.login == session.user:
            return ["open", "the detached transaction is still open"]
        mine = session.txn
        if mine is not None and mine.txn_id == name:
            return ["open", "it is this connection's open transaction"]
        for other in list(self.sessions.values()):
            if other is session or other.user != session.user:
                continue
            running = other.txn is not None and other.txn.txn_id == name
            if running or other.statement == name:
                log.info(
                    "transaction %s of '%s' is resolved for %s: closing the connection %s"
                    " still running it",
                    name,
                    session.user,
                    session.peer,
                    other.peer,
                )
                self._abort(other, f"transaction {name} was resolved by another connection")
        self.outcomes.fence(session.user, name)
        await durable(self.outcomes.journal, self.clock)
        outcome: Outcome = self.outcomes.lookup(session.user, name, seconds)
        why = self.outcomes.describe_unknown(seconds) if outcome == "unknown" else ""
        log.info(
            "transaction %s of '%s': %s (asked by %s)", name, session.user, outcome, session.peer
        )
        return [outcome, why]

    def _abort(self, session: Session, reason: str) -> None:
        if session.abort is not None:
            session.abort(reason)
        if not session.closed:
            self.close_session(session)

    # ---- detached transactions ---------------------------------------------------------------------

    def _detached(
        self, transaction_id: object, gone: str = "it was committed, rolled back, or expired"
    ) -> Transaction:
        """The detached transaction `transaction_id`; `gone`: why it may not be found."""
        ident = as_uuid(transaction_id, "transaction_id")
        txn = self.detached.get(ident)
        if txn is None:
            raise not_found(ErrorCode.NO_TRANSACTION, "transaction", ident, gone)
        return txn

    def _forget_detached(self, txn: Transaction) -> None:
        if txn.ident is not None:
            self.detached.pop(txn.ident, None)
            timer = self._expiry.pop(txn.ident, None)
            if timer is not None:
                timer.cancel()
            if txn.session.txn is txn:
                txn.session.txn = None

    def detach_transaction(self, session: Session) -> uuid.UUID:
        txn = self._explicit(session, "detach")
        if txn.ident is None:
            raise BrokerError(
                ErrorCode.NO_TRANSACTION,
                "only a transaction begun with detached=True can be detached",
            )
        session.txn = None
        return txn.ident

    def attach_transaction(self, session: Session, transaction_id: object) -> None:
        txn = self._detached(transaction_id)
        if session.txn is not None:
            raise BrokerError(
                ErrorCode.TRANSACTION_ACTIVE,
                "this connection already has a transaction open; finish or detach it first",
            )
        if txn.session.txn is txn and txn.session is not session:
            raise BrokerError(
                ErrorCode.TRANSACTION_ACTIVE,
                f"transaction {txn.ident} is attached to another connection",
            )
        txn.session = session
        session.txn = txn

    def commit_transaction(self, session: Session, transaction_id: object) -> None:
        txn = self._detached(transaction_id)
        self._forget_detached(txn)
        self.commit_now(txn)

    def rollback_transaction(
        self, session: Session, transaction_id: object, error: object = None
    ) -> None:
        txn = self._detached(transaction_id)
        text = self._error_text(error)
        self._forget_detached(txn)
        self.rollback_now(txn, text)

    def transaction_messages(self, session: Session, transaction_id: object) -> list[Message]:
        """What a detached transaction received, in receive order (it changes nothing)."""
        txn = self._detached(
            transaction_id,
            "it was committed, rolled back, or expired (its messages went back to their queue)",
        )
        return txn.received_messages()

    def _expire(self, ident: uuid.UUID) -> None:
        self._expiry.pop(ident, None)
        txn = self.detached.get(ident)
        if txn is not None:
            log.info("detached transaction %s expired; rolling it back", ident)
            self._forget_detached(txn)
            self.rollback_now(txn, f"transaction {ident} expired before it was committed")

    # ---- locks -----------------------------------------------------------------------------

    @staticmethod
    def lockable(txn: Transaction, queue: Queue, group_id: uuid.UUID) -> bool:
        group = queue.groups.get(group_id)
        return group is None or group.owner is None or group.owner is txn

    @staticmethod
    def _owner(queue: Queue, group_id: uuid.UUID) -> object | None:
        group = queue.groups.get(group_id)
        return None if group is None else group.owner

    def room(self, txn: Transaction, new: int) -> None:
        """Refuse, before anything is applied, `new` more locks beyond the limit."""
        if new and len(txn.locks) + new > self.max_locks:
            raise BrokerError(
                ErrorCode.TOO_MANY_LOCKS,
                f"this transaction already holds {len(txn.locks)} conversation-group locks,"
                " the limit ([limits] locks_per_transaction); commit it and go on in a new one",
            )

    @staticmethod
    def lock(txn: Transaction, queue: Queue, group_id: uuid.UUID) -> Group:
        group = queue.group(group_id)
        if group.owner is not txn:
            group.owner = txn
            txn.locks[group.id] = (queue, group)
            queue.touch(group)
        return group

    def locked(
        self, txn: Transaction, targets: list[tuple[Queue, uuid.UUID]], act: Callable[[], T]
    ) -> MaybeAwaitable[T]:
        """Run `act` holding the lock of every target (queue, group id), waiting if needed."""
        if len(txn.locks) + len(targets) > self.max_locks:  # near the limit: count exactly
            self.room(txn, sum(1 for q, g in targets if self._owner(q, g) is not txn))
        if all(self.lockable(txn, q, g) for q, g in targets):
            for queue, group_id in targets:
                self.lock(txn, queue, group_id)
            return act()
        return self._wait_locks(txn, targets, act)

    async def _wait_locks(
        self, txn: Transaction, targets: list[tuple[Queue, uuid.UUID]], act: Callable[[], T]
    ) -> T:
        deadline = self.clock.time() + self.lock_timeout
        while True:
            blocked = next((g for q, g in targets if not self.lockable(txn, q, g)), None)
            if blocked is None:
                break
            queue = next(q for q, g in targets if g == blocked)
            remaining = deadline - self.clock.time()
            if remaining <= 0 or txn.session.closed:
                raise BrokerError(
                    ErrorCode.LOCK_TIMEOUT,
                    f"conversation group {blocked} stayed locked by another transaction for "
                    f"{self.lock_timeout:g} s; retry, or commit the transaction holding it",
                )
            await self.wait(queue.group(blocked).lock_waiters, remaining)
        for queue, group_id in targets:
            self.lock(txn, queue, group_id)
        return act()

    async def wait(self, waiters: list[Callable[[], None]], timeout: float) -> None:
        """Wait until one of `waiters` is called, or `timeout` seconds."""
        future: asyncio.Future[None] = self.clock.create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        waiters.append(wake)
        timer = self.clock.call_at(self.clock.time() + timeout, wake)
        try:
            await future
        finally:
            timer.cancel()
            if wake in waiters:
                waiters.remove(wake)

    def release(self, txn: Transaction) -> None:
        touched: dict[str, Queue] = {}
        for queue, group in txn.locks.values():
            group.owner = None
            queue.touch(group)
            waiters, group.lock_waiters = group.lock_waiters, []
            for wake in waiters:
                wake()
            queue.drop_if_idle(group)
            touched[queue.name] = queue
        txn.locks.clear()
        for queue in touched.values():
            self.hooks.released(queue)
