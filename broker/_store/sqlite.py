"""The store on SQLite: the port's implementation, how a data directory's store is opened,
and its online copy.

Theory of operation. `SQLiteStore` is the families of tables (`tables`) over the group
commit (`commit`), on one SQLite file in the data directory, `broker.db`, beside its WAL
and shared-memory index (`schema`). One batch is one SQLite transaction: one fsync with
`durability="fsync"`, none with `"os"` (then the WAL is in the OS and survives a daemon
crash but not a power cut).

Where a commit runs. It has two halves: applying the batch's statements (BEGIN and the
writes, which change SQLite's page cache only), then COMMIT, which writes the WAL, syncs
it and, when SQLite's automatic checkpoint is due, checkpoints. The store thread always
runs the COMMIT. Applying on the store thread would make it win the interpreter lock
back from a busy loop after every statement step (SQLite releases it around each),
which stretched commits several times over in a broker that also carries
broker-to-broker traffic; so the event loop applies a batch of more than `INLINE_WEIGHT`
rows and at most `LOOP_WEIGHT` (the loop never stalls for long), and the thread still
does the I/O. A light batch (a lone client's: the hop to the thread then overlaps the
loop's own work), a heavier one, and any batch while commits fail are applied on the
thread too. Between the halves the writer connection is in the middle of a transaction:
nothing else uses it until the commit ends. For the same reason the hot tables' inserts
go many rows to a statement (`commit.MULTI_ROW_INSERT`): one step per row would stretch
a commit of a few hundred rows several times over.

With `"os"`, COMMIT syncs nothing: it writes the WAL into the operating system's cache,
which takes less than the hop to the store thread and back (most of a lone client's
round trip, and a tenth of the daemon's time per message end to end). So a batch of at
most `OS_INLINE_WEIGHT` rows touched (a few hundred messages sent or received) is
committed whole on the event loop. Such commits never run SQLite's automatic
checkpoint (it would sync files on the event loop); the checkpoint runs on the store
thread, in the next commit there, and at most `INLINE_STREAK` batches, or
`INLINE_ROWS` rows, in a row are committed inline. The commit after a checkpoint
starts the WAL again, and SQLite syncs its new header then (0.2-3 ms), whatever the
durability: that commit runs on the store thread too. (Only a checkpoint writes the
database file, so its mtime and size tell that one ran.)

With `"os"` a checkpoint is due once the WAL holds `OS_AUTO_CHECKPOINT` pages, four times
SQLite's default (`AUTO_CHECKPOINT`, kept with `"fsync"`). A checkpoint syncs the WAL and
the database file whatever the durability, and the next commit waits for it; under load
most messages are inserted and deleted within one checkpoint's span, so a longer span
writes each hot page into the database once for many commits and syncs less often. With
`"fsync"` every commit syncs the WAL, and the one-at-a-time round trip measured slower
with the longer span (probably because a commit that extends the WAL file syncs its new
blocks' metadata too, and the WAL grows four times as far before it is reused), so it
keeps SQLite's. The WAL is about 12 MiB larger at most, and a crash's recovery reads it
whole. A checkpoint syncs the WAL before it copies pages into the database, and the
commit that runs it (and everything behind it) waits for that sync: with "os" that was
most of a checkpoint's time (10-25 ms for 4,000 pages). So once `WAL_SYNC_ROWS` rows have
been committed since the last time, a thread of its own syncs the WAL written so far,
while commits go on (one such sync at a time); the checkpoint's own sync then finds
about a thousand pages at most to write (2-5 ms).

A commit that fails for want of space or an I/O error is retried (see `commit`) after a
WAL checkpoint that lets it reuse the WAL file's space. The *disk reserve* (`DiskReserve`,
the daemon's `disk_reserve` setting) is a file beside the store that holds room for a
full disk: when a commit fails it is given up and the commit tried again at once, and a
store that cannot be opened for want of space is opened after giving it up (SQLite
cannot even open its shared-memory index on a disk with no room at all), so that the
daemon starts, RECEIVE and END CONVERSATION commit, and space can be freed; the daemon
makes it again once there is room for it twice over (`keep_reserve`).

Space: the file's free pages go back to the file system (`auto_vacuum = INCREMENTAL`),
but only when the daemon is idle: while busy they are only reused by the next inserts
(returning them moves live pages from the file's end, which would stall the commits of
a drain). An idle daemon calls `checkpoint` repeatedly, each call returning up to
`IDLE_VACUUM_PAGES` and truncating the WAL, until only `KEEP_FREE_PAGES` are left free
for reuse. The start-up summary of a deep backlog reads its slices of the handle range
on connections and threads of their own (SQLite releases the GIL while it steps).

`open_store` opens a data directory's store for the daemon, creating or migrating it
(`schema`), and gives a new store its broker instance id. SQLite does not always say
that a full disk is why a store cannot be opened (sizing the shared-memory file fails
as an I/O error), so when the file system is almost full the refusal names the disk,
whatever SQLite said.

`copy_store` takes SQLite's online backup in one step, so the copy is read in one read
transaction: it is the store as it was after one commit, whatever the daemon writes
meanwhile (in WAL mode its writes go on; they are simply not in the copy). The source
is opened read-only: the copy changes nothing in the store (beside a stopped broker's
store SQLite may make the WAL and its index again, as the daemon's next start would).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .._core.capacity import readable_size
from .._core.ports import Row
from .commit import Batch, Connection, Plan, apply_statements
from .errors import StoreError, StoreFailure, StoreUnavailable, describe_failure
from .port import Store
from .schema import MEMORY, READER_CACHE_KIB, WRITER_CACHE_KIB, connect, create
from .tables import MULTI_ROW, ROW_COUNTS, AllTables
from .user_tables import UserTables, add_functions

if TYPE_CHECKING:
    from .port import ManualStore

log = logging.getLogger("ssb.store")

STORE_FILE: Final = "broker.db"
# the store's files in a data directory: the database and its companions (the online copy
# reads through them)
STORE_FILES: Final = frozenset(
    {STORE_FILE, f"{STORE_FILE}-wal", f"{STORE_FILE}-shm", f"{STORE_FILE}-journal"}
)
BROKER_INSTANCE: Final = "broker_instance"  # the meta key of the broker's instance id
NEARLY_FULL: Final = 1024 * 1024  # free bytes below which a store that cannot open blames the disk
RESERVE_FILE: Final = "disk-reserve"  # the disk reserve's file in the data directory
BUSY_TIMEOUT: Final = 30.0  # seconds the online copy waits for the daemon's store (a checkpoint)
KEEP_FREE_PAGES: Final = 2048  # free pages an idle store keeps for the next inserts
IDLE_VACUUM_PAGES: Final = 8192  # free pages returned per idle checkpoint
INLINE_WEIGHT: Final = 8  # a batch touching at most this many rows is light
OS_INLINE_WEIGHT: Final = 256  # with "os", a batch of at most this many rows commits inline
INLINE_STREAK: Final = 200  # batches in a row committed inline, then one on the thread
INLINE_ROWS: Final = 4096  # rows committed inline since the last threaded commit, at most
LOOP_WEIGHT: Final = 4096  # a batch touching at most this many rows is applied on the loop
AUTO_CHECKPOINT: Final = 1000  # WAL pages that make a threaded commit checkpoint (SQLite's)
OS_AUTO_CHECKPOINT: Final = 4000  # the same with "os" (see the module's comment)
WAL_SYNC_ROWS: Final = 1024  # with "os", rows committed that make the WAL synced ahead
SUMMARY_THREADS: Final = 2  # connections (and threads) the start-up summary reads on


_LOCK_CODES: Final = frozenset(
    getattr(sqlite3, name) for name in ("SQLITE_BUSY", "SQLITE_LOCKED") if hasattr(sqlite3, name)
)


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


class DiskReserve:
    """Room held for a full disk: a file of `size` bytes beside the store (see the
    module's comment)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.given_up = False  # by this process, for want of space (not yet made again)

    def _held(self) -> int | None:
        """The bytes the file holds now (None: there is none)."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return None

    def release(self) -> bool:
        """Give the room back to the file system; whether there was any to give."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        self.given_up = True
        log.warning(
            "the disk is full: the store's reserve of %s is given up to write",
            readable_size(self.size),
        )
        return True

    def keep(self) -> str | None:
        """Make the reserve again if it is not in place and the disk has room for it twice
        over; None when it is in place, else why not, in words. One made for another
        `disk_reserve` is cut down at once, or grown when there is room (until then it
        serves as it is)."""
        held = self._held()
        if self.size == 0 or held == self.size:
            return None
        if held is not None and held > self.size:
            try:
                os.truncate(self.path, self.size)  # the rest goes back to the file system
            except OSError as exc:
                log.info("the store's disk reserve cannot be cut down: %s", exc.strerror or exc)
            return None
        stat = os.statvfs(self.path.parent)
        free = stat.f_bavail * stat.f_frsize
        if free < 2 * self.size:
            return None if held is not None else self._missing(free)
        partial = self.path.with_name(self.path.name + ".new")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)  # blocks of its own, not a sparse file
            finally:
                os.close(fd)
            os.replace(partial, self.path)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            log.info("the store's disk reserve cannot be made yet: %s", exc.strerror or exc)
            return None if held is not None else self._missing(free)
        self.given_up = False
        log.info("the store's disk reserve (%s) is in place", readable_size(self.size))
        return None

    def _missing(self, free: int) -> str:
        """Why new messages wait while there is no reserve, and what makes one."""
        room = (
            f"once the disk has {readable_size(2 * self.size)} free (it has {readable_size(free)})"
        )
        if self.given_up:
            return (
                "the disk is full: the store gave up its disk reserve to write; it is made"
                f" again {room}: free space on the disk"
            )
        return (
            f"the store's disk reserve (disk_reserve, {readable_size(self.size)}) is not in"
            f" place: it is made {room}; free space on the disk, or lower disk_reserve"
        )


