"""Activated tasks and the worker processes that run them.

Theory of operation. An activated task is one run of a queue's activation procedure.
It never runs in the daemon: a *worker* (a `python -m ssb.client._worker` child process)
runs it, so a procedure that hangs, burns CPU, leaks or crashes the interpreter
cannot stall the broker's event loop or other queues. A worker runs one task at a
time and talks to the daemon over its stdin/stdout, one JSON object per line:

    worker -> daemon   {"ready": pid}                  once, when it can take work
    daemon -> worker   {"run": {task_id, queue, database, procedure, entry, user, token,
                                host, port}}
    worker -> daemon   {"done": task_id, "error": text | null}

The procedure itself uses an ordinary client connection to the client port, logged
in as the EXECUTE AS user with the task's one-time token in the queue's database, and
calls `attach_task` first, so the broker knows which session is which activated task.
`entry` is the function the worker runs: the procedure itself for a Python one, the
T-SQL interpreter's entry point (given `procedure`, the stored procedure's name) for
one written in T-SQL. A worker whose
process ends before it says "done" (crash, `kill -9`) ends its task with an error;
its connection drop has already rolled back whatever it had open.

What a procedure prints, and the traceback of a procedure that fails, leave the worker
on its standard error, which the daemon reads and logs line by line (logger
`ssb.task`, naming the worker), so the daemon's log stays one format.

Workers are pooled: after a task, a healthy worker goes back to the idle pool
(up to `idle_workers`) and the next activation reuses it without paying for a
process start ("warm"); otherwise it is told to exit (stdin closed). Every process
and every coroutine that waits on one is owned by the pool and stopped on close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final

from .._core.names import database_of, plain
from .._core.transactions import Session

log = logging.getLogger("ssb.activation")
output = logging.getLogger("ssb.task")  # what procedures write to standard error
OUTPUT_LINE_LIMIT: Final = 4096  # bytes of one line of a procedure's output logged

LINE_LIMIT: Final = 1 << 20
WORKER_PATH_ENV: Final = "SSB_WORKER_PATH"
STOP_GRACE: Final = 2.0


class WorkerError(RuntimeError):
    """A worker process could not be started or broke its protocol."""


@dataclass(eq=False)
class ActivatedTask:
    """One activated procedure run, from the monitor's decision to its end."""

    task_id: int
    queue: str  # its key (see the core's `names`)
    procedure: str
    execute_as: str
    token: str
    started: float
    entry: str = ""  # what the worker runs ("": `procedure`, a Python one)
    pid: int | None = None
    session: Session | None = None
    received: bool = False  # it has run its first RECEIVE on its queue

    def command(self, host: str, port: int) -> dict[str, Any]:
        return {
            "run": {
                "task_id": self.task_id,
                "queue": plain(self.queue),
                "database": database_of(self.queue),
                "procedure": plain(self.procedure),
                "entry": self.entry or self.procedure,
                "user": self.execute_as,
                "token": self.token,
                "host": host,
                "port": port,
            }
        }


