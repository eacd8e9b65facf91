"""Delivery: where every sequenced message goes, local delivery, and enqueue.

Theory of operation. A sequenced message (user message, EndDialog, Error) leaves its
endpoint at commit through `route`:

- to a service on this broker, it goes straight into the target queue (creating the
  target endpoint with the first message), unless that queue is OFF or earlier
  messages of the same direction still wait: then it waits in the transmission queue
  (see `transmission`), in order, and `release_held` delivers it when the queue is ON
  again;
- to a service elsewhere, it waits in the transmission queue until the far broker
  acknowledges it; the transport, told of it (`OutboundSink.outbound`), pulls it once
  its row is durable.

A message from another broker arrives complete and in order (see `remote`): on an
established conversation it goes straight into the queue; otherwise it takes the local
path above (`deliver_local`), with its sender's broker id.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from xml.sax.saxutils import escape

from . import catalog as cat
from .backlog import LOAD_BYTES
from .capacity import Capacity
from .conversations import CAN_SEND, Endpoint, Event, State
from .endpoints import Endpoints
from .names import DEFAULT_DATABASE, database_of, plain
from .ports import Clock, Journal, OutboundSink, QueueListener
from .priorities import assign_level
from .queues import Message, Queue
from .routes import Routes
from .transmission import DialogOutbox, Outbound, TransmissionQueue

log = logging.getLogger("ssb.core")

RELEASE_CHUNK: Final = 1000  # held messages delivered per pass of the event loop
SYSTEM_TYPES: Final = frozenset({cat.END_DIALOG, cat.ERROR})
# Service Broker's (11215): the sending broker's login may not SEND to the service
NO_SEND_PERMISSION_ERROR: Final = -11215


def error_body(code: int, description: str) -> bytes:
    return (
        f'<Error xmlns="{cat.ERROR}"><Code>{int(code)}</Code>'
        f"<Description>{escape(description)}</Description></Error>"
    ).encode()


@dataclass(eq=False)
class Delivery:
    """Where every sequenced message goes: local delivery, and the transmission queue
    (`transmission`) for what must wait."""

    journal: Journal
    clock: Clock
    catalog: cat.Catalog
    routes: Routes
    queues: dict[str, Queue]
    endpoints: Endpoints
    transmission: TransmissionQueue
    capacity: Capacity
    instance_id: str
    listener: QueueListener
    sink: OutboundSink

    def __post_init__(self) -> None:
        self.outboxes = self.transmission.outboxes  # read here; the transmission queue owns it
        self._hold_many = self.transmission.hold_many
        self.kick: Callable[[Queue], None] = lambda queue: None
        self.conversation_removed: Callable[[Endpoint], None] = lambda ep: None
        self.timer_set: Callable[[Endpoint], None] = lambda ep: None
        self._next_order = 1

    def restore_ids(self, max_order: int) -> None:
        self._next_order = max_order + 1

    def next_order(self) -> int:
        order = self._next_order
        self._next_order += 1
        return order

    # ---- the queue side ------------------------------------------------------------------

    def store(self, queue: Queue, message: Message) -> None:
        """Write a new message row and count it in its queue."""
        self.journal.insert_message(message.row())
        message.batch = self.journal.watermark()
        queue.counted(message)

    def delete(self, queue: Queue | None, message: Message) -> None:
        """Delete a message row (and uncount it)."""
        self.journal.delete_message(message.queuing_order)
        if queue is not None:
            queue.uncounted(message)

    def enqueue(
        self, ep: Endpoint, seq: int, mtype: str, letter: str, body: bytes, now: float
    ) -> Message:
        """A message of `ep`'s conversation arrives in its queue."""
        return self.enqueue_many(ep, seq, mtype, letter, [body], now)[0]

    def enqueue_many(
        self, ep: Endpoint, seq: int, mtype: str, letter: str, bodies: list[bytes], now: float
    ) -> list[Message]:
        """Messages of `ep`'s conversation arrive in its queue (sequence numbers from `seq`,
        or all -1 for messages the broker makes itself)."""
        queue = self.queues[ep.queue]
        conv = queue.conversation(
            queue.group(ep.group_id), ep.handle, ep.priority, ep.service, ep.contract
        )
        insert = self.journal.insert_message
        step = 0 if seq < 0 else 1
        messages = []
        for i, body in enumerate(bodies):
            message = Message(
                self.next_order(), conv, seq + i * step, mtype, letter, body, now, len(body)
            )
            insert(message.row())
            messages.append(message)
        batch = self.journal.watermark()
        for message in messages:
            message.batch = batch
            queue.counted(message)
        queue.add_many(conv, messages)
        self.kick(queue)
        self.listener.message_arrived(queue)
        return messages

    # ---- routing at commit ------------------------------------------------------------------

    def route(self, ep: Endpoint, mtype: str, letter: str, bodies: list[bytes], now: float) -> None:
        """Send `bodies` as `ep`'s next sequenced messages (numbers assigned here)."""
        first = ep.send_seq
        ep.send_seq += len(bodies)
        target = self.routes.local_target(
            ep.far_service, ep.far_broker_instance, database_of(ep.service)
        )
        from_service, contract = plain(ep.service), plain(ep.contract)
        outs = [
            Outbound(
                0,
                ep.handle,
                ep.conversation_id,
                ep.far_service if target is None else target,
                ep.far_broker_instance,
                from_service,
                contract,
                ep.is_initiator,
                first + i,
                mtype,
                letter,
                body,
                now,
                ep.priority,
            )
            for i, body in enumerate(bodies)
        ]
        if target is None:
            found = self.routes.find(ep.far_service, ep.far_broker_instance)
            if found is None:
                for out in outs:
                    out.status = f"no route to service '{ep.far_service}'"
            self.sink.outbound(self._hold_many(outs, False))
            return
        reason = self.local_block(target)
        if (ep.conversation_id, ep.is_initiator) in self.outboxes or reason:
            for out in outs:
                out.status = reason or "waiting behind earlier messages of this conversation"
            self._hold_many(outs, True)
            return
        if mtype in SYSTEM_TYPES or len(outs) == 1:
            for out in outs:
                self.deliver_local(out, now)
            return
        far = self.endpoints.by_conversation(ep.conversation_id, not ep.is_initiator)
        if far is None and ep.is_initiator:
            far = self.create_target(outs[0], now)
        if far is None or far.state in (State.DO, State.CD):
            for out in outs:
                self.deliver_local(out, now)
            return
        # user messages on a conversation that is open at the far side: one batch
        far.apply(Event.RECEIVED_MESSAGE)
        far.receive_seq = first + len(outs)
        self.enqueue_many(far, first, mtype, letter, bodies, now)
        self.endpoints.update(far)

    def local_block(self, service_name: str) -> str:
        """Why a message for this broker's service (its key) cannot go into its queue now,
        if so."""
        service = self.catalog.services.get(service_name)
        if service is None:
            return f"service '{plain(service_name)}' does not exist"
        queue = self.queues.get(service.queue)
        if queue is None:
            return f"queue '{service.queue}' of service '{service_name}' does not exist"
        if not queue.definition.status:
            return f"queue '{queue.name}' is disabled (STATUS = OFF)"
        return ""

    def release_held(self, queue_name: str) -> None:
        """Deliver, in order, what waited for a queue that is ON again."""
        for box in list(self.outboxes.values()):
            if not box.local or box.releasing:
                continue
            target = self.transmission.target_queue(box.to_service)
            if target is not None and target.name == queue_name:
                self._release(box)

    def service_created(self, name: str) -> None:
        """A service of this broker was created (`name`: its key): what waited in the
        transmission queue for a service of that name (held here, or one no route led to
        and never sent anywhere, named as BEGIN DIALOG named it) is delivered."""
        for box in [b for b in self.outboxes.values() if b.to_service in (name, plain(name))]:
            if not box.local:
                ep = self.endpoints.by_conversation(box.conversation_id, box.is_initiator)
                if ep is not None and ep.far_broker_instance is not None:
                    continue
                origin = DEFAULT_DATABASE if ep is None else database_of(ep.service)
                if self.routes.local_target(box.to_service, box.to_broker_instance, origin) != name:
                    continue
                box.to_service = name  # from now on it waits for that service, by its key
                self.transmission.make_local(box)
            elif not self._may_release(box, name):
                continue
            self._release(box)

    def _may_release(self, box: DialogOutbox, service: str) -> bool:
        """Whether what another broker sent for a service not created yet may go to it
        now that it exists: that broker's login needs SEND on it, as on arrival; until it
        has that (a GRANT tells `service_created` again), the messages wait, saying so."""
        taken = box.take(1, LOAD_BYTES)
        if not taken:
            return True
        first = taken[0]
        box.appendleft(first)
        origin = first.from_broker_instance
        if origin is None or self.sink.may_deliver(origin, service):
            return True
        status = (
            f"waits for the login of broker {origin} to hold SEND on service '{plain(service)}'"
        )
        if box.status != status:
            box.status = status
            log.warning("messages of conversation %s %s", box.conversation_id, status)
        return False

    def refuse_unopened(
        self, far: Endpoint, seq: int, text: str, from_broker: str, now: float
    ) -> None:
        """A new dialog from a broker without SEND on its service: the error goes back to
        the initiator as if the service had ended the dialog with it, and nothing of it
        reaches the service's queue; the endpoint goes once the far broker has it."""
        log.warning(
            "conversation %s from broker %s: message %d refused: %s",
            far.conversation_id,
            from_broker,
            seq,
            text,
        )
        far.receive_seq = seq + 1
        far.apply(Event.END)
        body = error_body(NO_SEND_PERMISSION_ERROR, f"refused by broker {self.instance_id}: {text}")
        self.route(far, cat.ERROR, "X", [body], now)
        if self.endpoints.known(far):
            self.endpoints.update(far)

    def _release(self, box: DialogOutbox) -> None:
        box.releasing = False
        now = self.clock.time()
        budget = RELEASE_CHUNK
        while box.count and not self.local_block(box.to_service):
            for out in box.take(min(budget, box.count), LOAD_BYTES):
                out.to_service = box.to_service  # (the key, for one sent before it existed)
                self.journal.delete_transmission(out.id)
                self.transmission.unhold(out)
                self.deliver_local(out, now)
                budget -= 1
            if budget <= 0 and box.count:
                # a long backlog goes a chunk per loop pass, so other sessions keep going
                box.releasing = True
                self.clock.call_soon(lambda: self._release(box))
                return
        self.transmission.let_go(box)

    # ---- local delivery ----------------------------------------------------------------------------

    def deliver_local(self, out: Outbound, now: float) -> None:
        far = self.endpoints.by_conversation(out.conversation_id, not out.is_initiator)
        if far is None:
            if not out.is_initiator:
                return  # the initiator is gone: nobody to deliver to
            far = self.create_target(out, now)
        if far.state in (State.DO, State.CD):
            if out.message_type in SYSTEM_TYPES:
                far.apply(
                    Event.RECEIVED_END
                    if out.message_type == cat.END_DIALOG
                    else Event.RECEIVED_ERROR
                )
                self.remove_endpoint(far)
            self.acknowledge(out.conversation_id, out.is_initiator, out.message_type)
            return
        if out.message_type == cat.END_DIALOG:
            far.apply(Event.RECEIVED_END)
        elif out.message_type == cat.ERROR:
            far.apply(Event.RECEIVED_ERROR)
        else:
            far.apply(Event.RECEIVED_MESSAGE)
        far.receive_seq = out.seq + 1
        self.enqueue_many(far, out.seq, out.message_type, out.validation, [out.body], now)
        self.endpoints.update(far)
        if out.message_type in SYSTEM_TYPES:
            self.acknowledge(out.conversation_id, out.is_initiator, out.message_type)

    def acknowledge(self, conversation_id: uuid.UUID, from_initiator: bool, mtype: str) -> None:
        """Delivery of an EndDialog or Error closes a sender waiting in DO."""
        if mtype not in SYSTEM_TYPES:
            return
        sender = self.endpoints.by_conversation(conversation_id, from_initiator)
        if sender is not None and sender.state == State.DO:
            sender.apply(Event.END_ACKED)
            self.remove_endpoint(sender)

    def create_target(self, out: Outbound, now: float) -> Endpoint:
        catalog = self.catalog
        service = catalog.services[out.to_service]
        database = database_of(service.name)
        contract = catalog.key_in("contract", out.contract, database)
        initiator = self.endpoints.by_conversation(out.conversation_id, True)
        far_broker = out.from_broker_instance
        if far_broker is None:  # a dialog within this broker: the initiator's database
            sender = catalog.databases.get(database_of(initiator.service)) if initiator else None
            far_broker = self.instance_id if sender is None else sender.service_broker_guid
        far = Endpoint(
            handle=uuid.uuid4(),
            conversation_id=out.conversation_id,
            is_initiator=False,
            service=service.name,
            far_service=out.from_service,
            far_broker_instance=far_broker,
            contract=contract,
            group_id=uuid.uuid4(),
            queue=service.queue,
            state=State.SI,
            priority=assign_level(
                catalog.in_database("broker_priority", database),
                contract,
                service.name,
                out.from_service,
            ),
            lifetime_expiry=initiator.lifetime_expiry if initiator else None,
            far_handle=None if out.from_broker_instance else out.handle,
            created=now,
        )
        self.endpoints.insert(far)
        if initiator is not None:
            initiator.far_handle = far.handle
            if initiator.far_broker_instance is None:  # later messages go to this database
                owner = catalog.databases.get(database)
                initiator.far_broker_instance = owner.service_broker_guid if owner else None
            self.endpoints.update(initiator)
        if far.lifetime_expiry is not None:
            self.timer_set(far)
        return far

    # ---- ending conversations ------------------------------------------------------------------------

    def fail_conversation(self, ep: Endpoint, code: int, description: str) -> None:
        """End a conversation with an error on both sides (poison policy, a refused message)."""
        now = self.clock.time()
        self.drop_messages(ep)
        body = error_body(code, description)
        if ep.state in CAN_SEND:
            self.route(ep, cat.ERROR, "X", [body], now)
        if self.endpoints.known(ep) and ep.state not in (State.ER, State.DO, State.CD):
            ep.apply(Event.RECEIVED_ERROR)
            self.enqueue(ep, -1, cat.ERROR, "X", body, now)
        self.endpoints.update(ep)

    def drop_messages(self, ep: Endpoint) -> None:
        """Delete a conversation's ready and retained messages."""
        queue = self.queues.get(ep.queue)
        if queue is not None and queue.drop_conversation(ep.group_id, ep.handle):
            self.journal.delete_conversation_messages(queue.name, ep.handle)

    def far_gone(self, ep: Endpoint) -> bool:
        """A target whose local initiator no longer exists has nobody to tell."""
        return (
            not ep.is_initiator
            and self.catalog.database_by_guid(ep.far_broker_instance) is not None
            and self.endpoints.by_conversation(ep.conversation_id, True) is None
        )

    def remove_endpoint(self, ep: Endpoint) -> None:
        """Close an endpoint for good: its messages and row go."""
        if not self.endpoints.known(ep):
            return
        self.drop_messages(ep)
        self.endpoints.remove(ep)
        self.conversation_removed(ep)

    def forget_endpoint(self, ep: Endpoint) -> None:
        """An endpoint begun by a transaction that rolled back."""
        self.endpoints.forget_uncommitted(ep)
