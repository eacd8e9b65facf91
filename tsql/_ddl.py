"""Service Broker's DDL, logins and permissions, each mapped to its client call.

What Service Broker has and ssb does not is refused with what to do instead (see
docs/tsql.md for the whole table): ALTER of what the broker cannot alter, a remote
service binding to a database user.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ssb import client

from . import _ast as ast
from . import _types as t
from ._broker import object_name
from ._errors import NotSupported, SqlError, found

if TYPE_CHECKING:
    from ._context import Context as Session
    from ._frame import Frame


async def _text(session: Session, value: object, frame: Frame) -> str | None:
    if isinstance(value, ast.Expr):
        return await session.text_value(value, frame)
    return None if value is None else str(value)


def _own(session: Session, name: str) -> str:
    """The name of an object of the session's database (see `object_name`)."""
    return object_name(name, session.connection().database)


async def ddl(session: Session, statement: ast.Ddl, frame: Frame) -> None:
    handler = _HANDLERS.get((statement.action, statement.kind))
    if handler is None:
        raise NotSupported(
            f"{statement.action} {statement.kind.replace('_', ' ').upper()}",
            _NOT_YET.get(statement.kind, "drop it and create it anew"),
            yet=True,
        )
    if "authorization" in statement.options and statement.kind not in _AUTHORIZATION_MAPS:
        owner = statement.options["authorization"]
        if session.login is not None and owner.lower() not in (session.login.lower(), "dbo"):
            raise NotSupported(
                f"AUTHORIZATION {owner}",
                "in ssb the login that creates an object owns it: connect as that login",
            )
    await handler(session, statement, frame)
    session.rowcount = 0


# where AUTHORIZATION names a principal the object maps to rather than its owner: a
# certificate's login is whom another broker presenting it acts as
_AUTHORIZATION_MAPS: Final = ("permission", "certificate")

_NOT_YET: Final = {
    "remote_service_binding": "drop the binding and create it anew",
    "contract": "Service Broker has no ALTER CONTRACT either; drop it and create it anew",
}


async def _create_message_type(session: Session, s: ast.Ddl, frame: Frame) -> None:
    conn = session.connection()
    await session.broker(conn.create_message_type(s.name, s.options.get("validation", "NONE")))


async def _alter_message_type(session: Session, s: ast.Ddl, frame: Frame) -> None:
    if "validation" not in s.options:
        raise SqlError(102, "Incorrect syntax: ALTER MESSAGE TYPE needs VALIDATION = ...", level=15)
    conn = session.connection()
    await session.broker(conn.alter_message_type(s.name, s.options["validation"]))


async def _alter_service(session: Session, s: ast.Ddl, frame: Frame) -> None:
    options = s.options
    queue = options.get("queue")
    await session.broker(
        session.connection().alter_service(
            s.name,
            options.get("add_contracts", []),
            options.get("drop_contracts", []),
            queue=None if queue is None else _own(session, str(queue)),
        )
    )


async def _create_contract(session: Session, s: ast.Ddl, frame: Frame) -> None:
    await session.broker(session.connection().create_contract(s.name, s.options["messages"]))


def _activation(session: Session, given: dict[str, Any]) -> dict[str, Any]:
    activation: dict[str, Any] = {}
    if given.get("drop"):  # the queue forgets its activation: off, no procedure
        return {"status": False, "procedure": "", "max_queue_readers": 1, "execute_as": None}
    if "status" in given:
        activation["status"] = given["status"]
    if "procedure" in given:
        procedure = str(given["procedure"])
        if given.get("tsql_procedure"):  # a stored procedure of the queue's database
            procedure = _own(session, procedure)
        activation["procedure"] = procedure
    if "max_queue_readers" in given:
        activation["max_queue_readers"] = given["max_queue_readers"]
    if "execute_as" in given:
        who = given["execute_as"]
        if who == "SELF":
            if session.login is not None:
                activation["execute_as"] = session.login
        else:  # OWNER: None, the queue's owner
            activation["execute_as"] = None if who == "OWNER" else who
    return activation


