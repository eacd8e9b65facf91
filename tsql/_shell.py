"""The interactive shell of `ssb sql`: lines gather into a batch that runs at GO.

As sqlcmd's: the prompt numbers the batch's lines (`1>`, `2>` ...), `GO [n]` runs the
batch, `RESET` drops it, `EXIT` or `QUIT` (or end of input) leaves. prompt_toolkit
gives line editing, a history kept in ~/.ssb_sql_history, and completion of T-SQL
keywords and of the broker's object names (queues, services, contracts, message
types, catalog views), read again after every batch that ran.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import WordCompleter
from prompt_toolkit.history import FileHistory, History, InMemoryHistory

from ._catalog import SYS_VIEWS
from ._cursor import RESERVED
from ._interpreter import Session
from ._source import MAX_GO_COUNT, Batch

_GO: Final = re.compile(r"^\s*go(?:\s+(\d+))?\s*$", re.IGNORECASE)
_COMMANDS: Final = frozenset(("EXIT", "QUIT", ":EXIT", ":QUIT"))
_WORDS: Final = sorted(
    RESERVED
    | {
        "RECEIVE",
        "SEND",
        "CONVERSATION",
        "DIALOG",
        "MESSAGE",
        "TYPE",
        "CONTRACT",
        "QUEUE",
        "SERVICE",
        "ROUTE",
        "PRIORITY",
        "BROKER",
        "TIMEOUT",
        "TIMER",
        "VALIDATION",
        "WELL_FORMED_XML",
        "ACTIVATION",
        "STATUS",
        "RETENTION",
        "MAX_QUEUE_READERS",
        "PROCEDURE_NAME",
        "ENCRYPTION",
        "LIFETIME",
        "INITIATOR",
        "TARGET",
        "SENT",
        "CLEANUP",
        "ERROR",
        "DESCRIPTION",
        "TRY",
        "CATCH",
        "THROW",
        "NVARCHAR",
        "UNIQUEIDENTIFIER",
        "VARBINARY",
        "message_body",
        "conversation_handle",
        "message_type_name",
        "conversation_group_id",
    }
)
_NAMED_VIEWS: Final = (
    ("service_queues", "name"),
    ("services", "name"),
    ("service_contracts", "name"),
    ("message_types", "name"),
)


def history_file() -> History:
    try:
        return FileHistory(str(Path.home() / ".ssb_sql_history"))
    except OSError:
        return InMemoryHistory()


async def object_names(session: Session) -> list[str]:
    """The broker's object names, for completion (none when the broker cannot say)."""
    names: set[str] = set(SYS_VIEWS)
    if session.conn is None:
        return sorted(names)
    for view, column in _NAMED_VIEWS:
        try:
            rows = await session.conn.view(view)
        except Exception:  # completion is a help; a view it cannot read leaves it out
            continue
        names.update(str(row[column]) for row in rows)
    return sorted(names)


async def shell(session: Session, prompt: PromptSession[str] | None = None) -> int:
    """Read batches until EXIT; the exit code (1 when a batch failed)."""
    names = await object_names(session)
    completer = WordCompleter(lambda: [*_WORDS, *names], ignore_case=True, sentence=True)
    reader = prompt or PromptSession(history=history_file())
    lines: list[str] = []
    ok = True
    first_line = 1
    while True:
        try:
            line = await reader.prompt_async(f"{len(lines) + 1}> ", completer=completer)
        except EOFError:
            break
        except KeyboardInterrupt:
            lines = []
            continue
        word = line.strip().upper()
        if not lines and word in _COMMANDS:
            break
        if word == "RESET":
            lines = []
            continue
        match = _GO.match(line)
        if match is None:
            lines.append(line)
            continue
        count = int(match.group(1) or 1)
        if "\n".join(lines).strip() and 1 <= count <= MAX_GO_COUNT:
            ok = await session.run_batch(Batch("\n".join(lines), first_line, count)) and ok
            names = await object_names(session)
        lines = []
    if "\n".join(lines).strip():
        ok = await session.run_batch(Batch("\n".join(lines), first_line)) and ok
    return 0 if ok else 1
