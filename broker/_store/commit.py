"""Group commit: batches of writes, committed by the event loop and the store thread.

Theory of operation. Writes join the *open batch* as the core changes its memory,
always in one synchronous stretch per operation, so a batch never holds half of an
operation. One batch at a time is committed in one SQLite transaction (one fsync with
`durability="fsync"`, none with `"os"`: then the WAL is in the OS and survives a daemon
crash but not a power cut). While a batch commits, new writes collect in the next one:
that is group commit.

A commit has two halves: the event loop applies the batch's statements (BEGIN and the
writes, which change SQLite's page cache only), then the store thread runs COMMIT,
which writes the WAL, syncs it and, when SQLite's automatic checkpoint is due,
checkpoints. Applying on the store thread would make it win the interpreter lock back
from a busy loop after every statement step, which stretched commits several times over
in a broker that also carries broker-to-broker traffic; the loop applies at no such
cost, and the thread still does the I/O. A batch heavier than `LOOP_WEIGHT` rows (the
loop never stalls for long), a light one of at most `INLINE_WEIGHT` rows (a lone
client's: the hop to the thread then overlaps the loop's own work, which keeps its round
trip short), and any batch while commits fail are applied on the thread too. Between
the halves the writer connection is in the middle of a transaction: nothing else uses
it until the commit ends.

With `"os"`, a light batch (at most `INLINE_WEIGHT` rows touched) is committed whole on
the event loop: that costs less than the hop to the store thread and back, which is
most of a lone client's round trip. Such commits never run SQLite's automatic
checkpoint (it would sync files on the event loop); the checkpoint runs on the store
thread, in the next commit there, and at most `INLINE_STREAK` light batches in a row
are committed inline.

Batches stay small: the families of tables rewrite them as they are written (a message
deleted before its insert has started committing is neither inserted nor deleted, an
endpoint written several times is written once, see `messages` and `endpoints`), and
rows of the hot tables (messages, the transmission queue, endpoints) are inserted many
to a statement, `MULTI_ROW_INSERT` at most: each statement step has a fixed cost
(SQLite releases and takes back the interpreter lock around it, which on the store
thread means waiting for a busy loop), so one step per row would stretch a commit of a
few hundred rows several times over.

Batches are numbered. `watermark()` is the number of the newest batch holding a write,
and `when_durable(n, callback)` runs the callback on the event loop once batch `n` is
on disk. The next commit starts before the callbacks of the last one run, so that the
store thread writes it while the loop answers.

A commit that fails for want of space or an I/O error is not the end: the batch stays,
merged with the writes that follow, and is tried again after `RETRY_DELAY`, after a WAL
checkpoint that lets it reuse the WAL file's space; meanwhile `on_trouble` tells the
daemon (which refuses new messages with the real cause) and answers wait. Any other
failure (a constraint broken: a bug) is fatal: memory would stay ahead of disk, so the
daemon stops and a restart rebuilds from what is durable.

Space: the file's free pages go back to the file system (`auto_vacuum = INCREMENTAL`),
but only when the daemon is idle: while busy they are only reused by the next inserts
(returning them moves live pages from the file's end, which would stall the commits of
a drain). An idle daemon calls `checkpoint` repeatedly, each call returning up to
`IDLE_VACUUM_PAGES` and truncating the WAL, until only `KEEP_FREE_PAGES` are left free
for reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, Final

from .._core.ports import Row
from .errors import StoreError, StoreFailure, describe_failure
from .schema import MEMORY, PAGE_SIZE, READER_CACHE_KIB, WRITER_CACHE_KIB, connect, create

log = logging.getLogger("ssb.store")

RETRY_DELAY: Final = 1.0  # seconds before a failed commit is tried again
KEEP_FREE_PAGES: Final = 2048  # free pages an idle store keeps for the next inserts
IDLE_VACUUM_PAGES: Final = 8192  # free pages returned per idle checkpoint
INLINE_WEIGHT: Final = 8  # a batch touching at most this many rows may commit on the loop
INLINE_STREAK: Final = 200  # light batches in a row committed inline, then one on the thread
LOOP_WEIGHT: Final = 4096  # a batch touching at most this many rows is applied on the loop
MULTI_ROW_INSERT: Final = 64  # rows one INSERT statement writes at most (see above)
AUTO_CHECKPOINT: Final = 1000  # WAL pages that make a threaded commit checkpoint (SQLite's)
UNKNOWN_ROWS: Final = 1 << 20  # the weight of a statement that deletes an unknown number
CANCELLED: Final = None  # a batch row that was cancelled before it was committed


def weight(size: int) -> int:
    """A row's weight in a batch (see `Batch.weight`): one, and one per page of its body."""
    return 1 + size // PAGE_SIZE


