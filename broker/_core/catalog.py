"""The catalog: databases, message types, contracts, queues, services, routes, broker
priorities, event notifications, procedures, and the rules that keep them consistent.

Catalog objects are small frozen records. Every change is checked completely before
anything is touched, then applied to memory and written to the store as one JSON
document per object, so a rejected change leaves nothing half-applied. System
objects (the DEFAULT message type and contract, Service Broker's system message
types, the event-notification contract) always exist, in every database, and cannot
be dropped.

Objects of a database are keyed by their qualified name (see `names`); routes,
certificates and remote service bindings are the broker's own (one routing table and
one identity per broker), keyed by their plain names.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final, TypeVar

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument, not_found
from .names import DEFAULT_DATABASE, database_of, display, plain, qualify
from .queue_options import (
    Activation,
    PoisonPolicy,
    parse_activation,
    parse_poison_policy,
    parse_quota,
    parse_switch,
)

END_DIALOG: Final = "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"
ERROR: Final = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
DIALOG_TIMER: Final = "http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer"
EVENT_NOTIFICATION: Final = "http://schemas.microsoft.com/SQL/Notifications/EventNotification"
POST_EVENT_NOTIFICATION: Final = (
    "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"
)
DEFAULT: Final = "DEFAULT"

VALIDATIONS: Final = {"NONE": "N", "EMPTY": "E", "WELL_FORMED_XML": "X", "VALID_JSON": "J"}
SENT_BY: Final = ("INITIATOR", "TARGET", "ANY")
EVENTS: Final = ("QUEUE_ACTIVATION", "BROKER_QUEUE_DISABLED")
MAX_NAME: Final = 256


@dataclass(frozen=True, slots=True)
class MessageType:
    name: str
    validation: str = "NONE"


@dataclass(frozen=True, slots=True)
class Contract:
    name: str
    messages: dict[str, str] = field(default_factory=dict)  # message type -> sent by

    def sent_by(self, message_type: str) -> str | None:
        return self.messages.get(message_type)


@dataclass(frozen=True, slots=True)
class QueueDef:
    name: str
    status: bool = True
    retention: bool = False
    activation: Activation = field(default_factory=Activation)
    poison_message_handling: bool = True
    poison_policy: PoisonPolicy | None = None
    max_messages: int | None = None  # quota: messages stored in the queue
    max_bytes: int | None = None  # quota: bytes of message bodies stored in the queue


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    queue: str
    contracts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    service_name: str
    address: str
    broker_instance: str | None = None
    expires: float | None = None
    # MIRROR_ADDRESS: another address of the same broker, tried when `address` does not
    # answer (its daemons share a database: one serves, the other stands by)
    mirror_address: str | None = None


@dataclass(frozen=True, slots=True)
class BrokerPriority:
    name: str
    contract: str | None = None
    local_service: str | None = None
    remote_service: str | None = None
    level: int = 5


@dataclass(frozen=True, slots=True)
class EventNotification:
    name: str
    event: str
    queue: str
    service: str
    broker_instance: str | None = None


@dataclass(frozen=True, slots=True)
class Certificate:
    """A peer broker's certificate that this broker trusts (CREATE CERTIFICATE), and the
    login its broker's messages act as (None: PUBLIC), as Service Broker maps a remote
    broker's certificate to the user that owns it."""

    name: str
    pem: str
    broker_instance: str
    login: str | None = None


@dataclass(frozen=True, slots=True)
class RemoteServiceBinding:
    """CREATE REMOTE SERVICE BINDING: the certificate of the broker that hosts a remote
    service; an encrypted dialog's session keys are wrapped for it, end to end."""

    name: str
    service: str
    pem: str
    broker_instance: str


@dataclass(frozen=True, slots=True)
class Database:
    """A database: a namespace of catalog objects, with Service Broker's options."""

    name: str
    database_id: int
    service_broker_guid: str
    is_broker_enabled: bool = True
    is_trustworthy_on: bool = False


@dataclass(frozen=True, slots=True)
class Procedure:
    """A T-SQL stored procedure: the text of its CREATE, kept as written."""

    name: str
    text: str
    created: float = 0.0
    modified: float = 0.0


