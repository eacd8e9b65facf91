"""An activation worker: a child process of the daemon that runs activated procedures.

Theory of operation. The daemon starts `python -m ssb.client._worker` and keeps
the process while it is useful (see the broker's activation workers). It imports only
the client package, so a procedure runs against exactly what a user program would. The control channel is the process's
original stdin/stdout, moved to private descriptors at start so that a procedure
printing to stdout (which now goes to stderr, the daemon's log) or reading stdin
(now /dev/null) cannot corrupt it. A reader thread takes commands off the channel;
when the channel closes (the daemon stopped, crashed or retired this worker) the
process exits at once, even in the middle of a procedure: nobody is left to report
to, and the broker has already rolled back the procedure's connection.

Each command runs one function, its `entry` (`package.module:function`), imported
once per worker: the activation procedure itself, or for one written in T-SQL the
interpreter's entry point, which runs the stored procedure the context names. A plain
function gets a blocking `client.SyncConnection`, an `async def` gets an async
`client.Connection` on a fresh event loop. The connection logs in as the EXECUTE AS
user with the task's one-time token, in the queue's database, and attaches itself to
the task before the procedure sees it. A procedure that accepts a second argument also
gets a `TaskContext` (its queue, task id, procedure, user and database). Whatever it raises is
reported back as the task's error; the connection is closed afterwards, which rolls
back anything it left open. The connection does not reconnect: its token logs in once,
and a dropped connection ends the task (the queue monitor starts another reader while
messages wait). Inside it, `run_transaction` still settles a commit whose answer was lost.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO, Final
from urllib.parse import quote

from ._functions import load_function
from ._task import ProcedureFailed, TaskContext

MAX_ERROR_TEXT: Final = 4000


WHERE: Final = (
    "activation workers import procedures from the daemon's working directory and from"
    " [activation] python_path in its --config file"
)


def _wants_context(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind(None, None)
    except (TypeError, ValueError):
        return False
    return True


def _url(run: dict[str, Any]) -> str:
    user = quote(str(run["user"]), safe="")
    return f"ssb://{user}:{run['token']}@{run['host']}:{int(run['port'])}"


def _run_sync(fn: Callable[..., Any], run: dict[str, Any], context: TaskContext) -> None:
    from ssb import client

    # the task ends with its connection: no reconnect
    conn = client.connect_sync(_url(run), reconnect=False, database=context.database)
    try:
        conn.attach_task(run["token"])
        if _wants_context(fn):
            fn(conn, context)
        else:
            fn(conn)
    finally:
        conn.close()


async def _run_async(fn: Callable[..., Any], run: dict[str, Any], context: TaskContext) -> None:
    from ssb import client

    # the task ends with its connection: no reconnect
    conn = await client.connect(_url(run), reconnect=False, database=context.database)
    try:
        await conn.attach_task(run["token"])
        if _wants_context(fn):
            await fn(conn, context)
        else:
            await fn(conn)
    finally:
        await conn.close()


def run_task(run: dict[str, Any]) -> str | None:
    """Run one procedure to its end; returns the error text, or None."""
    try:
        fn = load_function(str(run.get("entry") or run["procedure"]), WHERE)
        context = TaskContext(
            str(run["queue"]),
            int(run["task_id"]),
            str(run["procedure"]),
            str(run["user"]),
            str(run.get("database") or "master"),
        )
        if inspect.iscoroutinefunction(fn):
            asyncio.run(_run_async(fn, run, context))
        else:
            _run_sync(fn, run, context)
    except ProcedureFailed as exc:
        return str(exc)[:MAX_ERROR_TEXT] or "the procedure failed"
    except BaseException as exc:  # a procedure's failure ends its task, not the worker
        traceback.print_exc(file=sys.stderr)
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return text[:MAX_ERROR_TEXT] or type(exc).__name__
    return None


def _private_channel() -> tuple[BinaryIO, BinaryIO]:
    """Move the control pipes off fds 0 and 1; point those at /dev/null and stderr."""
    control_in = os.fdopen(os.dup(0), "rb")
    control_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return control_in, control_out


def _read_commands(control_in: BinaryIO, inbox: queue.SimpleQueue[dict[str, Any]]) -> None:
    for line in control_in:
        try:
            command = json.loads(line)
        except ValueError:
            continue
        if isinstance(command, dict):
            inbox.put(command)
    os._exit(0)  # the daemon is gone or retired us: stop now, whatever is running


def main() -> None:
    control_in, control_out = _private_channel()

    def say(message: dict[str, Any]) -> None:
        control_out.write(json.dumps(message).encode() + b"\n")
        control_out.flush()

    inbox: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    threading.Thread(target=_read_commands, args=(control_in, inbox), daemon=True).start()
    from ssb import client  # noqa: F401 - pay for the import before saying ready

    for entry in reversed(os.environ.get("SSB_WORKER_PATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    say({"ready": os.getpid()})
    while True:
        command = inbox.get()
        run = command.get("run")
        if not isinstance(run, dict):
            continue
        error = run_task(run)
        say({"done": run.get("task_id"), "error": error})


if __name__ == "__main__":
    main()