def _queue_options(session: Session, options: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {
        key: options[key]
        for key in ("status", "retention", "poison_message_handling")
        if key in options
    }
    if "activation" in options:
        found["activation"] = _activation(session, options["activation"])
    return found


async def _create_queue(session: Session, s: ast.Ddl, frame: Frame) -> None:
    arguments = _queue_options(session, s.options)
    await session.broker(session.connection().create_queue(_own(session, s.name), **arguments))


async def _alter_queue(session: Session, s: ast.Ddl, frame: Frame) -> None:
    changes = _queue_options(session, s.options)
    if not changes:
        raise SqlError(102, "Incorrect syntax near 'WITH': ALTER QUEUE needs an option.", level=15)
    await session.broker(session.connection().alter_queue(_own(session, s.name), **changes))


async def _create_service(session: Session, s: ast.Ddl, frame: Frame) -> None:
    await session.broker(
        session.connection().create_service(
            s.name,
            _own(session, s.options["queue"]),
            s.options.get("contracts", []),
        )
    )


def _address(text: str) -> str:
    upper = text.strip().upper()
    if upper in ("LOCAL", "TRANSPORT"):
        return upper
    if upper.startswith("TCP://"):
        return "tcp://" + text.strip()[6:]
    raise NotSupported(
        f"ADDRESS = '{text}'", "ssb routes to 'TCP://host:port', 'LOCAL' or 'TRANSPORT'"
    )


async def _route_parts(session: Session, s: ast.Ddl, frame: Frame) -> dict[str, Any]:
    """The parts of a route a CREATE / ALTER ROUTE gives, as the broker takes them."""
    options = s.options
    parts: dict[str, Any] = {}
    for option in ("service_name", "broker_instance", "address", "mirror_address"):
        if option in options:
            parts[option] = await _text(session, options[option], frame)
    for option in ("address", "mirror_address"):
        if parts.get(option) is not None:
            parts[option] = _address(parts[option])
    if "lifetime" in options:
        seconds = await session.value(options["lifetime"], frame)
        parts["lifetime"] = None if seconds.data is None else float(t.as_int(seconds))
    return parts


async def _alter_route(session: Session, s: ast.Ddl, frame: Frame) -> None:
    parts = await _route_parts(session, s, frame)
    await session.broker(session.connection().alter_route(s.name, **parts))


async def _create_route(session: Session, s: ast.Ddl, frame: Frame) -> None:
    parts = await _route_parts(session, s, frame)
    if parts.get("address") is None:
        raise SqlError(102, "Incorrect syntax: CREATE ROUTE needs ADDRESS.", level=15)
    if parts.get("service_name") is None:
        raise NotSupported(
            "CREATE ROUTE without SERVICE_NAME",
            "ssb's routes name the service they lead to: add SERVICE_NAME = '...'",
        )
    name, service, address = s.name, parts.pop("service_name"), parts.pop("address")
    await session.broker(session.connection().create_route(name, service, address, **parts))


async def _priority_options(session: Session, s: ast.Ddl, frame: Frame) -> dict[str, Any]:
    names = {
        "contract_name": "contract",
        "local_service_name": "local_service",
        "remote_service_name": "remote_service",
        "priority_level": "level",
    }
    found: dict[str, Any] = {}
    for option, value in s.options.items():
        if option not in names:
            continue
        if isinstance(value, ast.Expr):
            evaluated = (await session.value(value, frame)).data
            value = (
                evaluated
                if option == "priority_level"
                else (None if evaluated is None else str(evaluated))
            )
        found[names[option]] = value
    return found


async def _priority(session: Session, s: ast.Ddl, frame: Frame) -> None:
    """CREATE or ALTER BROKER PRIORITY."""
    options = await _priority_options(session, s, frame)
    conn = session.connection()
    call = conn.create_broker_priority if s.action == "CREATE" else conn.alter_broker_priority
    await session.broker(call(s.name, **options))


async def _create_notification(session: Session, s: ast.Ddl, frame: Frame) -> None:
    options = s.options
    service = await _text(session, options["service"], frame)
    instance = await _text(session, options["broker_instance"], frame)
    if service is None:
        raise SqlError(102, "Incorrect syntax: TO SERVICE needs a service name.", level=15)
    if instance is not None and instance.strip().upper() == "CURRENT DATABASE":
        instance = None
    await session.broker(
        session.connection().create_event_notification(
            s.name,
            options["event"],
            _own(session, options["queue"]),
            service,
            instance,
        )
    )


async def _create_certificate(session: Session, s: ast.Ddl, frame: Frame) -> None:
    path = await _text(session, s.options.get("file"), frame)
    if path is None:
        raise SqlError(
            102, "Incorrect syntax: CREATE CERTIFICATE ... FROM FILE = 'peer.pem'.", level=15
        )
    try:
        pem = Path(path).read_text()
    except OSError as exc:
        raise SqlError(
            15208, f"The certificate file '{path}' cannot be read: {exc.strerror or exc}."
        ) from None
    login = s.options.get("authorization")  # whom that broker's messages act as
    if isinstance(login, str) and login.lower() == "dbo":
        login = session.login  # the database's owner: here, the login that creates it
    await session.broker(session.connection().create_certificate(s.name, pem, login=login))


async def _create_binding(session: Session, s: ast.Ddl, frame: Frame) -> None:
    raise NotSupported(
        "CREATE REMOTE SERVICE BINDING ... WITH USER",
        "ssb binds a service to its broker's certificate, not to a database user: call"
        " create_remote_service_binding(name, service, pem) with the far broker's"
        " certificate from the client",
    )


async def _login(session: Session, s: ast.Ddl, frame: Frame) -> None:
    conn = session.connection()
    if s.options.get("extra"):
        raise NotSupported(
            "LOGIN options other than PASSWORD", "ssb's logins have a name and a password"
        )
    if s.action == "DROP":
        await session.broker(conn.drop_login(s.name))
        return
    password = await _text(session, s.options.get("password"), frame)
    if s.action == "CREATE":
        await session.broker(conn.create_login(s.name, password))
    else:
        if password is None:
            raise SqlError(15118, "Password validation failed: the password is NULL.")
        await session.broker(conn.alter_login(s.name, password))


_CLASSES: Final = {
    "SERVICE": "service",
    "QUEUE": "queue",
    "CONTRACT": "contract",
    "ROUTE": "route",
    "OBJECT": None,
    "MESSAGE TYPE": "message_type",
    "BROKER PRIORITY": "broker_priority",
    "EVENT NOTIFICATION": "event_notification",
    "CERTIFICATE": "certificate",
    "REMOTE SERVICE BINDING": "remote_service_binding",
    "DATABASE": "database",
}
_PERMISSIONS: Final = frozenset(
    ("CONTROL", "CREATE", "ALTER", "DROP", "SEND", "RECEIVE", "VIEW", "EXECUTE")
)


async def _permission(session: Session, s: ast.Ddl, frame: Frame) -> None:
    options = s.options
    permissions: list[str] = options["permissions"]
    kind: str | None = None
    name: str | None = None
    if "kind" in options:
        cls = str(options["kind"]).upper()
        name = _own(session, str(options["object"]))
        if cls not in _CLASSES:
            raise NotSupported(
                f"{s.action} ... ON {cls}::",
                "ssb grants on the broker, a service, a queue, a contract or a route",
            )
        kind = _CLASSES[cls]
        if kind is None:
            kind = (
                "queue"
                if permissions == ["RECEIVE"]
                else "procedure"
                if permissions == ["EXECUTE"]
                else None
            )
            if kind is None:
                raise NotSupported(
                    f"{s.action} {', '.join(permissions)} ON {name}",
                    "name the object's class: ON SERVICE::name, ON QUEUE::name (RECEIVE on a"
                    " queue needs no class)",
                )
    for permission in permissions:
        if permission not in _PERMISSIONS:
            raise NotSupported(
                f"{s.action} {permission}",
                "ssb's permissions are CONTROL, CREATE (of every kind at once), ALTER, DROP,"
                " SEND, RECEIVE, VIEW and EXECUTE",
            )
        if permission == "EXECUTE" and kind is None and name is not None:
            kind = "procedure"  # EXECUTE ON [OBJECT::]procedure
        call = session.connection().grant if s.action == "GRANT" else session.connection().revoke
        await session.broker(call(permission, options["login"], kind, name))


# what DROP drops, each kind by its client call (and only these kinds)
_DROPS: Final[dict[str, Callable[[client.Connection, str], Awaitable[None]]]] = {
    "message_type": lambda conn, name: conn.drop_message_type(name),
    "contract": lambda conn, name: conn.drop_contract(name),
    "queue": lambda conn, name: conn.drop_queue(name),
    "service": lambda conn, name: conn.drop_service(name),
    "route": lambda conn, name: conn.drop_route(name),
    "broker_priority": lambda conn, name: conn.drop_broker_priority(name),
    "event_notification": lambda conn, name: conn.drop_event_notification(name),
    "remote_service_binding": lambda conn, name: conn.drop_remote_service_binding(name),
    "certificate": lambda conn, name: conn.drop_certificate(name),
}


def _drop(kind: str) -> Callable[[Session, ast.Ddl, Frame], Coroutine[Any, Any, None]]:
    call, what = _DROPS[kind], kind.replace("_", " ")

    async def drop(session: Session, s: ast.Ddl, frame: Frame) -> None:
        name = _own(session, s.name) if kind == "queue" else s.name
        missing = SqlError(
            3701 if kind == "queue" else 15151,
            f"Cannot drop the {what} '{name}', because it does not exist or you do not"
            " have permission.",
        )
        await found(call(session.connection(), name), missing)

    return drop


Handler = Callable[[Any, Any, Any], Coroutine[Any, Any, None]]
_HANDLERS: Final[dict[tuple[str, str], Handler]] = {
    ("CREATE", "message_type"): _create_message_type,
    ("ALTER", "message_type"): _alter_message_type,
    ("CREATE", "contract"): _create_contract,
    ("ALTER", "service"): _alter_service,
    ("CREATE", "queue"): _create_queue,
    ("ALTER", "queue"): _alter_queue,
    ("CREATE", "service"): _create_service,
    ("CREATE", "route"): _create_route,
    ("ALTER", "route"): _alter_route,
    ("CREATE", "broker_priority"): _priority,
    ("ALTER", "broker_priority"): _priority,
    ("CREATE", "event_notification"): _create_notification,
    ("CREATE", "certificate"): _create_certificate,
    ("CREATE", "remote_service_binding"): _create_binding,
    ("CREATE", "login"): _login,
    ("ALTER", "login"): _login,
    ("DROP", "login"): _login,
    ("GRANT", "permission"): _permission,
    ("REVOKE", "permission"): _permission,
    **{("DROP", kind): _drop(kind) for kind in _DROPS},
}
DDL_STATEMENTS: Final[dict[type, Handler]] = {ast.Ddl: ddl}