class SQLiteStore(AllTables, UserTables):
    """The storage port on one SQLite file, with group commit on one background thread
    (see the module's comment)."""

    multi_row_inserts = MULTI_ROW
    row_counts = ROW_COUNTS
    _db: sqlite3.Connection
    _reader: sqlite3.Connection
    _writes: sqlite3.Cursor

    def __init__(
        self,
        path: Path | str,
        durability: str = "fsync",
        *,
        threaded: bool = True,
        reserve: DiskReserve | None = None,
    ) -> None:
        """Args:
        path: the database file (":memory:" for tests: one connection, no thread).
        durability: "fsync" or "os".
        threaded: commit on a store thread (the daemon); False commits only when
            `flush()` is called (tests drive durability by hand).
        reserve: the disk reserve beside it (None: none).
        """
        self.reserve = reserve
        memory = str(path) == MEMORY
        super().__init__(durability, threaded=threaded and not memory)
        self.path = path
        # the writer never waits for a lock (the loop applies statements on it): a
        # database that another process holds fails the commit at once, to be retried
        self._db = connect(path, WRITER_CACHE_KIB, timeout=0.0)
        create(self._db, path, durability)
        add_functions(self._db)
        # a commit's statements go through one cursor (`Connection.execute` makes one for
        # every statement: about 0.2 µs each, 4% of a small commit)
        self._writes = self._db.cursor()
        self._reader = self._db if memory else connect(path, READER_CACHE_KIB)
        self._streak = 0  # batches committed inline since the last threaded commit
        self._streak_rows = 0  # and the rows they touched
        # with "os", the WAL synced ahead of the checkpoints, on a thread of its own
        self._wal = Path(f"{path}-wal")
        self._wal_syncer = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssb-wal")
            if durability == "os" and threaded and not memory
            else None
        )
        self._unsynced_rows = 0  # rows committed since the last WAL sync began
        self._wal_syncing = False  # a WAL sync is queued or running
        # with "os", the database file's mtime and size after the last commit on the store
        # thread: when a checkpoint changed them, the next commit starts the WAL again,
        # which syncs its header, and so runs on the store thread too (`_restart_due`)
        self._written = self._stamp() if durability == "os" and not memory else None
        self._restart_due = False
        self._checkpoint_pages = OS_AUTO_CHECKPOINT if durability == "os" else AUTO_CHECKPOINT
        self._db.execute(f"PRAGMA wal_autocheckpoint={self._checkpoint_pages}")
        self._auto_checkpoint = True  # SQLite's automatic checkpoint is on

    # ---- commits --------------------------------------------------------------------------

    def _plan(self, weight: int) -> Plan:
        if self._tables_busy():
            return Plan.THREAD  # after the users' table statements (see `user_tables`)
        if (
            self.durability == "os"
            and self.trouble is None
            and weight <= OS_INLINE_WEIGHT
            and self._streak < INLINE_STREAK
            and self._streak_rows + weight <= INLINE_ROWS
            and not self._restart_due
        ):
            self._streak += 1
            self._streak_rows += weight
            return Plan.INLINE
        self._streak = self._streak_rows = 0
        if self.trouble is not None or not INLINE_WEIGHT < weight <= LOOP_WEIGHT:
            return Plan.THREAD
        return Plan.LOOP

    def _transient(self, exc: BaseException) -> bool:
        return _transient(exc)

    def _abandonable(self, exc: BaseException) -> bool:
        """No space or an I/O error; not a lock another process holds (that passes)."""
        code = getattr(exc, "sqlite_errorcode", None)
        return code is None or code & 0xFF not in _LOCK_CODES

    def _make_room(self) -> bool:
        return self.reserve is not None and self.reserve.release()

    def keep_reserve(self) -> str | None:
        return None if self.reserve is None else self.reserve.keep()

    def _commit(self, batches: list[Batch], checkpoint: bool = True) -> None:
        self._finish(self._apply(batches, checkpoint))

    def _apply(self, batches: list[Batch], checkpoint: bool = True) -> tuple[int, float]:
        """The first half of a commit: BEGIN and the batches' statements (their changes
        are in SQLite's page cache until `_finish` commits them); `checkpoint`: SQLite may
        checkpoint the WAL when they are committed. Returns the rows written and when
        this began (perf_counter), for `_finish`."""
        self._injected_failure()
        kept = self._kept_writes(batches)  # (None: no open transaction is left)
        db = self._writes
        if checkpoint is not self._auto_checkpoint:
            db.execute(f"PRAGMA wal_autocheckpoint={self._checkpoint_pages if checkpoint else 0}")
            self._auto_checkpoint = checkpoint
        started = time.perf_counter()
        if self.trouble is not None and str(self.path) != MEMORY:
            # the last commit failed: let this one reuse the WAL file's own space (a full
            # disk cannot grow it), after moving what it holds into the database
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        if kept is None:
            db.execute("BEGIN")
        try:
            rows = apply_statements(
                db, batches, self.multi_row_inserts, self.row_counts, kept or frozenset()
            )
        except BaseException:
            self._roll_back()
            raise
        return rows, started

    def _finish(self, applied: tuple[int, float]) -> None:
        """The second half: COMMIT what `_apply` wrote (the WAL written and, with fsync,
        synced; a checkpoint if SQLite's is due)."""
        try:
            self._writes.execute("COMMIT")
        except BaseException:
            self._roll_back()
            raise
        self._committed(*applied)
        if self._auto_checkpoint and self._written is not None:
            # a commit that may checkpoint (only a checkpoint writes the database file)
            stamp = self._stamp()
            self._restart_due = stamp != self._written
            self._written = stamp
        if self._wal_syncer is not None:
            self._unsynced_rows += applied[0]
            if self._unsynced_rows >= WAL_SYNC_ROWS and not self._wal_syncing:
                self._unsynced_rows = 0
                self._wal_syncing = True
                self._wal_syncer.submit(self._sync_wal)

    def _stamp(self) -> tuple[int, int]:
        """The database file's mtime and size ((-1, -1) when it cannot be read: the commit
        has happened, so this must not fail it)."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return -1, -1
        return stat.st_mtime_ns, stat.st_size

    def _sync_wal(self) -> None:
        """With "os", on the WAL's own thread: sync the WAL written so far, so that the
        next checkpoint, which syncs it first, finds little left to write (the commit that
        checkpoints, and what waits for it, wait for that sync)."""
        try:
            fd = os.open(self._wal, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            pass  # no WAL yet
        except OSError as exc:
            log.warning("the WAL could not be synced ahead of its checkpoint: %s", exc)
        finally:
            self._wal_syncing = False

    def _roll_back(self) -> None:
        # SQLite may have rolled back already (a full disk does): keep the first error
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def _release(self) -> None:
        if self._wal_syncer is not None:
            self._wal_syncer.shutdown(wait=True)
        if self._reader is not self._db:
            self._reader.close()
        self._db.close()

    def _run_slices(
        self, read: Callable[[Connection, Any], list[Row]], parts: Sequence[Any]
    ) -> list[Row]:
        """The start-up summary's slices, each on a connection and thread of its own."""
        if str(self.path) == MEMORY or len(parts) <= 1:
            return super()._run_slices(read, parts)
        workers = min(SUMMARY_THREADS, os.cpu_count() or 1)
        connections = [connect(self.path, READER_CACHE_KIB) for _ in range(workers)]
        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="ssb-start") as pool:
                slices = pool.map(
                    lambda i: [
                        row for part in parts[i::workers] for row in read(connections[i], part)
                    ],
                    range(workers),
                )
                return [row for rows in slices for row in rows]
        finally:
            for db in connections:
                db.close()

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
            self._end_provisional()
            surplus = self._free_pages() - KEEP_FREE_PAGES
            if surplus > 0:
                self._vacuum(min(surplus, IDLE_VACUUM_PAGES))
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            self._restart_due = True  # (the WAL is empty)
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


