"""Poison messages: the per-queue poison policy that Service Broker never had.

Theory of operation. Service Broker's own rule (five rollbacks in a row disable the
queue) lives in the engine. A queue may also carry a `PoisonPolicy`: when a
transaction that received a message rolls back and that message has now failed
`threshold` deliveries, the policy acts on that one message, so the rest of the
queue keeps flowing:

- dead_letter: move it, with its original columns and the reason, to the
  dead-letter queue (as a message of its original conversation handle and group,
  which no endpoint of that queue owns); `requeue_dead_letter` puts it back;
- end_conversation: end its conversation with an error on both sides (each side
  gets an Error message; the far side's endpoint and ours go to ER);
- park: take it out of the queue and put it back at the head of its conversation
  after `delay` seconds, at most `max_parks` times, then dead-letter it (or end the
  conversation when there is no dead-letter queue);
- record: leave it where it is and only record the incident.

Every action records an incident (the `poison_messages` view; the body is kept with
it) and, when the policy names a `notify_service`, posts an EventNotification of
type POISON_MESSAGE to that service. A policy action resets the queue's rollback
streak, so a handled poison message does not also disable the queue. Nothing is
dropped silently.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

from ssb.protocol import ErrorCode, unpack

from . import _catalog as cat
from ._conversations import CAN_SEND, State
from ._errors import BrokerError, bad_argument, not_found
from ._queues import Message, Queue

if TYPE_CHECKING:
    from ._engine import Engine


class PoisonHandler:
    """Applies queues' poison policies; owns parked messages and incidents."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.incidents: list[dict[str, Any]] = []
        self.parked: dict[int, tuple[str, Message]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._next_incident = 1

    # ---- start -----------------------------------------------------------------

    def load_incident(self, row: tuple[Any, ...]) -> None:
        ident, queue, handle, order, count, action, when, error = row
        self.incidents.append(
            {
                "id": ident,
                "queue": queue,
                "conversation_handle": None if handle is None else uuid.UUID(bytes=handle),
                "queuing_order": order,
                "delivery_count": count,
                "action": action,
                "time": when,
                "error": error,
            }
        )
        self._next_incident = max(self._next_incident, ident + 1)

    @staticmethod
    def restore_extra(message: Message, extra: bytes) -> None:
        data = unpack(extra)
        message.dead_letter_reason = data.get("reason")
        message.origin_queue = data.get("origin")
        message.parked_until = data.get("parked_until")
        message.parks = data.get("parks", 0)
        message.last_error = data.get("error", "")
        if message.dead_letter_reason is not None:
            message.conversation_group_id = data["group"]
            message.service_name = data["service"]
            message.service_contract_name = data["contract"]
            message.priority = data["priority"]

    def park_loaded(self, queue: Queue, message: Message) -> None:
        """A message that was parked when the daemon stopped stays parked."""
        self.parked[message.queuing_order] = (queue.name, message)

    def start(self) -> None:
        for order, (_, message) in self.parked.items():
            self._arm(order, message.parked_until or 0.0)

    # ---- after a rollback --------------------------------------------------------

    def after_rollback(self, queue: Queue, messages: list[Message]) -> bool:
        """Apply the queue's policy to messages that reached the threshold.

        Returns True when a message was moved out of the way (dead-lettered, parked
        or its conversation ended), which resets the queue's rollback streak.
        """
        policy = queue.definition.poison_policy
        if policy is None:
            return False
        moved = False
        for message in messages:
            if message.delivery_count < policy.threshold:
                continue
            if not self._still_ready(queue, message):
                continue
            action = policy.action
            if action == "park" and message.parks >= policy.max_parks:
                action = "dead_letter" if policy.dead_letter_queue else "end_conversation"
            if action == "record":
                if message.delivery_count == policy.threshold:
                    self._record(queue, message, "record")
                continue
            moved = True
            if action == "dead_letter":
                assert policy.dead_letter_queue is not None
                self._dead_letter(queue, message, policy.dead_letter_queue)
            elif action == "park":
                self._park(queue, message, policy.delay)
            else:
                self._end_conversation(queue, message, policy)
            self._record(queue, message, action)
        return moved

    def _still_ready(self, queue: Queue, message: Message) -> bool:
        group = queue.groups.get(message.conversation_group_id)
        if group is None:
            return False
        conv = group.convs.get(message.conversation_handle)
        return conv is not None and message in conv

    def _take(self, queue: Queue, message: Message) -> None:
        queue.remove(queue.groups[message.conversation_group_id], message)

    def _dead_letter(self, queue: Queue, message: Message, dlq_name: str) -> None:
        engine = self.engine
        dlq = engine.queues[dlq_name]
        self._take(queue, message)
        engine.store.delete_message(message.queuing_order)
        reason = (
            f"poison message: failed {message.delivery_count} deliveries from queue "
            f"'{queue.name}'" + (f"; last error: {message.last_error}" if message.last_error else "")
        )
        letter = Message(
            engine.next_queuing_order(),
            dlq.name,
            message.conversation_handle,
            message.conversation_group_id,
            message.message_sequence_number,
            message.service_name,
            message.service_contract_name,
            message.message_type_name,
            message.validation,
            message.message_body,
            message.message_enqueue_time,
            message.priority,
            delivery_count=message.delivery_count,
            last_error=message.last_error,
            dead_letter_reason=reason,
            origin_queue=queue.name,
        )
        dlq.add(letter)
        engine.store.insert_message(letter.row())
        engine.kick(dlq)
        engine.listener.message_arrived(dlq)

    def _park(self, queue: Queue, message: Message, delay: float) -> None:
        self._take(queue, message)
        message.parks += 1
        message.parked_until = time.time() + delay
        self.engine.store.set_message_extra(message.queuing_order, message.extra())
        self.parked[message.queuing_order] = (queue.name, message)
        self._arm(message.queuing_order, message.parked_until)

    def _arm(self, order: int, at: float) -> None:
        loop = self.engine.loop
        self._timers[order] = loop.call_later(max(0.0, at - time.time()), self._unpark, order)

    def _unpark(self, order: int) -> None:
        self._timers.pop(order, None)
        entry = self.parked.pop(order, None)
        if entry is None:
            return
        queue_name, message = entry
        engine = self.engine
        queue = engine.queues.get(queue_name)
        ep = engine.endpoints.get(message.conversation_handle)
        message.parked_until = None
        if queue is None or ep is None:
            # its conversation ended while it was parked: keep it visible as an incident
            engine.store.delete_message(order)
            self._record_detached(queue_name, message, "discarded: conversation ended while parked")
            return
        message.conversation_group_id = ep.group_id
        engine.store.set_message_extra(order, message.extra())
        queue.add_front(message)
        engine.kick(queue)
        engine.listener.message_arrived(queue)

    def forget_conversation(self, handle: uuid.UUID) -> None:
        """The conversation ended: its parked messages go with it (recorded)."""
        for order, (queue_name, message) in list(self.parked.items()):
            if message.conversation_handle == handle:
                timer = self._timers.pop(order, None)
                if timer is not None:
                    timer.cancel()
                del self.parked[order]
                self.engine.store.delete_message(order)
                self._record_detached(
                    queue_name, message, "discarded: conversation ended while parked"
                )

    def _end_conversation(self, queue: Queue, message: Message, policy: cat.PoisonPolicy) -> None:
        engine = self.engine
        ep = engine.endpoints.get(message.conversation_handle)
        self._take(queue, message)
        engine.store.delete_message(message.queuing_order)
        if ep is None:
            return
        description = policy.description or (
            f"poison message {message.queuing_order} failed {message.delivery_count} deliveries"
            + (f": {message.last_error}" if message.last_error else "")
        )
        engine.fail_conversation(ep, policy.error_code, description)

    # ---- incidents and notifications ------------------------------------------------

    def _record(self, queue: Queue, message: Message, action: str) -> None:
        self._record_detached(queue.name, message, action)

    def _record_detached(self, queue_name: str, message: Message, action: str) -> None:
        engine = self.engine
        ident = self._next_incident
        self._next_incident += 1
        now = time.time()
        incident = {
            "id": ident,
            "queue": queue_name,
            "conversation_handle": message.conversation_handle,
            "queuing_order": message.queuing_order,
            "delivery_count": message.delivery_count,
            "action": action,
            "time": now,
            "error": message.last_error,
        }
        self.incidents.append(incident)
        engine.store.insert_poison(
            (
                ident,
                queue_name,
                message.conversation_handle,
                message.queuing_order,
                message.delivery_count,
                action,
                now,
                message.last_error,
                message.message_body,
            )
        )
        queue = engine.queues.get(queue_name)
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
                f"poison policy of {queue_name}", "POISON_MESSAGE", queue_name, policy.notify_service
            )
            engine.post_notification(note, engine.event_body("POISON_MESSAGE", queue_name, details))

    # ---- re-queueing a dead letter ---------------------------------------------------

    def requeue(self, queue_name: object, queuing_order: object) -> None:
        engine = self.engine
        if not isinstance(queue_name, str) or queue_name not in engine.queues:
            raise not_found(ErrorCode.UNKNOWN_QUEUE, "queue", queue_name)
        if not isinstance(queuing_order, int):
            raise bad_argument("queuing_order must be the dead letter's queuing_order")
        dlq = engine.queues[queue_name]
        letter = next(
            (m for m in dlq.all_messages() if m.queuing_order == queuing_order), None
        )
        if letter is None or letter.dead_letter_reason is None:
            raise not_found(
                ErrorCode.UNKNOWN_CONVERSATION,
                "dead letter",
                queuing_order,
                f"look in view queue:{queue_name} for the queuing_order of a moved message",
            )
        group = dlq.groups[letter.conversation_group_id]
        if group.owner is not None:
            raise BrokerError(
                ErrorCode.LOCK_TIMEOUT,
                f"dead letter {queuing_order} is being received by another transaction",
            )
        ep = engine.endpoints.get(letter.conversation_handle)
        if ep is None or ep.state not in (*CAN_SEND, State.DI):
            raise BrokerError(
                ErrorCode.CONVERSATION_ENDED,
                f"the conversation of dead letter {queuing_order} has ended; receive the message "
                f"from '{queue_name}' instead of re-queueing it",
            )
        origin = engine.queues[ep.queue]
        dlq.remove(group, letter)
        if not group.endpoints and not group.convs:
            del dlq.groups[group.id]
        engine.store.delete_message(letter.queuing_order)
        again = engine.message_for(
            ep,
            engine.next_queuing_order(),
            letter.message_sequence_number,
            letter.message_type_name,
            letter.validation,
            letter.message_body,
            letter.message_enqueue_time,
        )
        origin.add_front(again)
        engine.store.insert_message(again.row())
        engine.kick(origin)
        engine.listener.message_arrived(origin)

