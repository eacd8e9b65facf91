"""Catalog statements: CREATE / ALTER / DROP of message types, contracts, queues, services,
routes, broker priorities, event notifications, certificates and procedures.

Theory of operation. The catalog (`catalog.Catalog`) checks every change completely
before anything is touched; this module then applies it to memory, writes the object
to the store as one document, and tells whoever depends on it: a queue turned ON gets
its held messages released and its waiting readers kicked; a queue turned OFF fails its
waiting readers; routes or services changing clear the route cache and wake the
transport; queue monitors hear of every queue change.

Drops follow Service Broker. DROP SERVICE waits for the conversation groups of its
conversations that other transactions hold, then ends every conversation of the service
with an error to the far side (`DROPPED_SERVICE_ERROR`; none to a far side that has
already ended) and deletes the service's messages from its queue. DROP QUEUE is refused
while a service uses the queue (or an event notification, or a poison policy as its
dead-letter queue), deletes whatever messages the queue still holds, and ends the waits
of RECEIVEs on it empty, as if their timeouts had passed (SQL Server's DROP waits for
them instead). A contract is not dropped while conversations use it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument, not_found
from . import catalog as cat
from .backlog import MessageCache
from .capacity import Capacity
from .conversations import Endpoint
from .delivery import Delivery
from .endpoints import Endpoints
from .events import Events
from .names import database_of, display, plain
from .ports import Clock, Journal, QueueListener
from .queue_options import is_python
from .queues import Queue
from .receive import Receiving
from .routes import Routes
from .transactions import MAX_TIMEOUT, MaybeAwaitable, Session, Transactions

# the error a dropped service's conversations end with: SQL Server's 8490, "Cannot find
# the remote service ... because it does not exist", negated as Service Broker does
DROPPED_SERVICE_ERROR: Final = -8490
MAX_PROCEDURE_TEXT: Final = 1 << 20
# LIFETIME is how long a route stays (SQL Server's whole seconds): less would make a route
# that has expired as it is made, never used, where None is a route that never expires
MIN_ROUTE_LIFETIME: Final = 1

log = logging.getLogger("ssb.core")


@dataclass(eq=False)
class Ddl:
    journal: Journal
    clock: Clock
    catalog: cat.Catalog
    routes: Routes
    queues: dict[str, Queue]
    cache: MessageCache
    capacity: Capacity
    endpoints: Endpoints
    delivery: Delivery
    receiving: Receiving
    events: Events
    listener: QueueListener
    # refuses an activation procedure the broker may not run (the daemon's policy)
    check_procedure: Callable[[str], None]
    transactions: Transactions
    # ends a conversation at once with an error to the far side (the dialogs')
    end_conversation: Callable[[Endpoint, int, str], None]
    # whether a login exists (the daemon's logins, set once they are loaded)
    is_login: Callable[[str], bool] = lambda login: True

    def persist(self, kind: str, obj: Any) -> None:
        self.catalog.table(kind)[obj.name] = obj
        self.journal.put_catalog(kind, obj.name, cat.encode(obj))
        if kind == "queue":
            self.count_quotas()
        elif kind in ("service", "route", "database"):
            self.routes.changed()
            if kind == "route":
                self.delivery.sink.routes_changed()

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
        self._check_activation(definition.activation.procedure)
        self._check_execute_as(definition.activation.execute_as)
        self.persist("queue", definition)
        self.listener.altered(self.add_queue(definition))

    def alter_queue(self, session: Session, name: object, **changes: object) -> None:
        if not isinstance(name, str):
            raise bad_argument("alter_queue needs a queue name")
        updated = self.catalog.altered_queue(name, changes)
        current = self.catalog.queues[name].activation
        if updated.activation.procedure != current.procedure:
            self._check_activation(updated.activation.procedure)
        if updated.activation.execute_as != current.execute_as:
            self._check_execute_as(updated.activation.execute_as)
        self.set_queue(updated)

    def _check_activation(self, procedure: str) -> None:
        """A Python procedure must be one the broker may run; a T-SQL one must exist."""
        if not procedure:
            return
        if is_python(procedure):
            self.check_procedure(procedure)
        elif self.catalog.find_procedure(procedure) is None:
            raise not_found(
                ErrorCode.UNKNOWN_PROCEDURE,
                "stored procedure",
                plain(procedure),
                f"CREATE PROCEDURE it in database '{database_of(procedure)}' first (a Python"
                " procedure is written 'package.module:function')",
            )

    def _check_execute_as(self, login: str) -> None:
        """The login an activation runs as must exist, as EXECUTE AS 'user' needs its
        user in SQL Server ("": the queue's owner)."""
        if login and not self.is_login(login):
            raise BrokerError(
                ErrorCode.UNKNOWN_LOGIN,
                f"there is no login '{login}' for the queue's activation to run as (EXECUTE"
                " AS): create_login it first, or leave execute_as out (None) for the queue's"
                " owner",
            )

    def set_queue(self, updated: cat.QueueDef, reason: str = "") -> None:
        queue = self.queues[updated.name]
        was = queue.definition
        was_on = was.status
        queue.definition = updated
        quota = (updated.max_messages, updated.max_bytes)
        if queue.quota_refusals.at is not None and quota != (was.max_messages, was.max_bytes):
            self.capacity.quota_spell_over(queue, "has a new quota")
        self.persist("queue", updated)
        if updated.status and not was_on:
            log.info(
                "queue %s enabled (it was off: %s)",
                display(updated.name),
                queue.disabled_reason or "set so",
            )
            queue.rollback_streak = 0
            queue.disabled_reason = ""
            self.delivery.release_held(updated.name)
            self.receiving.kick(queue)
        elif not updated.status:
            if was_on:
                log.info(
                    "queue %s disabled: %s", display(updated.name), reason or "status set to OFF"
                )
            queue.disabled_reason = reason
            self.receiving.fail_waiters(queue)
        self.listener.altered(queue)

    def disable_queue(self, queue: Queue, reason: str) -> None:
        self.set_queue(replace(queue.definition, status=False), reason)

    def create_service(
        self, session: Session, name: object, queue: object, contracts: object = None
    ) -> None:
        service = self.catalog.new_service(name, queue, contracts)
        self.persist("service", service)
        self.delivery.service_created(service.name)

    def alter_service(
        self,
        session: Session,
        name: object,
        add_contracts: object = None,
        drop_contracts: object = None,
        queue: object = None,
    ) -> None:
        altered = self.catalog.altered_service(name, add_contracts, drop_contracts)
        if queue is not None:
            if not isinstance(queue, str):
                raise bad_argument("queue must be a queue name")
            self.catalog.queue(queue)
            if queue != altered.queue and self.endpoints.count_using(service=altered.name):
                raise BrokerError(
                    ErrorCode.IN_USE,
                    f"service '{plain(altered.name)}' has open conversations: ssb moves a"
                    " service to another queue only while it has none (SQL Server would move"
                    " their messages); end them, or drop the service and create it on the"
                    " other queue",
                )
            altered = replace(altered, queue=queue)
        self.persist("service", altered)

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
        route = self.catalog.new_route(
            name, service_name, address, broker_instance, self._expires(lifetime), mirror_address
        )
        self.persist("route", route)

    def alter_route(self, session: Session, name: object, **changes: object) -> None:
        """ALTER ROUTE: the parts given change, the others stay."""
        if not isinstance(name, str) or name not in self.catalog.routes:
            raise not_found(ErrorCode.UNKNOWN_ROUTE, "route", name)
        cat.check_changes(
            "alter_route",
            changes,
            ("service_name", "address", "broker_instance", "lifetime", "mirror_address"),
        )
        current = self.catalog.routes[name]
        route = self.catalog.checked_route(
            name,
            changes.get("service_name", current.service_name),
            changes.get("address", current.address),
            changes.get("broker_instance", current.broker_instance),
            self._expires(changes["lifetime"]) if "lifetime" in changes else current.expires,
            changes.get("mirror_address", current.mirror_address),
        )
        self.persist("route", route)

    def _expires(self, lifetime: object) -> float | None:
        """When a route of `lifetime` seconds from now expires (None: never)."""
        if lifetime is None:
            return None
        if (
            isinstance(lifetime, bool)
            or not isinstance(lifetime, (int, float))
            or not MIN_ROUTE_LIFETIME <= lifetime <= MAX_TIMEOUT  # NaN fails this too
        ):
            raise bad_argument(
                f"a route's lifetime is seconds from {MIN_ROUTE_LIFETIME:g} to {MAX_TIMEOUT:g}"
                f" (None: it never expires), got {lifetime!r}"
            )
        return self.clock.time() + lifetime

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
        cat.check_changes(
            "alter_broker_priority",
            changes,
            ("contract", "local_service", "remote_service", "level"),
        )
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

    # ---- procedures -----------------------------------------------------------------------

    def create_procedure(
        self, session: Session, name: object, text: object, replace: object = False
    ) -> None:
        """CREATE PROCEDURE (`replace`: CREATE OR ALTER) keeps the procedure's text."""
        name = cat.check_name("procedure", name)
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_PROCEDURE_TEXT:
            raise bad_argument(
                f"a procedure's text is its CREATE PROCEDURE statement, at most"
                f" {MAX_PROCEDURE_TEXT} characters"
            )
        if not isinstance(replace, bool):
            raise bad_argument("replace must be True or False")
        current = self.catalog.find_procedure(name)
        if current is not None and not replace:
            raise BrokerError(
                ErrorCode.ALREADY_EXISTS,
                f"procedure '{plain(current.name)}' already exists; ALTER PROCEDURE changes it",
            )
        now = time.time()
        if current is None:
            self.persist("procedure", cat.Procedure(name, text, now, now))
        else:
            self.persist("procedure", cat.Procedure(current.name, text, current.created, now))

    def alter_procedure(self, session: Session, name: object, text: object) -> None:
        if not isinstance(name, str) or self.catalog.find_procedure(name) is None:
            raise not_found(ErrorCode.UNKNOWN_PROCEDURE, "procedure", plain(str(name)))
        self.create_procedure(session, name, text, replace=True)

    def procedure(self, session: Session, name: object) -> dict[str, Any]:
        """A procedure's name and text (what running it needs)."""
        found = self.catalog.find_procedure(name) if isinstance(name, str) else None
        if found is None:
            raise not_found(ErrorCode.UNKNOWN_PROCEDURE, "procedure", plain(str(name)))
        return {"name": plain(found.name), "text": found.text}

    # ---- drops ---------------------------------------------------------------------------------

    def drop(self, session: Session, kind: object, name: object) -> MaybeAwaitable[None]:
        if not isinstance(kind, str) or not isinstance(name, str):
            raise bad_argument("drop needs an object kind and a name")
        self.catalog.check_drop(kind, name)
        if kind == "service":
            return self._drop_service(session, name)
        if kind == "procedure":
            found = self.catalog.find_procedure(name)
            assert found is not None
            name = found.name
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
        self.forget(kind, name)
        return None

    def forget(self, kind: str, name: str) -> None:
        """Remove object `name` of `kind`, checked already, with what depends on it: a
        queue's messages and waiting readers, a notification's dialog, cached routes."""
        del self.catalog.table(kind)[name]
        self.journal.delete_catalog(kind, name)
        if kind == "queue":
            self.count_quotas()
            queue = self.queues.pop(name)
            if queue.quota_refusals.at is not None:
                self.capacity.quota_spell_over(queue, "was dropped")
            if queue.messages:
                queue.drop_all()
                self.journal.delete_queue_messages(name)
            self.receiving.end_waiters(queue)
            self.listener.altered(queue)
        elif kind == "event_notification":
            self.events.dropped(name)
        elif kind in ("route", "service", "database"):
            self.routes.changed()
            if kind == "route":
                self.delivery.sink.routes_changed()

    def _drop_service(self, session: Session, name: str) -> MaybeAwaitable[None]:
        """DROP SERVICE, once no other transaction holds a group of its conversations."""
        queue = self.queues[self.catalog.services[name].queue]
        txn = self.transactions.current(session)
        busy = {
            ep.group_id
            for ep in self.endpoints.of_service(name)
            if not self.transactions.lockable(txn, queue, ep.group_id)
        }

        def act() -> None:
            if name in self.catalog.services:
                self.forget("service", name)
                description = f"The service '{plain(name)}' was dropped."
                for ep in self.endpoints.of_service(name):
                    self.end_conversation(ep, DROPPED_SERVICE_ERROR, description)
            self.transactions.finish(txn)

        return self.transactions.locked(txn, [(queue, group) for group in busy], act)