def open_store(data_dir: Path, durability: str, reserve: int = 0) -> Store:
    """The store of a data directory, created (with a new broker instance id in its meta
    value `broker_instance`) or migrated if need be, not yet attached.

    Args:
        data_dir: an existing directory that this process has locked for itself.
        durability: "fsync" (every commit synced) or "os" (left to the OS).
        reserve: bytes of the disk reserve (0: none); given up if the store cannot be
            opened without it.

    Raises:
        StoreUnavailable: the store cannot be opened; the message says why (a full disk
            by name) and what to do.
    """
    room = DiskReserve(data_dir / RESERVE_FILE, reserve) if reserve else None
    if room is None and (data_dir / RESERVE_FILE).exists():
        (data_dir / RESERVE_FILE).unlink()  # disk_reserve = 0: the room goes back too
        log.info("the store's disk reserve is removed (disk_reserve = 0)")
    for last in (room is None, True):
        try:
            store = SQLiteStore(data_dir / STORE_FILE, durability, reserve=room)
            if BROKER_INSTANCE not in store.load_meta():
                store.put_meta(BROKER_INSTANCE, str(uuid.uuid4()))
                store.write_now()
            return store
        except (StoreFailure, sqlite3.Error, OSError) as exc:
            if last or room is None or not room.release():
                cause = exc.__cause__ if isinstance(exc, StoreFailure) else exc
                raise StoreUnavailable(_cannot_open(data_dir, cause or exc)) from None
    raise AssertionError("unreachable")


