"""Delivery: the transmission queue, local and remote delivery, acknowledgements, enqueue.

Theory of operation. A sequenced message (user message, EndDialog, Error) leaves its
endpoint at commit through `route`:

- to a service on this broker, it goes straight into the target queue (creating the
  target endpoint with the first message), unless that queue is OFF or earlier
  messages of the same direction still wait: then it waits in the transmission queue,
  in order, and `release_held` delivers it when the queue is ON again;
- to a service elsewhere, it waits in the transmission queue until the far broker
  acknowledges it (`remote_acknowledged`); the transport pulls it (`pull`) once its
  row is durable, so a crash can never make a sequence number mean two messages.

The transmission queue is the store's `transmission_queue` table. In memory each dialog
direction with waiting entries has a `DialogOutbox`, a backlog (see `backlog`) of its
entries: a small record and what the message cache allows of the bodies.

A message from another broker arrives complete and in order (`deliver_remote`): on an
established conversation it goes straight into the queue; otherwise it takes the local
path above, with its sender's broker id. `accepts` tells the transport, before the
dialog layer sees a fragment, whether a message for that direction could be stored now
(a full queue or a full disk is not acknowledged; the sender retries with backoff).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from xml.sax.saxutils import escape

from .._errors import BrokerError
from . import catalog as cat
from .backlog import ITEM_OVERHEAD, LOAD_BYTES, Backlog, MessageCache
from .capacity import Capacity
from .conversations import CAN_SEND, Endpoint, Event, State
from .endpoints import Endpoints
from .ports import Clock, Journal, NoTransport, OutboundSink, QueueListener, Row
from .priorities import assign_level
from .queues import Message, Queue
from .routes import Routes
from .validation import validate_body

log = logging.getLogger("ssb.core")

RELEASE_CHUNK: Final = 1000  # held messages delivered per pass of the event loop
SYSTEM_TYPES: Final = frozenset({cat.END_DIALOG, cat.ERROR})
TOO_LARGE_ERROR: Final = -8497
# ssb's code for a message from another broker that breaks this broker's rules
REFUSED_REMOTE_ERROR: Final = -8496


def error_body(code: int, description: str) -> bytes:
    return (
        f'<Error xmlns="{cat.ERROR}"><Code>{int(code)}</Code>'
        f"<Description>{escape(description)}</Description></Error>"
    ).encode()


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
    extra: bytes | None = None  # a message that came from another broker: that broker's id
    batch: int = 0  # the store batch holding its row

    @property
    def key(self) -> int:
        return self.seq  # a direction's entries are stored and read in sequence order

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def resident_size(self) -> int:
        return ITEM_OVERHEAD + len(self.body)

    @property
    def spillable(self) -> bool:
        return True

    @property
    def from_broker_instance(self) -> str | None:
        return None if self.extra is None else self.extra.decode()

    def row(self) -> Row:
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
    def from_row(cls, row: Row) -> Outbound:
        values = list(row)
        values[1] = uuid.UUID(bytes=values[1])
        values[2] = uuid.UUID(bytes=values[2])
        values[7] = bool(values[7])
        return cls(*values)


DirectionKey = tuple[uuid.UUID, bool]  # (conversation id, sent by the initiator)


class DialogOutbox(Backlog[Outbound]):
    """The transmission-queue entries of one dialog direction, in send order."""

    __slots__ = (
        "conversation_id",
        "is_initiator",
        "journal",
        "local",
        "priority",
        "releasing",
        "status",
        "to_broker_instance",
        "to_service",
    )

    def __init__(self, cache: MessageCache, journal: Journal, first: Outbound, local: bool) -> None:
        super().__init__(cache)
        self.journal = journal
        self.conversation_id = first.conversation_id
        self.is_initiator = first.is_initiator
        self.to_service = first.to_service
        self.to_broker_instance = first.to_broker_instance
        self.priority = first.priority
        self.local = local  # waits for a queue of this broker (else for another broker)
        self.status = first.status  # why it waits, in words
        self.releasing = False

    def __repr__(self) -> str:
        return f"transmission queue of dialog {self.conversation_id}"

    @property
    def direction(self) -> DirectionKey:
        return (self.conversation_id, self.is_initiator)

    def _read(self, first: int, before: int | None, limit: int, max_bytes: int) -> list[Outbound]:
        rows = self.journal.read_transmission(
            self.conversation_id, self.is_initiator, first, before, limit, max_bytes
        )
        return [Outbound.from_row(row) for row in rows]

    def _next_key(self, after: int, before: int | None) -> int | None:
        return self.journal.next_transmission_seq(
            self.conversation_id, self.is_initiator, after, before
        )


class Delivery:
    """Where every sequenced message goes, and the transmission queue it may wait in."""

    def __init__(
        self,
        journal: Journal,
        clock: Clock,
        catalog: cat.Catalog,
        routes: Routes,
        queues: dict[str, Queue],
        endpoints: Endpoints,
        cache: MessageCache,
        capacity: Capacity,
        instance_id: str,
        listener: QueueListener,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.catalog = catalog
        self.routes = routes
        self.queues = queues
        self.endpoints = endpoints
        self.cache = cache
        self.capacity = capacity
        self.instance_id = instance_id
        self.outboxes: dict[DirectionKey, DialogOutbox] = {}
        self.listener = listener
        self.sink: OutboundSink = NoTransport()
        self.kick: Callable[[Queue], None] = lambda queue: None
        self.conversation_removed: Callable[[Endpoint], None] = lambda ep: None
        self.timer_set: Callable[[Endpoint], None] = lambda ep: None
        self._next_order = 1
        self._next_outbound = 1

    def restore_ids(self, max_order: int, max_outbound: int) -> None:
        self._next_order = max_order + 1
        self._next_outbound = max_outbound + 1

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
        outs = [
            Outbound(
                0,
                ep.handle,
                ep.conversation_id,
                ep.far_service,
                ep.far_broker_instance,
                ep.service,
                ep.contract,
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
        if not self.routes.is_local(ep.far_service, ep.far_broker_instance):
            found = self.routes.find(ep.far_service, ep.far_broker_instance)
            status = "" if found is not None else f"no route to service '{ep.far_service}'"
            for out in outs:
                out.status = status
                box = self._hold(out, local=False)
            self.sink.outbound(box)
            return
        reason = self.local_block(ep.far_service)
        if (ep.conversation_id, ep.is_initiator) in self.outboxes or reason:
            for out in outs:
                out.status = reason or "waiting behind earlier messages of this conversation"
                self._hold(out, local=True)
            return
        if mtype in SYSTEM_TYPES or len(outs) == 1:
            for out in outs:
                self.deliver_local(out, now)
            return
        far = self.endpoints.by_conversation(ep.conversation_id, not ep.is_initiator)
        if far is None and ep.is_initiator:
            far = self._create_target(outs[0], now)
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
        """Why a message for this broker's service cannot go into its queue now, if so."""
        service = self.catalog.services.get(service_name)
        if service is None:
            return f"service '{service_name}' does not exist"
        queue = self.queues.get(service.queue)
        if queue is None:
            return f"queue '{service.queue}' of service '{service_name}' does not exist"
        if not queue.definition.status:
            return f"queue '{queue.name}' is disabled (STATUS = OFF)"
        return ""

    def _target_queue(self, service_name: str) -> Queue | None:
        service = self.catalog.services.get(service_name)
        return None if service is None else self.queues.get(service.queue)

    def _hold(self, out: Outbound, local: bool) -> DialogOutbox:
        out.id = self._next_outbound
        self._next_outbound += 1
        self.journal.insert_transmission(out.row())
        out.batch = self.journal.watermark()
        box = self._add(out, local)
        if local:
            target = self._target_queue(out.to_service)
            if target is not None:
                target.held += 1
                target.held_bytes += out.size
        return box

    def _add(self, out: Outbound, local: bool) -> DialogOutbox:
        key = (out.conversation_id, out.is_initiator)
        box = self.outboxes.get(key)
        if box is None:
            box = self.outboxes[key] = DialogOutbox(self.cache, self.journal, out, local)
        box.append(out)
        return box

    def restore_outbox(self, first: Outbound, count: int, local: bool) -> DialogOutbox:
        """A direction's waiting entries after a restart: all on disk, from `first`'s seq."""
        box = DialogOutbox(self.cache, self.journal, first, local)
        box.count = box.spilled = count
        box.spilled_from = first.seq
        self.outboxes[box.direction] = box
        if local:
            target = self._target_queue(first.to_service)
            if target is not None:
                target.held += count
        return box

    def _unhold(self, box: DialogOutbox, out: Outbound) -> None:
        target = self._target_queue(out.to_service)
        if target is not None:
            target.held -= 1
            target.held_bytes = max(0, target.held_bytes - out.size)

    def release_held(self, queue_name: str) -> None:
        """Deliver, in order, what waited for a queue that is ON again."""
        for box in list(self.outboxes.values()):
            if not box.local or box.releasing:
                continue
            target = self._target_queue(box.to_service)
            if target is not None and target.name == queue_name:
                self._release(box)

    def _release(self, box: DialogOutbox) -> None:
        box.releasing = False
        now = self.clock.time()
        budget = RELEASE_CHUNK
        while box.count and not self.local_block(box.to_service):
            for out in box.take(min(budget, box.count), LOAD_BYTES):
                self.journal.delete_transmission(out.id)
                self._unhold(box, out)
                self.deliver_local(out, now)
                budget -= 1
            if budget <= 0 and box.count:
                # a long backlog goes a chunk per loop pass, so other sessions keep going
                box.releasing = True
                self.clock.call_soon(lambda: self._release(box))
                return
        if not box.count and self.outboxes.get(box.direction) is box:
            del self.outboxes[box.direction]

    def drop_outbound(self, ep: Endpoint) -> None:
        """Forget what this endpoint still has in the transmission queue."""
        key = (ep.conversation_id, ep.is_initiator)
        box = self.outboxes.pop(key, None)
        if box is not None and box.local:
            target = self._target_queue(box.to_service)
            if target is not None:
                target.held -= box.count
                target.held_bytes = max(0, target.held_bytes - box.bytes)
        if box is not None:
            box.clear()
        self.journal.delete_transmission_direction(ep.conversation_id, ep.is_initiator)

    # ---- local delivery ----------------------------------------------------------------------------

    def deliver_local(self, out: Outbound, now: float) -> None:
        far = self.endpoints.by_conversation(out.conversation_id, not out.is_initiator)
        if far is None:
            if not out.is_initiator:
                return  # the initiator is gone: nobody to deliver to
            far = self._create_target(out, now)
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

    def _create_target(self, out: Outbound, now: float) -> Endpoint:
        service = self.catalog.services[out.to_service]
        initiator = self.endpoints.by_conversation(out.conversation_id, True)
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
        self.endpoints.insert(far)
        if initiator is not None:
            initiator.far_handle = far.handle
            self.endpoints.update(initiator)
        if far.lifetime_expiry is not None:
            self.timer_set(far)
        return far

    # ---- from and to other brokers ---------------------------------------------------------------------

    def accepts(
        self,
        conversation_id: uuid.UUID,
        from_initiator: bool,
        to_service: str,
        pending: Callable[[], tuple[int, int]] | None = None,
        arriving: int = 1,
    ) -> str | None:
        """Why `arriving` messages of this direction from another broker could not be
        stored now. `pending()`: messages (and bytes) accepted and not yet delivered,
        counted as if they were in its queue (an upper bound: the transport delivers a
        read's messages together); asked only for a queue with a quota."""
        reason = self.capacity.refusal
        if reason is not None:
            return reason
        far = self.endpoints.by_conversation(conversation_id, not from_initiator)
        queue = self.queues.get(far.queue) if far is not None else self._target_queue(to_service)
        if queue is None or not queue.has_quota:
            return None
        count, nbytes = (0, 0) if pending is None else pending()
        return queue.over_quota(arriving + count, nbytes)

    def deliver_remote_many(
        self,
        conversation_id: uuid.UUID,
        from_initiator: bool,
        seq: int,
        message_type: str,
        bodies: list[bytes],
        from_service: str,
        to_service: str,
        contract: str,
        from_broker: str,
    ) -> None:
        """Messages `seq`, `seq + 1`, ... of one dialog direction, all of one type, arrived
        complete and in order: delivered together when they are plain user messages on an
        established conversation (one enqueue), else one by one (`deliver_remote`)."""
        far = self.endpoints.by_conversation(conversation_id, not from_initiator)
        if self._deliver_plain(far, from_initiator, seq, message_type, bodies, to_service):
            return
        for i, body in enumerate(bodies):
            self.deliver_remote(
                conversation_id,
                from_initiator,
                seq + i,
                message_type,
                body,
                from_service,
                to_service,
                contract,
                from_broker,
            )

    def _deliver_plain(
        self,
        far: Endpoint | None,
        from_initiator: bool,
        seq: int,
        message_type: str,
        bodies: list[bytes],
        to_service: str,
    ) -> bool:
        """The common case: user messages within the rules on an established conversation
        go into its queue (one enqueue). False, with nothing done, when any of them needs
        `deliver_remote`'s careful path."""
        limit = self.capacity.max_message_size
        if not (
            far is not None
            and far.state is State.CO
            and (far.conversation_id, from_initiator) not in self.outboxes
            and message_type not in SYSTEM_TYPES
            and not self.local_block(to_service)
            and all(
                len(body) <= limit
                and self.remote_violation(far.contract, from_initiator, message_type, body) is None
                for body in bodies
            )
        ):
            return False
        known = self.catalog.message_types.get(message_type)
        letter = cat.VALIDATIONS[known.validation] if known else "N"
        far.receive_seq = seq + len(bodies)
        self.enqueue_many(far, seq, message_type, letter, bodies, self.clock.time())
        self.endpoints.update(far)
        return True

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
        refusal: str = "",
    ) -> None:
        """A message of a dialog with another broker arrived complete and in order.

        `refusal`: why the dialog layer could not accept it (a body that does not
        decrypt); it ends the dialog with that error like a contract violation.
        """
        far = self.endpoints.by_conversation(conversation_id, not from_initiator)
        if not refusal and self._deliver_plain(
            far, from_initiator, seq, message_type, [body], to_service
        ):
            return
        now = self.clock.time()
        known = self.catalog.message_types.get(message_type)
        letter = cat.VALIDATIONS[known.validation] if known else "N"
        key = (conversation_id, from_initiator)
        too_large = len(body) > self.capacity.max_message_size
        violation = refusal or self.remote_violation(
            far.contract if far is not None else contract, from_initiator, message_type, body
        )
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
        if too_large or violation is not None:
            if far is None and from_initiator and to_service in self.catalog.services:
                far = self._create_target(out, now)
            if too_large:
                self._refuse_too_large(
                    far, conversation_id, from_initiator, seq, len(body), from_broker
                )
            else:
                self._refuse_remote(far, conversation_id, seq, str(violation), from_broker)
            return
        reason = self.local_block(to_service)
        if key in self.outboxes or reason:
            out.status = reason or "waiting behind earlier messages of this conversation"
            self._hold(out, local=True)
            return
        self.deliver_local(out, now)

    def _refuse_too_large(
        self,
        far: Endpoint | None,
        conversation_id: uuid.UUID,
        from_initiator: bool,
        seq: int,
        size: int,
        from_broker: str,
    ) -> None:
        text = (
            f"message {seq} of {size} bytes exceeds the max_message_size of broker"
            f" {self.instance_id} ({self.capacity.max_message_size} bytes)"
        )
        log.warning("conversation %s from broker %s: %s", conversation_id, from_broker, text)
        if far is not None:
            far.receive_seq = seq + 1
            self.fail_conversation(far, TOO_LARGE_ERROR, text)

    def remote_violation(
        self, contract_name: str, from_initiator: bool, message_type: str, body: bytes
    ) -> str | None:
        """Why a message from another broker breaks this broker's rules, as a local SEND
        would (its type, its contract and direction, its validation); None when it does not."""
        if message_type in SYSTEM_TYPES:
            return None
        mtype = self.catalog.message_types.get(message_type)
        if mtype is None:
            return f"message type '{message_type}' does not exist on broker {self.instance_id}"
        contract = self.catalog.contracts.get(contract_name)
        if contract is None:
            return f"contract '{contract_name}' does not exist on broker {self.instance_id}"
        sent_by = contract.sent_by(message_type)
        if sent_by is None:
            return f"message type '{message_type}' is not part of contract '{contract_name}'"
        side = "INITIATOR" if from_initiator else "TARGET"
        if sent_by not in ("ANY", side):
            return (
                f"message type '{message_type}' is sent by the {sent_by} in contract"
                f" '{contract_name}', not by the {side}"
            )
        if mtype.validation != "NONE":
            try:
                validate_body(message_type, mtype.validation, body)
            except BrokerError as exc:
                return exc.message
        return None

    def _refuse_remote(
        self,
        far: Endpoint | None,
        conversation_id: uuid.UUID,
        seq: int,
        text: str,
        from_broker: str,
    ) -> None:
        """A message another broker should not have sent: the dialog ends with an error to
        both sides (never delivered, never silently dropped)."""
        log.warning(
            "conversation %s from broker %s: message %d refused: %s",
            conversation_id,
            from_broker,
            seq,
            text,
        )
        if far is not None:
            far.receive_seq = seq + 1
            self.fail_conversation(
                far, REFUSED_REMOTE_ERROR, f"refused by broker {self.instance_id}: {text}"
            )

    def remote_acknowledged(
        self,
        conversation_id: uuid.UUID,
        from_initiator: bool,
        first: int,
        last: int,
        message_type: str = "",
    ) -> None:
        """The far broker stored messages `first`..`last`: they leave the transmission
        queue. `message_type`: the last one's, when an EndDialog or Error may close the
        sender."""
        self.journal.delete_transmission_seqs(conversation_id, from_initiator, first, last)
        self.acknowledge(conversation_id, from_initiator, message_type)

    def outbox(self, direction: DirectionKey) -> DialogOutbox | None:
        """The outbox holding a dialog direction's waiting entries, if it has any."""
        return self.outboxes.get(direction)

    def is_current(self, box: DialogOutbox) -> bool:
        """Whether `box` still holds its direction's waiting entries: `pull` lets go of a box
        it empties, and the next entry of the direction makes a new one."""
        return self.outboxes.get(box.direction) is box

    def pull(self, box: DialogOutbox, limit: int, max_bytes: int) -> list[Outbound]:
        """Durable entries of a remote direction, for the transport to send (in order)."""
        durable = self.journal.durable
        taken = box.take(limit, max_bytes, 0, lambda out: out.batch <= durable)
        if not box.count and self.outboxes.get(box.direction) is box:
            del self.outboxes[box.direction]
        return taken

    def remote_outboxes(self) -> list[DialogOutbox]:
        return [box for box in self.outboxes.values() if not box.local]

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
            and ep.far_broker_instance == self.instance_id
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
