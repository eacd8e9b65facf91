"""Remote delivery: messages to and from other brokers, as the transport sees them.

Theory of operation. This is the part of the core the broker-to-broker transport is
handed (besides the endpoint and route lookups of `ports`). Out: the transmission
queue's remote directions, which the transport takes in order once durable
(`remote_outboxes`, `outbox`, `is_current`, `pull`, those of `transmission`), and what
the far broker acknowledged (`remote_acknowledged`), which leaves it. In: a message from
another broker arrives complete and in order (`deliver_remote`, `deliver_remote_many`):
within the rules on an established conversation it goes straight into the queue; a
message that breaks this broker's rules (too large, not of its contract, invalid) ends
its dialog with an error to both sides, never delivered and never silently dropped;
anything else takes `Delivery`'s local path, with its sender's broker id. `accepts`
tells the transport, before the dialog layer sees a fragment, whether a message for that
direction could be stored now (a full queue or a full disk is not acknowledged; the
sender retries with backoff).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Final

from .._errors import BrokerError
from . import catalog as cat
from .conversations import Endpoint, State
from .delivery import NO_SEND_PERMISSION_ERROR, SYSTEM_TYPES, Delivery
from .names import database_of, plain
from .transmission import Outbound, TransmissionQueue
from .validation import validate_body

log = logging.getLogger("ssb.core")

TOO_LARGE_ERROR: Final = -8497
# ssb's code for a message from another broker that breaks this broker's rules
REFUSED_REMOTE_ERROR: Final = -8496


class RemoteDelivery:
    """Messages to and from other brokers: all the transport asks of delivery."""

    def __init__(self, delivery: Delivery, transmission: TransmissionQueue) -> None:
        self.delivery = delivery
        # the parts delivery works on, read as messages arrive
        self.journal = delivery.journal
        self.clock = delivery.clock
        self.catalog = delivery.catalog
        self.routes = delivery.routes
        self.queues = delivery.queues
        self.endpoints = delivery.endpoints
        self.capacity = delivery.capacity
        self.instance_id = delivery.instance_id
        self.outboxes = transmission.outboxes  # read here; the transmission queue owns it
        self.target_queue = transmission.target_queue
        # the transmission queue's way out, as it is
        self.remote_outboxes = transmission.remote_outboxes
        self.outbox = transmission.outbox
        self.is_current = transmission.is_current
        self.pull = transmission.pull
        self._hold = transmission.hold

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
        if far is not None:
            queue = self.queues.get(far.queue)
        else:
            queue = self.target_queue(self.routes.local_target(to_service, None) or to_service)
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
            and not self.delivery.local_block(far.service)
            and all(len(body) <= limit for body in bodies)
            and self.remote_violation(far.contract, from_initiator, message_type, bodies) is None
        ):
            return False
        letter = self._letter(message_type, far.contract)
        far.receive_seq = seq + len(bodies)
        self.delivery.enqueue_many(far, seq, message_type, letter, bodies, self.clock.time())
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
        code: int = REFUSED_REMOTE_ERROR,
    ) -> None:
        """A message of a dialog with another broker arrived complete and in order.

        `refusal`: why it may not be accepted (a body that does not decrypt, a sender
        without SEND permission); it ends the dialog with that error (`code`) like a
        contract violation.
        """
        far = self.endpoints.by_conversation(conversation_id, not from_initiator)
        if not refusal and self._deliver_plain(
            far, from_initiator, seq, message_type, [body], to_service
        ):
            return
        if far is not None and far.state is State.ER and message_type not in SYSTEM_TYPES:
            return  # the dialog ended with an error here (a refused message): nobody reads it
        now = self.clock.time()
        if far is not None:
            target, contract_key = far.service, far.contract
        else:  # a service of this broker, found by name from master (the local route)
            target = self.routes.local_target(to_service, None) or to_service
            contract_key = self.catalog.key_in("contract", contract, database_of(target))
        letter = self._letter(message_type, contract_key)
        key = (conversation_id, from_initiator)
        too_large = len(body) > self.capacity.max_message_size
        violation = refusal or self.remote_violation(
            contract_key, from_initiator, message_type, [body]
        )
        out = Outbound(
            0,
            conversation_id,
            conversation_id,
            target,
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
            opened = far is None and from_initiator and target in self.catalog.services
            if opened:
                far = self.delivery.create_target(out, now)
            if too_large:
                self._refuse_too_large(
                    far, conversation_id, from_initiator, seq, len(body), from_broker
                )
            elif opened and code == NO_SEND_PERMISSION_ERROR and far is not None:
                self.delivery.refuse_unopened(far, seq, str(violation), from_broker, now)
            else:
                self._refuse_remote(far, conversation_id, seq, str(violation), from_broker, code)
            return
        reason = self.delivery.local_block(target)
        if key in self.outboxes or reason:
            out.status = reason or "waiting behind earlier messages of this conversation"
            self._hold(out, local=True)
            return
        self.delivery.deliver_local(out, now)

    def _letter(self, message_type: str, contract: str) -> str:
        """The validation letter of a message type arriving on `contract` (a key): the
        message type of the contract's database decides."""
        key = self.catalog.key_in("message_type", message_type, database_of(contract))
        known = self.catalog.message_types.get(key)
        return cat.VALIDATIONS[known.validation] if known else "N"

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
            self.delivery.fail_conversation(far, TOO_LARGE_ERROR, text)

    def remote_violation(
        self, contract_name: str, from_initiator: bool, message_type: str, bodies: list[bytes]
    ) -> str | None:
        """Why messages of one type from another broker break this broker's rules, as a
        local SEND would (their type, its contract and direction, each body's validation);
        None when none does. The type is looked up once for them all."""
        if message_type in SYSTEM_TYPES:
            return None
        catalog = self.catalog
        mtype = catalog.message_types.get(
            catalog.key_in("message_type", message_type, database_of(contract_name))
        )
        if mtype is None:
            return f"message type '{message_type}' does not exist on broker {self.instance_id}"
        contract = catalog.contracts.get(contract_name)
        if contract is None:
            return f"contract '{plain(contract_name)}' does not exist on broker {self.instance_id}"
        sent_by = contract.sent_by(mtype.name)
        if sent_by is None:
            return f"message type '{message_type}' is not part of contract '{plain(contract_name)}'"
        side = "INITIATOR" if from_initiator else "TARGET"
        if sent_by not in ("ANY", side):
            return (
                f"message type '{message_type}' is sent by the {sent_by} in contract"
                f" '{contract_name}', not by the {side}"
            )
        if mtype.validation != "NONE":
            for body in bodies:
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
        code: int = REFUSED_REMOTE_ERROR,
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
            self.delivery.fail_conversation(
                far, code, f"refused by broker {self.instance_id}: {text}"
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
        self.delivery.acknowledge(conversation_id, from_initiator, message_type)
