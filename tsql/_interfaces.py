"""What the interpreter asks of the broker beyond the client API: the databases it
names and the stored procedures it keeps.

Theory of operation. Until the broker has databases and a procedure catalog, `ssb sql`
runs with `SingleDatabase` (the broker is one database, `DEFAULT_DATABASE`) and
`NoProcedures` (none can be created: CREATE PROCEDURE and EXECUTE of a T-SQL procedure
are refused as not supported yet; listing finds none, which is the truth). The broker's
implementations will answer the same protocols; the interpreter's side (parsing,
parameters, OUTPUT, RETURN, nesting) is complete and tested against an in-process
catalog.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final, Protocol

from ._errors import NotSupported, SqlError

DEFAULT_DATABASE: Final = "ssb"


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

    async def list(self) -> list[DatabaseInfo]: ...


class NoProcedures:
    """The broker has no procedure catalog yet: creating or running one is refused."""

    async def get(self, name: str) -> StoredProcedure | None:
        return None

    async def create(self, procedure: StoredProcedure, *, replace: bool) -> None:
        raise NotSupported(
            "CREATE PROCEDURE",
            "stored procedures need the broker's procedure catalog, which comes in the next"
            " version; until then write the statements in the script itself",
            yet=True,
        )

    async def drop(self, name: str) -> bool:
        return False

    async def names(self) -> list[str]:
        return []


class SingleDatabase:
    """The broker as one database until it has several: only DEFAULT_DATABASE exists."""

    def __init__(self, broker_instance: uuid.UUID | None = None) -> None:
        self.broker_instance = broker_instance

    def current(self) -> str:
        return DEFAULT_DATABASE

    def _refuse(self, what: str) -> SqlError:
        return NotSupported(
            f"{what}",
            f"the broker has one database, '{DEFAULT_DATABASE}', until databases come in the"
            " next version; run the script's statements without USE and ALTER DATABASE",
            yet=True,
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

    async def list(self) -> list[DatabaseInfo]:
        return [DatabaseInfo(DEFAULT_DATABASE, 1, True, self.broker_instance, False)]