_KINDS: Final[dict[str, type[Any]]] = {
    "database": Database,
    "message_type": MessageType,
    "contract": Contract,
    "queue": QueueDef,
    "service": Service,
    "route": Route,
    "broker_priority": BrokerPriority,
    "event_notification": EventNotification,
    "certificate": Certificate,
    "remote_service_binding": RemoteServiceBinding,
    "procedure": Procedure,
}
# the kinds a database holds (the others are the broker's own)
IN_DATABASE: Final = frozenset(
    {
        "message_type",
        "contract",
        "queue",
        "service",
        "broker_priority",
        "event_notification",
        "procedure",
    }
)


def encode(obj: object) -> str:
    return json.dumps(asdict(obj), sort_keys=True)  # type: ignore[call-overload]


def decode(kind: str, body: str) -> Any:
    data = json.loads(body)
    if kind == "queue":
        data["activation"] = Activation(**data["activation"])
        if data.get("poison_policy"):
            data["poison_policy"] = PoisonPolicy(**data["poison_policy"])
    if kind == "service":
        data["contracts"] = tuple(data["contracts"])
    return _KINDS[kind](**data)


def check_name(kind: str, name: object) -> str:
    """`name` (a key: its database's part was checked where it was qualified), if its
    plain name is one a client may give."""
    if not isinstance(name, str) or not plain(name).strip():
        raise bad_argument(f"a {kind} name must be a non-empty string, got {name!r}")
    if len(plain(name)) > MAX_NAME:
        raise bad_argument(f"a {kind} name may have at most {MAX_NAME} characters")
    if has_control(plain(name)):
        raise bad_argument(f"a {kind} name may not hold control characters, got {name!r}")
    return name


