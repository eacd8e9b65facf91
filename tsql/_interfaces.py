"""What the interpreter asks of the broker beyond the statements it sends: the databases
it names and the stored procedures it keeps.

Theory of operation. A session on a broker connection uses the broker's own
(`_broker.BrokerDatabases`, `_broker.BrokerProcedures`); a session without a broker
(`--parse-only`) has `SingleDatabase` (one database, `DEFAULT_DATABASE`) and
`NoProcedures` (none can be created). Tests may stand an in-process catalog in.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final, Protocol

from ._errors import NotSupported, SqlError

DEFAULT_DATABASE: Final = "master"  # the broker's default database


@dataclass(frozen=True, slots=True)
class StoredProcedure:
    """A procedure as the catalog keeps it: its name and the text of its CREATE."""

    name: str
    text: str
    owner: str = ""


@dataclass(frozen=True, slots=True)
class DatabaseInfo:
    """A row of sys.databases."""

    name: str
    database_id: int
    is_broker_enabled: bool
    service_broker_guid: uuid.UUID | None
    is_trustworthy_on: bool = False


class ProcedureCatalog(Protocol):
    """Where T-SQL stored procedures live (the broker's catalog, in its database)."""

    async def get(self, name: str) -> StoredProcedure | None:
        """The procedure named `name` (without case), or None."""
        ...

    async def create(self, procedure: StoredProcedure, *, replace: bool) -> None:
        """Store a procedure; `replace` for ALTER / CREATE OR ALTER.

        Raises:
            SqlError: 2714 when it exists and not `replace`; 208 when ALTER finds none.
        """
        ...

    async def drop(self, name: str) -> bool:
        """Remove a procedure; False when there was none."""
        ...

    async def names(self) -> list[str]:
        """Every procedure's name (sys.objects, sys.procedures)."""
        ...


class Databases(Protocol):
    """The databases of the broker, and which one the session uses."""

    def current(self) -> str: ...

    async def use(self, name: str) -> None: ...

    async def create(self, name: str) -> None: ...

    async def drop(self, name: str) -> None: ...

    async def alter(self, name: str, options: dict[str, str]) -> None: ...

    def known(self) -> list[DatabaseInfo]:
        """The databases as `list` last found them (DB_ID and DB_NAME in a query)."""
        ...

    async def list(self) -> list[DatabaseInfo]: ...


class NoProcedures:
    """No broker, no procedure catalog: creating or running one is refused."""

    async def get(self, name: str) -> StoredProcedure | None:
        return None

    async def create(self, procedure: StoredProcedure, *, replace: bool) -> None:
        raise NotSupported(
            "CREATE PROCEDURE without a broker",
            "stored procedures live in the broker's catalog: run the script with ssb sql --url",
        )

    async def drop(self, name: str) -> bool:
        return False

    async def names(self) -> list[str]:
        return []


class SingleDatabase:
    """No broker: one database, DEFAULT_DATABASE, and nothing to change about it."""

    def __init__(self, broker_instance: uuid.UUID | None = None) -> None:
        self.broker_instance = broker_instance

    def current(self) -> str:
        return DEFAULT_DATABASE

    def _refuse(self, what: str) -> SqlError:
        return NotSupported(
            f"{what} without a broker", "databases are the broker's: run ssb sql --url"
        )

    async def use(self, name: str) -> None:
        if name.lower() != DEFAULT_DATABASE:
            raise self._refuse(f"USE {name}")

    async def create(self, name: str) -> None:
        raise self._refuse(f"CREATE DATABASE {name}")

    async def drop(self, name: str) -> None:
        raise self._refuse(f"DROP DATABASE {name}")

    async def alter(self, name: str, options: dict[str, str]) -> None:
        raise self._refuse(f"ALTER DATABASE {name}")

    def known(self) -> list[DatabaseInfo]:
        return [DatabaseInfo(DEFAULT_DATABASE, 1, True, self.broker_instance, False)]

    async def list(self) -> list[DatabaseInfo]:
        return self.known()
