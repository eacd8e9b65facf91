"""Running T-SQL in tests: a session over a broker connection (or none), its output
collected in order; and an in-process procedure catalog, standing in for the broker's
until the broker keeps procedures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ssb.tsql import (
    Collect,
    ResultSet,
    Session,
    SqlError,
    StoredProcedure,
    split_batches,
)

# Microsoft's published Service Broker tutorials, byte for byte (see SOURCES.md there)
SCRIPTS = Path(__file__).resolve().parent.parent / "third_party" / "sb-scripts"


class MemoryProcedures:
    """A procedure catalog in a dict, as the broker's will answer."""

    def __init__(self) -> None:
        self.procedures: dict[str, StoredProcedure] = {}

    async def get(self, name: str) -> StoredProcedure | None:
        return self.procedures.get(name.rsplit(".", 1)[-1].lower())

    async def create(self, procedure: StoredProcedure, *, replace: bool) -> None:
        key = procedure.name.rsplit(".", 1)[-1].lower()
        if key in self.procedures and not replace:
            raise SqlError(
                2714, f"There is already an object named '{procedure.name}' in the database."
            )
        self.procedures[key] = procedure

    async def drop(self, name: str) -> bool:
        return self.procedures.pop(name.rsplit(".", 1)[-1].lower(), None) is not None

    async def names(self) -> list[str]:
        return [p.name for p in self.procedures.values()]


async def run(session: Session, text: str) -> bool:
    """Run a script's batches on `session`; whether all succeeded."""
    ok = True
    for batch in split_batches(text):
        ok = await session.run_batch(batch) and ok
    return ok


async def each_fails(session: Session, *texts: str) -> None:
    """Run each script of `texts` on `session`, one after the other: every one must fail
    (else AssertionError, naming the script). The caller reads the errors in the output."""
    for text in texts:
        assert not await run(session, text), text


async def failed(*texts: str, **options: Any) -> tuple[Session, Collect]:
    """A new session (`new_session(**options)`) that has run the scripts `texts`, one after
    the other, every one failing (else AssertionError, naming the script)."""
    session, output = new_session(**options)
    await each_fails(session, *texts)
    return session, output


async def failures(*texts: str, **options: Any) -> list[tuple[int, str]]:
    """The errors (number, text) of the scripts `texts`, each failing (see `failed`)."""
    _, output = await failed(*texts, **options)
    return [(e.number, e.text) for e in output.errors]


def new_session(conn: Any = None, **options: Any) -> tuple[Session, Collect]:
    output = Collect()
    return Session(conn, output, **options), output


async def ran(text: str, conn: Any = None, **options: Any) -> tuple[Session, Collect]:
    """A new session (`new_session(conn, **options)`) that has run the script `text`, every
    batch of it succeeding (else AssertionError, with the errors)."""
    session, output = new_session(conn, **options)
    assert await run(session, text), output.errors
    return session, output


def table(result: ResultSet) -> list[list[object]]:
    """A result set's rows as plain data."""
    return [[v.data for v in row] for row in result.rows]
