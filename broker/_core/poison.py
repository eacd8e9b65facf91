"""Poison messages: Service Broker's rule and the per-queue poison policy beyond it.

Theory of operation. Service Broker's rule: a transaction that received from a queue
and rolls back five times in a row disables the queue (status OFF) and fires
BROKER_QUEUE_DISABLED, unless the queue has POISON_MESSAGE_HANDLING (STATUS = OFF).

A queue may also carry a `PoisonPolicy`: when a transaction that received a message
rolls back and that message has now failed `threshold` deliveries, the policy acts on
that one message, so the rest of the queue keeps flowing:

- dead_letter: move it, with its original columns and the reason, to the dead-letter
  queue (as a message of its original conversation handle and group, which no endpoint
  of that queue owns); `requeue_dead_letter` puts it back at the head of its conversation;
- end_conversation: end its conversation with an error on both sides;
- park: take it out of the queue and put it back at the head of its conversation after
  `delay` seconds, at most `max_parks` times, then dead-letter it (or end the
  conversation when there is no dead-letter queue);
- record: leave it where it is and only record the incident.

Every action, and every queue disabled by the rule (one incident per message the last
rolled-back transaction received), records an incident (the store's poison_messages
table, the body kept with it) and, when the policy names a `notify_service`, posts an EventNotification of type
POISON_MESSAGE to that service. A policy action resets the queue's rollback streak, so
a handled poison message does not also disable the queue. Nothing is dropped silently.

A parked message keeps its row (status PARKED, with the time it comes back); while it
is away only its record stays in memory, its body is on disk.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final
from xml.sax.saxutils import escape

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument, not_found
from . import catalog as cat
from .conversations import CAN_SEND, Endpoint, State
from .delivery import Delivery
from .endpoints import Endpoints
from .events import Events
from .ports import Cancellable, Clock, Journal, Row
from .queue_options import PoisonPolicy
from .queues import Message, Queue, Status

log = logging.getLogger("ssb.core")

POISON_ROLLBACKS: Final = 5
MAX_QUEUING_ORDER: Final = 2**63 - 1  # a signed 64-bit column in the store


@dataclass(eq=False)
class Poison:
    """Applies queues' poison policies; owns parked messages and incident ids."""

    journal: Journal
    clock: Clock
    queues: dict[str, Queue]
    endpoints: Endpoints
    delivery: Delivery
    events: Events

    def __post_init__(self) -> None:
        self.parked: dict[int, tuple[str, Message]] = {}
        self._timers: dict[int, Cancellable] = {}
        self._next_incident = 1
        # set by the engine: turn a queue OFF with a reason (the catalog's business)
        self.disable_queue: Callable[[Queue, str], None] = lambda queue, reason: None

    def restore_ids(self, max_incident: int) -> None:
        self._next_incident = max_incident + 1

    def park_loaded(self, queue: Queue, message: Message) -> None:
        """A message that was parked when the daemon stopped stays parked."""
        self.parked[message.queuing_order] = (queue.name, message)
        self._arm(message.queuing_order, message.parked_until or 0.0)

    # ---- after a rollback --------------------------------------------------------------

    def after_rollback(self, queue: Queue, messages: list[Message]) -> None:
        """Service Broker's rule and the queue's policy, after a receiving rollback."""
        if self._apply_policy(queue, messages):
            queue.rollback_streak = 0
            return
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
            for message in messages:  # what the last rolled-back transaction received
                self._record(queue.name, message, "queue_disabled")
            self.disable_queue(queue, reason)
            self.events.fire("BROKER_QUEUE_DISABLED", queue.name)

    def _apply_policy(self, queue: Queue, messages: list[Message]) -> bool:
        """Returns True when a message was moved out of the way (dead-lettered, parked or
        its conversation ended)."""
        policy = queue.definition.poison_policy
        if policy is None:
            return False
        moved = False
        for message in messages:
            if message.delivery_count < policy.threshold:
                continue
            action = policy.action
            if action == "park" and message.parks >= policy.max_parks:
                action = "dead_letter" if policy.dead_letter_queue else "end_conversation"
            if action == "record":
                if message.delivery_count == policy.threshold:
                    self._record(queue.name, message, "record")
                continue
            if not queue.remove(message):
                continue  # no longer ready (taken again, or its conversation ended)
            moved = True
            if action == "dead_letter":
                assert policy.dead_letter_queue is not None
                self._dead_letter(queue, message, policy.dead_letter_queue)
            elif action == "park":
                self._park(message, policy.delay)
            else:
                self._end_conversation(queue, message, policy)
            self._record(queue.name, message, action)
        return moved

    def _dead_letter(self, queue: Queue, message: Message, dlq_name: str) -> None:
        dlq = self.queues[dlq_name]
        self.delivery.delete(queue, message)
        reason = (
            f"poison message: failed {message.delivery_count} deliveries from queue "
            f"'{queue.name}'"
            + (f"; last error: {message.last_error}" if message.last_error else "")
        )
        body = message.message_body
        if body is None:
            body = self.journal.read_message_bodies([message.queuing_order]).get(
                message.queuing_order, b""
            )
        origin = message.conversation
        conv = dlq.conversation(
            dlq.group(origin.group_id),
            origin.handle,
            origin.priority,
            origin.service,
            origin.contract,
        )
        conv.dead_letters = True
        letter = Message(
            self.delivery.next_order(),
            conv,
            message.message_sequence_number,
            message.message_type_name,
            message.validation,
            body,
            message.message_enqueue_time,
            len(body),
            delivery_count=message.delivery_count,
            last_error=message.last_error,
            dead_letter_reason=reason,
            origin_queue=queue.name,
        )
        self.delivery.store(dlq, letter)
        dlq.add(letter)
        self.delivery.kick(dlq)
        self.delivery.listener.message_arrived(dlq)

    def _park(self, message: Message, delay: float) -> None:
        message.parks += 1
        message.parked_until = self.clock.time() + delay
        message.status = Status.PARKED
        self.journal.set_message_status(message.queuing_order, int(Status.PARKED))
        self.journal.set_message_extra(message.queuing_order, message.extra())
        if message.batch <= self.journal.durable:
            message.message_body = None  # on disk; read again when it is taken
        self.parked[message.queuing_order] = (message.queue, message)
        self._arm(message.queuing_order, message.parked_until)

    def _arm(self, order: int, at: float) -> None:
        self._timers[order] = self.clock.call_at(at, lambda: self._unpark(order))

    def _unpark(self, order: int) -> None:
        self._timers.pop(order, None)
        entry = self.parked.pop(order, None)
        if entry is None:
            return
        queue_name, message = entry
        queue = self.queues.get(queue_name)
        ep = self.endpoints.get(message.conversation_handle)
        message.parked_until = None
        if queue is None or ep is None:
            # its conversation ended while it was parked: keep it visible as an incident
            self.journal.delete_message(order)
            if queue is not None:
                queue.uncounted(message)
            self._record(queue_name, message, "discarded: conversation ended while parked")
            return
        message.status = Status.REQUEUED
        message.conversation = queue.conversation(
            queue.group(ep.group_id), ep.handle, ep.priority, ep.service, ep.contract
        )
        self.journal.set_message_status(order, int(Status.REQUEUED))
        self.journal.set_message_extra(order, message.extra())
        queue.add_front(message)
        self.delivery.kick(queue)
        self.delivery.listener.message_arrived(queue)

    def forget_conversation(self, handle: uuid.UUID) -> None:
        """The conversation ended: its parked messages go with it (recorded)."""
        for order, (queue_name, message) in list(self.parked.items()):
            if message.conversation_handle == handle:
                timer = self._timers.pop(order, None)
                if timer is not None:
                    timer.cancel()
                del self.parked[order]
                self.journal.delete_message(order)
                queue = self.queues.get(queue_name)
                if queue is not None:
                    queue.uncounted(message)
                self._record(queue_name, message, "discarded: conversation ended while parked")

    def _end_conversation(self, queue: Queue, message: Message, policy: PoisonPolicy) -> None:
        ep = self.endpoints.get(message.conversation_handle)
        self.delivery.delete(queue, message)
        if ep is None:
            return
        description = policy.description or (
            f"poison message {message.queuing_order} failed {message.delivery_count} deliveries"
            + (f": {message.last_error}" if message.last_error else "")
        )
        self.delivery.fail_conversation(ep, policy.error_code, description)

    # ---- incidents and notifications -------------------------------------------------------

    def _record(self, queue_name: str, message: Message, action: str) -> None:
        ident = self._next_incident
        self._next_incident += 1
        now = self.clock.time()
        body = message.message_body
        if body is None:
            body = self.journal.read_message_bodies([message.queuing_order]).get(
                message.queuing_order
            )
        self.journal.insert_poison(
            (
                ident,
                queue_name,
                message.conversation_handle,
                message.queuing_order,
                message.delivery_count,
                action,
                now,
                message.last_error,
                body,
            )
        )
        queue = self.queues.get(queue_name)
        policy = queue.definition.poison_policy if queue else None
        if policy is not None and policy.notify_service:
            details = (
                f"<Action>{escape(action)}</Action>"
                f"<ConversationHandle>{message.conversation_handle}</ConversationHandle>"
                f"<QueuingOrder>{message.queuing_order}</QueuingOrder>"
                f"<DeliveryCount>{message.delivery_count}</DeliveryCount>"
                f"<Error>{escape(message.last_error)}</Error>"
            )
            note = cat.EventNotification(
                f"poison policy of {queue_name}",
                "POISON_MESSAGE",
                queue_name,
                policy.notify_service,
            )
            self.events.post(note, self.events.body("POISON_MESSAGE", queue_name, details))

    # ---- re-queueing a dead letter -------------------------------------------------------

    def requeue(self, queue_name: object, queuing_order: object) -> None:
        if not isinstance(queue_name, str) or queue_name not in self.queues:
            raise not_found(ErrorCode.UNKNOWN_QUEUE, "queue", queue_name)
        if (
            isinstance(queuing_order, bool)
            or not isinstance(queuing_order, int)
            or not 1 <= queuing_order <= MAX_QUEUING_ORDER
        ):
            raise bad_argument(
                "queuing_order must be the dead letter's queuing_order, an integer from 1 to"
                f" {MAX_QUEUING_ORDER}; got {queuing_order!r}"
            )
        dlq = self.queues[queue_name]
        row = self.journal.read_message(queuing_order)
        letter = self._dead_letter_in(dlq, row) if row is not None else None
        if letter is None:
            raise not_found(
                ErrorCode.UNKNOWN_CONVERSATION,
                "dead letter",
                queuing_order,
                f"look in view queue:{queue_name} for the queuing_order of a moved message",
            )
        conv = letter.conversation
        group = dlq.groups.get(conv.group_id)
        if group is not None and group.owner is not None:
            raise BrokerError(
                ErrorCode.LOCK_TIMEOUT,
                f"dead letter {queuing_order} is being received by another transaction",
            )
        ep = self.endpoints.get(conv.handle)
        if ep is None or ep.state not in (*CAN_SEND, State.DI):
            raise BrokerError(
                ErrorCode.CONVERSATION_ENDED,
                f"the conversation of dead letter {queuing_order} has ended; receive the message "
                f"from '{queue_name}' instead of re-queueing it",
            )
        if not self._take_letter(dlq, letter):
            raise not_found(
                ErrorCode.UNKNOWN_CONVERSATION, "dead letter", queuing_order, "it was received"
            )
        body = letter.message_body
        if body is None:
            body = self.journal.read_message_bodies([queuing_order]).get(queuing_order, b"")
        self.delivery.delete(dlq, letter)
        self._requeue(ep, letter, body)

    def _dead_letter_in(self, dlq: Queue, row: Row) -> Message | None:
        """The dead letter of `dlq` that this row is, as a message of its DLQ conversation."""
        if row[1] != dlq.name or row[8] != int(Status.READY):
            return None
        handle = uuid.UUID(bytes=row[2])
        for conv in dlq.conversations():
            if conv.handle != handle or not conv.dead_letters:
                continue
            message = conv.message(row)
            if message.dead_letter_reason is None:
                return None
            for resident in conv.resident_items():
                if resident.queuing_order == message.queuing_order:
                    return resident
            return message
        return None

    @staticmethod
    def _take_letter(dlq: Queue, letter: Message) -> bool:
        conv = letter.conversation
        if dlq.remove(letter):
            return True
        if conv.discard(letter.queuing_order, letter.size):
            dlq.ready -= 1
            dlq.touch(conv.group)
            dlq.drop_if_idle(conv.group)
            return True
        return False

    def _requeue(self, ep: Endpoint, letter: Message, body: bytes) -> None:
        origin = self.queues[ep.queue]
        conv = origin.conversation(
            origin.group(ep.group_id), ep.handle, ep.priority, ep.service, ep.contract
        )
        again = replace(
            letter,
            queuing_order=self.delivery.next_order(),
            conversation=conv,
            message_body=body,
            size=len(body),
            status=Status.REQUEUED,
            dead_letter_reason=None,
            origin_queue=None,
            last_error="",
            parks=0,
            parked_until=None,
        )
        self.delivery.store(origin, again)
        origin.add_front(again)
        self.delivery.kick(origin)
        self.delivery.listener.message_arrived(origin)