@functools.cache
def _multi_row(sql: str, columns: int, rows: int) -> str:
    """`sql`, a one-row INSERT of `columns` values, extended to insert `rows` rows."""
    group = "(" + ", ".join("?" * columns) + ")"
    return sql + ", " + ", ".join([group] * (rows - 1)) if rows > 1 else sql


def _insert_rows(db: sqlite3.Connection, sql: str, columns: int, rows: list[Row]) -> None:
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


def _transient(exc: BaseException) -> bool:
    """Whether a failed commit may succeed later (space, I/O), rather than being a bug."""
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        transient = {
            getattr(sqlite3, name)
            for name in (
                "SQLITE_FULL",
                "SQLITE_IOERR",
                "SQLITE_BUSY",
                "SQLITE_LOCKED",
                "SQLITE_CANTOPEN",
            )
            if hasattr(sqlite3, name)
        }
        if code is not None:
            return code & 0xFF in transient
        text = str(exc).lower()
        return "full" in text or "disk i/o" in text or "locked" in text
    return False


class Batch:
    """Writes collected for one SQLite transaction, in statement order (consecutive writes
    of one statement share a parameter list: one executemany)."""

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

    path: Path | str
    _db: sqlite3.Connection
    _reader: sqlite3.Connection
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

    def _add(self, sql: str, row: Row, weight: int = 1) -> None:
        self._open.add(sql, row, weight)
        if self._wake:
            self._schedule()

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


