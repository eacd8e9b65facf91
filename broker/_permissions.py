"""Permissions in Service Broker's terms: which login may do what to which object.

Theory of operation. Permissions are CONTROL, CREATE, ALTER, DROP, SEND, RECEIVE, VIEW
and EXECUTE, held on the broker itself (everything of the kind) or on one object: SEND
on a service, RECEIVE and EXECUTE on a queue, EXECUTE on a procedure, ALTER / DROP /
CONTROL on any catalog object or database. The login that creates an object owns it and
holds every permission on it; the owner of a database (its creator) holds every
permission on every object in it; `admin` holds CONTROL of the broker and cannot lose
it. CREATE on the broker covers CREATE DATABASE, as it covers every other CREATE. Any
login may USE any database: what it may do there is what its permissions on the
objects say (ssb has no database users). Grants and owners live in the
store (owned here) and are changed by `grant` / `revoke`, which CONTROL of the broker or
of the object (its owner) may call.

PUBLIC (`public`) is every login and every broker whose certificate names no login:
what is granted to it, each of them holds. A message from another broker acts as the
login its certificate names (`create_certificate(..., login=...)`), else as PUBLIC, and
needs SEND on the service it is for (`may_send`, asked by the transport), as Service
Broker maps a remote broker's certificate to a user.

Every client operation passes `check` before it runs (`Operations.call`): a table names,
per operation, what it needs, resolved from its arguments (a conversation handle leads
to its endpoint's service and that service's queue). An operation missing from the
table needs CONTROL, so a new operation is closed until someone decides otherwise. A
session acts for a conversation endpoint only if it may RECEIVE from that endpoint's
queue; beginning a dialog also needs SEND on the target service. A refusal raises
PERMISSION_DENIED naming the permission, the object and who can grant it, before
anything is applied, and is logged. `created` / `dropped` keep owners current after a
statement succeeded.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Container, Mapping
from typing import Any, Final

from ssb.protocol import ErrorCode

from ._core.catalog import IN_DATABASE, Catalog
from ._core.endpoints import Endpoints
from ._core.names import DEFAULT_DATABASE, database_of, display, plain, qualify
from ._core.ports import TableStatement
from ._core.queue_options import is_python
from ._core.tables import is_temporary
from ._core.transactions import Session, Transactions
from ._errors import BrokerError, bad_argument
from ._logins import ADMIN
from ._store import Store

log = logging.getLogger("ssb.permissions")

KINDS: Final = (
    "database",
    "procedure",
    "message_type",
    "contract",
    "queue",
    "service",
    "route",
    "broker_priority",
    "event_notification",
    "certificate",
    "remote_service_binding",
    "table",
)
# the permissions a table statement may need on its table, besides ALTER, DROP, CONTROL
TABLE_PERMISSIONS: Final = ("SELECT", "INSERT", "UPDATE", "DELETE")
_TRUST: Final = frozenset({"route", "certificate", "remote_service_binding"})
PUBLIC: Final = "public"  # every login, and every broker whose certificate names none
# which kinds of object each permission can be granted on ("" is the broker itself)
GRANTABLE: Final[Mapping[str, frozenset[str]]] = {
    "CONTROL": frozenset({"", *KINDS}),
    "CREATE": frozenset({"", "database"}),  # on a database: CREATE TABLE in it
    "ALTER": frozenset({"", *KINDS}),
    "DROP": frozenset({"", *KINDS}),
    "SEND": frozenset({"", "service"}),
    "RECEIVE": frozenset({"", "queue"}),
    "VIEW": frozenset({""}),
    "EXECUTE": frozenset({"", "queue", "procedure"}),
    **{permission: frozenset({"", "table"}) for permission in TABLE_PERMISSIONS},
}
# operations that create an object of a kind (the creator becomes its owner)
CREATES: Final = {
    "create_message_type": "message_type",
    "create_contract": "contract",
    "create_queue": "queue",
    "create_service": "service",
    "create_route": "route",
    "create_broker_priority": "broker_priority",
    "create_event_notification": "event_notification",
    "create_certificate": "certificate",
    "create_remote_service_binding": "remote_service_binding",
    "create_procedure": "procedure",
    "create_database": "database",
}
# operations anyone logged in may call: they touch only the caller's own session,
# its own activated task or its own scheduler log, or read this broker's identity
OPEN: Final = frozenset(
    {
        "ping",
        "broker_instance",
        "broker_certificate",
        "begin_transaction",
        "commit",
        "rollback",
        "detach_transaction",
        "transaction_outcome",  # only the login's own transactions
        "attach_task",
        "end_task",
        "log_task",
        "log_task_start",
        "log_task_end",
        "use",  # any login may use any database; its objects have their own permissions
        "save_transaction",
        "rollback_to_savepoint",
        "execute",  # each statement's own needs are checked by `check_table_statement`
        "execute_many",  # (as execute)
        "fetch_rows",  # the rest of the session's own last answer
    }
)

# drops of objects the transport keeps (not through the catalog's generic `drop`)
DROPS: Final = {
    "drop_certificate": "certificate",
    "drop_remote_service_binding": "remote_service_binding",
}
_TRACKED: Final = frozenset({*CREATES, "drop", *DROPS, "drop_database"})
Need = tuple[str, str, str]  # (permission, kind, name): kind "" for the broker


class Permissions:
    """Grants and owners (owned here), and the check every operation passes."""

    def __init__(
        self,
        store: Store,
        catalog: Catalog,
        endpoints: Endpoints,
        transactions: Transactions,
        logins: Container[str],
        local_target: Callable[[str, object, str], str | None] = lambda s, b, d: None,
        sendable: Callable[[str], None] = lambda service: None,
    ) -> None:
        """Grants and owners in `store`; the core's objects, endpoints and detached
        transactions, to resolve what an operation touches; the logins that exist;
        `local_target`: the key of this broker's service a dialog to (service, broker
        instance) from a database reaches (the routes'); `sendable(service)`: told after a
        grant that may let another broker's waiting messages go to that service (its key)."""
        self.store = store
        self.local_target = local_target
        self.sendable = sendable
        self.catalog = catalog
        self.endpoints = endpoints
        self.transactions = transactions
        self.logins = logins
        self.tracked = _TRACKED
        self.tables: Container[str] = frozenset()  # the tables that exist, by key
        self.grants: set[tuple[str, str, str, str]] = set()
        self.owners: dict[tuple[str, str], str] = {}
        self._rules: dict[str, Callable[[Session, dict[str, Any]], list[Need]]] = {
            "create_queue": self._create_queue,
            "alter_queue": self._alter_queue,
            "create_service": self._create_service,
            "alter_broker_priority": lambda s, a: [("ALTER", "broker_priority", _name(a))],
            "alter_message_type": lambda s, a: [("ALTER", "message_type", _name(a))],
            "alter_service": self._alter_service,
            "alter_route": lambda s, a: [("CONTROL", "", "")],
            "alter_procedure": lambda s, a: [("ALTER", "procedure", _name(a))],
            "procedure": lambda s, a: [("EXECUTE", "procedure", _name(a))],
            "alter_database": lambda s, a: [("ALTER", "database", self._database(a))],
            "drop_database": lambda s, a: [("DROP", "database", self._database(a))],
            "drop": self._drop,
            "begin_dialog": self._begin_dialog,
            "send": lambda s, a: self._endpoints(a.get("handles")),
            "end_conversation": lambda s, a: self._endpoints([a.get("handle")]),
            "begin_conversation_timer": lambda s, a: self._endpoints([a.get("handle")]),
            "move_conversation": lambda s, a: self._endpoints([a.get("handle")]),
            "receive": self._queue_receive,
            "get_conversation_group": self._queue_receive,
            "requeue_dead_letter": self._queue_receive,
            "view": self._view,
            "attach_transaction": self._detached,
            "commit_transaction": self._detached,
            "rollback_transaction": self._detached,
            "transaction_messages": self._detached,
            "check_procedure": lambda s, a: [("EXECUTE", "", "")],
            "register_task": self._queue_receive,
            "request_stop": lambda s, a: [("EXECUTE", "", "")],
            "label_job": lambda s, a: [("EXECUTE", "", "")],
            # CONTROL of the broker or of the object, checked by grant / revoke themselves
            "grant": lambda s, a: [],
            "revoke": lambda s, a: [],
        }
        for operation, kind in CREATES.items():
            if operation not in self._rules:
                trusted = kind in _TRUST  # who this broker talks to
                need: Need = ("CONTROL", "", "") if trusted else ("CREATE", "", "")
                self._rules[operation] = lambda s, a, need=need: [need]  # type: ignore[misc]

    def load(self) -> None:
        grants, owners = self.store.load_permissions()
        self.grants = {(str(a), str(b), str(c), str(d)) for a, b, c, d in grants}
        self.owners = {(str(k), str(n)): str(login) for k, n, login in owners}

    # ---- the question ---------------------------------------------------------------

    def has(self, user: str, permission: str, kind: str = "", name: str = "") -> bool:
        """Whether `user` holds `permission` on the object (or the broker), itself or
        through PUBLIC."""
        if user == ADMIN:
            return True
        if self._holds(user, permission, kind, name):
            return True
        return user != PUBLIC and self._holds(PUBLIC, permission, kind, name)

    def _holds(self, user: str, permission: str, kind: str, name: str) -> bool:
        grants = self.grants
        if (user, "CONTROL", "", "") in grants or (user, permission, "", "") in grants:
            return True
        if not kind:
            return False
        if (
            self.owners.get((kind, name)) == user
            or (user, permission, kind, name) in grants
            or (user, "CONTROL", kind, name) in grants
        ):
            return True
        if not _in_database(kind):
            return False
        database = database_of(name)  # its database's owner, or CONTROL of its database
        control = (user, "CONTROL", "database", database)
        return self.owners.get(("database", database)) == user or control in grants

    # ---- messages from other brokers (the transport's SendPermission) ---------------

    def is_principal(self, name: str) -> bool:
        return name == PUBLIC or name in self.logins

    def may_send(self, login: str | None, service: str) -> bool:
        """Whether `login` (None: PUBLIC) may SEND to `service`: the key of a service of
        this broker, or the name a new dialog from another broker gives, which reaches a
        service in whichever database. A name no service here has yet passes: its
        messages wait until the service exists, as Service Broker's do."""
        key = service if service in self.catalog.services else None
        key = key or self.local_target(service, None, DEFAULT_DATABASE)
        if key is None:
            return True
        return self.has(PUBLIC if login is None else login, "SEND", "service", key)

    # ---- users' tables --------------------------------------------------------------

    def check_table_statement(self, session: Session, statement: TableStatement) -> None:
        """Raise PERMISSION_DENIED unless `session` may run the table statement: CREATE on
        its database (or the broker) for CREATE TABLE, and on each table the permission
        its use needs (SELECT to read it; INSERT, UPDATE, DELETE, ALTER or DROP)."""
        if session.user == ADMIN:
            return
        for table, permission in statement.writes.items():
            if is_temporary(table):  # a session's own, as in SQL Server's tempdb
                continue
            if permission == "CREATE":
                if not self.has(session.user, "CREATE", "database", statement.database):
                    self._refuse(session, "CREATE TABLE", "CREATE", "database", statement.database)
                continue
            key = qualify(statement.database, table)
            for need in permission.split():  # (a MERGE needs INSERT and UPDATE)
                if key in self.tables and not self.has(session.user, need, "table", key):
                    self._refuse(session, f"{need} of a table", need, "table", key)
        for table in statement.reads:
            key = qualify(statement.database, table)
            if key in self.tables and not self.has(session.user, "SELECT", "table", key):
                self._refuse(session, "SELECT from a table", "SELECT", "table", key)

    def table_created(self, key: str, login: str) -> None:
        """A table's CREATE committed: its creator owns it."""
        self.owners[("table", key)] = login
        self.store.put_owner(("table", key, login))

    def owned_by(self, login: str) -> list[str]:
        """What `login` owns, in words ("queue 'Shop.Orders'")."""
        return sorted(
            f"{kind.replace('_', ' ')} '{display(key)}'"
            for (kind, key), owner in self.owners.items()
            if owner == login
        )

    def owner(self, kind: str, name: str) -> str | None:
        return self.owners.get((kind, name))

    def check(self, session: Session, operation: str, arguments: dict[str, Any]) -> None:
        """Raise PERMISSION_DENIED unless `session` may run `operation` with `arguments`."""
        if operation in OPEN or session.user == ADMIN:
            return
        rule = self._rules.get(operation)
        needs = [("CONTROL", "", "")] if rule is None else rule(session, arguments)
        for permission, kind, name in needs:
            if not self.has(session.user, permission, kind, name):
                self._refuse(session, operation, permission, kind, name)

    def _refuse(
        self, session: Session, operation: str, permission: str, kind: str, name: str
    ) -> None:
        target = f"{kind.replace('_', ' ')} '{name}'" if kind else "the broker"
        owner = self.owners.get((kind, name)) if kind else None
        who = f"its owner '{owner}' or a login with CONTROL" if owner else "a login with CONTROL"
        log.warning(
            "refused %s to %r from %s: needs %s on %s",
            operation,
            session.user,
            session.peer,
            permission,
            target,
        )
        raise BrokerError(
            ErrorCode.PERMISSION_DENIED,
            f"login '{session.user}' lacks {permission} on {target}, which {operation} needs;"
            f" {who} can grant it",
        )

    # ---- after a statement succeeded ------------------------------------------------------

    def succeeded(self, session: Session, operation: str, arguments: dict[str, Any]) -> None:
        kind = CREATES.get(operation)
        if kind is not None and isinstance(arguments.get("name"), str):
            self.owners[(kind, arguments["name"])] = session.user
            self.store.put_owner((kind, arguments["name"], session.user))
        elif operation == "drop":
            kind, name = str(arguments.get("kind")), str(arguments.get("name"))
            self.forget(kind, name)
        elif operation in DROPS:
            self.forget(DROPS[operation], str(arguments.get("name")))
        elif operation == "drop_database":
            self.database_dropped(self._database(arguments))

    def database_dropped(self, database: str) -> None:
        """Forget the owners of, and grants on, a dropped database and all it held."""
        folded = database.casefold()
        gone = {
            (kind, name)
            for kind, name in [*self.owners, *((g[2], g[3]) for g in self.grants)]
            if (kind == "database" and name.casefold() == folded)
            or (_in_database(kind) and database_of(name).casefold() == folded)
        }
        for kind, name in gone:
            self.forget(kind, name)

    def forget(self, kind: str, name: str) -> None:
        self.owners.pop((kind, name), None)
        self.grants = {g for g in self.grants if (g[2], g[3]) != (kind, name)}
        self.store.forget_object(kind, name)

    def login_dropped(self, login: str) -> None:
        if any(g[0] == login for g in self.grants):
            self.grants = {g for g in self.grants if g[0] != login}
            self.store.forget_login(login)

    # ---- rules ----------------------------------------------------------------------------

    def _create_queue(self, session: Session, args: dict[str, Any]) -> list[Need]:
        return [("CREATE", "", ""), *self._activation(session, args.get("activation"))]

    def _alter_queue(self, session: Session, args: dict[str, Any]) -> list[Need]:
        name = _name(args)
        return [("ALTER", "queue", name), *self._activation(session, args.get("activation"))]

    def _activation(self, session: Session, activation: object) -> list[Need]:
        """Setting a procedure needs EXECUTE (on a T-SQL procedure, or of the broker for a
        Python one); running it as another login needs CONTROL."""
        if not isinstance(activation, dict) or not activation:
            return []
        needs: list[Need] = []
        procedure = activation.get("procedure")
        if isinstance(procedure, str) and procedure and not is_python(procedure):
            needs.append(("EXECUTE", "procedure", procedure))
        elif procedure:
            needs.append(("EXECUTE", "", ""))
        execute_as = activation.get("execute_as")
        if isinstance(execute_as, str) and execute_as and execute_as != session.user:
            needs.append(("CONTROL", "", ""))
        return needs

    def _alter_service(self, session: Session, args: dict[str, Any]) -> list[Need]:
        queue = args.get("queue")
        on_queue: list[Need] = [("ALTER", "queue", queue)] if isinstance(queue, str) else []
        return [("ALTER", "service", _name(args)), *on_queue]

    def _database(self, args: dict[str, Any]) -> str:
        """The canonical name of the database an operation names (as given if none)."""
        found = self.catalog.find_database(_name(args))
        return _name(args) if found is None else found.name

    def _create_service(self, session: Session, args: dict[str, Any]) -> list[Need]:
        queue = args.get("queue")
        on_queue: list[Need] = [("ALTER", "queue", queue)] if isinstance(queue, str) else []
        return [("CREATE", "", ""), *on_queue]

    def _drop(self, session: Session, args: dict[str, Any]) -> list[Need]:
        kind, name = args.get("kind"), args.get("name")
        if not isinstance(kind, str) or not isinstance(name, str):
            return []  # the statement itself says what is wrong
        if kind in _TRUST:
            return [("CONTROL", "", "")]
        return [("DROP", kind, name)]

    def _service_queue(self, service: object) -> str | None:
        found = self.catalog.services.get(service) if isinstance(service, str) else None
        return None if found is None else found.queue

    def _begin_dialog(self, session: Session, args: dict[str, Any]) -> list[Need]:
        needs: list[Need] = []
        queue = self._service_queue(args.get("from_service"))
        if queue is not None:
            needs.append(("RECEIVE", "queue", queue))
        target = args.get("to_service")
        if isinstance(target, str):
            local = self.local_target(target, args.get("broker_instance"), session.database)
            needs.append(("SEND", "service", target if local is None else local))
        related = args.get("related_conversation")
        if related is not None:
            needs += self._endpoints([related])
        return needs

    def _endpoints(self, handles: object) -> list[Need]:
        """RECEIVE on the queue of each conversation endpoint named."""
        if not isinstance(handles, list):
            return []
        needs: list[Need] = []
        for raw in handles[:10_000]:
            try:
                handle = raw if isinstance(raw, uuid.UUID) else uuid.UUID(str(raw))
            except ValueError:
                continue  # the statement reports the bad handle
            endpoint = self.endpoints.get(handle)
            if endpoint is None:
                continue  # and the unknown conversation
            queue = self._service_queue(endpoint.service)
            if queue is not None:
                needs.append(("RECEIVE", "queue", queue))
        return needs

    def _queue_receive(self, session: Session, args: dict[str, Any]) -> list[Need]:
        queue = args.get("queue")
        return [("RECEIVE", "queue", queue)] if isinstance(queue, str) else []

    def _view(self, session: Session, args: dict[str, Any]) -> list[Need]:
        name = args.get("name")
        if isinstance(name, str) and name.startswith("queue:"):
            return [("RECEIVE", "queue", name[len("queue:") :])]
        return [("VIEW", "", "")]

    def _detached(self, session: Session, args: dict[str, Any]) -> list[Need]:
        """A detached transaction is its login's: another needs CONTROL to touch it."""
        try:
            ident = uuid.UUID(str(args.get("transaction_id")))
        except ValueError:
            return []
        txn = self.transactions.detached.get(ident)
        if txn is None or txn.session.user == session.user:
            return []
        return [("CONTROL", "", "")]

    # ---- GRANT / REVOKE and the view --------------------------------------------------------

    def operations(self) -> dict[str, Callable[..., Any]]:
        return {"grant": self._grant, "revoke": self._revoke}

    def views(self) -> dict[str, Callable[[], list[dict[str, Any]]]]:
        return {"permissions": self.rows}

    def _parse(
        self,
        session: Session,
        operation: str,
        permission: object,
        kind: object,
        name: object,
        login: object,
    ) -> tuple[str, str, str, str]:
        """The (login, permission, kind, name) row of a GRANT or REVOKE (`operation`), once
        its arguments are checked and `session` may change it."""
        if not isinstance(permission, str) or permission.upper() not in GRANTABLE:
            raise bad_argument(
                f"permission must be one of {', '.join(GRANTABLE)}, not {permission!r}"
            )
        permission = permission.upper()
        kind = "" if kind is None else kind
        name = "" if name is None else name
        if not isinstance(kind, str) or not isinstance(name, str) or bool(kind) != bool(name):
            raise bad_argument("give both kind and name of an object, or neither (the broker)")
        if kind not in GRANTABLE[permission]:
            on = ", ".join(k or "the broker" for k in sorted(GRANTABLE[permission]))
            raise bad_argument(f"{permission} can be granted on {on}, not on {kind}")
        if not isinstance(login, str) or not login:
            raise bad_argument("grant and revoke need the login to change")
        if kind == "database":
            found = self.catalog.find_database(name)
            name = found.name if found is not None else name
        if login.lower() == PUBLIC:
            login = PUBLIC  # T-SQL's PUBLIC
        if kind == "table":
            name = qualify(session.database, name.lower())
            if name not in self.tables:
                raise BrokerError(ErrorCode.BAD_ARGUMENT, f"there is no table '{plain(name)}'")
        elif kind and self.catalog.table(kind).get(name) is None:
            raise BrokerError(
                ErrorCode.BAD_ARGUMENT, f"there is no {kind.replace('_', ' ')} '{name}'"
            )
        # CONTROL of the broker, or of the object (its owner), may grant on it
        if not self.has(session.user, "CONTROL", kind, name):
            self._refuse(session, operation, "CONTROL", kind, name)
        return login, permission, kind, name

    def _grant(
        self,
        session: Session,
        permission: object,
        login: object,
        kind: object = None,
        name: object = None,
    ) -> None:
        row = self._parse(session, "grant", permission, kind, name, login)
        if not self.is_principal(row[0]):
            raise BrokerError(
                ErrorCode.UNKNOWN_LOGIN, f"there is no login '{row[0]}' (nor is it PUBLIC)"
            )
        self.grants.add(row)
        self.store.put_grant(row)
        log.info("%r granted %s on %s to %r", session.user, row[1], row[2] or "the broker", row[0])
        if row[1] in ("SEND", "CONTROL") and row[2] in ("service", "", "database"):
            services = [row[3]] if row[2] == "service" else list(self.catalog.services)
            for service in services:  # what another broker sent may wait for this grant
                self.sendable(service)

    def _revoke(
        self,
        session: Session,
        permission: object,
        login: object,
        kind: object = None,
        name: object = None,
    ) -> None:
        row = self._parse(session, "revoke", permission, kind, name, login)
        self.grants.discard(row)
        self.store.delete_grant(row)
        log.info(
            "%r revoked %s on %s from %r", session.user, row[1], row[2] or "the broker", row[0]
        )

    def rows(self) -> list[dict[str, Any]]:
        rows = [
            {"login": login, "permission": p, **_object(k, n), "owner": False}
            for login, p, k, n in sorted(self.grants)
        ]
        rows += [
            {"login": login, "permission": "CONTROL", **_object(k, n), "owner": True}
            for (k, n), login in sorted(self.owners.items())
        ]
        return rows


def _object(kind: str, name: str) -> dict[str, str | None]:
    """A view's columns for an object: its kind, database (for a database's objects) and
    plain name; all None for the broker itself."""
    return {
        "kind": kind or None,
        "database": database_of(name) if _in_database(kind) else None,
        "name": plain(name) if name else None,
    }


def _in_database(kind: str) -> bool:
    """Whether objects of `kind` belong to a database (keys `names.qualify` made)."""
    return kind in IN_DATABASE or kind == "table"


def _name(args: dict[str, Any]) -> str:
    name = args.get("name")
    return name if isinstance(name, str) else ""
