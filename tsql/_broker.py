"""The broker's databases and procedure catalog, as the interpreter asks for them.

`BrokerDatabases` and `BrokerProcedures` answer the interfaces of `_interfaces` over a
client connection: USE, CREATE / DROP / ALTER DATABASE and sys.databases are the
broker's database operations; CREATE / ALTER / DROP PROCEDURE keep a procedure's text
in its database's catalog, and EXECUTE reads it back (which needs EXECUTE on it). What
the broker refuses comes back in SQL Server's numbers and words where SQL Server has
them (911, 1801, 3701, 3702, 2714).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable

from ssb import client

from ._errors import NotSupported, SqlError, found, from_broker
from ._interfaces import DatabaseInfo, StoredProcedure
from ._parser import BROKER_OPTIONS


def object_name(name: str, database: str) -> str:
    """A schema-scoped object's own name (a queue's, a procedure's) from
    `[database.][schema.]name`: ssb has no schemas, every object is dbo's; an object of
    another database than the session's (`database`) is refused."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[-3] and parts[-3].casefold() != database.casefold():
        raise NotSupported(
            f"{name}, an object of another database",
            "USE that database first, or name an object of this one",
        )
    return parts[-1]


async def _create(creating: Awaitable[None], exists: SqlError) -> None:
    """Await a CREATE on the broker: `exists` where the name is taken, any other refusal
    in SQL Server's terms."""
    try:
        await creating
    except client.AlreadyExistsError:
        raise exists from None
    except client.BrokerError as exc:
        raise from_broker(exc) from None


class BrokerProcedures:
    """T-SQL procedures kept in the broker's catalog, in the session's database."""

    def __init__(self, conn: client.Connection) -> None:
        self.conn = conn

    async def get(self, name: str) -> StoredProcedure | None:
        try:
            found = await self.conn.procedure(object_name(name, self.conn.database))
        except client.NotFoundError:
            return None
        except client.BrokerError as exc:
            raise from_broker(exc) from None
        return StoredProcedure(found["name"], found["text"])

    async def create(self, procedure: StoredProcedure, *, replace: bool) -> None:
        name = object_name(procedure.name, self.conn.database)
        await _create(
            self.conn.create_procedure(name, procedure.text, replace),
            SqlError(2714, f"There is already an object named '{name}' in the database."),
        )

    async def drop(self, name: str) -> bool:
        try:
            await self.conn.drop_procedure(object_name(name, self.conn.database))
        except client.NotFoundError:
            return False
        except client.BrokerError as exc:
            raise from_broker(exc) from None
        return True

    async def names(self) -> list[str]:
        rows = await self.conn.view("procedures")
        database = self.conn.database
        return [str(r["name"]) for r in rows if r["database"] == database]


class BrokerDatabases:
    """The broker's databases, and the session's current one (its connection's)."""

    def __init__(self, conn: client.Connection) -> None:
        self.conn = conn
        self._known: list[DatabaseInfo] = []

    def current(self) -> str:
        return self.conn.database

    async def use(self, name: str) -> None:
        await found(self.conn.use(name), _no_database(name))

    async def create(self, name: str) -> None:
        await _create(
            self.conn.create_database(name),
            SqlError(1801, f"Database '{name}' already exists. Choose a different database name."),
        )

    async def drop(self, name: str) -> None:
        try:
            await self.conn.drop_database(name)
        except client.NotFoundError:
            raise SqlError(
                3701,
                f"Cannot drop the database '{name}', because it does not exist or you do not"
                " have permission.",
            ) from None
        except client.InUseError as exc:
            raise SqlError(
                3702, f'Cannot drop database "{name}" because it is currently in use. {exc.message}'
            ) from None
        except client.BrokerError as exc:
            raise from_broker(exc) from None

    async def alter(self, name: str, options: dict[str, str]) -> None:
        broker: str | None = None
        trustworthy: bool | None = None
        for option, value in options.items():
            if option in BROKER_OPTIONS:
                if option in ("DISABLE_BROKER", "ERROR_BROKER_CONVERSATIONS"):
                    raise NotSupported(
                        f"ALTER DATABASE ... SET {option}",
                        "a database's broker is always enabled in ssb: turn its queues OFF"
                        " (ALTER QUEUE ... WITH STATUS = OFF) to hold their messages, or END"
                        " CONVERSATION ... WITH ERROR",
                    )
                broker = option
            elif option == "TRUSTWORTHY" and value in ("ON", "OFF"):
                trustworthy = value == "ON"
            else:
                raise NotSupported(
                    f"ALTER DATABASE ... SET {option}",
                    "ssb's databases take SET ENABLE_BROKER, NEW_BROKER and TRUSTWORTHY ON | OFF",
                )
        await found(
            self.conn.alter_database(name, broker=broker, trustworthy=trustworthy),
            _no_database(name),
        )

    def known(self) -> list[DatabaseInfo]:
        return self._known

    async def list(self) -> list[DatabaseInfo]:
        rows = await self.conn.view("databases")
        self._known = [
            DatabaseInfo(
                str(r["name"]),
                int(r["database_id"]),
                bool(r["is_broker_enabled"]),
                uuid.UUID(str(r["service_broker_guid"])),
                bool(r["is_trustworthy_on"]),
            )
            for r in rows
        ]
        return self._known


def _no_database(name: str) -> SqlError:
    return SqlError(
        911, f"Database '{name}' does not exist. Make sure that the name is entered correctly."
    )
