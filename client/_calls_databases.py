"""The broker operations of databases and stored procedures, as request builders.

A database is a namespace of message types, contracts, queues, services, broker
priorities, event notifications and procedures; a session names objects in its current
database (`use`, or `connect(database=...)`). A stored procedure is T-SQL kept in its
database's catalog (its CREATE text); `ssb.tsql` runs it.
"""

from __future__ import annotations

from typing import Any

from ._calls import NO_RESULT, Call


def use(database: str) -> Call[str]:
    """USE: the session's current database from now on (kept across reconnects).

    Returns:
        The database's name as it was created.
    """
    return Call("use", {"database": database}, str)


def create_database(name: str) -> Call[None]:
    """CREATE DATABASE (a regular identifier; the creator owns it)."""
    return Call("create_database", {"name": name}, NO_RESULT)


def drop_database(name: str) -> Call[None]:
    """DROP DATABASE: its conversations end (an error to far sides that still listen) and
    everything in it goes; refused while a session uses it."""
    return Call("drop_database", {"name": name}, NO_RESULT)


def alter_database(
    name: str, *, broker: str | None = None, trustworthy: bool | None = None
) -> Call[None]:
    """ALTER DATABASE ... SET: `broker` "ENABLE_BROKER" or "NEW_BROKER" (a new
    service_broker_guid; its conversations are removed, telling nobody), `trustworthy`."""
    arguments: dict[str, Any] = {"name": name}
    if broker is not None:
        arguments["broker"] = broker
    if trustworthy is not None:
        arguments["trustworthy"] = trustworthy
    return Call("alter_database", arguments, NO_RESULT)


def create_procedure(name: str, text: str, replace: bool = False) -> Call[None]:
    """CREATE PROCEDURE in the current database: `text` is the whole CREATE PROCEDURE
    statement; `replace` for CREATE OR ALTER. Procedures are named without case."""
    return Call("create_procedure", {"name": name, "text": text, "replace": replace}, NO_RESULT)


def alter_procedure(name: str, text: str) -> Call[None]:
    """ALTER PROCEDURE: a new text for an existing procedure."""
    return Call("alter_procedure", {"name": name, "text": text}, NO_RESULT)


def procedure(name: str) -> Call[dict[str, str]]:
    """A procedure's {"name", "text"} (needs EXECUTE on it)."""
    return Call("procedure", {"name": name}, lambda value: {k: str(v) for k, v in value.items()})


def drop_procedure(name: str) -> Call[None]:
    """DROP PROCEDURE."""
    return Call("drop", {"kind": "procedure", "name": name}, NO_RESULT)
