"""Object names within databases: how the core keys an object of one database.

Theory of operation. A database is a namespace of message types, contracts, queues,
services, broker priorities, event notifications and procedures, as in Service Broker:
two databases may each hold a contract of the same name. The core keys every such
object by its *qualified name*: its plain name in the default database (`master`,
where everything made before databases existed lives, so their keys did not change),
and `database + SEPARATOR + name` in any other. The separator is a control character,
which no name may hold (`check_name`), so a key is never ambiguous and the store keeps
keys in the columns that always held names.

Names from a client are qualified with the session's database at the client port (see
the broker's `_namespaces`); names shown to a client (views, RECEIVE's columns, what
travels to other brokers) are plain again. System objects (the DEFAULT message type and
contract, Service Broker's system message types) exist in every database: their names
are never qualified.

Databases are named without case (SQL Server's default collation); a database's
canonical spelling is the one it was created with, and keys use it.

Logins are the broker's, not a database's: their names (`is_login_name`) are never
qualified.
"""

from __future__ import annotations

from typing import Final, TypeGuard

DEFAULT_DATABASE: Final = "master"
SEPARATOR: Final = "\x1f"
MAX_LOGIN_NAME: Final = 128


def is_login_name(name: object) -> TypeGuard[str]:
    """Whether `name` may name a login: 1..MAX_LOGIN_NAME letters, digits, '_', '-' or '.'."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_LOGIN_NAME
        and all(c.isalnum() or c in "_-." for c in name)
    )


def qualify(database: str, name: str) -> str:
    """The key of object `name` of `database` (its canonical spelling)."""
    if database == DEFAULT_DATABASE:
        return name
    return f"{database}{SEPARATOR}{name}"


def split(key: str) -> tuple[str, str]:
    """(database, plain name) of a key."""
    database, separator, name = key.partition(SEPARATOR)
    if not separator:
        return DEFAULT_DATABASE, key
    return database, name


def database_of(key: str) -> str:
    """The database an object's key belongs to."""
    database, separator, _ = key.partition(SEPARATOR)
    return database if separator else DEFAULT_DATABASE


def plain(key: str) -> str:
    """An object's name as a client sees it (its key without the database)."""
    return key.rpartition(SEPARATOR)[2]


def shown(key: str, database: str) -> str:
    """A key as a session in `database` sees it: plain for an object of its own database,
    `database.name` for another's."""
    owner, name = split(key)
    return name if owner == database else f"{owner}.{name}"


def display(key: str) -> str:
    """A key in words for the log: its name, `database.name` outside `master`."""
    database, name = split(key)
    return name if database == DEFAULT_DATABASE else f"{database}.{name}"