class Committer(Tables):
    """Group commit on one SQLite file: the connections, the open batch and the batches
    being committed, the store thread, and the store's upkeep (see the module's
    comment)."""

    # statement -> how many columns a row binds, for the inserts written many rows to a
    # statement (see `_insert_rows`)
    multi_row_inserts: ClassVar[Mapping[str, int]] = {}
    # statement -> the rows one of its parameter rows touches, where that is not one
    row_counts: ClassVar[Mapping[str, Callable[[Row], int]]] = {}

    def __init__(
        self, path: Path | str, durability: str = "fsync", *, threaded: bool = True
    ) -> None:
        """Args:
        path: the database file (":memory:" for tests: one connection, no thread).
        durability: "fsync" or "os".
        threaded: commit on a store thread (the daemon); False commits only when
            `flush()` is called (tests drive durability by hand).
        """
        if durability not in ("fsync", "os"):
            raise ValueError(f"durability must be 'fsync' or 'os', not {durability!r}")
        self.path = path
        self.durability = durability
        memory = str(path) == MEMORY
        # the writer never waits for a lock (the loop applies statements on it): a
        # database that another process holds fails the commit at once, to be retried
        self._db = connect(path, WRITER_CACHE_KIB, timeout=0.0)
        create(self._db, path, durability)
        self._reader = self._db if memory else connect(path, READER_CACHE_KIB)
        self._open = Batch(1)
        self._retry: list[Batch] = []  # batches whose commit failed, to try again first
        self._durable = 0
        # a write schedules a commit only when none runs or is scheduled (`_wake`)
        self._committing = False
        self._wake = False
        self._streak = 0  # light batches committed inline since the last threaded commit
        self._auto_checkpoint = True  # SQLite's automatic checkpoint is on
        self._callbacks: deque[tuple[int, Callable[[], None]]] = deque()
        self._inserts = {}
        self._endpoint_rows = {}
        self._deferred: list[Callable[[], None]] = []  # writers run when the batch is taken
        self._threaded = threaded and not memory
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssb-store")
            if self._threaded
            else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_failure: Callable[[BaseException], None] | None = None
        self._on_trouble: Callable[[str | None], None] | None = None
        self.failed: BaseException | None = None
        self.trouble: str | None = None
        self.fail_next: BaseException | None = None  # tests: the next commit raises this
        self.commits = 0
        self.rows_written = 0
        self.cancelled = 0  # message rows never written (deleted before their batch ran)
        # told (on the event loop) the rows and seconds of each commit that succeeded
        self.commit_observer: Callable[[int, float], None] | None = None
        self._last_commit = (0, 0.0)

    # ---- start and stop -------------------------------------------------------------

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[BaseException], None],
        on_trouble: Callable[[str | None], None] | None = None,
    ) -> None:
        self._loop = loop
        self._on_failure = on_failure
        self._on_trouble = on_trouble
        self._wake = self._threaded
        if self._wake and (self._open.rows or self._deferred):
            self._schedule()

    def write_now(self) -> None:
        """Commit what is pending, synchronously (start-up, shutdown); StoreFailure when
        it cannot."""
        if self._open.rows or self._retry or self._deferred:
            batches = self._pending()
            try:
                self._commit(batches)
            except (sqlite3.Error, OSError) as exc:
                raise StoreFailure(describe_failure(exc)) from exc
            self._settle(batches, None)
            self._run_callbacks()

    def flush(self) -> None:
        """Commit what is pending now, as the store thread would (tests drive durability
        by hand with a store made with threaded=False)."""
        if self._open.rows or self._retry or self._deferred:
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
        if self._committing and self.failed is None and self._loop is not None:
            done: asyncio.Future[None] = self._loop.create_future()
            self.when_durable(self._open.number - 1, lambda: done.set_result(None))
            await done
        self._wake = False
        if self.failed is None and self.trouble is None:
            self.write_now()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._reader is not self._db:
            self._reader.close()
        self._db.close()

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
        if self._committing or self.failed is not None:
            return
        if not (self._open.rows or self._retry or self._deferred):
            self._wake = True
            return
        assert self._loop is not None and self._executor is not None
        self._committing = True  # (deferred writers write while the batch is taken)
        batches = self._pending()
        weight = sum(batch.weight for batch in batches)
        if self._inline(weight):
            self._streak += 1
            failure: Exception | None = None
            try:
                self._commit(batches, checkpoint=False)
            except Exception as exc:
                failure = exc
            self._flushed(batches, failure, inline=True)
            return
        self._streak = 0
        if self.trouble is not None or not INLINE_WEIGHT < weight <= LOOP_WEIGHT:
            # all on the store thread (see the module's comment)
            future = self._loop.run_in_executor(self._executor, self._commit, batches)
        else:
            try:
                applied = self._apply(batches)
            except Exception as exc:
                self._flushed(batches, exc, inline=True)
                return
            future = self._loop.run_in_executor(self._executor, self._finish, applied)
        future.add_done_callback(lambda f: self._flushed(batches, f.exception()))

    def _inline(self, weight: int) -> bool:
        """Whether to commit batches of `weight` whole on the event loop (see the module's
        comment)."""
        return (
            self.durability == "os"
            and self.trouble is None
            and self._streak < INLINE_STREAK
            and weight <= INLINE_WEIGHT
        )

    def _flushed(
        self, batches: list[Batch], exc: BaseException | None, inline: bool = False
    ) -> None:
        """A commit ended: settle it, start the next, then run what waited for it. The next
        commit starts first, so that the store thread writes it while the loop answers
        (after an inline commit, it starts from the event loop's next turn, so that
        commits never nest)."""
        self._committing = False
        self._settle(batches, exc)
        if self.failed is not None:
            return
        assert self._loop is not None
        if self._retry:
            self._loop.call_later(RETRY_DELAY, self._start_flush)
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
            if not _transient(exc):
                self.failed = exc
                if self._on_failure is not None:
                    self._on_failure(exc)
                return
            reason = describe_failure(exc)
            if self.trouble is None:
                log.error("store commit failed (%s); retrying every %g s", reason, RETRY_DELAY)
            self.trouble = reason
            if self._on_trouble is not None:
                self._on_trouble(reason)
            self._retry = batches
            return
        if self.trouble is not None:
            log.warning("store commits again after: %s", self.trouble)
            self.trouble = None
            if self._on_trouble is not None:
                self._on_trouble(None)
        self._durable = batches[-1].number
        if self.commit_observer is not None:
            self.commit_observer(*self._last_commit)

    def _commit(self, batches: list[Batch], checkpoint: bool = True) -> None:
        """Write batches in one transaction (on the store thread, or synchronously);
        `checkpoint`: SQLite may checkpoint the WAL in this commit."""
        self._finish(self._apply(batches, checkpoint))

    def _apply(self, batches: list[Batch], checkpoint: bool = True) -> tuple[int, float]:
        """The first half of a commit: BEGIN and the batches' statements (their changes
        are in SQLite's page cache until `_finish` commits them); `checkpoint`: SQLite may
        checkpoint the WAL when they are committed. Returns the rows written and when
        this began (perf_counter), for `_finish`."""
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        db = self._db
        if checkpoint is not self._auto_checkpoint:
            db.execute(f"PRAGMA wal_autocheckpoint={AUTO_CHECKPOINT if checkpoint else 0}")
            self._auto_checkpoint = checkpoint
        started = time.perf_counter()
        if self.trouble is not None and str(self.path) != MEMORY:
            # the last commit failed: let this one reuse the WAL file's own space (a full
            # disk cannot grow it), after moving what it holds into the database
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        multi_row, row_counts = self.multi_row_inserts, self.row_counts
        rows = 0
        db.execute("BEGIN")
        try:
            for batch in batches:
                for sql, params in batch.statements:
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
        except BaseException:
            self._roll_back()
            raise
        return rows, started

    def _finish(self, applied: tuple[int, float]) -> None:
        """The second half: COMMIT what `_apply` wrote (the WAL written and, with fsync,
        synced; a checkpoint if SQLite's is due)."""
        try:
            self._db.execute("COMMIT")
        except BaseException:
            self._roll_back()
            raise
        rows, started = applied
        self.commits += 1
        self.rows_written += rows
        self._last_commit = (rows, time.perf_counter() - started)

    def _roll_back(self) -> None:
        # SQLite may have rolled back already (a full disk does): keep the first error
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    # ---- space ----------------------------------------------------------------------------

    def _free_pages(self) -> int:
        return int(self._db.execute("PRAGMA freelist_count").fetchone()[0])

    def _vacuum(self, pages: int) -> None:
        """Return up to `pages` free pages to the file system (store thread). The pragma
        frees one page per step, and a statement that yields no rows is stepped only
        once by `execute`: a script runs it to the end."""
        self._db.executescript(f"PRAGMA incremental_vacuum({pages});")

    async def checkpoint(self) -> int | None:
        """When the store is idle (the daemon calls this): return up to
        `IDLE_VACUUM_PAGES` free pages, truncate the WAL, and say how many free pages are
        left beyond the `KEEP_FREE_PAGES` kept for reuse (0: nothing more to return; None:
        skipped, a commit was under way or the store failed). The
        connections' page caches are emptied each time (the next reads fill them again)."""
        if self._committing or self.failed is not None or self._executor is None:
            return None
        assert self._loop is not None

        def run() -> int:
            surplus = self._free_pages() - KEEP_FREE_PAGES
            if surplus > 0:
                self._vacuum(min(surplus, IDLE_VACUUM_PAGES))
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            left = max(0, self._free_pages() - KEEP_FREE_PAGES)
            self._db.execute("PRAGMA shrink_memory")  # the page cache, until needed again
            return left

        self._committing = True
        self._wake = False
        try:
            left = await self._loop.run_in_executor(self._executor, run)
            if self._reader is not self._db:
                self._reader.execute("PRAGMA shrink_memory")
            return left
        except sqlite3.Error as exc:
            log.info("checkpoint skipped: %s", exc)
            return None
        finally:
            self._committing = False
            self._start_flush()

    def free_bytes(self) -> int:
        """Free space for the store: the file system's plus the store's own free pages."""
        try:
            pages = self._reader.execute("PRAGMA freelist_count").fetchone()[0]
            size = self._reader.execute("PRAGMA page_size").fetchone()[0]
            if str(self.path) == MEMORY:
                return 1 << 62
            stat = os.statvfs(Path(self.path).parent)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(describe_failure(exc)) from exc
        return int(stat.f_bavail * stat.f_frsize + pages * size)
