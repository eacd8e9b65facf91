"""`ssb sql`: T-SQL files run in order in one session, as `sqlcmd -i a.sql -i b.sql`.

Batches are cut at GO lines; each batch is parsed whole and run; an error ends its batch
(printed as sqlcmd prints it, with the line in its file) and the run goes on with the
next batch, unless `-b` (stop at the first error). The exit code is 1 when any batch
failed, 0 otherwise. `--parse-only` (and SET PARSEONLY ON) checks syntax without
running anything, and needs no broker.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO

from ssb import client

from ._errors import SqlError
from ._interpreter import Session
from ._output import CsvOutput, JsonOutput, Output, TextOutput
from ._source import Batch, SourceError, decode, split_batches

FORMATS = {"table": TextOutput, "csv": CsvOutput, "json": JsonOutput}


def read_script(path: str) -> list[Batch]:
    """A file's batches (`-` is standard input).

    Raises:
        SourceError: the file cannot be read, or is not UTF-8 / UTF-16 with a BOM.
    """
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None
    return split_batches(decode(data, path), path)


def output_for(fmt: str, out: IO[str] | None = None, err: IO[str] | None = None) -> Output:
    return FORMATS[fmt](out or sys.stdout, err or sys.stderr)


async def run_batches(session: Session, batches: list[Batch], *, bail: bool) -> bool:
    """Run batches in order; False when any failed (with `bail`, stop at the first)."""
    ok = True
    for batch in batches:
        if not await session.run_batch(batch):
            ok = False
            if bail:
                return False
    return ok


async def run_files(
    paths: list[str],
    url: str | None,
    *,
    database: str | None = None,
    fmt: str = "table",
    bail: bool = False,
    parse_only: bool = False,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    """Run (or only parse) the files in one session; the exit code."""
    output = output_for(fmt, out, err)
    try:
        scripts = [read_script(path) for path in paths]
    except SourceError as exc:
        (err or sys.stderr).write(f"ssb sql: {exc}\n")
        return 2
    if parse_only:
        session = Session(None, output)
        session.parse_only = True
        ok = True
        for batches in scripts:
            for batch in batches:
                ok = await session.run_batch(batch) and ok
                if not ok and bail:
                    return 1
        return 0 if ok else 1
    assert url is not None
    conn = await client.connect(url)
    try:
        session = Session(conn, output, login=client_login(url))
        use = Batch(f"USE [{(database or '').replace(']', ']]')}]", 0)
        if database is not None and not await session.run_batch(use):
            return 1
        ok = True
        for batches in scripts:
            if not await run_batches(session, batches, bail=bail):
                ok = False
                if bail:
                    break
        return 0 if ok else 1
    finally:
        await conn.close()


def client_login(url: str) -> str | None:
    from urllib.parse import unquote, urlsplit

    user = urlsplit(url).username
    return None if user is None else unquote(user)


__all__ = ["SqlError", "read_script", "run_batches", "run_files"]
