"""Catalog statements: CREATE / ALTER / DROP of message types, contracts, queues, services,
routes, broker priorities, event notifications and certificates.

Theory of operation. The catalog (`catalog.Catalog`) checks every change completely
before anything is touched; this module then applies it to memory, writes the object
to the store as one document, and tells whoever depends on it: a queue turned ON gets
its held messages released and its waiting readers kicked; a queue turned OFF fails its
waiting readers; routes changing clear the route cache and wake the transport; queue
monitors hear of every queue change. A drop is refused while something still uses the
object (open conversations, stored messages, a receiving transaction).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument, not_found
from . import catalog as cat
from .backlog import MessageCache
from .capacity import Capacity
from .delivery import Delivery
from .endpoints import Endpoints
from .events import Events
from .ports import Clock, Journal, QueueListener
from .queues import Queue
from .receive import Receiving
from .routes import Routes
from .transactions import Session, as_seconds

log = logging.getLogger("ssb.core")


class Ddl:
    def __init__(
        self,
        journal: Journal,
        clock: Clock,
        catalog: cat.Catalog,
        routes: Routes,
        queues: dict[str, Queue],
        cache: MessageCache,
        capacity: Capacity,
        endpoints: Endpoints,
        delivery: Delivery,
        receiving: Receiving,
        events: Events,
        listener: QueueListener,
        check_procedure: Callable[[str], None],
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.catalog = catalog
        self.routes = routes
        self.queues = queues
        self.cache = cache
        self.capacity = capacity
        self.endpoints = endpoints
        self.delivery = delivery
        self.receiving = receiving
        self.events = events
        self.listener = listener
        # refuses an activation procedure the broker may not run (the daemon's policy)
        self.check_procedure = check_procedure

    def persist(self, kind: str, obj: Any) -> None:
        self.catalog.table(kind)[obj.name] = obj
        self.journal.put_catalog(kind, obj.name, cat.encode(obj))
        if kind == "queue":
            self.count_quotas()

    def count_quotas(self) -> None:
        """Tell capacity how many queues carry a quota (none: SEND need not look)."""
        self.capacity.queue_quotas = sum(
            1
            for q in self.catalog.queues.values()
            if q.max_messages is not None or q.max_bytes is not None
        )

    def add_queue(self, definition: cat.QueueDef) -> Queue:
        queue = self.queues[definition.name] = Queue(definition, self.cache, self.journal)
        return queue

    # ---- statements -------------------------------------------------------------------

    def create_message_type(
        self, session: Session, name: object, validation: object = "NONE"
    ) -> None:
        self.persist("message_type", self.catalog.new_message_type(name, validation))

    def alter_message_type(self, session: Session, name: object, validation: object) -> None:
        self.persist("message_type", self.catalog.altered_message_type(name, validation))

    def create_contract(self, session: Session, name: object, messages: object) -> None:
        self.persist("contract", self.catalog.new_contract(name, messages))

    def create_queue(
        self,
        session: Session,
        name: object,
        status: object = "ON",
        retention: object = "OFF",
        activation: object = None,
        poison_message_handling: object = None,
        poison_policy: object = None,
        max_messages: object = None,
        max_bytes: object = None,
    ) -> None:
        definition = self.catalog.new_queue(
            name,
            status,
            retention,
            activation,
            poison_message_handling,
            poison_policy,
            max_messages,
            max_bytes,
        )
        if definition.activation.procedure:
            self.check_procedure(definition.activation.procedure)
        self.persist("queue", definition)
        self.listener.altered(self.add_queue(definition))

    def alter_queue(self, session: Session, name: object, **changes: object) -> None:
        if not isinstance(name, str):
            raise bad_argument("alter_queue needs a queue name")
        updated = self.catalog.altered_queue(name, changes)
        procedure = updated.activation.procedure
        if procedure and procedure != self.catalog.queues[name].activation.procedure:
            self.check_procedure(procedure)
        self.set_queue(updated)

    def set_queue(self, updated: cat.QueueDef, reason: str = "") -> None:
        queue = self.queues[updated.name]
        was_on = queue.definition.status
        queue.definition = updated
        self.persist("queue", updated)
        if updated.status and not was_on:
            log.info(
                "queue %s enabled (it was off: %s)", updated.name, queue.disabled_reason or "set so"
            )
            queue.rollback_streak = 0
            queue.disabled_reason = ""
            self.delivery.release_held(updated.name)
            self.receiving.kick(queue)
        elif not updated.status:
            if was_on:
                log.info("queue %s disabled: %s", updated.name, reason or "status set to OFF")
            queue.disabled_reason = reason
            self.receiving.fail_waiters(queue)
        self.listener.altered(queue)

    def disable_queue(self, queue: Queue, reason: str) -> None:
        self.set_queue(replace(queue.definition, status=False), reason)

    def create_service(
        self, session: Session, name: object, queue: object, contracts: object = None
    ) -> None:
        self.persist("service", self.catalog.new_service(name, queue, contracts))

    def alter_service(
        self,
        session: Session,
        name: object,
        add_contracts: object = None,
        drop_contracts: object = None,
    ) -> None:
        self.persist("service", self.catalog.altered_service(name, add_contracts, drop_contracts))

    def create_route(
        self,
        session: Session,
        name: object,
        service_name: object,
        address: object,
        broker_instance: object = None,
        lifetime: object = None,
        mirror_address: object = None,
    ) -> None:
        seconds = as_seconds(lifetime, "lifetime", allow_none=True)
        expires = None if seconds is None else self.clock.time() + seconds
        route = self.catalog.new_route(
            name, service_name, address, broker_instance, expires, mirror_address
        )
        self.persist("route", route)
        self.routes.changed()
        self.delivery.sink.routes_changed()

    def create_broker_priority(
        self,
        session: Session,
        name: object,
        contract: object = None,
        local_service: object = None,
        remote_service: object = None,
        level: object = 5,
    ) -> None:
        self.persist(
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
        self.persist("broker_priority", self.catalog.checked_priority(current, **merged))

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
        self.persist("event_notification", note)
        self.listener.altered(self.queues[note.queue])

    def drop(self, session: Session, kind: object, name: object) -> None:
        if not isinstance(kind, str) or not isinstance(name, str):
            raise bad_argument("drop needs an object kind and a name")
        self.catalog.check_drop(kind, name)
        if kind == "service":
            open_ = self.endpoints.count_using(service=name)
            if open_:
                raise BrokerError(
                    ErrorCode.IN_USE,
                    f"cannot drop service '{name}': it has {open_} open conversation(s); "
                    "end them first",
                )
        if kind == "contract" and self.endpoints.count_using(contract=name):
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
                    "let it commit or roll it back first",
                )
            held = queue.messages + queue.held
            if held:
                raise BrokerError(
                    ErrorCode.IN_USE,
                    f"cannot drop queue '{name}': it still holds {held} message(s); "
                    "receive them first",
                )
        del self.catalog.table(kind)[name]
        self.journal.delete_catalog(kind, name)
        if kind == "queue":
            self.count_quotas()
            queue = self.queues.pop(name)
            self.receiving.fail_waiters(queue)
            self.listener.altered(queue)
        if kind == "event_notification":
            self.events.dropped(name)
        if kind == "route":
            self.routes.changed()
            self.delivery.sink.routes_changed()