def check_broker_instance(value: object) -> str | None:
    """A broker instance id as a route or an event notification names it (None: any)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_argument(f"broker_instance must be a broker instance id string, got {value!r}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise bad_argument(f"broker_instance {value!r} is not a UUID") from None


def check_changes(operation: str, changes: Mapping[str, object], known: Collection[str]) -> None:
    """Refuses an ALTER whose `changes` name a part that `operation` does not change."""
    unknown = set(changes).difference(known)
    if unknown:
        raise bad_argument(f"{operation} does not know {', '.join(sorted(unknown))}")


def has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


class Catalog:
    """All catalog objects of one broker, with their consistency rules."""

    def __init__(self) -> None:
        self.databases: dict[str, Database] = {}
        self.message_types: dict[str, MessageType] = {}
        self.contracts: dict[str, Contract] = {}
        self.queues: dict[str, QueueDef] = {}
        self.services: dict[str, Service] = {}
        self.routes: dict[str, Route] = {}
        self.priorities: dict[str, BrokerPriority] = {}
        self.notifications: dict[str, EventNotification] = {}
        self.certificates: dict[str, Certificate] = {}
        self.bindings: dict[str, RemoteServiceBinding] = {}
        self.procedures: dict[str, Procedure] = {}
        for name, validation in (
            (DEFAULT, "NONE"),
            (END_DIALOG, "EMPTY"),
            (ERROR, "WELL_FORMED_XML"),
            (DIALOG_TIMER, "EMPTY"),
            (EVENT_NOTIFICATION, "WELL_FORMED_XML"),
        ):
            self.message_types[name] = MessageType(name, validation)
        self.contracts[DEFAULT] = Contract(DEFAULT, {DEFAULT: "ANY"})
        self.contracts[POST_EVENT_NOTIFICATION] = Contract(
            POST_EVENT_NOTIFICATION, {EVENT_NOTIFICATION: "INITIATOR"}
        )
        self.system_names = {("message_type", n) for n in self.message_types} | {
            ("contract", n) for n in self.contracts
        }

    def table(self, kind: str) -> dict[str, Any]:
        tables: dict[str, dict[str, Any]] = {
            "database": self.databases,
            "message_type": self.message_types,
            "contract": self.contracts,
            "queue": self.queues,
            "service": self.services,
            "route": self.routes,
            "broker_priority": self.priorities,
            "event_notification": self.notifications,
            "certificate": self.certificates,
            "remote_service_binding": self.bindings,
            "procedure": self.procedures,
        }
        return tables[kind]

    def load(self, kind: str, body: str) -> None:
        obj = decode(kind, body)
        self.table(kind)[obj.name] = obj

    def exists(self, kind: str, name: str) -> bool:
        return name in self.table(kind)

    def is_system(self, kind: str, name: str) -> bool:
        """Whether (kind, name) is a system object (in every database, never qualified)."""
        return (kind, name) in self.system_names

    def key_in(self, kind: str, name: str, database: str) -> str:
        """The key `name` (a plain name, or another database's key) has among the objects
        of `kind` in `database`; a system object keeps its name."""
        name = plain(name)
        return name if (kind, name) in self.system_names else qualify(database, name)

    def in_database(self, kind: str, database: str) -> list[Any]:
        """The objects of `kind` in `database`."""
        return [obj for key, obj in self.table(kind).items() if database_of(key) == database]

    # ---- databases ------------------------------------------------------------------------

    def find_database(self, name: str) -> Database | None:
        """The database named `name`, without case (None: no such database)."""
        found = self.databases.get(name)
        if found is not None:
            return found
        folded = name.casefold()
        return next((d for d in self.databases.values() if d.name.casefold() == folded), None)

    def database(self, name: object) -> Database:
        found = self.find_database(name) if isinstance(name, str) else None
        if found is None:
            raise not_found(
                ErrorCode.UNKNOWN_DATABASE,
                "database",
                name,
                "CREATE DATABASE makes one; the view 'databases' lists them",
            )
        return found

    def database_by_guid(self, guid: object) -> Database | None:
        """The database whose service_broker_guid is `guid` (None: not one of ours)."""
        if guid is None:
            return None
        text = str(guid).lower()
        return next((d for d in self.databases.values() if d.service_broker_guid == text), None)

    def default_database(self, instance_id: str) -> Database:
        """`master`: the broker's first database, named by the broker instance id."""
        return Database(DEFAULT_DATABASE, 1, instance_id.lower())

    # ---- procedures -----------------------------------------------------------------------

    def find_procedure(self, key: str) -> Procedure | None:
        """The procedure of `key`, its plain name without case (None: none)."""
        found = self.procedures.get(key)
        if found is not None:
            return found
        folded = key.casefold()
        return next((p for k, p in self.procedures.items() if k.casefold() == folded), None)

    # ---- what holds a login ----------------------------------------------------------------

    def mapping_to(self, login: str) -> list[str]:
        """The certificates that map another broker to `login`."""
        return sorted(c.name for c in self.certificates.values() if c.login == login)

    def activated_as(self, login: str) -> list[str]:
        """The queues (in words: `database.name` outside master) whose activation runs as
        `login`."""
        return sorted(
            display(q.name) for q in self.queues.values() if q.activation.execute_as == login
        )

    # ---- what the broker-to-broker transport reads ------------------------

    def peer_certificates(self) -> list[Certificate]:
        """Other brokers' certificates this broker trusts (CREATE CERTIFICATE), in catalog order."""
        return list(self.certificates.values())

    def remote_service_bindings(self) -> list[RemoteServiceBinding]:
        return list(self.bindings.values())

    def service_queue(self, service: str) -> str | None:
        """The queue of this broker's service `service` (None: no such service)."""
        found = self.services.get(service)
        return None if found is None else found.queue

    # ---- lookups that raise a clear error ---------------------------------

    def find_binding(self, service: str) -> RemoteServiceBinding | None:
        """The remote service binding of `service` (the first by name if several)."""
        for name in sorted(self.bindings):
            if self.bindings[name].service == service:
                return self.bindings[name]
        return None

    def binding_for(self, service: str) -> RemoteServiceBinding:
        """`find_binding`, or the error ENCRYPTION = ON without a binding gets."""
        found = self.find_binding(service)
        if found is not None:
            return found
        raise BrokerError(
            ErrorCode.UNKNOWN_REMOTE_SERVICE_BINDING,
            f"ENCRYPTION = ON needs a remote service binding for service '{service}': call"
            " create_remote_service_binding(name, service, pem) with the certificate of the"
            " broker that hosts it (its broker_certificate()), or begin the dialog without"
            " encryption=True",
        )

    def message_type(self, name: str) -> MessageType:
        return _find(self.message_types, name, ErrorCode.UNKNOWN_MESSAGE_TYPE, "message type")

    def contract(self, name: str) -> Contract:
        return _find(self.contracts, name, ErrorCode.UNKNOWN_CONTRACT, "contract")

    def queue(self, name: str) -> QueueDef:
        return _find(self.queues, name, ErrorCode.UNKNOWN_QUEUE, "queue")

    def service(self, name: str) -> Service:
        return _find(self.services, name, ErrorCode.UNKNOWN_SERVICE, "service")

    # ---- checks for each change ---------------------------------------------

    def _absent(self, kind: str, name: str) -> None:
        if name in self.table(kind):
            raise BrokerError(
                ErrorCode.ALREADY_EXISTS,
                f"{kind.replace('_', ' ')} '{name}' already exists; drop it first or pick another name",
            )

    def _not_system(self, kind: str, name: str) -> None:
        if (kind, name) in self.system_names:
            raise BrokerError(
                ErrorCode.SYSTEM_OBJECT, f"{kind.replace('_', ' ')} '{name}' is a system object"
            )

    def new_message_type(self, name: object, validation: object) -> MessageType:
        name = check_name("message type", name)
        self._absent("message_type", name)
        if not isinstance(validation, str) or validation.upper() not in VALIDATIONS:
            raise bad_argument(
                f"validation must be one of {', '.join(VALIDATIONS)}, got {validation!r}"
            )
        return MessageType(name, validation.upper())

    def altered_message_type(self, name: object, validation: object) -> MessageType:
        """ALTER MESSAGE TYPE: a new validation (messages already queued keep theirs)."""
        if not isinstance(name, str):
            raise bad_argument("alter_message_type needs a message type name")
        current = self.message_type(name)
        self._not_system("message_type", name)
        if not isinstance(validation, str) or validation.upper() not in VALIDATIONS:
            raise bad_argument(
                f"validation must be one of {', '.join(VALIDATIONS)}, got {validation!r}"
            )
        return replace(current, validation=validation.upper())

    def new_contract(self, name: object, messages: object) -> Contract:
        name = check_name("contract", name)
        self._absent("contract", name)
        if not isinstance(messages, dict) or not messages:
            raise bad_argument(
                "a contract needs a map of message type -> sent by (INITIATOR, TARGET or ANY)"
            )
        clean: dict[str, str] = {}
        for type_name, sent_by in messages.items():
            self.message_type(type_name)
            if not isinstance(sent_by, str) or sent_by.upper() not in SENT_BY:
                raise bad_argument(
                    f"message type '{type_name}' must be sent by INITIATOR, TARGET or ANY,"
                    f" not {sent_by!r}"
                )
            clean[type_name] = sent_by.upper()
        return Contract(name, clean)

    def new_queue(
        self,
        name: object,
        status: object = "ON",
        retention: object = "OFF",
        activation: object = None,
        poison_message_handling: object = None,
        poison_policy: object = None,
        max_messages: object = None,
        max_bytes: object = None,
    ) -> QueueDef:
        name = check_name("queue", name)
        self._absent("queue", name)
        definition = QueueDef(
            name,
            status=parse_switch("status", status),
            retention=parse_switch("retention", retention),
            activation=parse_activation(activation),
            poison_message_handling=self._poison_switch(poison_message_handling, True),
            poison_policy=parse_poison_policy(poison_policy),
            max_messages=parse_quota("max_messages", max_messages),
            max_bytes=parse_quota("max_bytes", max_bytes),
        )
        self._check_policy_queue(definition)
        return definition

    def altered_queue(self, name: str, changes: dict[str, object]) -> QueueDef:
        current = self.queue(name)
        check_changes(
            "alter_queue",
            changes,
            (
                "status",
                "retention",
                "activation",
                "poison_message_handling",
                "poison_policy",
                "max_messages",
                "max_bytes",
            ),
        )
        updated = current
        if "status" in changes:
            updated = replace(updated, status=parse_switch("status", changes["status"]))
        if "retention" in changes:
            updated = replace(updated, retention=parse_switch("retention", changes["retention"]))
        if "activation" in changes:
            updated = replace(
                updated, activation=parse_activation(changes["activation"], current.activation)
            )
        if "poison_message_handling" in changes:
            updated = replace(
                updated,
                poison_message_handling=self._poison_switch(
                    changes["poison_message_handling"], current.poison_message_handling
                ),
            )
        if "poison_policy" in changes:
            updated = replace(updated, poison_policy=parse_poison_policy(changes["poison_policy"]))
        if "max_messages" in changes:
            updated = replace(
                updated, max_messages=parse_quota("max_messages", changes["max_messages"])
            )
        if "max_bytes" in changes:
            updated = replace(updated, max_bytes=parse_quota("max_bytes", changes["max_bytes"]))
        self._check_policy_queue(updated)
        return updated

    def _check_policy_queue(self, definition: QueueDef) -> None:
        policy = definition.poison_policy
        if policy is None:
            return
        if policy.dead_letter_queue is not None:
            if policy.dead_letter_queue == definition.name:
                raise bad_argument("a queue cannot be its own dead-letter queue")
            self.queue(policy.dead_letter_queue)
        if policy.notify_service is not None:
            self.service(policy.notify_service)

    @staticmethod
    def _poison_switch(value: object, default: bool) -> bool:
        if value is None:
            return default
        if isinstance(value, dict):
            unknown = set(value) - {"status"}
            if unknown:
                raise bad_argument(
                    "unknown poison_message_handling option(s)"
                    f" {', '.join(sorted(map(str, unknown)))}; it takes status (ON or OFF)"
                )
            return parse_switch("poison_message_handling status", value.get("status", "ON"))
        return parse_switch("poison_message_handling", value)

    def altered_service(self, name: object, add: object, drop: object) -> Service:
        """ALTER SERVICE (ADD CONTRACT ..., DROP CONTRACT ...): the contracts it accepts as
        a target from now on (conversations already begun keep theirs)."""
        if not isinstance(name, str):
            raise bad_argument("alter_service needs a service name")
        current = self.service(name)
        self._not_system("service", name)
        added = self._names("add_contracts", add)
        dropped = self._names("drop_contracts", drop)
        for contract in added:
            self.contract(contract)
            if contract in current.contracts:
                raise BrokerError(
                    ErrorCode.ALREADY_EXISTS,
                    f"service '{name}' already accepts contract '{contract}'",
                )
        for contract in dropped:
            if contract not in current.contracts:
                raise BrokerError(
                    ErrorCode.UNKNOWN_CONTRACT,
                    f"service '{name}' does not accept contract '{contract}': nothing to drop",
                )
        kept = [c for c in current.contracts if c not in dropped]
        return replace(current, contracts=(*kept, *added))

    @staticmethod
    def _names(what: str, value: object) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise bad_argument(f"{what} must be a list of contract names")
        seen: set[str] = set()
        for contract in value:
            if contract in seen:
                raise bad_argument(f"{what} names contract '{contract}' twice")
            seen.add(contract)
        return list(value)

    def new_service(self, name: object, queue: object, contracts: object) -> Service:
        name = check_name("service", name)
        self._absent("service", name)
        if not isinstance(queue, str):
            raise bad_argument("a service needs the name of its queue")
        self.queue(queue)
        names = self._names("contracts", contracts)
        for contract in names:
            self.contract(contract)
        return Service(name, queue, tuple(names))

    def new_route(
        self,
        name: object,
        service_name: object,
        address: object,
        broker_instance: object,
        expires: float | None,
        mirror_address: object = None,
    ) -> Route:
        name = check_name("route", name)
        self._absent("route", name)
        return self.checked_route(
            name, service_name, address, broker_instance, expires, mirror_address
        )

    def checked_route(
        self,
        name: str,
        service_name: object,
        address: object,
        broker_instance: object,
        expires: float | None,
        mirror_address: object = None,
    ) -> Route:
        """A route of these parts, each checked (CREATE ROUTE, ALTER ROUTE)."""
        service_name = check_name("service", service_name)
        if not isinstance(address, str) or not (
            address in ("LOCAL", "TRANSPORT") or address.startswith("tcp://")
        ):
            raise bad_argument(
                f"route address must be 'tcp://host:port', 'LOCAL' or 'TRANSPORT', got {address!r}"
            )
        broker_instance = check_broker_instance(broker_instance)
        if mirror_address is not None:
            if not isinstance(mirror_address, str) or not mirror_address.startswith("tcp://"):
                raise bad_argument(
                    f"mirror_address must be 'tcp://host:port', got {mirror_address!r}"
                )
            if not address.startswith("tcp://"):
                raise bad_argument(
                    f"a route to {address} has no mirror address: only a tcp:// address has one"
                )
            if broker_instance is None:
                raise bad_argument(
                    "a route with a mirror_address names the broker_instance both addresses"
                    " serve (as Service Broker's MIRROR_ADDRESS needs BROKER_INSTANCE)"
                )
            if mirror_address == address:
                raise bad_argument("mirror_address is the route's own address")
        return Route(name, service_name, address, broker_instance, expires, mirror_address)

    def new_priority(
        self,
        name: object,
        contract: object,
        local_service: object,
        remote_service: object,
        level: object,
    ) -> BrokerPriority:
        name = check_name("broker priority", name)
        self._absent("broker_priority", name)
        return self.checked_priority(
            BrokerPriority(name), contract, local_service, remote_service, level
        )

    def checked_priority(
        self,
        base: BrokerPriority,
        contract: object,
        local_service: object,
        remote_service: object,
        level: object,
    ) -> BrokerPriority:
        for what, value in (
            ("contract", contract),
            ("local_service", local_service),
            ("remote_service", remote_service),
        ):
            if value is not None and not isinstance(value, str):
                raise bad_argument(f"{what} must be a name, or None for ANY")
        if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 10:
            raise bad_argument(f"priority level must be an integer 1..10, got {level!r}")

        def any_(v: object) -> str | None:
            return None if v is None or (isinstance(v, str) and v.upper() == "ANY") else str(v)

        return replace(
            base,
            contract=any_(contract),
            local_service=any_(local_service),
            remote_service=any_(remote_service),
            level=level,
        )

    def new_notification(
        self, name: object, event: object, queue: object, service: object, broker_instance: object
    ) -> EventNotification:
        name = check_name("event notification", name)
        self._absent("event_notification", name)
        if event not in EVENTS:
            raise bad_argument(f"event must be one of {', '.join(EVENTS)}, got {event!r}")
        if not isinstance(queue, str):
            raise bad_argument("an event notification needs a queue name")
        self.queue(queue)
        service = check_name("service", service)
        return EventNotification(
            name, str(event), queue, service, check_broker_instance(broker_instance)
        )

    def check_drop(self, kind: str, name: str) -> None:
        """Raise unless dropping (kind, name) leaves the catalog consistent."""
        if kind not in _KINDS or kind == "database":
            raise bad_argument(f"unknown object kind {kind!r}")
        self._not_system(kind, name)
        if kind == "procedure" and self.find_procedure(name) is not None:
            return
        if name not in self.table(kind):
            code = {
                "message_type": ErrorCode.UNKNOWN_MESSAGE_TYPE,
                "contract": ErrorCode.UNKNOWN_CONTRACT,
                "queue": ErrorCode.UNKNOWN_QUEUE,
                "service": ErrorCode.UNKNOWN_SERVICE,
                "route": ErrorCode.UNKNOWN_ROUTE,
                "broker_priority": ErrorCode.UNKNOWN_PRIORITY,
                "event_notification": ErrorCode.UNKNOWN_EVENT_NOTIFICATION,
                "certificate": ErrorCode.UNKNOWN_CERTIFICATE,
                "remote_service_binding": ErrorCode.UNKNOWN_REMOTE_SERVICE_BINDING,
                "procedure": ErrorCode.UNKNOWN_PROCEDURE,
            }[kind]
            raise not_found(code, kind.replace("_", " "), name)
        users: list[str] = []
        if kind == "message_type":
            users = [c.name for c in self.contracts.values() if name in c.messages]
        elif kind == "contract":
            users = [s.name for s in self.services.values() if name in s.contracts]
        elif kind == "service":
            # Service Broker: no service a conversation priority refers to is dropped
            users = [
                f"broker priority {p.name}"
                for p in self.priorities.values()
                if p.local_service == name
            ]
        elif kind == "queue":
            users = [f"service {s.name}" for s in self.services.values() if s.queue == name]
            users += [
                f"event notification {n.name}"
                for n in self.notifications.values()
                if n.queue == name
            ]
            users += [
                f"queue {q.name} (dead-letter queue)"
                for q in self.queues.values()
                if q.poison_policy and q.poison_policy.dead_letter_queue == name
            ]
        if users:
            raise BrokerError(
                ErrorCode.IN_USE,
                f"cannot drop {kind.replace('_', ' ')} '{name}': it is used by "
                f"{', '.join(users)}; drop or change those first",
            )


_Object = TypeVar("_Object")


def _find(table: dict[str, _Object], name: str, code: ErrorCode, kind: str) -> _Object:
    """The object `name` of `table`, or the error that names what was not found."""
    found = table.get(name)
    if found is None:
        raise not_found(code, kind, name)
    return found
