"""T-SQL activation: what an activation worker runs for a queue whose ACTIVATION names a
stored procedure.

Theory of operation. The broker's activation starts readers of such a queue exactly as
it starts Python ones, and the worker runs `run` with a connection logged in as the
EXECUTE AS login in the queue's database. `run` is one session of the interpreter that
executes the procedure (`EXEC [name]`) once, as SQL Server's activation does: the
procedure's own loop receives until the queue stays empty and returns. What it PRINTs
(and its informational RAISERRORs) and an error that ends it go to the worker's
standard error, which the broker logs under `ssb.task`; an error ends the task with
SQL Server's message as its error, and whatever transaction the procedure left open
rolls back when the connection closes.
"""

from __future__ import annotations

import sys

from ssb import client

from ._errors import SqlError
from ._interpreter import Session
from ._output import TextOutput
from ._source import Batch


class _Log(TextOutput):
    """Everything to standard error (the broker's log), the first error kept."""

    def __init__(self) -> None:
        super().__init__(sys.stderr, sys.stderr)
        self.failure: SqlError | None = None

    def error(self, error: SqlError) -> None:
        super().error(error)
        if self.failure is None:
            self.failure = error


async def run(conn: client.Connection, context: client.TaskContext) -> None:
    """Run the T-SQL stored procedure `context.procedure` of the queue's database once."""
    output = _Log()
    session = Session(conn, output, login=context.execute_as)
    session.nocount = True  # an activated procedure has nobody to count rows for
    name = context.procedure.replace("]", "]]")
    if not await session.run_batch(Batch(f"EXEC [{name}]", 1)) and output.failure is not None:
        raise client.ProcedureFailed(output.failure.format())
