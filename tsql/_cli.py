"""`ssb sql [--url URL] [-d DATABASE] [-b] [--format table|csv|json] [--parse-only] [FILE ...]`.

The broker's command line declares the options (broker/cli.py) and hands them here.
With files: run them in order in one session (as `sqlcmd -i a.sql -i b.sql`); without:
the interactive shell.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from ssb import client

from ._interpreter import Session
from ._output import TextOutput
from ._runner import client_login, run_files
from ._shell import shell
from ._source import Batch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `ssb sql` (besides --url, which the broker's command line adds)."""
    parser.add_argument("files", nargs="*", metavar="FILE", help="T-SQL files, run in order")
    parser.add_argument(
        "-d",
        "--database",
        help="the database to USE first (default: master)",
    )
    parser.add_argument(
        "-b",
        dest="bail",
        action="store_true",
        help="stop at the first batch that fails (sqlcmd -b)",
    )
    parser.add_argument(
        "--format", choices=("table", "csv", "json"), default="table", help="how result sets print"
    )
    parser.add_argument(
        "--parse-only",
        action="store_true",
        help="check the syntax only; run nothing (no broker needed)",
    )


def main(args: argparse.Namespace, url: str) -> int:
    """Run `ssb sql` with parsed options; the exit code."""
    try:
        if args.files:
            return asyncio.run(
                run_files(
                    args.files,
                    url,
                    database=args.database,
                    fmt=args.format,
                    bail=args.bail,
                    parse_only=args.parse_only,
                )
            )
        return asyncio.run(_interactive(url, args.database, args.parse_only))
    except KeyboardInterrupt:
        return 130


async def _interactive(url: str, database: str | None, parse_only: bool) -> int:
    output = TextOutput(sys.stdout, sys.stderr)
    if parse_only:
        session = Session(None, output)
        session.parse_only = True
        return await shell(session)
    conn = await client.connect(url)
    try:
        session = Session(conn, output, login=client_login(url))
        if database is not None and not await session.run_batch(
            Batch(f"USE [{database.replace(']', ']]')}]", 0)
        ):
            return 1
        return await shell(session)
    finally:
        await conn.close()