def _cannot_open(data_dir: Path, exc: BaseException) -> str:
    """One line for a store that cannot be opened (see the module's comment)."""
    text = str(exc)
    try:
        stat = os.statvfs(data_dir)
        free_bytes: int | None = stat.f_bavail * stat.f_frsize
    except OSError:
        free_bytes = None
    full = (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "full" in text.lower()
    if full or (free_bytes is not None and free_bytes < NEARLY_FULL):
        free = "no space" if free_bytes is None else f"{readable_size(free_bytes)} free"
        return (
            f"cannot start: the disk holding {data_dir} is full ({free}; SQLite said: {text});"
            " free some space and start again"
        )
    return f"cannot open the store in {data_dir}: {text}"


def copy_store(source: Path, target: Path) -> None:
    """Copy the store file `source`, running or stopped, into the file `target` as it
    was after one commit (see the module's comment).

    Args:
        source: a data directory's STORE_FILE.
        target: a new, empty file (made beforehand, so that it has the right mode).

    Raises:
        StoreError: the store cannot be read, or the copy written.
    """
    uri = f"{source.resolve().as_uri()}?mode=ro"
    try:
        reader = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT)
        try:
            copy = sqlite3.connect(target)
            try:
                reader.backup(copy)  # all pages in one step: one snapshot
            finally:
                copy.close()
        finally:
            reader.close()
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from None


if TYPE_CHECKING:

    def _made_for_tests(store: SQLiteStore) -> ManualStore:
        """A store made with threaded=False is what the shared store tests drive (mypy
        checks this assignment; `open_store` checks the port itself)."""
        return store
