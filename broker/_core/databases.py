"""Databases: CREATE / ALTER / DROP DATABASE, USE, and the view of them.

Theory of operation. A database is a namespace of catalog objects (see `names`) with
Service Broker's options: `service_broker_guid` (the broker instance a dialog names to
reach it; `master`'s is the broker instance id other brokers know), `is_broker_enabled`
and `is_trustworthy_on`. `master` always exists and holds what was made before
databases existed; every session starts in it (or in the database its client asked
for) and moves with USE. Databases are records of the catalog, stored as its rows.

DROP DATABASE ends the conversations of its services as DROP SERVICE does (an error to
far sides that still listen), deletes its queues' messages and then every object of the
database; it is refused while a session uses the database or a transaction holds one
of its conversation groups. NEW_BROKER gives a database a new service_broker_guid and
removes its conversations at once, telling nobody, as SQL Server does; `master` keeps
its guid (other brokers' routes name it). ENABLE_BROKER asks for what every database
is; DISABLE_BROKER and ERROR_BROKER_CONVERSATIONS are not supported. TRUSTWORTHY is kept
and shown: ssb checks every permission against the login whatever the database, so it
has nothing more to allow.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument
from .._operations import methods
from . import catalog as cat
from .conversations import Endpoint
from .ddl import DROPPED_SERVICE_ERROR, Ddl
from .endpoints import Endpoints
from .names import DEFAULT_DATABASE, database_of
from .transactions import Session, Transactions

# SQL Server's regular identifiers: what a database name may be in ssb
_NAME: Final = re.compile(r"[A-Za-z_@#][A-Za-z0-9_@#$]{0,127}")
FIRST_USER_DATABASE: Final = 5  # SQL Server numbers user databases from 5
# what DROP DATABASE removes, in this order (what refers to something goes first)
_DROP_ORDER: Final = (
    "event_notification",
    "broker_priority",
    "service",
    "queue",
    "contract",
    "message_type",
    "procedure",
)
_BROKER_OPTIONS: Final = (
    "ENABLE_BROKER",
    "NEW_BROKER",
    "DISABLE_BROKER",
    "ERROR_BROKER_CONVERSATIONS",
)


@dataclass(eq=False)
class Databases:
    """The statements of databases, over the catalog's database records."""

    catalog: cat.Catalog
    ddl: Ddl
    transactions: Transactions
    endpoints: Endpoints
    # end an endpoint with an error to its far side, or remove it telling nobody (the
    # dialogs')
    end_conversation: Callable[[Endpoint, int, str], None]
    remove_conversation: Callable[[Endpoint], None]
    instance_id: str

    def __post_init__(self) -> None:
        # a database is about to be dropped: what else it holds goes too (the engine's
        # tables); raises IN_USE to refuse before anything changed
        self.dropping: Callable[[str], None] = lambda name: None

    def ensure_default(self) -> None:
        """At start: `master` exists (made on the first start with databases)."""
        if DEFAULT_DATABASE not in self.catalog.databases:
            self.ddl.persist("database", self.catalog.default_database(self.instance_id))

    # ---- statements ------------------------------------------------------------------------

    def use(self, session: Session, database: object) -> str:
        """USE: the session's current database from now on; returns its canonical name."""
        found = self.catalog.database(database)
        session.database = found.name
        return found.name

    def create_database(self, session: Session, name: object) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_argument(
                f"a database name is a regular identifier (a letter, _, @ or # first, then"
                f" letters, digits, _, @, # or $; at most 128), got {name!r}"
            )
        if self.catalog.find_database(name) is not None:
            raise BrokerError(
                ErrorCode.ALREADY_EXISTS,
                f"database '{name}' already exists; choose a different database name",
            )
        number = max(
            [FIRST_USER_DATABASE - 1, *(d.database_id for d in self.catalog.databases.values())]
        )
        self.ddl.persist("database", cat.Database(name, number + 1, str(uuid.uuid4())))

    def drop_database(self, session: Session, name: object) -> None:
        database = self._user_database(name, "DROP DATABASE")
        self._exclusive(database, "drop")
        users = [s for s in self.transactions.sessions.values() if s.database == database.name]
        if users:
            raise BrokerError(
                ErrorCode.IN_USE,
                f"cannot drop database '{database.name}' because it is currently in use by"
                f" {len(users)} session(s); USE another database in them first",
            )
        self.dropping(database.name)
        for service in self.catalog.in_database("service", database.name):
            self._end_conversations(service.name, "error")
            self._end_conversations(service.name, "cleanup")  # what waits for other brokers
        for kind in _DROP_ORDER:
            for obj in self.catalog.in_database(kind, database.name):
                self.ddl.forget(kind, obj.name)
        self.ddl.forget("database", database.name)

    def alter_database(
        self, session: Session, name: object, broker: object = None, trustworthy: object = None
    ) -> None:
        """ALTER DATABASE ... SET ENABLE_BROKER | NEW_BROKER, TRUSTWORTHY ON | OFF."""
        database = self.catalog.database(name)
        if broker is not None and broker not in _BROKER_OPTIONS:
            raise bad_argument(f"broker must be one of {', '.join(_BROKER_OPTIONS)}")
        if broker in ("DISABLE_BROKER", "ERROR_BROKER_CONVERSATIONS"):
            raise bad_argument(
                f"{broker} is not supported by ssb: a database's broker is always enabled; turn"
                " its queues OFF (alter_queue(status='OFF')) to hold their messages, or end"
                " conversations with end_conversation(..., error=...)"
            )
        if trustworthy is not None and not isinstance(trustworthy, bool):
            raise bad_argument("trustworthy must be True or False")
        changed = database
        if broker == "NEW_BROKER":
            if database.name == DEFAULT_DATABASE:
                raise BrokerError(
                    ErrorCode.SYSTEM_OBJECT,
                    "master keeps its service_broker_guid: it is the broker instance id other"
                    " brokers' routes name",
                )
            self._exclusive(database, "give a new broker to")
            for service in self.catalog.in_database("service", database.name):
                self._end_conversations(service.name, "cleanup")
            changed = cat.Database(
                database.name,
                database.database_id,
                str(uuid.uuid4()),
                True,
                database.is_trustworthy_on,
            )
        if trustworthy is not None:
            changed = cat.Database(
                changed.name,
                changed.database_id,
                changed.service_broker_guid,
                changed.is_broker_enabled,
                trustworthy,
            )
        if changed is not database:
            self.ddl.persist("database", changed)

    # ---- helpers ------------------------------------------------------------------------------

    def _user_database(self, name: object, what: str) -> cat.Database:
        database = self.catalog.database(name)
        if database.name == DEFAULT_DATABASE:
            raise BrokerError(ErrorCode.SYSTEM_OBJECT, f"{what} of master is not allowed")
        return database

    def _exclusive(self, database: cat.Database, verb: str) -> None:
        """Refuse while a transaction holds a conversation group of the database."""
        for queue in self.ddl.queues.values():
            if database_of(queue.name) == database.name and any(
                g.owner is not None for g in queue.groups.values()
            ):
                raise BrokerError(
                    ErrorCode.IN_USE,
                    f"cannot {verb} database '{database.name}': a transaction holds a"
                    f" conversation group of its queue '{queue.name}'; let it commit or roll"
                    " back first",
                )

    def _end_conversations(self, service: str, how: str) -> None:
        """End every conversation of `service`: with an error to the far side ("error"),
        or removed telling nobody ("cleanup")."""
        for ep in self.endpoints.of_service(service):
            if how == "error":
                text = f"The database '{database_of(service)}' was dropped."
                self.end_conversation(ep, DROPPED_SERVICE_ERROR, text)
            else:
                self.remove_conversation(ep)

    # ---- operations and the view -----------------------------------------------------------------

    def operations(self) -> dict[str, Callable[..., Any]]:
        return methods(self, "use", "create_database", "drop_database", "alter_database")

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "name": d.name,
                "database_id": d.database_id,
                "service_broker_guid": d.service_broker_guid,
                "is_broker_enabled": d.is_broker_enabled,
                "is_trustworthy_on": d.is_trustworthy_on,
            }
            for d in sorted(self.catalog.databases.values(), key=lambda d: d.database_id)
        ]
