"""The broker core: dialogs, SEND, RECEIVE, transactions, timers and the catalog.

Theory of operation. Everything runs on the event loop thread, so each operation is
atomic with respect to the others: it checks all its input first, then mutates
memory and appends its store writes in one synchronous stretch (see `_store`).
Operations that must wait (RECEIVE ... WAITFOR, a lock held by another transaction)
return a coroutine instead of a value; the server awaits it.

Transactions (see `_transactions`): RECEIVE takes messages out of their group and
locks the group until the transaction ends; SEND, END CONVERSATION, timers and MOVE
lock their endpoint's group and are deferred until COMMIT, where they are applied in
statement order. ROLLBACK puts received messages back where they were and counts a
delivery against each. A statement outside an explicit transaction commits at once.

Delivery: a message to a service on this broker goes straight into the target
queue (creating the target endpoint with the first message); if that queue is OFF,
or messages of the same conversation direction are already waiting, it waits in the
transmission queue, in order, until the queue is ON again. Messages for services
elsewhere wait in the transmission queue for the broker-to-broker transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Final, TypeAlias, TypeVar, Union
from xml.sax.saxutils import escape

from ssb.protocol import ErrorCode

from . import _catalog as cat
from ._catalog import Catalog, QueueDef
from ._conversations import CAN_SEND, ENDED_BY_FAR_SIDE, Endpoint, Event, State
from ._errors import BrokerError, bad_argument, not_found
from ._poison import PoisonHandler
from ._priorities import assign_level
from ._queues import Group, Message, Queue
from ._store import Store
from ._transactions import End, Move, Send, Session, Timer, Transaction
from ._validation import validate_body

log = logging.getLogger("ssb.engine")

T = TypeVar("T")
MaybeAwaitable: TypeAlias = Union[T, Awaitable[T]]  # noqa: UP007 - a generic alias

POISON_ROLLBACKS: Final = 5
LIFETIME_ERROR_CODE: Final = -8489
LIFETIME_ERROR_TEXT: Final = "The conversation dialog has exceeded the lifetime."
MAX_LIFETIME: Final = 2**31 - 1
DETACHED_TIMEOUT: Final = 300.0
_SYSTEM_TYPES: Final = frozenset({cat.END_DIALOG, cat.ERROR})


@dataclass(slots=True, eq=False)
class Outbound:
    """A sequenced message waiting in the transmission queue."""

    id: int
    handle: uuid.UUID
    conversation_id: uuid.UUID
    to_service: str
    to_broker_instance: str | None
    from_service: str
    contract: str
    is_initiator: bool
    seq: int
    message_type: str
    validation: str
    body: bytes
    enqueue_time: float
    priority: int
    status: str = ""
    extra: bytes | None = None  # for a message that came from another broker: its id

    @property
    def from_broker_instance(self) -> str | None:
        return None if self.extra is None else self.extra.decode()

    def row(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.handle,
            self.conversation_id,
            self.to_service,
            self.to_broker_instance,
            self.from_service,
            self.contract,
            int(self.is_initiator),
            self.seq,
            self.message_type,
            self.validation,
            self.body,
            self.enqueue_time,
            self.priority,
            self.status,
            self.extra,
        )

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Outbound:
        values = list(row)
        values[1] = uuid.UUID(bytes=values[1])
        values[2] = uuid.UUID(bytes=values[2])
        values[7] = bool(values[7])
        return cls(*values)


@dataclass(slots=True, eq=False)
class Waiter:
    txn: Transaction
    queue: Queue
    top: int | None
    handle: uuid.UUID | None
    group_id: uuid.UUID | None
    get_group: bool
    future: asyncio.Future[tuple[Group, list[Message]]]


class QueueListener:
    """Hooks for queue monitors (activation); the default does nothing."""

    def message_arrived(self, queue: Queue) -> None: ...
    def received(self, queue: Queue, session: Session, empty: bool) -> None: ...
    def rolled_back(self, queue: Queue) -> None: ...
    def altered(self, queue: Queue) -> None: ...
    def waiting_changed(self, queue: Queue) -> None: ...
    def session_closed(self, session: Session) -> None: ...


def _as_uuid(value: object, what: str) -> uuid.UUID:
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


def _as_body(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        return b""
    raise bad_argument(f"a message body must be bytes or str, got {type(value).__name__}")


def _as_seconds(value: object, what: str, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise bad_argument(f"{what} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _waker(future: asyncio.Future[None]) -> Callable[[], None]:
    def wake() -> None:
        if not future.done():
            future.set_result(None)

    return wake


def error_body(code: int, description: str) -> bytes:
    return (
        f'<Error xmlns="{cat.ERROR}"><Code>{int(code)}</Code>'
        f"<Description>{escape(description)}</Description></Error>"
    ).encode()


class Engine:
    """One broker's state and every operation a session can run on it."""

    def __init__(self, store: Store, instance_id: str, lock_timeout: float = 30.0) -> None:
        self.store = store
        self.instance_id = instance_id
        self.lock_timeout = lock_timeout
        self.catalog = Catalog()
        self.queues: dict[str, Queue] = {}
        self.endpoints: dict[uuid.UUID, Endpoint] = {}
        self.by_conversation: dict[tuple[uuid.UUID, bool], Endpoint] = {}
        self.transmission: dict[int, Outbound] = {}
        self.held: dict[tuple[uuid.UUID, bool], deque[Outbound]] = {}
        self.remote_outbound: dict[tuple[uuid.UUID, bool, int], Outbound] = {}
        self.detached: dict[uuid.UUID, Transaction] = {}
        self._detached_timers: dict[uuid.UUID, asyncio.TimerHandle] = {}
        self.sessions: dict[int, Session] = {}
        self.listener: QueueListener = QueueListener()
        self.on_outbound: Callable[[Outbound], None] | None = None
        self.on_endpoint_removed: Callable[[Endpoint], None] | None = None
        self.describe_outbound: Callable[[Outbound], str] = lambda out: out.status
        self.on_routes_changed: Callable[[], None] | None = None
        self._route_cache: dict[tuple[str, object], tuple[cat.Route | None, float]] = {}
        self.poison = PoisonHandler(self)
        self._timers: dict[uuid.UUID, asyncio.TimerHandle] = {}
        self._lifetimes: dict[uuid.UUID, asyncio.TimerHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_order = 1
        self._next_outbound = 1
        self.notification_dialogs: dict[str, uuid.UUID] = {}

    # ================================================================ start

    def load(self) -> None:
        """Rebuild memory from the store (before serving)."""
        snap = self.store.load()
        for kind, _name, body in snap.catalog:
            self.catalog.load(kind, body)
        for definition in self.catalog.queues.values():
            self.queues[definition.name] = Queue(definition)
        for row in snap.endpoints:
            service = self.catalog.services.get(row[3])
            queue = service.queue if service else ""
            ep = Endpoint.from_row(row, queue)
            self._register(ep)
        for row in snap.messages:
            self._load_message(row)
        for row in snap.transmission:
            self._index(Outbound.from_row(row))
        for row in snap.poison:
            self.poison.load_incident(row)
        max_order, max_out, _ = self.store.max_ids()
        self._next_order = max_order + 1
        self._next_outbound = max_out + 1
        self.store.write_now()

    def _load_message(self, row: tuple[Any, ...]) -> None:
        (order, queue_name, raw_handle, seq, mtype, letter, body, enqueued, status, dc, extra) = row
        handle = uuid.UUID(bytes=raw_handle)
        ep = self.endpoints.get(handle)
        queue = self.queues.get(queue_name)
        message = None
        if ep is not None:
            message = self.message_for(ep, order, seq, mtype, letter, body, enqueued)
        elif extra is not None:  # a dead letter lives on without its endpoint
            message = Message(
                order, queue_name, handle, handle, seq, "", "", mtype, letter, body, enqueued, 5
            )
        if message is not None and extra is not None:
            self.poison.restore_extra(message, extra)
        if queue is None or message is None or (ep is None and message.dead_letter_reason is None):
            log.warning("dropping orphan message %s of queue %s", order, queue_name)
            self.store.delete_message(order)
            return
        message.status, message.delivery_count = status, dc
        if message.parked_until is not None:
            self.poison.park_loaded(queue, message)
        elif status == 0 and ep is not None:
            queue.retained.setdefault(ep.handle, []).append(message)
        else:
            queue.add(message)

    def next_queuing_order(self) -> int:
        order = self._next_order
        self._next_order += 1
        return order

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.poison.start()
        for ep in list(self.endpoints.values()):
            self._arm_timer(ep)
            self._arm_lifetime(ep)
        for queue in self.queues.values():
            if queue.definition.status:
                self._release_held(queue.name)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "engine not started"
        return self._loop

    def _register(self, ep: Endpoint) -> None:
        self.endpoints[ep.handle] = ep
        self.by_conversation[(ep.conversation_id, ep.is_initiator)] = ep
        queue = self.queues.get(ep.queue)
        if queue is not None:
            queue.group(ep.group_id).endpoints.add(ep.handle)

    # ================================================================ sessions

    def open_session(self, user: str, peer: str) -> Session:
        session = Session(user=user, peer=peer)
        self.sessions[session.ident] = session
        return session

    def close_session(self, session: Session) -> None:
        """A dropped connection rolls back whatever it had open."""
        session.closed = True
        if session.txn is not None and session.txn.ident is not None:
            session.txn = None  # a detached transaction outlives its connection
        if session.txn is not None:
            self._rollback(session.txn, "the connection was closed with the transaction open")
            session.txn = None
        self.sessions.pop(session.ident, None)
        self.listener.session_closed(session)

    def begin_transaction(
        self, session: Session, detached: object = False, timeout: object = None
    ) -> uuid.UUID | None:
        if session.txn is not None:
            raise BrokerError(
                ErrorCode.TRANSACTION_ACTIVE,
                "a transaction is already open on this connection; commit or roll it back first",
            )
        txn = Transaction(session, explicit=True)
        if detached:
            seconds = _as_seconds(
                DETACHED_TIMEOUT if timeout is None else timeout, "timeout"
            )
            assert seconds is not None
            txn.ident = uuid.uuid4()
            txn.expires = time.time() + seconds
            self.detached[txn.ident] = txn
            self._detached_timers[txn.ident] = self.loop.call_later(
                seconds, self._expire_transaction, txn.ident
            )
        session.txn = txn
        return txn.ident

    def commit(self, session: Session) -> None:
        txn = self._explicit(session, "commit")
        session.txn = None
        self._forget_detached(txn)
        self._commit(txn)

    def rollback(self, session: Session, error: object = None) -> None:
        txn = self._explicit(session, "roll back")
        if error is not None and not isinstance(error, str):
            raise bad_argument("rollback error must be a text saying what went wrong")
        session.txn = None
        self._forget_detached(txn)
        self._rollback(txn, error or "")

    # ---- detached transactions --------------------------------------------------

    def _detached(self, transaction_id: object) -> Transaction:
        ident = _as_uuid(transaction_id, "transaction_id")
        txn = self.detached.get(ident)
        if txn is None:
            raise not_found(
                ErrorCode.NO_TRANSACTION,
                "transaction",
                ident,
                "it was committed, rolled back, or expired",
            )
        return txn

    def _forget_detached(self, txn: Transaction) -> None:
        if txn.ident is not None:
            self.detached.pop(txn.ident, None)
            timer = self._detached_timers.pop(txn.ident, None)
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
        self._commit(txn)

    def rollback_transaction(
        self, session: Session, transaction_id: object, error: object = None
    ) -> None:
        txn = self._detached(transaction_id)
        if error is not None and not isinstance(error, str):
            raise bad_argument("rollback error must be a text saying what went wrong")
        self._forget_detached(txn)
        self._rollback(txn, error or "")

    def _expire_transaction(self, ident: uuid.UUID) -> None:
        self._detached_timers.pop(ident, None)
        txn = self.detached.get(ident)
        if txn is not None:
            log.info("detached transaction %s expired; rolling it back", ident)
            self._forget_detached(txn)
            self._rollback(txn, f"transaction {ident} expired before it was committed")

    def requeue_dead_letter(self, session: Session, queue: object, queuing_order: object) -> None:
        self.poison.requeue(queue, queuing_order)

    def _explicit(self, session: Session, verb: str) -> Transaction:
        if session.txn is None:
            raise BrokerError(
                ErrorCode.NO_TRANSACTION,
                f"there is no open transaction to {verb}; call begin_transaction() first",
            )
        return session.txn

    def _txn(self, session: Session) -> Transaction:
        return session.txn if session.txn is not None else Transaction(session, explicit=False)

    def _finish(self, txn: Transaction) -> None:
        """End a statement: an implicit transaction commits on its own."""
        if not txn.explicit:
            self._commit(txn)

    # ================================================================ catalog

    def _persist(self, kind: str, obj: Any) -> None:
        self.catalog.table(kind)[obj.name] = obj
        self.store.put_catalog(kind, obj.name, cat.encode(obj))

    def create_message_type(
        self, session: Session, name: object, validation: object = "NONE"
    ) -> None:
        self._persist("message_type", self.catalog.new_message_type(name, validation))

    def create_contract(self, session: Session, name: object, messages: object) -> None:
        self._persist("contract", self.catalog.new_contract(name, messages))

    def create_queue(
        self,
        session: Session,
        name: object,
        status: object = "ON",
        retention: object = "OFF",
        activation: object = None,
        poison_message_handling: object = None,
        poison_policy: object = None,
    ) -> None:
        definition = self.catalog.new_queue(
            name, status, retention, activation, poison_message_handling, poison_policy
        )
        self._persist("queue", definition)
        self.queues[definition.name] = Queue(definition)
        self.listener.altered(self.queues[definition.name])

    def alter_queue(self, session: Session, name: object, **changes: object) -> None:
        if not isinstance(name, str):
            raise bad_argument("alter_queue needs a queue name")
        updated = self.catalog.altered_queue(name, changes)
        self._set_queue(updated)

    def _set_queue(self, updated: QueueDef, reason: str = "") -> None:
        queue = self.queues[updated.name]
        was_on = queue.definition.status
        queue.definition = updated
        self._persist("queue", updated)
        if updated.status and not was_on:
            queue.rollback_streak = 0
            queue.disabled_reason = ""
            self._release_held(updated.name)
            self.kick(queue)
        elif not updated.status:
            queue.disabled_reason = reason
            self._fail_waiters(queue)
        self.listener.altered(queue)

    def create_service(
        self, session: Session, name: object, queue: object, contracts: object = None
    ) -> None:
        self._persist("service", self.catalog.new_service(name, queue, contracts))

    def create_route(
        self,
        session: Session,
        name: object,
        service_name: object,
        address: object,
        broker_instance: object = None,
        lifetime: object = None,
    ) -> None:
        seconds = _as_seconds(lifetime, "lifetime", allow_none=True)
        expires = None if seconds is None else time.time() + seconds
        self._persist(
            "route", self.catalog.new_route(name, service_name, address, broker_instance, expires)
        )
        self._route_cache.clear()
        if self.on_routes_changed is not None:
            self.on_routes_changed()

    def create_broker_priority(
        self,
        session: Session,
        name: object,
        contract: object = None,
        local_service: object = None,
        remote_service: object = None,
        level: object = 5,
    ) -> None:
        self._persist(
            "broker_priority",
            self.catalog.new_priority(name, contract, local_service, remote_service, level),
        )

    def alter_broker_priority(self, session: Session, name: object, **changes: object) -> None:
        if not isinstance(name, str) or name not in self.catalog.priorities:
            raise not_found(ErrorCode.UNKNOWN_PRIORITY, "broker priority", name)
        unknown = set(changes) - {"contract", "local_service", "remote_service", "level"}
        if unknown:
            raise bad_argument(f"alter_broker_priority does not know {', '.join(sorted(unknown))}")
        current = self.catalog.priorities[name]
        merged = {
            "contract": current.contract,
            "local_service": current.local_service,
            "remote_service": current.remote_service,
            "level": current.level,
            **changes,
        }
        self._persist("broker_priority", self.catalog.checked_priority(current, **merged))

    def create_event_notification(
        self,
        session: Session,
        name: object,
        event: object,
        queue: object,
        service: object,
        broker_instance: object = None,
    ) -> None:
        note = self.catalog.new_notification(name, event, queue, service, broker_instance)
        self._persist("event_notification", note)
        self.listener.altered(self.queues[note.queue])

    def drop(self, session: Session, kind: object, name: object) -> None:
        if not isinstance(kind, str) or not isinstance(name, str):
            raise bad_argument("drop needs an object kind and a name")
        self.catalog.check_drop(kind, name)
        if kind == "service":
            open_ = sum(1 for ep in self.endpoints.values() if ep.service == name)
            if open_:
                raise BrokerError(
                    ErrorCode.IN_USE,
                    f"cannot drop service '{name}': it has {open_} open conversation(s); "
                    "end them first",
                )
        if kind == "contract" and any(ep.contract == name for ep in self.endpoints.values()):
            raise BrokerError(
                ErrorCode.IN_USE,
                f"cannot drop contract '{name}': open conversations use it; end them first",
            )
        if kind == "queue":
            queue = self.queues[name]
            if any(g.owner is not None for g in queue.groups.values()):
                raise BrokerError(
                    ErrorCode.IN_USE,
                    f"cannot drop queue '{name}': a transaction is receiving from it; "
                    "let it commit or roll back first",
                )
            held = len(queue.all_messages())
            if held:
                raise BrokerError(
                    ErrorCode.IN_USE,
                    f"cannot drop queue '{name}': it still holds {held} message(s); "
                    "receive them first",
                )
        del self.catalog.table(kind)[name]
        self.store.delete_catalog(kind, name)
        if kind == "queue":
            queue = self.queues.pop(name)
            self._fail_waiters(queue)
            self.listener.altered(queue)
        if kind == "event_notification":
            self.notification_dialogs.pop(name, None)
        if kind == "route":
            self._route_cache.clear()
            if self.on_routes_changed is not None:
                self.on_routes_changed()

    # ================================================================ dialogs

    def begin_dialog(
        self,
        session: Session,
        from_service: object,
        to_service: object,
        contract: object = cat.DEFAULT,
        broker_instance: object = None,
        related_conversation: object = None,
        related_conversation_group: object = None,
        lifetime: object = None,
        encryption: object = False,
    ) -> MaybeAwaitable[uuid.UUID]:
        if not isinstance(from_service, str):
            raise bad_argument("begin_dialog needs the name of a local service (from_service)")
        if not isinstance(to_service, str) or not to_service:
            raise bad_argument("begin_dialog needs the name of the target service (to_service)")
        if not isinstance(contract, str):
            raise bad_argument("contract must be a contract name")
        if isinstance(broker_instance, uuid.UUID):
            broker_instance = str(broker_instance)
        if broker_instance is not None and not isinstance(broker_instance, str):
            raise bad_argument("broker_instance must be a broker instance id string")
        service = self.catalog.service(from_service)
        contract_def = self.catalog.contract(contract)
        self._check_target(to_service, broker_instance, contract_def.name)
        seconds = _as_seconds(lifetime, "lifetime", allow_none=True)
        if seconds is not None and (seconds < 1 or seconds > MAX_LIFETIME):
            raise bad_argument(f"lifetime must be 1..{MAX_LIFETIME} seconds")
        if related_conversation is not None and related_conversation_group is not None:
            raise bad_argument("give related_conversation or related_conversation_group, not both")
        queue = self.queues[service.queue]
        group_id: uuid.UUID
        if related_conversation is not None:
            related = self._endpoint(session, related_conversation)
            if related.queue != queue.name:
                raise bad_argument(
                    f"related conversation {related.handle} belongs to queue '{related.queue}',"
                    f" but service '{service.name}' uses queue '{queue.name}'"
                )
            group_id = related.group_id
        elif related_conversation_group is not None:
            group_id = _as_uuid(related_conversation_group, "related_conversation_group")
            other = next(
                (q.name for q in self.queues.values() if group_id in q.groups and q is not queue),
                None,
            )
            if other is not None:
                raise bad_argument(
                    f"conversation group {group_id} belongs to queue '{other}', not '{queue.name}'"
                )
        else:
            group_id = uuid.uuid4()
        txn = self._txn(session)
        group = queue.group(group_id)

        def act() -> uuid.UUID:
            now = time.time()
            ep = Endpoint(
                handle=uuid.uuid4(),
                conversation_id=uuid.uuid4(),
                is_initiator=True,
                service=service.name,
                far_service=to_service,
                far_broker_instance=broker_instance,
                contract=contract_def.name,
                group_id=group_id,
                queue=queue.name,
                state=State.SO,
                priority=assign_level(
                    self.catalog.priorities.values(), contract_def.name, service.name, to_service
                ),
                lifetime_expiry=None if seconds is None else now + seconds,
                created=now,
                committed=False,
            )
            self._register(ep)
            txn.new_endpoints.append(ep)
            self._finish(txn)
            return ep.handle

        return self._locked(txn, [(queue, group)], act)

    def _check_target(self, to_service: str, broker_instance: object, contract: str) -> None:
        if self._is_local(to_service, broker_instance):
            target = self.catalog.services[to_service]
            if contract not in target.contracts:
                raise BrokerError(
                    ErrorCode.CONTRACT_NOT_ACCEPTED,
                    f"service '{to_service}' does not accept contract '{contract}'; "
                    f"it accepts {', '.join(target.contracts) or 'no contract (initiator only)'}",
                )
            return
        if self.find_route(to_service, broker_instance) is None:
            raise not_found(
                ErrorCode.UNKNOWN_SERVICE,
                "service",
                to_service,
                "it is not on this broker and no route leads to it (create_route for a remote"
                " service)",
            )

    def _is_local(self, service: str, broker_instance: object) -> bool:
        if broker_instance is not None and broker_instance != self.instance_id:
            return False
        if service not in self.catalog.services:
            return False
        route = self.find_route(service, broker_instance)
        return route is None or route.address == "LOCAL"

    def find_route(self, service: str, broker_instance: object) -> cat.Route | None:
        """Service Broker's route matching: the most specific live route wins.

        Answers are cached until a route changes or the next route lifetime ends."""
        key = (service, broker_instance)
        now = time.time()
        hit = self._route_cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        if not self.catalog.routes:
            self._route_cache[key] = (None, float("inf"))
            return None
        best: cat.Route | None = None
        best_score = -1
        valid_until = float("inf")
        for route in self.catalog.routes.values():
            if route.expires is not None:
                if route.expires <= now:
                    continue
                valid_until = min(valid_until, route.expires)
            if route.address == "TRANSPORT":
                score = 0
            elif route.service_name != service:
                continue
            elif route.broker_instance is None:
                score = 1
            elif broker_instance is None or route.broker_instance == broker_instance:
                score = 2
            else:
                continue
            if score > best_score:
                best, best_score = route, score
        if len(self._route_cache) > 10_000:
            self._route_cache.clear()
        self._route_cache[key] = (best, valid_until)
        return best

    def _endpoint(self, session: Session, handle: object) -> Endpoint:
        handle = _as_uuid(handle, "conversation handle")
        ep = self.endpoints.get(handle)
        if ep is None or (
            not ep.committed and (session.txn is None or ep not in session.txn.new_endpoints)
        ):
            raise not_found(
                ErrorCode.UNKNOWN_CONVERSATION,
                "conversation handle",
                handle,
                "it never existed or has ended",
            )
        return ep

    def send(
        self,
        session: Session,
        handles: object,
        message_type: object = cat.DEFAULT,
        bodies: object = None,
    ) -> MaybeAwaitable[None]:
        if isinstance(handles, (list, tuple)):
            if not handles:
                raise bad_argument("send needs at least one conversation handle")
            handle_list = list(handles)
        else:
            handle_list = [handles]
        if not isinstance(message_type, str):
            raise bad_argument("message_type must be a message type name")
        if bodies is None:
            bodies = [b""]
        if not isinstance(bodies, (list, tuple)):
            raise bad_argument("bodies must be a list of message bodies")
        body_list = [_as_body(b) for b in bodies]
        mtype = self.catalog.message_type(message_type)
        txn = self._txn(session)
        endpoints: list[Endpoint] = []
        for handle in handle_list:
            ep = self._endpoint(session, handle)
            if ep.handle in txn.ended:
                raise BrokerError(
                    ErrorCode.CONVERSATION_ENDED,
                    f"conversation {ep.handle} was ended earlier in this transaction",
                )
            if ep.state not in CAN_SEND:
                raise BrokerError(ErrorCode.CONVERSATION_ENDED, self._cannot_send(ep))
            contract = self.catalog.contract(ep.contract)
            sent_by = contract.sent_by(mtype.name)
            if sent_by is None:
                raise BrokerError(
                    ErrorCode.MESSAGE_TYPE_NOT_IN_CONTRACT,
                    f"message type '{mtype.name}' is not part of contract '{contract.name}' "
                    f"of conversation {ep.handle}; the contract allows "
                    f"{', '.join(sorted(contract.messages))}",
                )
            side = "INITIATOR" if ep.is_initiator else "TARGET"
            if sent_by not in ("ANY", side):
                raise BrokerError(
                    ErrorCode.WRONG_DIRECTION,
                    f"message type '{mtype.name}' is sent by the {sent_by} in contract "
                    f"'{contract.name}', but conversation {ep.handle} is the {side} side",
                )
            endpoints.append(ep)
        for body in body_list:
            validate_body(mtype.name, mtype.validation, body)
        letter = cat.VALIDATIONS[mtype.validation]
        targets = [
            (self.queues[ep.queue], self.queues[ep.queue].group(ep.group_id)) for ep in endpoints
        ]

        def act() -> None:
            for ep in endpoints:
                txn.actions.append(Send(ep, mtype.name, letter, body_list))
            self._finish(txn)

        return self._locked(txn, targets, act)

    def _cannot_send(self, ep: Endpoint) -> str:
        if ep.state == State.DI:
            why = "the far side ended it; call end_conversation to close your side"
        elif ep.state == State.ER:
            why = "it failed with an error (see the Error message in the queue); end it"
        else:
            why = "it has been ended"
        return f"cannot send on conversation {ep.handle} (state {ep.state.name}): {why}"

    def end_conversation(
        self,
        session: Session,
        handle: object,
        error: object = None,
        description: object = None,
        cleanup: object = False,
    ) -> MaybeAwaitable[None]:
        ep = self._endpoint(session, handle)
        if error is not None:
            if isinstance(error, bool) or not isinstance(error, int) or error == 0:
                raise bad_argument("error must be a non-zero integer code")
            if not isinstance(description, str) or not description:
                raise bad_argument("end_conversation with error needs a description")
            if cleanup:
                raise bad_argument("give error or cleanup, not both")
        txn = self._txn(session)
        if ep.handle in txn.ended:
            raise BrokerError(
                ErrorCode.CONVERSATION_ENDED,
                f"conversation {ep.handle} was already ended in this transaction",
            )
        if ep.state in (State.DO, State.CD) and not cleanup:
            raise BrokerError(
                ErrorCode.CONVERSATION_ENDED,
                f"conversation {ep.handle} has already been ended (state {ep.state.name})",
            )
        queue = self.queues[ep.queue]

        def act() -> None:
            txn.ended.add(ep.handle)
            txn.actions.append(
                End(
                    ep,
                    error if isinstance(error, int) else None,
                    str(description or ""),
                    bool(cleanup),
                )
            )
            self._finish(txn)

        return self._locked(txn, [(queue, queue.group(ep.group_id))], act)

    def begin_conversation_timer(
        self, session: Session, handle: object, timeout: object
    ) -> MaybeAwaitable[None]:
        ep = self._endpoint(session, handle)
        seconds = _as_seconds(timeout, "timeout")
        assert seconds is not None
        txn = self._txn(session)
        queue = self.queues[ep.queue]

        def act() -> None:
            txn.actions.append(Timer(ep, seconds))
            self._finish(txn)

        return self._locked(txn, [(queue, queue.group(ep.group_id))], act)

    def move_conversation(
        self, session: Session, handle: object, group_id: object
    ) -> MaybeAwaitable[None]:
        ep = self._endpoint(session, handle)
        target_id = _as_uuid(group_id, "conversation group id")
        queue = self.queues[ep.queue]
        target = queue.groups.get(target_id)
        if target is None:
            raise not_found(
                ErrorCode.UNKNOWN_CONVERSATION_GROUP,
                "conversation group",
                target_id,
                f"it must be a group of queue '{queue.name}'",
            )
        txn = self._txn(session)
        source = queue.group(ep.group_id)

        def act() -> None:
            txn.actions.append(Move(ep, target))
            self._finish(txn)

        return self._locked(txn, [(queue, source), (queue, target)], act)

    # ================================================================ locks

    def _lockable(self, txn: Transaction, group: Group) -> bool:
        return group.owner is None or group.owner is txn

    def _lock(self, txn: Transaction, queue: Queue, group: Group) -> None:
        if group.owner is txn:
            return
        group.owner = txn
        txn.locks[group.id] = (queue, group)
        queue.touch(group)

    def _locked(
        self, txn: Transaction, targets: list[tuple[Queue, Group]], act: Callable[[], T]
    ) -> MaybeAwaitable[T]:
        """Run `act` holding every target group's lock, waiting for them if needed."""
        if all(self._lockable(txn, g) for _, g in targets):
            for queue, group in targets:
                self._lock(txn, queue, group)
            return act()
        return self._wait_locks(txn, targets, act)

    async def _wait_locks(
        self, txn: Transaction, targets: list[tuple[Queue, Group]], act: Callable[[], T]
    ) -> T:
        deadline = self.loop.time() + self.lock_timeout
        while True:
            blocked = next((g for _, g in targets if not self._lockable(txn, g)), None)
            if blocked is None:
                break
            remaining = deadline - self.loop.time()
            if remaining <= 0 or txn.session.closed:
                raise BrokerError(
                    ErrorCode.LOCK_TIMEOUT,
                    f"conversation group {blocked.id} stayed locked by another transaction for "
                    f"{self.lock_timeout:g} s; retry, or commit the transaction holding it",
                )
            wake: asyncio.Future[None] = self.loop.create_future()
            blocked.lock_waiters.append(_waker(wake))
            await asyncio.wait({wake}, timeout=remaining)
        for queue, group in targets:
            self._lock(txn, queue, group)
        return act()

    def _release(self, txn: Transaction) -> None:
        for queue, group in txn.locks.values():
            group.owner = None
            if not group.endpoints and not group.convs:
                if queue.groups.get(group.id) is group:
                    del queue.groups[group.id]
            else:
                queue.touch(group)
            waiters, group.lock_waiters = group.lock_waiters, []
            for wake in waiters:
                wake()
            self.kick(queue)
        txn.locks.clear()

    # ================================================================ receive

    def _receivable(self, name: object) -> Queue:
        if not isinstance(name, str):
            raise bad_argument("receive needs a queue name")
        queue = self.queues.get(name)
        if queue is None:
            raise not_found(ErrorCode.UNKNOWN_QUEUE, "queue", name)
        if not queue.definition.status:
            raise self._disabled_error(queue)
        return queue

    def _disabled_error(self, queue: Queue) -> BrokerError:
        reason = queue.disabled_reason
        why = f": {reason}" if reason else ""
        return BrokerError(
            ErrorCode.QUEUE_DISABLED,
            f"queue '{queue.name}' is disabled (STATUS = OFF){why}; "
            f"alter_queue('{queue.name}', status='ON') enables it",
        )

    def receive(
        self,
        session: Session,
        queue: object,
        top: object = None,
        timeout: object = 0.0,
        conversation_handle: object = None,
        conversation_group_id: object = None,
    ) -> MaybeAwaitable[list[list[Any]]]:
        q = self._receivable(queue)
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
            raise bad_argument(f"top must be a positive integer or None, got {top!r}")
        wait = _as_seconds(timeout, "timeout", allow_none=True)
        handle, group_id = self._where(q, conversation_handle, conversation_group_id)
        txn = self._txn(session)
        got = self._try_take(txn, q, top, handle, group_id, False)
        if got is None and wait != 0:
            return self._receive_waiting(session, txn, q, top, handle, group_id, wait)
        return self._received(session, txn, q, got, handle is None and group_id is None)

    async def _receive_waiting(
        self,
        session: Session,
        txn: Transaction,
        q: Queue,
        top: int | None,
        handle: uuid.UUID | None,
        group_id: uuid.UUID | None,
        wait: float | None,
    ) -> list[list[Any]]:
        got = await self._wait(session, txn, q, top, handle, group_id, False, wait)
        return self._received(session, txn, q, got, handle is None and group_id is None)

    def _received(
        self,
        session: Session,
        txn: Transaction,
        q: Queue,
        got: tuple[Group, list[Message]] | None,
        unfiltered: bool,
    ) -> list[list[Any]]:
        now = time.time()
        q.last_receive = now
        if got is None or not got[1]:
            if unfiltered:
                q.last_empty_rowset = now
            self.listener.received(q, session, True)
            return []
        rows = [m.wire() for m in got[1]]
        self._finish(txn)
        self.listener.received(q, session, False)
        return rows

    def get_conversation_group(
        self, session: Session, queue: object, timeout: object = 0.0
    ) -> MaybeAwaitable[uuid.UUID | None]:
        q = self._receivable(queue)
        wait = _as_seconds(timeout, "timeout", allow_none=True)
        txn = self._txn(session)
        got = self._try_take(txn, q, None, None, None, True)
        if got is None and wait != 0:
            return self._group_waiting(session, txn, q, wait)
        return self._got_group(session, txn, q, got)

    async def _group_waiting(
        self, session: Session, txn: Transaction, q: Queue, wait: float | None
    ) -> uuid.UUID | None:
        got = await self._wait(session, txn, q, None, None, None, True, wait)
        return self._got_group(session, txn, q, got)

    def _got_group(
        self, session: Session, txn: Transaction, q: Queue, got: tuple[Group, list[Message]] | None
    ) -> uuid.UUID | None:
        now = time.time()
        q.last_receive = now
        if got is None:
            q.last_empty_rowset = now
            self.listener.received(q, session, True)
            return None
        self._finish(txn)
        self.listener.received(q, session, False)
        return got[0].id

    def _where(
        self, q: Queue, handle: object, group_id: object
    ) -> tuple[uuid.UUID | None, uuid.UUID | None]:
        if handle is not None and group_id is not None:
            raise bad_argument("filter on conversation_handle or conversation_group_id, not both")
        h = None if handle is None else _as_uuid(handle, "conversation_handle")
        g = None if group_id is None else _as_uuid(group_id, "conversation_group_id")
        if h is not None:
            ep = self.endpoints.get(h)
            if ep is None:
                raise not_found(
                    ErrorCode.UNKNOWN_CONVERSATION, "conversation handle", h, "it may have ended"
                )
            if ep.queue != q.name:
                raise bad_argument(
                    f"conversation {h} receives on queue '{ep.queue}', not '{q.name}'"
                )
        return h, g

    def _try_take(
        self,
        txn: Transaction,
        q: Queue,
        top: int | None,
        handle: uuid.UUID | None,
        group_id: uuid.UUID | None,
        get_group: bool,
    ) -> tuple[Group, list[Message]] | None:
        group: Group | None
        if handle is not None:
            ep = self.endpoints.get(handle)
            if ep is None:
                return None
            group = q.groups.get(ep.group_id)
            if group is None or not self._lockable(txn, group) or handle not in group.convs:
                return None
        elif group_id is not None:
            group = q.groups.get(group_id)
            if group is None or not self._lockable(txn, group) or not group.convs:
                return None
        else:
            group = q.peek_eligible()
            own = [g for qq, g in txn.locks.values() if qq is q and g.convs]
            if own:
                best = min(own, key=lambda g: g.key() or (0, 0))
                if group is None or (best.key() or (0, 0)) <= (group.heap_key or (0, 0)):
                    group = best
            if group is None:
                return None
        self._lock(txn, q, group)
        if get_group:
            return group, []
        messages = q.take(group, top, handle)
        for m in messages:
            m.delivery_count += 1
        if messages:
            txn.received.append((q, group, messages))
        return group, messages

    async def _wait(
        self,
        session: Session,
        txn: Transaction,
        q: Queue,
        top: int | None,
        handle: uuid.UUID | None,
        group_id: uuid.UUID | None,
        get_group: bool,
        wait: float | None,
    ) -> tuple[Group, list[Message]] | None:
        future: asyncio.Future[tuple[Group, list[Message]]] = self.loop.create_future()
        waiter = Waiter(txn, q, top, handle, group_id, get_group, future)
        q.waiters.append(waiter)
        session.waiting = waiter
        # a message may have arrived between the first try and now: look once more
        self.kick(q)
        self.listener.waiting_changed(q)
        try:
            _done, _ = await asyncio.wait({future}, timeout=wait)
        except asyncio.CancelledError:
            # the session went away; what was handed to it never reached it
            delivered = future.done() and not future.cancelled() and future.exception() is None
            if delivered and not txn.explicit:
                self._give_back(txn)
            raise
        finally:
            session.waiting = None
            if waiter in q.waiters:
                q.waiters.remove(waiter)
            self.listener.waiting_changed(q)
        if future.done():
            return future.result()
        future.cancel()
        return None

    def kick(self, queue: Queue) -> None:
        if queue.waiters and not queue.kick_scheduled:
            queue.kick_scheduled = True
            self.loop.call_soon(self._serve_waiters, queue)

    def _serve_waiters(self, queue: Queue) -> None:
        queue.kick_scheduled = False
        if not queue.definition.status:
            return
        remaining: deque[Waiter] = deque()
        for waiter in queue.waiters:
            if waiter.future.done():
                continue
            got = self._try_take(
                waiter.txn, queue, waiter.top, waiter.handle, waiter.group_id, waiter.get_group
            )
            if got is None:
                remaining.append(waiter)
            else:
                waiter.future.set_result(got)
        queue.waiters = remaining

    def _fail_waiters(self, queue: Queue) -> None:
        error = self._disabled_error(queue)
        for waiter in queue.waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        queue.waiters = deque()

    def waiting_sessions(self, queue: Queue) -> int:
        """Sessions blocked in RECEIVE or GET CONVERSATION GROUP without WHERE."""
        return sum(
            1
            for w in queue.waiters
            if w.handle is None and w.group_id is None and not w.future.done()
        )

    # ================================================================ commit

    def _commit(self, txn: Transaction) -> None:
        now = time.time()
        for ep in txn.new_endpoints:
            if ep.handle in self.endpoints:
                ep.committed = True
                self.store.put_endpoint(ep.row())
                self._arm_lifetime(ep)
        for action in txn.actions:
            if isinstance(action, Send):
                self._apply_send(action, now)
            elif isinstance(action, End):
                self._apply_end(action, now)
            elif isinstance(action, Timer):
                self._apply_timer(action, now)
            else:
                self._apply_move(action)
        for queue, _group, messages in txn.received:
            retention = queue.definition.retention
            for m in messages:
                if retention and m.conversation_handle in self.endpoints:
                    m.status = 0
                    queue.retained.setdefault(m.conversation_handle, []).append(m)
                    self.store.set_message_status(m.queuing_order, 0)
                else:
                    self.store.delete_message(m.queuing_order)
            queue.rollback_streak = 0
        self._release(txn)

    def _rollback(self, txn: Transaction, error: str = "") -> None:
        received_from: dict[str, tuple[Queue, list[Message]]] = {}
        for queue, group, messages in reversed(txn.received):
            queue.restore(group, messages)
            for m in messages:
                if error:
                    m.last_error = error
                    self.store.set_message_extra(m.queuing_order, m.extra())
                self.store.set_delivery_count(m.queuing_order, m.delivery_count)
            received_from.setdefault(queue.name, (queue, []))[1].extend(messages)
        for ep in txn.new_endpoints:
            self._forget(ep)
        self._release(txn)
        for queue, messages in received_from.values():
            if self.poison.after_rollback(queue, messages):
                queue.rollback_streak = 0
            else:
                self._count_rollback(queue)
            self.listener.rolled_back(queue)

    def _give_back(self, txn: Transaction) -> None:
        """Undo takes that were never delivered: no rollback, no delivery counted."""
        for queue, group, messages in reversed(txn.received):
            for m in messages:
                m.delivery_count -= 1
            queue.restore(group, messages)
        txn.received.clear()
        self._release(txn)

    def _count_rollback(self, queue: Queue) -> None:
        queue.rollback_streak += 1
        definition = queue.definition
        if (
            queue.rollback_streak >= POISON_ROLLBACKS
            and definition.status
            and definition.poison_message_handling
        ):
            reason = (
                f"poison message detected after {queue.rollback_streak} consecutive rollbacks"
                " of transactions that received from it"
            )
            log.warning("disabling queue %s: %s", queue.name, reason)
            self._set_queue(replace(definition, status=False), reason)
            self.fire_event("BROKER_QUEUE_DISABLED", queue.name)

    # ---- applying deferred actions -------------------------------------------

    def _apply_send(self, action: Send, now: float) -> None:
        ep = action.endpoint
        if ep.handle not in self.endpoints or ep.state not in CAN_SEND:
            log.info("send on %s dropped at commit: conversation ended meanwhile", ep.handle)
            return
        for body in action.bodies:
            seq = ep.send_seq
            ep.send_seq += 1
            self._route(ep, seq, action.message_type, action.validation, body, now)
        if ep.state == State.SO:
            ep.apply(Event.SENT)
        if ep.handle in self.endpoints:
            self.store.put_endpoint(ep.row())

    def _apply_end(self, action: End, now: float) -> None:
        ep = action.endpoint
        if ep.handle not in self.endpoints:
            return
        if action.cleanup:
            self._drop_outbound(ep)
            self._remove(ep)
            return
        queue = self.queues.get(ep.queue)
        if queue is not None:
            group = queue.groups.get(ep.group_id)
            if group is not None:
                for m in queue.drop_conversation(group, ep.handle):
                    self.store.delete_message(m.queuing_order)
        if action.error is not None:
            self._drop_outbound(ep)
        if ep.state in ENDED_BY_FAR_SIDE or ep.state == State.SO or self._far_gone(ep):
            ep.state = State.CD
            self._remove(ep)
            return
        ep.apply(Event.END)
        if action.error is not None:
            mtype, letter, body = cat.ERROR, "X", error_body(action.error, action.description)
        else:
            mtype, letter, body = cat.END_DIALOG, "E", b""
        seq = ep.send_seq
        ep.send_seq += 1
        self._route(ep, seq, mtype, letter, body, now)
        if ep.handle in self.endpoints:
            self.store.put_endpoint(ep.row())

    def fail_conversation(self, ep: Endpoint, code: int, description: str) -> None:
        """End a conversation with an error on both sides (poison policy)."""
        now = time.time()
        queue = self.queues.get(ep.queue)
        group = queue.groups.get(ep.group_id) if queue else None
        if queue is not None and group is not None:
            for m in queue.drop_conversation(group, ep.handle):
                self.store.delete_message(m.queuing_order)
        body = error_body(code, description)
        if ep.state in CAN_SEND:
            seq = ep.send_seq
            ep.send_seq += 1
            self._route(ep, seq, cat.ERROR, "X", body, now)
        if ep.handle in self.endpoints and ep.state not in (State.ER, State.DO, State.CD):
            ep.apply(Event.RECEIVED_ERROR)
            self._enqueue(ep, -1, cat.ERROR, "X", body, now)
            self.store.put_endpoint(ep.row())

    def _far_gone(self, ep: Endpoint) -> bool:
        """A target whose local initiator no longer exists has nobody to tell."""
        return (
            not ep.is_initiator
            and ep.far_broker_instance == self.instance_id
            and (ep.conversation_id, True) not in self.by_conversation
        )

    def _apply_timer(self, action: Timer, now: float) -> None:
        ep = action.endpoint
        if ep.handle not in self.endpoints:
            return
        ep.timer_at = now + action.timeout
        self.store.put_endpoint(ep.row())
        self._arm_timer(ep)

    def _apply_move(self, action: Move) -> None:
        ep = action.endpoint
        queue = self.queues[ep.queue]
        if ep.handle not in self.endpoints or ep.group_id == action.group.id:
            return
        source = queue.groups[ep.group_id]
        source.endpoints.discard(ep.handle)
        conv = source.convs.pop(ep.handle, None)
        target = action.group
        queue.groups[target.id] = target
        target.endpoints.add(ep.handle)
        ep.group_id = target.id
        for m in list(conv or ()) + queue.retained.get(ep.handle, []):
            m.conversation_group_id = target.id
        if conv:
            target.convs[ep.handle] = conv
        self.store.put_endpoint(ep.row())

    # ---- delivery ------------------------------------------------------------

    def _route(
        self, ep: Endpoint, seq: int, mtype: str, letter: str, body: bytes, now: float
    ) -> None:
        out = Outbound(
            0,
            ep.handle,
            ep.conversation_id,
            ep.far_service,
            ep.far_broker_instance,
            ep.service,
            ep.contract,
            ep.is_initiator,
            seq,
            mtype,
            letter,
            body,
            now,
            ep.priority,
        )
        if not self._is_local(ep.far_service, ep.far_broker_instance):
            route = self.find_route(ep.far_service, ep.far_broker_instance)
            status = "" if route is not None else f"no route to service '{ep.far_service}'"
            self._hold(out, status, local=False)
            if self.on_outbound is not None:
                self.on_outbound(out)
            return
        key = (ep.conversation_id, ep.is_initiator)
        reason = self._local_block(ep.far_service)
        if key in self.held or reason:
            self._hold(out, reason or "waiting behind earlier messages of this conversation")
            return
        self._deliver_local(out, now)

    def _local_block(self, service_name: str) -> str:
        service = self.catalog.services.get(service_name)
        if service is None:
            return f"service '{service_name}' does not exist"
        queue = self.queues.get(service.queue)
        if queue is None:
            return f"queue '{service.queue}' of service '{service_name}' does not exist"
        if not queue.definition.status:
            return f"queue '{queue.name}' is disabled (STATUS = OFF)"
        return ""

    def _hold(self, out: Outbound, status: str, local: bool | None = None) -> None:
        out.id = self._next_outbound
        self._next_outbound += 1
        out.status = status
        self._index(out, local)
        self.store.put_transmission(out.row())

    def _index(self, out: Outbound, local: bool | None = None) -> None:
        """A transmission-queue entry waits either for a local queue or for a peer."""
        self.transmission[out.id] = out
        if local is None:
            local = self._is_local(out.to_service, out.to_broker_instance)
        if local:
            self.held.setdefault((out.conversation_id, out.is_initiator), deque()).append(out)
        else:
            self.remote_outbound[(out.conversation_id, out.is_initiator, out.seq)] = out

    def _release_held(self, queue_name: str) -> None:
        """Deliver, in order, what waited for a queue that is ON again."""
        now = time.time()
        for key, waiting in list(self.held.items()):
            while waiting:
                out = waiting[0]
                service = self.catalog.services.get(out.to_service)
                if service is None or service.queue != queue_name:
                    break
                if self._local_block(out.to_service):
                    break
                waiting.popleft()
                del self.transmission[out.id]
                self.store.delete_transmission(out.id)
                self._deliver_local(out, now)
            if not waiting:
                del self.held[key]

    def _drop_outbound(self, ep: Endpoint) -> None:
        """Forget what this endpoint still has in the transmission queue."""
        key = (ep.conversation_id, ep.is_initiator)
        self.held.pop(key, None)
        for out in list(self.transmission.values()):
            if out.handle == ep.handle:
                del self.transmission[out.id]
                self.remote_outbound.pop((out.conversation_id, out.is_initiator, out.seq), None)
                self.store.delete_transmission(out.id)

    def _deliver_local(self, out: Outbound, now: float) -> None:
        far = self.by_conversation.get((out.conversation_id, not out.is_initiator))
        if far is None:
            if not out.is_initiator:
                return  # the initiator is gone: nobody to deliver to
            far = self._create_target(out, now)
        if far.state in (State.DO, State.CD):
            if out.message_type in (cat.END_DIALOG, cat.ERROR):
                far.apply(
                    Event.RECEIVED_END
                    if out.message_type == cat.END_DIALOG
                    else Event.RECEIVED_ERROR
                )
                self._remove(far)
            self._acknowledge(out)
            return
        if out.message_type == cat.END_DIALOG:
            far.apply(Event.RECEIVED_END)
        elif out.message_type == cat.ERROR:
            far.apply(Event.RECEIVED_ERROR)
        else:
            far.apply(Event.RECEIVED_MESSAGE)
        far.receive_seq = out.seq + 1
        self._enqueue(far, out.seq, out.message_type, out.validation, out.body, now)
        if out.message_type in (cat.END_DIALOG, cat.ERROR):
            self.store.put_endpoint(far.row())
        self._acknowledge(out)

    def deliver_remote(
        self,
        conversation_id: uuid.UUID,
        from_initiator: bool,
        seq: int,
        message_type: str,
        body: bytes,
        from_service: str,
        to_service: str,
        contract: str,
        from_broker: str,
    ) -> None:
        """A message of a dialog with another broker arrived complete and in order."""
        now = time.time()
        known = self.catalog.message_types.get(message_type)
        letter = cat.VALIDATIONS[known.validation] if known else "N"
        key = (conversation_id, from_initiator)
        far = self.by_conversation.get((conversation_id, not from_initiator))
        if (
            far is not None
            and far.state is State.CO
            and key not in self.held
            and message_type not in _SYSTEM_TYPES
            and not self._local_block(to_service)
        ):
            # the common case, a user message on an established conversation
            far.receive_seq = seq + 1
            self._enqueue(far, seq, message_type, letter, body, now)
            return
        out = Outbound(
            0,
            conversation_id,
            conversation_id,
            to_service,
            self.instance_id,
            from_service,
            contract,
            from_initiator,
            seq,
            message_type,
            letter,
            body,
            now,
            5,
            extra=from_broker.encode(),
        )
        reason = self._local_block(to_service)
        if key in self.held or reason:
            self._hold(out, reason or "waiting behind earlier messages of this conversation")
            return
        self._deliver_local(out, now)

    def remote_acknowledged(self, conversation_id: uuid.UUID, from_initiator: bool, seq: int) -> None:
        """The far broker stored message `seq`: it leaves the transmission queue."""
        out = self.remote_outbound.pop((conversation_id, from_initiator, seq), None)
        if out is None:
            return
        del self.transmission[out.id]
        self.store.delete_transmission(out.id)
        self._acknowledge(out)

    def set_transmission_status(self, out: Outbound, status: str) -> None:
        if out.status != status and out.id in self.transmission:
            out.status = status
            self.store.set_transmission_status(out.id, status)

    def _acknowledge(self, out: Outbound) -> None:
        """Local delivery is its own acknowledgement: close a sender waiting in DO."""
        if out.message_type not in (cat.END_DIALOG, cat.ERROR):
            return
        sender = self.by_conversation.get((out.conversation_id, out.is_initiator))
        if sender is not None and sender.state == State.DO:
            sender.apply(Event.END_ACKED)
            self._remove(sender)

    def _create_target(self, out: Outbound, now: float) -> Endpoint:
        service = self.catalog.services[out.to_service]
        initiator = self.by_conversation.get((out.conversation_id, True))
        far = Endpoint(
            handle=uuid.uuid4(),
            conversation_id=out.conversation_id,
            is_initiator=False,
            service=service.name,
            far_service=out.from_service,
            far_broker_instance=out.from_broker_instance or self.instance_id,
            contract=out.contract,
            group_id=uuid.uuid4(),
            queue=service.queue,
            state=State.SI,
            priority=assign_level(
                self.catalog.priorities.values(), out.contract, service.name, out.from_service
            ),
            lifetime_expiry=initiator.lifetime_expiry if initiator else None,
            far_handle=None if out.from_broker_instance else out.handle,
            created=now,
        )
        self._register(far)
        if initiator is not None:
            initiator.far_handle = far.handle
        self.store.put_endpoint(far.row())
        self._arm_lifetime(far)
        return far

    def message_for(
        self,
        ep: Endpoint,
        order: int,
        seq: int,
        mtype: str,
        letter: str,
        body: bytes,
        now: float,
    ) -> Message:
        """A message of `ep`'s conversation, as its queue holds it."""
        return Message(
            order,
            ep.queue,
            ep.handle,
            ep.group_id,
            seq,
            ep.service,
            ep.contract,
            mtype,
            letter,
            body,
            now,
            ep.priority,
        )

    def _enqueue(
        self, ep: Endpoint, seq: int, mtype: str, letter: str, body: bytes, now: float
    ) -> Message:
        queue = self.queues[ep.queue]
        message = self.message_for(ep, self.next_queuing_order(), seq, mtype, letter, body, now)
        queue.add(message)
        self.store.insert_message(message.row())
        self.kick(queue)
        self.listener.message_arrived(queue)
        return message

    # ---- endpoint removal ----------------------------------------------------

    def _remove(self, ep: Endpoint) -> None:
        """Close an endpoint for good: its messages, timers and row go."""
        self._forget(ep)
        if ep.committed:
            self.store.delete_endpoint(ep.handle)

    def _forget(self, ep: Endpoint) -> None:
        if self.endpoints.get(ep.handle) is not ep:
            return
        del self.endpoints[ep.handle]
        self.by_conversation.pop((ep.conversation_id, ep.is_initiator), None)
        self.poison.forget_conversation(ep.handle)
        if self.on_endpoint_removed is not None:
            self.on_endpoint_removed(ep)
        for timers in (self._timers, self._lifetimes):
            handle = timers.pop(ep.handle, None)
            if handle is not None:
                handle.cancel()
        queue = self.queues.get(ep.queue)
        if queue is None:
            return
        group = queue.groups.get(ep.group_id)
        if group is None:
            return
        for m in queue.drop_conversation(group, ep.handle):
            self.store.delete_message(m.queuing_order)
        group.endpoints.discard(ep.handle)
        if not group.endpoints and not group.convs and group.owner is None:
            del queue.groups[group.id]

    # ---- timers and lifetimes --------------------------------------------------

    def _arm_timer(self, ep: Endpoint) -> None:
        old = self._timers.pop(ep.handle, None)
        if old is not None:
            old.cancel()
        if ep.timer_at is not None and self._loop is not None:
            delay = max(0.0, ep.timer_at - time.time())
            self._timers[ep.handle] = self.loop.call_later(delay, self._fire_timer, ep.handle)

    def _fire_timer(self, handle: uuid.UUID) -> None:
        self._timers.pop(handle, None)
        ep = self.endpoints.get(handle)
        if ep is None or ep.timer_at is None:
            return
        ep.timer_at = None
        self._enqueue(ep, -1, cat.DIALOG_TIMER, "E", b"", time.time())
        self.store.put_endpoint(ep.row())

    def _arm_lifetime(self, ep: Endpoint) -> None:
        if ep.lifetime_expiry is None or self._loop is None or ep.handle in self._lifetimes:
            return
        delay = max(0.0, ep.lifetime_expiry - time.time())
        self._lifetimes[ep.handle] = self.loop.call_later(delay, self._expire, ep.handle)

    def _expire(self, handle: uuid.UUID) -> None:
        self._lifetimes.pop(handle, None)
        ep = self.endpoints.get(handle)
        if ep is None:
            return
        if ep.state == State.DO:
            self._drop_outbound(ep)
            self._remove(ep)
            return
        if ep.state in (State.ER, State.CD):
            return
        ep.apply(Event.RECEIVED_ERROR)
        self._enqueue(
            ep,
            -1,
            cat.ERROR,
            "X",
            error_body(LIFETIME_ERROR_CODE, LIFETIME_ERROR_TEXT),
            time.time(),
        )
        self.store.put_endpoint(ep.row())

    # ================================================================ events

    def fire_event(self, event: str, queue_name: str) -> int:
        """Post an EventNotification for `event` on `queue_name`; returns how many."""
        fired = 0
        for note in list(self.catalog.notifications.values()):
            if note.event != event or note.queue != queue_name:
                continue
            body = self.event_body(event, queue_name)
            self.post_notification(note, body)
            fired += 1
        return fired

    def event_body(self, event: str, queue_name: str, details: str = "") -> bytes:
        """The EventNotification body: EVENT_INSTANCE naming event, queue, broker, time."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        return (
            f"<EVENT_INSTANCE><EventType>{event}</EventType><PostTime>{stamp}Z</PostTime>"
            f"<BrokerInstance>{self.instance_id}</BrokerInstance>"
            f"<ObjectName>{escape(queue_name)}</ObjectName><ObjectType>QUEUE</ObjectType>"
            f"{details}</EVENT_INSTANCE>"
        ).encode()

    def post_notification(self, note: cat.EventNotification, body: bytes) -> None:
        """Deliver on the notification's own dialog (one per notification, reused)."""
        now = time.time()
        handle = self.notification_dialogs.get(note.name)
        ep = self.endpoints.get(handle) if handle else None
        if ep is None or ep.state not in CAN_SEND:
            service = self.catalog.services.get(note.service)
            if service is None or not self._is_local(note.service, note.broker_instance):
                log.warning(
                    "event notification %s: service %s is not on this broker; event dropped",
                    note.name,
                    note.service,
                )
                return
            conversation_id = uuid.uuid4()
            out = Outbound(
                0,
                uuid.uuid4(),
                conversation_id,
                note.service,
                note.broker_instance,
                note.name,
                cat.POST_EVENT_NOTIFICATION,
                True,
                0,
                cat.EVENT_NOTIFICATION,
                "X",
                body,
                now,
                5,
            )
            reason = self._local_block(note.service)
            if reason:
                log.warning("event notification %s not delivered: %s", note.name, reason)
                return
            self._deliver_local(out, now)
            target = self.by_conversation.get((conversation_id, False))
            if target is not None:
                self.notification_dialogs[note.name] = target.handle
            return
        reason = self._local_block(ep.service)
        if reason:
            log.warning("event notification %s not delivered: %s", note.name, reason)
            return
        ep.receive_seq += 1
        self._enqueue(ep, ep.receive_seq - 1, cat.EVENT_NOTIFICATION, "X", body, now)
        self.store.put_endpoint(ep.row())

    # ================================================================ helpers for views

    def all_endpoints(self) -> Iterable[Endpoint]:
        return (ep for ep in self.endpoints.values() if ep.committed)
