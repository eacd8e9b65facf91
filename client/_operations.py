"""The broker operations both connections offer, listed once.

Theory of operation. Every broker operation is a pure request builder in `_calls`: it
checks its arguments and returns a `Call`. `Operations` lists the builders once, each
as an `operation`, and both connection classes inherit it: the async `Connection`,
whose `call` is a coroutine, and the blocking `SyncConnection`, whose `call` returns
the answer. When a connection class is defined, `Operations.__init_subclass__` gives
it one plain method per operation, of its own kind (`await self.call(build(...))` or
`self.call(build(...))`) and with the builder's name, signature and docstring, so a
call costs no more than a hand-written method. Type checkers read the same table
through `operation.__get__`: on a connection whose `call` is async a method returns
an awaitable of the answer, on one whose `call` blocks the answer itself.

What the two report about their session's transaction (`settled`, `transaction_id`)
lives here too, over the `Tracker` both keep; run_transaction's retry policy is
`_recovery.Retries`.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

from ssb.protocol import Welcome

from . import _calls as calls
from . import _calls_databases as databases
from . import _calls_tables as tables
from ._calls import Call
from ._recovery import DEFAULT_RETRIES, Options, Tracker, opened_database

P = ParamSpec("P")
T = TypeVar("T")


class _Blocking(Protocol):
    def call(self, request: Call[T]) -> T: ...


class _Async(Protocol):
    async def call(self, request: Call[T]) -> T: ...


class operation(Generic[P, T]):
    """A request builder of `_calls` as a method of both connection classes."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, connection: None, owner: type[Any]) -> operation[P, T]: ...

    @overload
    def __get__(self, connection: _Blocking, owner: type[Any]) -> Callable[P, T]: ...

    @overload
    def __get__(
        self, connection: _Async, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, connection: object, owner: type[Any]) -> Any:
        # reached only through Operations itself: a connection class has its own methods
        return self

    def method(self, owner: type[Any]) -> Callable[..., Any]:
        """The method of connection class `owner`: async when its `call` is."""
        build = self.build
        method: Callable[..., Any]
        if inspect.iscoroutinefunction(owner.call):

            async def method(self: _Async, /, *args: Any, **kwargs: Any) -> Any:
                return await self.call(build(*args, **kwargs))

        else:

            def method(self: _Blocking, /, *args: Any, **kwargs: Any) -> Any:
                return self.call(build(*args, **kwargs))

        functools.update_wrapper(method, build)  # name, docstring; help() shows its signature
        method.__qualname__ = f"{owner.__qualname__}.{build.__name__}"
        method.__module__ = owner.__module__
        return method