def _exit_text(pid: int, code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process {pid} was killed by {name}"
    return f"worker process {pid} exited with code {code} before the procedure returned"


class WorkerProcess:
    """One worker child process and its control pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.started = time.time()
        self.tasks_run = 0
        self.task: ActivatedTask | None = None
        self._relay = asyncio.ensure_future(self._relay_output())

    async def _relay_output(self) -> None:
        """Log what the worker writes to its standard error, a line at a time."""
        stream = self.proc.stderr
        if stream is None:
            return
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line beyond the limit: log it in pieces
                line = await stream.read(LINE_LIMIT)
            if not line:
                return
            text = line[:OUTPUT_LINE_LIMIT].decode(errors="replace").rstrip()
            more = f" ... ({len(line)} bytes)" if len(line) > OUTPUT_LINE_LIMIT else ""
            output.info("worker %d: %s%s", self.pid, text, more)

    @classmethod
    async def spawn(cls, env: dict[str, str], timeout: float) -> WorkerProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ssb.client._worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            limit=LINE_LIMIT,
        )
        worker = cls(proc)
        try:
            hello = await asyncio.wait_for(worker._read(), timeout)
        except BaseException:
            await worker.kill()
            raise
        if hello is None or "ready" not in hello:
            code = await proc.wait()
            raise WorkerError(f"worker process {proc.pid} did not start (exit code {code})")
        return worker

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def _read(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            return None
        message = json.loads(line)
        if not isinstance(message, dict):
            raise WorkerError(f"worker process {self.pid} sent {line[:80]!r}")
        return message

    async def run(self, task: ActivatedTask, host: str, port: int) -> str | None:
        """Run `task` here; returns its error text, None when it returned normally."""
        assert self.proc.stdin is not None
        self.task = task
        try:
            self.proc.stdin.write(json.dumps(task.command(host, port)).encode() + b"\n")
            await self.proc.stdin.drain()
            while True:
                message = await self._read()
                if message is None:
                    return _exit_text(self.pid, await self.proc.wait())
                if message.get("done") == task.task_id:
                    error = message.get("error")
                    return None if error is None else str(error)
        except (ConnectionError, json.JSONDecodeError) as exc:
            await self.kill()
            return f"worker process {self.pid} failed: {exc!r}"
        finally:
            self.task = None
            self.tasks_run += 1

    async def stop(self) -> None:
        """Ask the worker to exit (stdin closed); kill it if it does not."""
        if self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_GRACE)
        except TimeoutError:
            await self.kill()
            return
        await self._end_relay()

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()
        await self._end_relay()

    async def _end_relay(self) -> None:
        """Log what the ended worker wrote last; a child of the procedure may hold the
        pipe open: wait for it not long."""
        await asyncio.wait([self._relay], timeout=1.0)
        self._relay.cancel()


class WorkerPool:
    """Idle workers kept warm, busy workers running tasks, all owned here."""

    def __init__(
        self,
        host: str,
        port: int,
        idle_workers: int,
        start_timeout: float,
        python_path: tuple[str, ...] = (),
    ) -> None:
        self.host = host
        self.port = port
        self.idle_workers = idle_workers
        self.start_timeout = start_timeout
        self.idle: list[WorkerProcess] = []
        self.busy: set[WorkerProcess] = set()
        self.spawned = 0
        self._booting = 0  # prestarted workers not ready yet
        self._wanted: deque[asyncio.Future[WorkerProcess]] = deque()  # tasks waiting for them
        self._jobs: set[asyncio.Task[Any]] = set()
        self._closing = False
        # not PYTHONPATH: the worker adds these only after importing the client, so a
        # directory there cannot shadow the broker's own packages
        paths = os.pathsep.join([*python_path, os.getcwd()])
        self.env = {**os.environ, WORKER_PATH_ENV: paths}

    def _own(self, coro: Coroutine[Any, Any, Any]) -> None:
        job = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _spawn(self) -> WorkerProcess:
        worker = await WorkerProcess.spawn(self.env, self.start_timeout)
        self.spawned += 1
        return worker

    def prestart(self, count: int) -> None:
        """Start up to `count` idle workers in the background."""
        for _ in range(max(0, min(count, self.idle_workers) - len(self.idle))):
            self._own(self._prestart_one())

    async def _prestart_one(self) -> None:
        self._booting += 1
        try:
            worker = await self._spawn()
        except (TimeoutError, OSError, WorkerError) as exc:
            log.warning("could not prestart an activation worker: %r", exc)
            while self._wanted:
                waiter = self._wanted.popleft()
                if not waiter.done():
                    waiter.set_exception(WorkerError(f"worker did not start: {exc!r}"))
                    break
            return
        finally:
            self._booting -= 1
        while self._wanted:
            waiter = self._wanted.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        if self._closing or len(self.idle) >= self.idle_workers:
            await worker.stop()
        else:
            self.idle.append(worker)

    async def _worker(self) -> WorkerProcess:
        """An idle worker, one still booting, or a new one, in that order of preference."""
        worker = self._take_idle()
        if worker is not None:
            return worker
        if self._booting > len(self._wanted):
            waiter: asyncio.Future[WorkerProcess] = asyncio.get_running_loop().create_future()
            self._wanted.append(waiter)
            try:
                return await asyncio.wait_for(waiter, self.start_timeout)
            except TimeoutError:
                pass
        return await self._spawn()

    def _take_idle(self) -> WorkerProcess | None:
        while self.idle:
            worker = self.idle.pop()
            if worker.alive:
                return worker
            self._own(worker.kill())  # reap it
        return None

    async def run(self, task: ActivatedTask) -> str | None:
        """Run `task` on a warm worker, or a new one; returns its error text or None."""
        worker = await self._worker()
        self.busy.add(worker)
        task.pid = worker.pid
        try:
            error = await worker.run(task, self.host, self.port)
        except asyncio.CancelledError:
            self.busy.discard(worker)
            await worker.kill()
            raise
        self.busy.discard(worker)
        if worker.alive and not self._closing and len(self.idle) < self.idle_workers:
            self.idle.append(worker)
        else:
            self._own(worker.stop())
        return error

    def rows(self) -> list[tuple[WorkerProcess, str]]:
        return [(w, "BUSY") for w in self.busy] + [(w, "IDLE") for w in self.idle]

    async def close(self) -> None:
        self._closing = True
        workers = list(self.idle) + list(self.busy)
        self.idle.clear()
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)
        await asyncio.gather(*(w.kill() for w in workers), return_exceptions=True)
