"""Group commit: batches of writes, numbered, committed in order, one at a time.

Theory of operation. Writes join the *open batch* as the core changes its memory,
always in one synchronous stretch per operation, so a batch never holds half of an
operation. One batch at a time is committed in one database transaction; while it
commits, new writes collect in the next one: that is group commit. `Committer` is this
machinery, whatever the database; an implementation (`sqlite`, `postgres`) supplies the
commit itself (`_commit`), says where each commit runs (`_plan`: on the store thread by
default; SQLite also applies or commits some batches on the event loop), and which
failures may pass (`_transient`).

Batches stay small: the families of tables rewrite them as they are written (a message
deleted before its insert has started committing is neither inserted nor deleted, an
endpoint written several times is written once, see `messages` and `endpoints`), and
`apply_statements` writes a batch with as few statement steps as the database allows:
consecutive writes of one statement share a parameter list, written as one executemany
or, for the hot tables' inserts where the implementation asks for it, many rows to a
statement (`MULTI_ROW_INSERT` at most).

Batches are numbered. `watermark()` is the number of the newest batch holding a write,
and `when_durable(n, callback)` runs the callback on the event loop once batch `n` is
committed. The next commit starts before the callbacks of the last one run, so that the
store thread writes it while the loop answers.

A commit that fails for a cause that may pass (no space, an I/O error, a lost
connection) is not the end: the batches stay, merged with the writes that follow, and
are tried again after `RETRY_DELAY` (at once when the implementation could make room,
`_make_room`: SQLite gives up its disk reserve); meanwhile `on_trouble` tells the daemon
(which refuses new messages with the real cause) and answers wait. When commits have
failed for `abandon_after` seconds and the last failure is one the database answered
and that surely committed nothing (`_abandonable`: no space or an I/O error, not a lock
held elsewhere nor a lost connection, after which a PostgreSQL commit may have happened
and the server may just be restarting), the batches are *abandoned*: rolled back, never to be written, and so is everything written
since; the store commits nothing more and `on_abandon` tells the daemon, which answers
the clients that waited and starts again from what is durable (memory was ahead of it).
Any other failure (a constraint broken: a bug) is fatal: memory would stay ahead of disk,
so the daemon stops and a restart rebuilds from what is durable.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Final, Protocol

from .._core.ports import Row
from .errors import StoreFailure, describe_failure
from .port import CommitHooks

log = logging.getLogger("ssb.store")

RETRY_DELAY: Final = 1.0  # seconds before a failed commit is tried again
WEIGHT_PAGE: Final = 4096  # bytes of a body that weigh as much as one more row
MULTI_ROW_INSERT: Final = 64  # rows one multi-row INSERT statement writes at most
UNKNOWN_ROWS: Final = 1 << 20  # the weight of a statement that deletes an unknown number
CANCELLED: Final = None  # a batch row that was cancelled before it was committed


class Cursor(Protocol):
    """What the families read through: a DB-API cursor."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...

    def close(self) -> None: ...


class Connection(Protocol):
    """What the families and `apply_statements` need of a database connection: SQL with
    `?` placeholders, in the DB-API's manner (sqlite3's own, or `postgres.Session`)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any: ...


def weight(size: int) -> int:
    """A row's weight in a batch (see `Batch.weight`): one, and one per page of its body."""
    return 1 + size // WEIGHT_PAGE


@functools.cache
def _multi_row(sql: str, columns: int, rows: int) -> str:
    """`sql`, a one-row INSERT of `columns` values, extended to insert `rows` rows."""
    group = "(" + ", ".join("?" * columns) + ")"
    return sql + ", " + ", ".join([group] * (rows - 1)) if rows > 1 else sql


def _insert_rows(db: Connection, sql: str, columns: int, rows: list[Row]) -> None:
    """Insert `rows` with statements of MULTI_ROW_INSERT rows, then of halving sizes for
    the rest (a few statement shapes per table, all of them in the statement cache)."""
    size = MULTI_ROW_INSERT
    done = 0
    while done < len(rows):
        while size > len(rows) - done:
            size //= 2
        chunk = rows[done : done + size]
        db.execute(_multi_row(sql, columns, size), list(itertools.chain.from_iterable(chunk)))
        done += size