class Operations:
    """What both connections offer: each broker operation, what they report about their
    session's transaction, and the documentation of the methods each implements in its
    own kind (`call`, `transaction`, `run_transaction`, `transaction_outcome`, `close`)."""

    url: str
    server: str
    broker_instance_id: str
    max_message_size: int
    reconnects: int
    _options: Options
    _tracker: Tracker

    def _open_session(self, welcome: Welcome, url: str, options: Options, database: str) -> None:
        """Keep what both connections know of their session from its start: the broker's
        welcome, the URL and options it was opened with, and its tracker, in the database
        the broker opened it in (`database`: the one asked for, "" for the default)."""
        self.broker_instance_id = welcome.broker_instance
        self.server = welcome.server
        self.max_message_size = welcome.max_message_size
        self.url = url
        self._options = options
        self._tracker = Tracker(opened_database(welcome, database))
        self.reconnects = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, declared in vars(Operations).items():
            if isinstance(declared, operation):
                setattr(cls, name, declared.method(cls))

    @property
    def settled(self) -> dict[str, int]:
        """How many requests whose answers were lost were settled, by "operation outcome"
        (e.g. "commit committed": the commit happened though its answer was lost)."""
        return dict(self._tracker.settled)

    @property
    def database(self) -> str:
        """The session's current database (`use` changes it; a reconnect keeps it)."""
        return self._tracker.database

    @property
    def transaction_id(self) -> uuid.UUID | None:
        """The id of this connection's open transaction (None outside one)."""
        txn = self._tracker.txn
        return None if txn is None else txn.id

    # ---- what each connection implements in its own kind (awaitable or blocking),
    # documented here once

    def call(self, request: Call[Any]) -> Any:
        """Send one request and return its answer (settling it after a lost connection)."""
        raise NotImplementedError

    def transaction_outcome(self, txn_id: uuid.UUID | str) -> Any:
        """ "committed", "rolled_back" or "unknown" (older than the broker's window) for a
        transaction (or statement outside one) of this login; "open" for one still open
        here or detached. Asking fixes the answer: that id can never commit afterwards."""
        raise NotImplementedError

    def transaction(self) -> Any:
        """BEGIN TRANSACTION, the block, then COMMIT (ROLLBACK if the block raises).

        BEGIN leaves in one write with the block's first request, and its answer is taken
        at the block's end rather than before it (a round trip fewer), when nothing can
        make the broker refuse it: this session has no transaction open by its own
        record, the connection is up, and nothing lost waits to be settled. A plain BEGIN
        is refused only while a transaction is open, so whatever the block sent behind it
        never runs by itself; the refusal is raised at the block's end, as it would have
        been at its start, and nothing is rolled back.
        """
        raise NotImplementedError

    def run_transaction(self, fn: Any, retries: int = DEFAULT_RETRIES) -> Any:
        """Run `fn(conn)` in a transaction (awaiting it, on an async connection) and
        commit; return what it returned once the commit is known to have happened.

        It runs again (up to `retries` more times) only when the transaction is known to
        have been rolled back: the connection dropped before the commit was applied, or a
        lock wait timed out. Any other error rolls back and is raised; so is the last one
        when the retries run out, and `OutcomeUnknownError` when the broker can no longer
        tell whether the commit happened.
        """
        raise NotImplementedError

    def close(self) -> Any:
        """Close the connection; an open transaction is rolled back by the broker."""
        raise NotImplementedError

    def _outcome_request(self, txn_id: uuid.UUID | str, now: float) -> Call[tuple[str, str]]:
        """`transaction_outcome` of `txn_id`, saying how long ago this client sent it."""
        ident = txn_id if isinstance(txn_id, uuid.UUID) else uuid.UUID(str(txn_id))
        return calls.transaction_outcome(ident, self._tracker.age(ident, now))

    # ---- the operations (see _calls for each one's documentation) ------------------

    create_message_type = operation(calls.create_message_type)
    alter_message_type = operation(calls.alter_message_type)
    create_contract = operation(calls.create_contract)
    create_queue = operation(calls.create_queue)
    alter_queue = operation(calls.alter_queue)
    create_service = operation(calls.create_service)
    alter_service = operation(calls.alter_service)
    create_route = operation(calls.create_route)
    alter_route = operation(calls.alter_route)
    create_broker_priority = operation(calls.create_broker_priority)
    alter_broker_priority = operation(calls.alter_broker_priority)
    create_event_notification = operation(calls.create_event_notification)
    drop_message_type = operation(calls.drop_message_type)
    drop_contract = operation(calls.drop_contract)
    drop_queue = operation(calls.drop_queue)
    drop_service = operation(calls.drop_service)
    drop_route = operation(calls.drop_route)
    drop_broker_priority = operation(calls.drop_broker_priority)
    drop_event_notification = operation(calls.drop_event_notification)
    begin_dialog = operation(calls.begin_dialog)
    send = operation(calls.send)
    send_many = operation(calls.send_many)
    end_conversation = operation(calls.end_conversation)
    begin_conversation_timer = operation(calls.begin_conversation_timer)
    move_conversation = operation(calls.move_conversation)
    receive = operation(calls.receive)
    get_conversation_group = operation(calls.get_conversation_group)
    begin_transaction = operation(calls.begin_transaction)
    commit = operation(calls.commit)
    rollback = operation(calls.rollback)
    save_transaction = operation(calls.save_transaction)
    rollback_to_savepoint = operation(calls.rollback_to_savepoint)
    detach_transaction = operation(calls.detach_transaction)
    attach_transaction = operation(calls.attach_transaction)
    commit_transaction = operation(calls.commit_transaction)
    rollback_transaction = operation(calls.rollback_transaction)
    requeue_dead_letter = operation(calls.requeue_dead_letter)
    view = operation(calls.view)
    peek = operation(calls.peek)
    broker_instance = operation(calls.broker_instance)
    ping = operation(calls.ping)
    broker_certificate = operation(calls.broker_certificate)
    check_procedure = operation(calls.check_procedure)
    create_certificate = operation(calls.create_certificate)
    drop_certificate = operation(calls.drop_certificate)
    next_broker_certificate = operation(calls.next_broker_certificate)
    rotate_broker_certificate = operation(calls.rotate_broker_certificate)
    create_remote_service_binding = operation(calls.create_remote_service_binding)
    drop_remote_service_binding = operation(calls.drop_remote_service_binding)
    create_login = operation(calls.create_login)
    alter_login = operation(calls.alter_login)
    drop_login = operation(calls.drop_login)
    grant = operation(calls.grant)
    revoke = operation(calls.revoke)
    attach_task = operation(calls.attach_task)
    log_task = operation(calls.log_task)
    log_task_start = operation(calls.log_task_start)
    log_task_end = operation(calls.log_task_end)
    register_task = operation(calls.register_task)
    end_task = operation(calls.end_task)
    request_stop = operation(calls.request_stop)
    label_job = operation(calls.label_job)
    transaction_messages = operation(calls.transaction_messages)
    use = operation(databases.use)
    create_database = operation(databases.create_database)
    drop_database = operation(databases.drop_database)
    alter_database = operation(databases.alter_database)
    create_procedure = operation(databases.create_procedure)
    alter_procedure = operation(databases.alter_procedure)
    procedure = operation(databases.procedure)
    drop_procedure = operation(databases.drop_procedure)
    execute = operation(tables.execute)
    executemany = operation(tables.executemany)
    fetch_rows = operation(tables.fetch_rows)
