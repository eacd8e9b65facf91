"""Read-only views of the broker, one list of rows (dicts) per view.

Names follow Service Broker's catalog views and DMVs without the `sys.` prefix.
`queue:NAME` reads a queue's messages without receiving them, like SELECT on a queue.
Rows of a database's objects carry its `database` beside their plain names; the
broker's own objects (routes, certificates, bindings) and its DMVs show every database.

Theory of operation. A view first waits until everything applied before it is durable
(so a session always sees its own writes), then reads the core's memory and the store.
Views over what can be huge (endpoints, groups, the transmission queue, a queue's
messages) are bounded: at most `limit` rows (DEFAULT_LIMIT unless asked, MAX_LIMIT at
most) and, for messages, an answer's worth of bytes; `after` pages through a queue or
the transmission queue by queuing order / id. Other parts of the daemon (activation,
the transport, the scheduler's log) add their own views with `merge`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ssb.protocol import MAX_MESSAGE_SIZE_LIMIT, MESSAGE_COLUMNS, ErrorCode

from ._core import catalog as cat
from ._core.backlog import MessageCache
from ._core.capacity import Capacity
from ._core.delivery import Delivery
from ._core.endpoints import ConversationTimers, Endpoints
from ._core.names import database_of, plain
from ._core.ports import Clock, durable
from ._core.queues import Conversation, Queue
from ._core.transactions import Session, Transactions
from ._core.transmission import Outbound
from ._errors import BrokerError, bad_argument
from ._store import Store
from ._transport import HeldPartial

DEFAULT_LIMIT: Final = 10_000
MAX_LIMIT: Final = 100_000
MAX_AFTER: Final = 2**63 - 1  # queuing orders and ids are signed 64-bit columns in the store

ViewFn = Callable[[int, int | None], list[dict[str, Any]]]
# (queue, conversation handle, first queuing order) -> (group, priority, service,
# contract, dead letters?) of its stored messages, or None (see the core's engine)
Identity = Callable[[Queue, uuid.UUID, int], tuple[uuid.UUID, int, str, str, bool] | None]


def iso_time(value: float | None) -> str | None:
    if value is None:
        return None
    return dt.datetime.fromtimestamp(value, dt.UTC).isoformat(timespec="milliseconds")


def _arriving(p: HeldPartial) -> str:
    m = p.message
    return (
        f"partial message (status 2): {m.fragments_received} of {m.fragment_count} fragments"
        f" received from broker {p.from_broker}"
    )


@dataclass(eq=False, repr=False, kw_only=True)
class Views:
    """The views, over the parts of the broker they read, passed in: the core's parts,
    the store (and `clock`, to wait until what a session applied is durable), and
    `partials`: the messages from other brokers still arriving (the transport's)."""

    catalog: cat.Catalog
    queues: Mapping[str, Queue]
    endpoints: Endpoints
    delivery: Delivery
    transactions: Transactions
    cache: MessageCache
    capacity: Capacity
    timers: ConversationTimers
    identity: Identity
    store: Store
    clock: Clock
    partials: Callable[[], list[HeldPartial]]
    table: dict[str, ViewFn] = field(init=False)

    def __post_init__(self) -> None:
        self.table = {
            "conversation_endpoints": self.conversation_endpoints,
            "conversation_groups": self.conversation_groups,
            "service_queues": self.service_queues,
            "transmission_queue": self.transmission_queue,
            "services": self._catalog(self.services),
            "service_contracts": self._catalog(self.service_contracts),
            "message_types": self._catalog(self.message_types),
            "routes": self._catalog(self.routes),
            "conversation_priorities": self._catalog(self.conversation_priorities),
            "event_notifications": self._catalog(self.event_notifications),
            "procedures": self._catalog(self.procedures),
            "poison_messages": self.poison_messages,
            "open_transactions": self._catalog(self.open_transactions),
            "broker_resources": self._catalog(self.broker_resources),
            "partial_messages": self._catalog(self.partial_messages),
        }

    def merge(self, views: Mapping[str, Callable[[], list[dict[str, Any]]]]) -> None:
        for name, fn in views.items():
            if name in self.table:
                raise RuntimeError(f"view '{name}' is defined twice")
            self.table[name] = self._catalog(fn)

    def operations(self) -> dict[str, Callable[..., Any]]:
        return {"view": self.view}

    @staticmethod
    def _catalog(fn: Callable[[], list[dict[str, Any]]]) -> ViewFn:
        return lambda limit, after: fn()[:limit]

    # ---- the operation -------------------------------------------------------------------

    async def view(
        self, session: Session, name: object, limit: object = None, after: object = None
    ) -> list[dict[str, Any]]:
        if not isinstance(name, str):
            raise bad_argument("view needs a view name")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT
        ):
            raise bad_argument(f"limit must be a whole number 1..{MAX_LIMIT}, got {limit!r}")
        if after is not None and (
            isinstance(after, bool) or not isinstance(after, int) or after > MAX_AFTER
        ):
            raise bad_argument(
                f"after must be a queuing order (or id) to page from, at most {MAX_AFTER};"
                f" got {after!r}"
            )
        view: ViewFn
        if name.startswith("queue:"):
            queue = name[len("queue:") :]
            if queue not in self.queues:
                raise BrokerError(ErrorCode.UNKNOWN_QUEUE, f"queue '{plain(queue)}' does not exist")
            view = lambda lim, aft: self.queue_contents(queue, lim, aft)  # noqa: E731
        else:
            found = self.table.get(name)
            if found is None:
                raise BrokerError(
                    ErrorCode.UNKNOWN_VIEW,
                    f"there is no view '{name}'; views are {', '.join(sorted(self.table))}"
                    " and queue:NAME",
                )
            view = found
        await self._settled()
        return view(DEFAULT_LIMIT if limit is None else limit, after)

    async def _settled(self) -> None:
        """Wait until what was applied so far is durable (unless the store is in trouble:
        then a view shows what is durable, which is what an operator needs to see)."""
        if self.store.trouble is None:
            await durable(self.store, self.clock)

    # ---- views over what can be huge ----------------------------------------------------------

    def conversation_endpoints(self, limit: int, after: int | None) -> list[dict[str, Any]]:
        return [
            {
                "conversation_handle": ep.handle,
                "conversation_id": ep.conversation_id,
                "is_initiator": ep.is_initiator,
                "database": database_of(ep.service),
                "service_name": plain(ep.service),
                "far_service": ep.far_service,
                "far_broker_instance": ep.far_broker_instance,
                "service_contract_name": plain(ep.contract),
                "conversation_group_id": ep.group_id,
                "queue_name": plain(ep.queue),
                "state": ep.state.name,
                "state_desc": ep.state.value,
                "priority": ep.priority,
                "lifetime": iso_time(ep.lifetime_expiry),
                "dialog_timer": iso_time(ep.timer_at),
                "send_sequence": ep.send_seq,
                "receive_sequence": ep.receive_seq,
                "is_encrypted": ep.encrypted,
            }
            for ep in self.endpoints.page(None, limit)
        ]

    def conversation_groups(self, limit: int, after: int | None) -> list[dict[str, Any]]:
        rows = []
        for raw_group, service, conversations in self.store.read_groups(limit):
            group_id = uuid.UUID(bytes=raw_group)
            found = self.catalog.services.get(service)
            queue = self.queues.get(found.queue) if found else None
            group = queue.groups.get(group_id) if queue else None
            owner = getattr(group.owner, "session", None) if group else None
            rows.append(
                {
                    "conversation_group_id": group_id,
                    "database": database_of(service),
                    "queue_name": plain(queue.name) if queue else None,
                    "conversations": conversations,
                    "messages": group.message_count() if group else 0,
                    "is_locked": group is not None and group.owner is not None,
                    "locked_by_session": getattr(owner, "ident", None),
                }
            )
        return rows

    def transmission_queue(self, limit: int, after: int | None) -> list[dict[str, Any]]:
        delivery = self.delivery
        rows = []
        for row in self.store.read_transmission_page(after, limit):
            out = Outbound.from_row(row)
            box = delivery.outboxes.get((out.conversation_id, out.is_initiator))
            if box is not None and box.local:
                status = delivery.local_block(out.to_service) or box.status
            else:
                status = delivery.sink.describe(out)
            sender = self.endpoints.get(out.handle)
            rows.append(
                {
                    "id": out.id,
                    "database": database_of(sender.service if sender else out.to_service),
                    "conversation_handle": out.handle,
                    "to_service_name": plain(out.to_service),
                    "to_broker_instance": out.to_broker_instance,
                    "from_service_name": out.from_service,
                    "service_contract_name": out.contract,
                    "message_sequence_number": out.seq,
                    "message_type_name": out.message_type,
                    "priority": out.priority,
                    "enqueue_time": iso_time(out.enqueue_time),
                    "is_conversation_error": out.message_type.endswith("/Error"),
                    "is_end_of_dialog": out.message_type.endswith("/EndDialog"),
                    "message_body_length": len(out.body),
                    "transmission_status": status,
                }
            )
        if after is None:  # still arriving, for a queue that is OFF: held here once complete
            rows += [self._partial_transmission_row(p) for p in self._partials(off=True)]
        return rows[:limit]

    def _partials(self, *, off: bool, queue: str | None = None) -> list[HeldPartial]:
        queues = self.queues
        found = []
        for partial in self.partials():
            target = queues.get(partial.queue) if partial.queue else None
            if target is None or (queue is not None and partial.queue != queue):
                continue
            if (not target.definition.status) == off:
                found.append(partial)
        return found

    @staticmethod
    def _partial_transmission_row(p: HeldPartial) -> dict[str, Any]:
        m = p.message
        return {
            "id": None,
            "conversation_handle": p.handle,
            "to_service_name": plain(p.service),
            "to_broker_instance": None,
            "from_service_name": p.from_service,
            "service_contract_name": plain(p.contract),
            "message_sequence_number": m.seq,
            "message_type_name": m.message_type,
            "priority": p.priority,
            "enqueue_time": None,
            "is_conversation_error": m.message_type.endswith("/Error"),
            "is_end_of_dialog": m.message_type.endswith("/EndDialog"),
            "message_body_length": m.bytes_received,
            "transmission_status": _arriving(p),
        }

    def _partial_queue_row(self, p: HeldPartial) -> dict[str, Any]:
        m = p.message
        known = self.catalog.message_types.get(m.message_type)
        row: dict[str, Any] = dict.fromkeys(MESSAGE_COLUMNS)
        row.update(
            status=2,
            priority=p.priority,
            conversation_group_id=p.group_id,
            conversation_handle=p.handle,
            message_sequence_number=m.seq,
            service_name=plain(p.service),
            service_contract_name=plain(p.contract),
            message_type_name=m.message_type,
            validation=cat.VALIDATIONS[known.validation] if known else "N",
            message_body=b"",
            delivery_count=0,
        )
        return row

    def partial_messages(self) -> list[dict[str, Any]]:
        return [
            {
                "conversation_id": p.conversation_id,
                "conversation_handle": p.handle,
                "queue_name": plain(p.queue) if p.queue else None,
                "service_name": plain(p.service),
                "from_broker_instance": p.from_broker,
                "message_sequence_number": p.message.seq,
                "message_type_name": p.message.message_type,
                "fragments_received": p.message.fragments_received,
                "fragment_count": p.message.fragment_count,
                "bytes_received": p.message.bytes_received,
            }
            for p in self.partials()
        ]

    def queue_contents(self, queue: str, limit: int, after: int | None) -> list[dict[str, Any]]:
        """A queue's messages without receiving them (not those an open transaction took)."""
        taken = self.transactions.taken()
        found = self.queues[queue]
        rows = []
        for row in self.store.read_queue_messages(queue, after, limit, MAX_MESSAGE_SIZE_LIMIT):
            if row[0] in taken:
                continue
            conv = self._conversation_of(found.name, row)
            if conv is None:
                continue
            message = conv.message(row)
            wire = dict(zip(MESSAGE_COLUMNS, message.wire(row[6]), strict=True))
            wire["message_enqueue_time"] = iso_time(message.message_enqueue_time)
            rows.append(wire)
        if after is None and found.definition.status:  # still arriving from another broker
            rows += [self._partial_queue_row(p) for p in self._partials(off=False, queue=queue)]
        return rows[:limit]

    def _conversation_of(self, queue_name: str, row: tuple[Any, ...]) -> Conversation | None:
        queue = self.queues[queue_name]
        handle = uuid.UUID(bytes=row[2])
        for conv in queue.conversations():
            if conv.handle == handle:
                return conv
        found = self.identity(queue, handle, row[0])
        if found is None:
            return None
        group_id, priority, service, contract, _ = found
        return queue.loose_conversation(group_id, handle, priority, service, contract)

    # ---- views of memory ------------------------------------------------------------------------

    def service_queues(self, limit: int, after: int | None) -> list[dict[str, Any]]:
        rows = []
        for queue in list(self.queues.values())[:limit]:
            d = queue.definition
            rows.append(
                {
                    "database": database_of(d.name),
                    "name": plain(d.name),
                    "is_receive_enabled": d.status,
                    "is_enqueue_enabled": d.status,
                    "is_retention_enabled": d.retention,
                    "is_activation_enabled": d.activation.status,
                    "activation_procedure": plain(d.activation.procedure) or None,
                    "max_readers": d.activation.max_queue_readers,
                    "execute_as": d.activation.execute_as or None,
                    "is_poison_message_handling_enabled": d.poison_message_handling,
                    "poison_policy": None if d.poison_policy is None else d.poison_policy.action,
                    "max_messages": d.max_messages,
                    "max_bytes": d.max_bytes,
                    "messages_ready": queue.ready,
                    "messages_retained": sum(c for c, _ in queue.retained.values()),
                    "messages_stored": queue.messages,
                    "bytes_stored": queue.bytes,
                    "messages_held_for_it": queue.held,
                    "readers_waiting": len(queue.waiters),
                    "disabled_reason": queue.disabled_reason or None,
                }
            )
        return rows

    def poison_messages(self, limit: int, after: int | None) -> list[dict[str, Any]]:
        rows = []
        for ident, queue, handle, order, count, action, when, error in self.store.read_poison(
            limit
        ):
            rows.append(
                {
                    "id": ident,
                    "database": database_of(queue),
                    "queue": plain(queue),
                    "conversation_handle": None if handle is None else uuid.UUID(bytes=handle),
                    "queuing_order": order,
                    "delivery_count": count,
                    "action": action,
                    "time": iso_time(when),
                    "error": error,
                }
            )
        return rows

    def services(self) -> list[dict[str, Any]]:
        return [
            {
                "database": database_of(s.name),
                "name": plain(s.name),
                "queue_name": plain(s.queue),
                "contracts": ", ".join(plain(c) for c in s.contracts),
            }
            for s in self.catalog.services.values()
        ]

    def service_contracts(self) -> list[dict[str, Any]]:
        system = self._system("contract")
        return [
            {
                "database": database_of(name) if name not in system else None,
                "name": plain(name),
                "message_type_name": plain(mtype),
                "sent_by": sent_by,
            }
            for name, contract in self.catalog.contracts.items()
            for mtype, sent_by in contract.messages.items()
        ]

    def message_types(self) -> list[dict[str, Any]]:
        system = self._system("message_type")
        return [
            {
                "database": database_of(m.name) if m.name not in system else None,
                "name": plain(m.name),
                "validation": m.validation,
            }
            for m in self.catalog.message_types.values()
        ]

    def _system(self, kind: str) -> frozenset[str]:
        """The names of the system objects of `kind` (in every database)."""
        return frozenset(n for k, n in self.catalog.system_names if k == kind)

    def routes(self) -> list[dict[str, Any]]:
        return [
            {
                "name": r.name,
                "remote_service_name": r.service_name,
                "broker_instance": r.broker_instance,
                "address": r.address,
                "mirror_address": r.mirror_address,
                "lifetime": iso_time(r.expires),
            }
            for r in self.catalog.routes.values()
        ]

    def conversation_priorities(self) -> list[dict[str, Any]]:
        return [
            {
                "database": database_of(p.name),
                "name": plain(p.name),
                "service_contract_name": plain(p.contract) if p.contract else "ANY",
                "local_service_name": plain(p.local_service) if p.local_service else "ANY",
                "remote_service_name": p.remote_service or "ANY",
                "priority": p.level,
            }
            for p in self.catalog.priorities.values()
        ]

    def event_notifications(self) -> list[dict[str, Any]]:
        return [
            {
                "database": database_of(n.name),
                "name": plain(n.name),
                "event": n.event,
                "queue_name": plain(n.queue),
                "service_name": n.service,
                "broker_instance": n.broker_instance,
            }
            for n in self.catalog.notifications.values()
        ]

    def procedures(self) -> list[dict[str, Any]]:
        return [
            {
                "database": database_of(p.name),
                "name": plain(p.name),
                "create_date": iso_time(p.created),
                "modify_date": iso_time(p.modified),
            }
            for p in self.catalog.procedures.values()
        ]

    def open_transactions(self) -> list[dict[str, Any]]:
        return [
            {
                "transaction_id": txn.ident,
                "attached_session": txn.session.ident if txn.session.txn is txn else None,
                "locked_groups": len(txn.locks),
                "received_messages": sum(len(m) for _, m in txn.received),
                "pending_actions": len(txn.actions),
                "expires": iso_time(txn.expires),
            }
            for txn in self.transactions.detached.values()
        ]

    def broker_resources(self) -> list[dict[str, Any]]:
        """What the broker holds in memory and on disk, and whether it accepts new work."""
        cache, capacity, store = self.cache, self.capacity, self.store
        return [
            {
                "message_cache_bytes": cache.budget,
                "cached_bytes": cache.resident,
                "cache_spills": cache.spills,
                "conversation_endpoints": store.count_rows("endpoints"),
                "transmission_queue_messages": store.count_rows("transmission_queue"),
                "stored_messages": sum(q.messages for q in self.queues.values()),
                "endpoints_in_memory": self.endpoints.in_memory(),
                "endpoint_reads": self.endpoints.reads,
                "timers_pending": self.timers.pending(),
                "transmission_directions": len(self.delivery.outboxes),
                "free_disk_bytes": store.free_bytes(),
                "min_free_disk": capacity.min_free_disk,
                "max_message_size": capacity.max_message_size,
                "accepting_messages": capacity.refusal is None,
                "refusal": capacity.refusal,
                "store_commits": store.commits,
                "store_rows_written": store.rows_written,
                "store_rows_never_written": store.cancelled,
            }
        ]
