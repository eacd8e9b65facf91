"""Dialog statements: BEGIN DIALOG, SEND, END CONVERSATION, conversation timers, MOVE.

Theory of operation. Every statement checks all its input first (names, handles,
the contract's message types and directions, validation, size, quotas, disk space),
then takes the conversation-group locks it needs (waiting for them if another
transaction holds them) and records a deferred action on its transaction. Nothing
reaches a queue or the transmission queue before COMMIT, where `apply_commit` applies
the actions in statement order; a statement outside an explicit transaction commits at
once. So a refused statement leaves nothing behind, and a rolled-back transaction sent
nothing.

A quota is checked at the statement (counting what this transaction already sends to
the same queue) and again at COMMIT, before anything is applied: a queue filled by
others meanwhile makes the commit fail and the transaction roll back, all of it.

A statement or COMMIT refused for want of room (disk space, a queue's quota) marks its
transaction, so its rollback does not count toward the poison rules (see `capacity`).

Timers and lifetimes fire from `endpoints.ConversationTimers`: a DialogTimer message,
or an Error on both sides of a dialog whose LIFETIME ran out.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Final

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument, not_found
from . import catalog as cat
from .capacity import Capacity
from .conversations import CAN_SEND, ENDED_BY_FAR_SIDE, Endpoint, Event, State
from .delivery import Delivery, error_body
from .endpoints import ConversationTimers, Endpoints
from .names import database_of, plain
from .ports import Clock
from .priorities import assign_level
from .queues import Queue
from .routes import Routes
from .transactions import (
    End,
    MaybeAwaitable,
    Move,
    Send,
    Session,
    Timer,
    Transaction,
    Transactions,
    as_seconds,
    as_uuid,
)
from .transmission import TransmissionQueue
from .validation import validate_body

log = logging.getLogger("ssb.core")

LIFETIME_ERROR_CODE: Final = -8489
LIFETIME_ERROR_TEXT: Final = "The conversation dialog has exceeded the lifetime."
MAX_LIFETIME: Final = 2**31 - 1
# messages one SEND makes (each body on each conversation): they are made in one pass of
# the event loop, so this bounds how long one request keeps every other session waiting
MAX_SEND_MESSAGES: Final = 100_000


def as_body(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        return b""
    raise bad_argument(f"a message body must be bytes or str, got {type(value).__name__}")


@dataclass(eq=False)
class Dialogs:
    clock: Clock
    catalog: cat.Catalog
    routes: Routes
    queues: dict[str, Queue]
    endpoints: Endpoints
    transactions: Transactions
    delivery: Delivery
    transmission: TransmissionQueue
    capacity: Capacity

    def __post_init__(self) -> None:
        self.timers = ConversationTimers(
            self.endpoints, self.delivery.journal, self.clock, self._fire_timer, self._expire
        )
        self.delivery.timer_set = self.timers.schedule

    # ---- BEGIN DIALOG ------------------------------------------------------------------

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
        if len(to_service) > cat.MAX_NAME:  # as any service's name, here or on another broker
            raise bad_argument(
                f"to_service names a service: at most {cat.MAX_NAME} characters, got"
                f" {len(to_service)}"
            )
        if not isinstance(contract, str):
            raise bad_argument("contract must be a contract name")
        if not isinstance(encryption, bool):
            raise bad_argument("encryption must be True or False")
        if isinstance(broker_instance, uuid.UUID):
            broker_instance = str(broker_instance)
        broker_instance = cat.check_broker_instance(broker_instance)  # (as routes keep it)
        service = self.catalog.service(from_service)
        contract_def = self.catalog.contract(contract)
        database = database_of(service.name)
        local = self._check_target(to_service, broker_instance, contract_def.name, database)
        if encryption and not local:
            self.catalog.binding_for(to_service)  # raises: nothing to encrypt for
        seconds = as_seconds(lifetime, "lifetime", allow_none=True)
        if seconds is not None and not 1 <= seconds <= MAX_LIFETIME:
            raise bad_argument(f"lifetime must be 1..{MAX_LIFETIME} seconds")
        if related_conversation is not None and related_conversation_group is not None:
            raise bad_argument("give related_conversation or related_conversation_group, not both")
        queue = self.queues[service.queue]
        group_id: uuid.UUID
        if related_conversation is not None:
            related = self.endpoint(session, related_conversation)
            if related.queue != queue.name:
                raise bad_argument(
                    f"related conversation {related.handle} belongs to queue '{related.queue}',"
                    f" but service '{service.name}' uses queue '{queue.name}'"
                )
            group_id = related.group_id
        elif related_conversation_group is not None:
            group_id = as_uuid(related_conversation_group, "related_conversation_group")
            other = self.endpoints.group_queue(group_id)
            if other is not None and other != queue.name:
                raise bad_argument(
                    f"conversation group {group_id} belongs to queue '{other}', not '{queue.name}'"
                )
        else:
            group_id = uuid.uuid4()
        if self.capacity.refusal is not None:
            self.capacity.check_space(session.txn, "BEGIN DIALOG")
        txn = self.transactions.current(session)

        def act() -> uuid.UUID:
            now = self.clock.time()
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
                    self.catalog.in_database("broker_priority", database),
                    contract_def.name,
                    service.name,
                    to_service,
                ),
                lifetime_expiry=None if seconds is None else now + seconds,
                created=now,
                encrypted=encryption,
            )
            self.endpoints.begin(ep)
            txn.new_endpoints.append(ep)
            self.transactions.finish(txn)
            return ep.handle

        return self.transactions.locked(txn, [(queue, group_id)], act)

    def _check_target(
        self, to_service: str, broker_instance: object, contract: str, database: str
    ) -> bool:
        """Whether the target is on this broker (then it must accept the contract). A
        target no route leads to yet is not refused, as in Service Broker: its messages
        wait in the transmission queue, saying why, and go once a route (or the service
        here) exists."""
        key = self.routes.local_target(to_service, broker_instance, database)
        if key is not None:
            target = self.catalog.services[key]
            wanted = self.catalog.key_in("contract", contract, database_of(key))
            if wanted not in target.contracts:
                accepted = ", ".join(plain(c) for c in target.contracts)
                raise BrokerError(
                    ErrorCode.CONTRACT_NOT_ACCEPTED,
                    f"service '{to_service}' does not accept contract '{plain(contract)}'; "
                    f"it accepts {accepted or 'no contract (initiator only)'}",
                )
            return True
        return False

    def endpoint(self, session: Session, handle: object) -> Endpoint:
        """The endpoint of `handle` as this session may see it (a clear error if none)."""
        handle = as_uuid(handle, "conversation handle")
        ep = self.endpoints.get(handle)
        if (
            ep is None
            or (not ep.committed and (session.txn is None or ep not in session.txn.new_endpoints))
            or database_of(ep.service) != session.database
        ):
            raise not_found(
                ErrorCode.UNKNOWN_CONVERSATION,
                "conversation handle",
                handle,
                "it never existed or has ended",
            )
        return ep

    # ---- SEND ------------------------------------------------------------------------------

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
        if len(handle_list) * len(bodies) > MAX_SEND_MESSAGES:
            raise bad_argument(
                f"one send makes at most {MAX_SEND_MESSAGES} messages (each body on each"
                f" conversation), this one {len(handle_list) * len(bodies)}; split it"
            )
        body_list = [as_body(b) for b in bodies]
        if not body_list:
            raise bad_argument("send needs at least one message body")
        capacity = self.capacity
        limit = capacity.max_message_size
        for body in body_list:
            if len(body) > limit:
                capacity.check_body(len(body))
        mtype = self.catalog.message_type(message_type)
        txn = self.transactions.current(session)
        endpoints: list[Endpoint] = []
        for handle in handle_list:
            ep = self.endpoint(session, handle)
            if ep.handle in txn.ended:
                raise BrokerError(
                    ErrorCode.CONVERSATION_ENDED,
                    f"conversation {ep.handle} was ended earlier in this transaction",
                )
            if ep.state not in CAN_SEND:
                raise BrokerError(ErrorCode.CONVERSATION_ENDED, _cannot_send(ep))
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
        if capacity.refusal is not None:
            capacity.check_space(session.txn, "SEND")
        letter = cat.VALIDATIONS[mtype.validation]
        actions = [Send(ep, plain(mtype.name), letter, body_list) for ep in endpoints]
        if capacity.queue_quotas:
            earlier = [a for a in txn.actions if isinstance(a, Send)] if txn.actions else []
            self._check_quotas(txn, earlier + actions, "SEND")
        targets = [(self.queues[ep.queue], ep.group_id) for ep in endpoints]

        def act() -> None:
            txn.actions.extend(actions)
            self.transactions.finish(txn)

        return self.transactions.locked(txn, targets, act)

    def _quota_target(self, ep: Endpoint) -> Queue | None:
        """The local queue with a quota that `ep`'s messages go to, if any."""
        key = self.routes.local_target(
            ep.far_service, ep.far_broker_instance, database_of(ep.service)
        )
        service = None if key is None else self.catalog.services.get(key)
        queue = None if service is None else self.queues.get(service.queue)
        return queue if queue is not None and queue.has_quota else None

    def _check_quotas(self, txn: Transaction, sends: list[Send], what: str) -> None:
        """Raise QUEUE_FULL if `sends` (of `txn`) would break a local queue's quota."""
        wanted: dict[str, list[int]] = {}
        queues: dict[str, Queue] = {}
        for action in sends:
            target = self._quota_target(action.endpoint)
            if target is None:
                continue
            counts = wanted.setdefault(target.name, [0, 0])
            counts[0] += len(action.bodies)
            counts[1] += sum(len(b) for b in action.bodies)
            queues[target.name] = target
        for name, (count, nbytes) in wanted.items():
            self.capacity.check_quota(txn, queues[name], count, nbytes, what, self.clock.time())

    # ---- END CONVERSATION, timers, MOVE --------------------------------------------------------

    def end_conversation(
        self,
        session: Session,
        handle: object,
        error: object = None,
        description: object = None,
        cleanup: object = False,
    ) -> MaybeAwaitable[None]:
        ep = self.endpoint(session, handle)
        if error is not None:
            if isinstance(error, bool) or not isinstance(error, int) or error == 0:
                raise bad_argument("error must be a non-zero integer code")
            if not -(2**31) <= error < 2**31:
                raise bad_argument("error must fit in 32 bits")
            if not isinstance(description, str) or not description:
                raise bad_argument("end_conversation with error needs a description")
            if cleanup:
                raise bad_argument("give error or cleanup, not both")
        elif description is not None:
            raise bad_argument("a description goes with an error code (error=...)")
        if not isinstance(cleanup, bool):
            raise bad_argument("cleanup must be True or False")
        txn = self.transactions.current(session)
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
        end = End(
            ep, error if isinstance(error, int) else None, str(description or "")[:4000], cleanup
        )
        return self._locked(txn, [(self.queues[ep.queue], ep.group_id)], end)

    def begin_conversation_timer(
        self, session: Session, handle: object, timeout: object
    ) -> MaybeAwaitable[None]:
        ep = self.endpoint(session, handle)
        seconds = as_seconds(timeout, "timeout")
        assert seconds is not None
        txn = self.transactions.current(session)
        return self._locked(txn, [(self.queues[ep.queue], ep.group_id)], Timer(ep, seconds))

    def move_conversation(
        self, session: Session, handle: object, group_id: object
    ) -> MaybeAwaitable[None]:
        ep = self.endpoint(session, handle)
        target_id = as_uuid(group_id, "conversation group id")
        queue = self.queues[ep.queue]
        if target_id not in queue.groups and self.endpoints.group_queue(target_id) != queue.name:
            raise not_found(
                ErrorCode.UNKNOWN_CONVERSATION_GROUP,
                "conversation group",
                target_id,
                f"it must be a group of queue '{queue.name}'",
            )
        txn = self.transactions.current(session)
        groups = [(queue, ep.group_id), (queue, target_id)]
        return self._locked(txn, groups, Move(ep, target_id))

    def _locked(
        self, txn: Transaction, groups: list[tuple[Queue, uuid.UUID]], action: End | Timer | Move
    ) -> MaybeAwaitable[None]:
        """`action` joins the transaction once it holds the locks of `groups` (queue,
        group id), and the statement ends; an END also marks its conversation ended."""

        def act() -> None:
            if isinstance(action, End):
                txn.ended.add(action.endpoint.handle)
            txn.actions.append(action)
            self.transactions.finish(txn)

        return self.transactions.locked(txn, groups, act)

    # ---- at commit ----------------------------------------------------------------------------

    def check_commit(self, txn: Transaction) -> None:
        """Before an explicit transaction's COMMIT applies anything: room for its sends?"""
        sends = [a for a in txn.actions if isinstance(a, Send)]
        if sends:
            if self.capacity.refusal is not None:
                self.capacity.check_space(txn, "COMMIT of a transaction that sends")
            if self.capacity.queue_quotas:
                self._check_quotas(txn, sends, "COMMIT")

    def apply_commit(self, txn: Transaction) -> None:
        now = self.clock.time()
        for ep in txn.new_endpoints:
            if self.endpoints.known(ep):
                self.endpoints.insert(ep)
                if ep.lifetime_expiry is not None:
                    self.timers.schedule(ep)
        for action in txn.actions:
            if isinstance(action, Send):
                self._apply_send(action, now)
            elif isinstance(action, End):
                self._apply_end(action, now)
            elif isinstance(action, Timer):
                self._apply_timer(action, now)
            else:
                self._apply_move(action)

    def undo(self, txn: Transaction, first: int = 0) -> None:
        """Forget the endpoints `txn` began (from its `first` BEGIN DIALOG on)."""
        for ep in txn.new_endpoints[first:]:
            self.delivery.forget_endpoint(ep)
        del txn.new_endpoints[first:]

    def _apply_send(self, action: Send, now: float) -> None:
        ep = action.endpoint
        if ep.gone or ep.state not in CAN_SEND:
            log.info("send on %s dropped at commit: conversation ended meanwhile", ep.handle)
            return
        self.delivery.route(ep, action.message_type, action.validation, action.bodies, now)
        if ep.state == State.SO:
            ep.apply(Event.SENT)
        self.endpoints.update(ep)

    def end_now(self, ep: Endpoint, error: int, description: str) -> None:
        """End `ep` at once, outside any transaction, with an error to the far side when it
        still listens (DROP SERVICE, DROP DATABASE): nothing of it is left here but, until
        another broker acknowledges that error, its endpoint in DO."""
        if not ep.committed or ep.state in (State.DO, State.CD):
            self.remove_now(ep)
        else:
            self._apply_end(End(ep, error, description), self.clock.time())

    def remove_now(self, ep: Endpoint) -> None:
        """Remove `ep` at once, its messages and what it still has to send, telling nobody
        (NEW_BROKER, WITH CLEANUP)."""
        if not ep.committed:
            self.delivery.forget_endpoint(ep)
            return
        self.transmission.drop(ep.conversation_id, ep.is_initiator)
        self.delivery.remove_endpoint(ep)

    def _apply_end(self, action: End, now: float) -> None:
        ep = action.endpoint
        if not self.endpoints.known(ep):
            return
        if action.cleanup:
            self.remove_now(ep)
            return
        self.delivery.drop_messages(ep)
        if action.error is not None:
            self.transmission.drop(ep.conversation_id, ep.is_initiator)
        if ep.state in ENDED_BY_FAR_SIDE or ep.state == State.SO or self.delivery.far_gone(ep):
            ep.state = State.CD
            self.delivery.remove_endpoint(ep)
            return
        ep.apply(Event.END)
        if action.error is not None:
            mtype, letter, body = cat.ERROR, "X", error_body(action.error, action.description)
        else:
            mtype, letter, body = cat.END_DIALOG, "E", b""
        self.delivery.route(ep, mtype, letter, [body], now)
        if self.endpoints.known(ep):
            self.endpoints.update(ep)

    def _apply_timer(self, action: Timer, now: float) -> None:
        ep = action.endpoint
        if not self.endpoints.known(ep):
            return
        ep.timer_at = now + action.timeout
        self.endpoints.update(ep)
        self.timers.schedule(ep)

    def _apply_move(self, action: Move) -> None:
        ep = action.endpoint
        queue = self.queues[ep.queue]
        if not self.endpoints.known(ep) or ep.group_id == action.group:
            return
        source = queue.groups.get(ep.group_id)
        conv = source.conversations.pop(ep.handle, None) if source is not None else None
        ep.group_id = action.group
        if conv is not None and source is not None:
            target = queue.group(action.group)
            conv.group = target
            target.conversations[ep.handle] = conv
            queue.touch(source)
            queue.touch(target)
        self.endpoints.update(ep)

    # ---- timers fire ------------------------------------------------------------------------------

    def _fire_timer(self, ep: Endpoint) -> None:
        ep.timer_at = None
        self.delivery.enqueue(ep, -1, cat.DIALOG_TIMER, "E", b"", self.clock.time())
        self.endpoints.update(ep)

    def _expire(self, ep: Endpoint) -> None:
        if ep.state == State.DO:
            self.transmission.drop(ep.conversation_id, ep.is_initiator)
            self.delivery.remove_endpoint(ep)
            return
        if ep.state in (State.ER, State.CD):
            return
        ep.apply(Event.RECEIVED_ERROR)
        self.delivery.enqueue(
            ep,
            -1,
            cat.ERROR,
            "X",
            error_body(LIFETIME_ERROR_CODE, LIFETIME_ERROR_TEXT),
            self.clock.time(),
        )
        self.endpoints.update(ep)


def _cannot_send(ep: Endpoint) -> str:
    if ep.state == State.DI:
        why = "the far side ended it; call end_conversation to close your side"
    elif ep.state == State.ER:
        why = "it failed with an error (see the Error message in the queue); end it"
    else:
        why = "it has been ended"
    return f"cannot send on conversation {ep.handle} (state {ep.state.name}): {why}"
