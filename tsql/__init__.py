"""Service Broker's own language on ssb: T-SQL batches run through the client API.

    from ssb import client, tsql
    conn = await client.connect(url)
    session = tsql.Session(conn, tsql.TextOutput(sys.stdout, sys.stderr))
    for batch in tsql.split_batches(tsql.decode(open("lesson.sql", "rb").read())):
        await session.run_batch(batch)

`ssb sql FILE ...` does the same from the command line (see `tsql.run_files`).
"""

from __future__ import annotations

from ._cli import add_arguments, main
from ._errors import NotSupported, SqlError
from ._interfaces import (
    DEFAULT_DATABASE,
    DatabaseInfo,
    Databases,
    NoProcedures,
    ProcedureCatalog,
    SingleDatabase,
    StoredProcedure,
)
from ._interpreter import Session
from ._output import Collect, CsvOutput, JsonOutput, Output, ResultSet, TextOutput, format_table
from ._parser import parse_batch
from ._source import Batch, SourceError, decode, split_batches
from ._types import SqlType, Value
from ._xml import Xml

__all__ = [
    "DEFAULT_DATABASE",
    "Batch",
    "Collect",
    "CsvOutput",
    "DatabaseInfo",
    "Databases",
    "JsonOutput",
    "NoProcedures",
    "NotSupported",
    "Output",
    "ProcedureCatalog",
    "ResultSet",
    "Session",
    "SingleDatabase",
    "SourceError",
    "SqlError",
    "SqlType",
    "StoredProcedure",
    "TextOutput",
    "Value",
    "Xml",
    "add_arguments",
    "decode",
    "format_table",
    "main",
    "parse_batch",
    "split_batches",
]