def apply_statements(
    db: Connection,
    batches: Sequence[Batch],
    multi_row: Mapping[str, int],
    row_counts: Mapping[str, Callable[[Row], int]],
    applied: Container[int] = frozenset(),
) -> int:
    """Execute the writes of `batches` on `db`, in order, inside a transaction the caller
    opened: one step for a lone row, many rows to a statement for the inserts of
    `multi_row` (statement -> columns), an executemany for the rest; none of the
    parameter lists whose ids are in `applied` (that transaction holds their writes
    already). Returns the rows written (`row_counts`: statement -> the rows one of its
    parameter rows touches, where that is not one)."""
    rows = 0
    for batch in batches:
        for sql, params in batch.statements:
            if applied and id(params) in applied:
                rows += len(params)
                continue
            live = [p for p in params if p is not CANCELLED]
            if len(live) == 1:
                db.execute(sql, live[0])
            elif live:
                columns = multi_row.get(sql)
                if columns is None:
                    db.executemany(sql, live)
                else:
                    _insert_rows(db, sql, columns, live)
            count = row_counts.get(sql)
            rows += len(live) if count is None else sum(map(count, live))
    return rows


class Plan(enum.Enum):
    """Where a commit runs (see `Committer._plan`)."""

    THREAD = "thread"  # all of it on the store thread
    LOOP = "loop"  # applied on the event loop (`_apply`), finished on the store thread
    INLINE = "inline"  # all of it on the event loop


class Batch:
    """Writes collected for one transaction, in statement order (consecutive writes of
    one statement share a parameter list: one executemany)."""

    __slots__ = ("last_sql", "number", "params", "rows", "statements", "weight")

    def __init__(self, number: int) -> None:
        self.number = number
        self.statements: list[tuple[str, list[Row | None]]] = []
        self.rows = 0
        self.weight = 0  # rows touched, a large body counting for one per page
        self.last_sql = ""
        self.params: list[Row | None] = []

    def add(self, sql: str, row: Row, weight: int = 1) -> list[Row | None]:
        """Append a write; returns the parameter list it went into (it is the last item)."""
        if sql is not self.last_sql:
            self.last_sql = sql
            self.params = []
            self.statements.append((sql, self.params))
        params = self.params
        params.append(row)
        self.rows += 1
        self.weight += weight
        return params


class Tables:
    """The shared base of the families of tables: the open batch they write into and the
    connections they read on (`_reader` on the event loop, which sees committed batches
    only; `_db`, the writer, for the start-up reads)."""

    _db: Connection
    _reader: Connection
    _open: Batch
    _wake: bool
    # rows of the open batch that a later write may cancel or replace (see `messages`
    # and `endpoints`); emptied when the batch is taken
    _inserts: dict[int, tuple[list[Row | None], int]]
    _endpoint_rows: dict[bytes, tuple[list[Row | None], int, bool]]
    cancelled: int

    def _schedule(self) -> None:
        """A write arrived while no commit is under way or scheduled: schedule one."""
        raise NotImplementedError

    def _add(self, sql: str, row: Row, weight: int = 1) -> list[Row | None]:
        """Append a write to the open batch; returns the parameter list it went into."""
        params = self._open.add(sql, row, weight)
        if self._wake:
            self._schedule()
        return params

    def _add_tracked(self, sql: str, row: Row) -> tuple[list[Row | None], int]:
        """`_add`, returning where the row went (to cancel or replace it in this batch)."""
        params = self._open.add(sql, row)
        if self._wake:
            self._schedule()
        return params, len(params) - 1

    def _bounded(
        self, sql: str, params: Row, size: Callable[[Row], int], max_bytes: int
    ) -> list[Row]:
        """Rows of `sql` while their sizes add up to at most `max_bytes` (at least one)."""
        rows: list[Row] = []
        used = 0
        cursor = self._reader.execute(sql, params)
        try:
            for row in cursor:
                used += size(row)
                if rows and used > max_bytes:
                    break
                rows.append(row)
        finally:
            cursor.close()
        return rows

    def _run_slices(
        self, read: Callable[[Connection, Any], list[Row]], parts: Sequence[Any]
    ) -> list[Row]:
        """`read(db, part)` of every part, on the writer connection (a start-up read);
        an implementation may read the parts in parallel."""
        return [row for part in parts for row in read(self._db, part)]


class Committer(Tables):
    """Group commit: the open batch and the batches being committed, the store thread,
    retries and the callbacks waiting for durability (see the module's comment). An
    implementation makes the connections and supplies `_commit`, `_transient` and
    `_release` (and `_plan`, `_apply` and `_finish` to commit elsewhere than on the
    store thread)."""

    # statement -> how many columns a row binds, for the inserts written many rows to a
    # statement (see `apply_statements`)
    multi_row_inserts: ClassVar[Mapping[str, int]] = {}
    # statement -> the rows one of its parameter rows touches, where that is not one
    row_counts: ClassVar[Mapping[str, Callable[[Row], int]]] = {}

    def __init__(self, durability: str, *, threaded: bool) -> None:
        """Args:
        durability: "fsync" or "os" (what each implementation makes of them).
        threaded: commit on a store thread once attached (the daemon); False commits only
            when `flush()` is called (tests drive durability by hand).
        """
        if durability not in ("fsync", "os"):
            raise ValueError(f"durability must be 'fsync' or 'os', not {durability!r}")
        self.durability = durability
        self._open = Batch(1)
        self._retry: list[Batch] = []  # batches whose commit failed, to try again first
        self._durable = 0
        # a write schedules a commit only when none runs or is scheduled (`_wake`)
        self._committing = False
        self._wake = False
        self._callbacks: deque[tuple[int, Callable[[], None]]] = deque()
        self._inserts = {}
        self._endpoint_rows = {}
        self._deferred: list[Callable[[], None]] = []  # writers run when the batch is taken
        self._threaded = threaded
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssb-store") if threaded else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ended: list[asyncio.Future[None]] = []  # `close` waiting for a commit to end
        self._hooks = CommitHooks()
        self.failed: BaseException | None = None
        self.trouble: str | None = None
        self.abandoned: str | None = None  # why the batches not yet durable were given up
        self._trouble_since: float | None = None  # monotonic time of the first failure
        self._last_failure: BaseException | None = None
        self.fail_next: BaseException | None = None  # tests: the next commit raises this
        self.commits = 0
        self.rows_written = 0
        self.cancelled = 0  # message rows never written (deleted before their batch ran)
        self._last_commit = (0, 0.0)

    # ---- what an implementation supplies ----------------------------------------------

    def _commit(self, batches: list[Batch], checkpoint: bool = True) -> None:
        """Write `batches` in one transaction, synchronously (on the store thread, or at
        start-up); `checkpoint`: the database may do its own upkeep in this commit. Calls
        `_injected_failure` first and `_committed` once the transaction is committed."""
        raise NotImplementedError

    def _transient(self, exc: BaseException) -> bool:
        """Whether a failed commit may succeed later, rather than being a bug."""
        raise NotImplementedError

    def _release(self) -> None:
        """Close the connections (the store is closed)."""
        raise NotImplementedError

    def _plan(self, weight: int) -> Plan:
        """Where to commit batches of `weight`: on the store thread unless the
        implementation says otherwise."""
        return Plan.THREAD

    def _apply(self, batches: list[Batch]) -> Any:
        """Plan.LOOP's first half, on the event loop; returns what `_finish` needs."""
        raise NotImplementedError

    def _finish(self, applied: Any) -> None:
        """Plan.LOOP's second half, on the store thread."""
        raise NotImplementedError

    def _abandonable(self, exc: BaseException) -> bool:
        """Whether the failed commit (it failed with `exc`) may be given up: the database
        answered that it cannot write it, and it surely committed nothing."""
        return True

    def _make_room(self) -> bool:
        """After a failed commit: make room for the next attempt if the implementation can
        (then it is tried at once)."""
        return False

    def _injected_failure(self) -> None:
        """Raise the failure a test asked the next commit to have (`fail_next`)."""
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc

    def _committed(self, rows: int, started: float) -> None:
        """Count a commit of `rows` that began at `started` (perf_counter)."""
        self.commits += 1
        self.rows_written += rows
        self._last_commit = (rows, time.perf_counter() - started)

    # ---- start and stop -------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop, hooks: CommitHooks) -> None:
        self._loop = loop
        self._hooks = hooks
        self._wake = self._threaded
        if self._wake and (self._open.rows or self._deferred):
            self._schedule()

    def write_now(self) -> None:
        """Commit what is pending, synchronously (start-up, shutdown); StoreFailure when
        it cannot."""
        if self.abandoned is None and (self._open.rows or self._retry or self._deferred):
            batches = self._pending()
            try:
                self._commit(batches)
            except Exception as exc:
                raise StoreFailure(describe_failure(exc)) from exc
            self._settle(batches, None)
            self._run_callbacks()

    def flush(self) -> None:
        """Commit what is pending now, as the store thread would (tests drive durability
        by hand with a store made with threaded=False)."""
        if self.abandoned is None and (self._open.rows or self._retry or self._deferred):
            batches = self._pending()
            try:
                self._commit(batches)
            except Exception as exc:
                self._settle(batches, exc)
                return
            self._settle(batches, None)
            self._run_callbacks()

    def discard_pending(self) -> None:
        """Forget every write not yet committed, as a crash would (tests)."""
        self._open = Batch(self._open.number)
        self._retry = []
        self._deferred = []
        self._inserts = {}
        self._endpoint_rows = {}

    async def close(self) -> None:
        while self._committing and self.failed is None and self._loop is not None:
            ended: asyncio.Future[None] = self._loop.create_future()
            self._ended.append(ended)  # a commit that fails for good ends the wait too
            await ended
        self._wake = False
        try:
            if self.failed is None and self.trouble is None and self.abandoned is None:
                self.write_now()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self._release()

    # ---- durability ---------------------------------------------------------------------

    def watermark(self) -> int:
        """The batch that must be durable before an answer may leave."""
        if self._open.rows or self._deferred:
            return self._open.number
        return self._open.number - 1

    def defer(self, writer: Callable[[], None]) -> None:
        """Run `writer` just before the open batch is committed, to write rows that would
        otherwise be rewritten many times in one batch (an endpoint's state); the batch
        counts as holding a write from now on."""
        self._deferred.append(writer)
        if self._wake:
            self._schedule()

    @property
    def durable(self) -> int:
        return self._durable

    def when_durable(self, batch: int, callback: Callable[[], None]) -> None:
        if batch <= self._durable:
            callback()
            return
        self._callbacks.append((batch, callback))

    def _run_callbacks(self) -> None:
        callbacks = self._callbacks
        durable = self._durable
        while callbacks and callbacks[0][0] <= durable:
            callbacks.popleft()[1]()

    # ---- group commit ---------------------------------------------------------------------

    def _schedule(self) -> None:
        """A write arrived while no commit is under way or scheduled: schedule one."""
        if self._wake and self._loop is not None:
            self._wake = False
            self._loop.call_soon(self._start_flush)

    def _take_open(self) -> Batch:
        writers, self._deferred = self._deferred, []
        for writer in writers:
            writer()
        batch = self._open
        self._open = Batch(batch.number + 1)
        self._inserts = {}
        self._endpoint_rows = {}
        return batch

    def _pending(self) -> list[Batch]:
        """Failed batches first, then the open one: what the next commit writes."""
        batches = self._retry
        self._retry = []
        if self._open.rows or self._deferred:
            batches = [*batches, self._take_open()]
        return batches

    def _start_flush(self) -> None:
        if self._committing or self.failed is not None or self.abandoned is not None:
            return
        if not (self._open.rows or self._retry or self._deferred):
            self._wake = True
            return
        assert self._loop is not None and self._executor is not None
        self._committing = True  # (deferred writers write while the batch is taken)
        batches = self._pending()
        plan = self._plan(sum(batch.weight for batch in batches))
        if plan is Plan.INLINE:
            failure: Exception | None = None
            try:
                self._commit(batches, checkpoint=False)
            except Exception as exc:
                failure = exc
            self._flushed(batches, failure, inline=True)
            return
        if plan is Plan.LOOP:
            try:
                applied = self._apply(batches)
            except Exception as exc:
                self._flushed(batches, exc, inline=True)
                return
            future = self._loop.run_in_executor(self._executor, self._finish, applied)
        else:
            future = self._loop.run_in_executor(self._executor, self._commit, batches)
        future.add_done_callback(lambda f: self._flushed(batches, f.exception()))

    def _flushed(
        self, batches: list[Batch], exc: BaseException | None, inline: bool = False
    ) -> None:
        """A commit ended: settle it, start the next, then run what waited for it. The next
        commit starts first, so that the store thread writes it while the loop answers
        (after an inline commit, it starts from the event loop's next turn, so that
        commits never nest)."""
        self._committing = False
        ended, self._ended = self._ended, []
        for waiter in ended:
            waiter.set_result(None)
        self._settle(batches, exc)
        if self.failed is not None:
            return
        assert self._loop is not None
        if self._retry:
            if self._abandon_due():
                self.abandon()
                return
            self._loop.call_later(0.0 if self._make_room() else RETRY_DELAY, self._start_flush)
        elif self._open.rows or self._deferred:
            if not inline:
                self._start_flush()
            else:
                self._committing = True  # nothing else starts a commit in between
                self._loop.call_soon(self._next_flush)
        else:
            self._wake = True
        self._run_callbacks()

    def _next_flush(self) -> None:
        self._committing = False
        self._start_flush()

    def _settle(self, batches: list[Batch], exc: BaseException | None) -> None:
        """A commit of `batches` ended: make them durable, keep them to retry, or fail
        (the caller runs the callbacks of what became durable)."""
        if exc is not None:
            if not self._transient(exc):
                self.failed = exc
                if self._hooks.on_failure is not None:
                    self._hooks.on_failure(exc)
                return
            reason = describe_failure(exc)
            self._last_failure = exc
            if self._trouble_since is None:
                self._trouble_since = time.monotonic()
            if self.trouble is None:
                log.error("store commit failed (%s); retrying every %g s", reason, RETRY_DELAY)
            self.trouble = reason
            if self._hooks.on_trouble is not None:
                self._hooks.on_trouble(reason)
            self._retry = batches
            return
        self._trouble_since = None
        if self.trouble is not None:
            log.warning("store commits again after: %s", self.trouble)
            self.trouble = None
            if self._hooks.on_trouble is not None:
                self._hooks.on_trouble(None)
        self._durable = batches[-1].number
        if self._hooks.on_commit is not None:
            self._hooks.on_commit(*self._last_commit)

    # ---- giving up ------------------------------------------------------------------------

    def _abandon_due(self) -> bool:
        """Whether commits have failed long enough to give the batches up (the next try
        would come too late) and the last attempt surely committed nothing."""
        since, after = self._trouble_since, self._hooks.abandon_after
        return (
            since is not None
            and after is not None
            and time.monotonic() + RETRY_DELAY >= since + after
            and self._last_failure is not None
            and self._abandonable(self._last_failure)
        )

    def abandon(self) -> None:
        """Give up every batch not yet durable: none of it is ever written, what waits for
        it never runs, and the store commits nothing more (memory is ahead of disk: the
        daemon starts again from what is durable). `on_abandon` hears why."""
        reason = self.trouble or "the store could not write"
        self.abandoned = reason
        self._retry = []
        self._deferred = []
        self._open = Batch(self._open.number + 1)
        self._inserts = {}
        self._endpoint_rows = {}
        self._callbacks.clear()
        log.error(
            "store commits failed for %g s (%s): the batches not yet written are rolled back",
            self._hooks.abandon_after or 0.0,
            reason,
        )
        if self._hooks.on_abandon is not None:
            self._hooks.on_abandon(reason)
