"""The lease on a PostgreSQL database: which of the daemons sharing it serves.

Theory of operation. Several daemons may be given one database; they are one broker, and
one of them serves: the one that holds the *lease*, the row of `broker_lease`. The row
has an *epoch*, bumped by every takeover, the holder's node id, and a deadline
(`expires`) that the holder pushes forward with each renewal. Every time is the database
server's clock, so that daemons on machines whose clocks differ judge one deadline.

Two things tell a standby that the holder is gone, and both are needed:

- the advisory lock BROKER_LOCK, which the holder's lease session holds for as long as
  it lives: when the holder dies, the server ends its session and the lock is free at
  once (a takeover within a poll of a kill -9);
- the deadline: a holder that is frozen (SIGSTOP, a paused virtual machine) or cut off
  from the database keeps its TCP connection open in the kernel, and with it the lock;
  once its deadline has passed the standby ends the holder's sessions on the server
  (`pg_terminate_backend`), and whichever session holds the lock (a standby may have
  taken the lock and frozen before it took the lease), which frees the lock.

A takeover (`take`) happens only on the lock: with it, the standby ends what is left of
the old holder's sessions and bumps the epoch with `SELECT ... FOR UPDATE` then
`UPDATE`. That is what fences the old holder: every commit begins with
`ssb_fence(epoch)`, which holds the lease row in KEY SHARE mode and fails unless the
epoch is still the committer's. A commit already past its fence holds the row, so the
takeover waits for it to end (a frozen one is ended with its session); a commit that
comes later waits for the takeover, then finds the epoch moved on and fails. The new
holder reads the broker's state only after its takeover has committed: it sees every
commit the old holder made, and the old holder can make none after.

Renewal (`renew`) is an UPDATE of the deadline where the epoch is still the renewer's (a
NO KEY UPDATE lock: it never waits for the holder's own commits); no row updated means
the lease has passed to another. The holder also judges its lease by its own monotonic
clock (see `broker/_lease.py`): the deadline on the server is at least the duration
after the renewal was sent, so a holder that stops when its own clock says so has
stopped before any standby can think the lease expired.

`broker_nodes` holds one row per daemon (its node id, what it is called, its role, when
it was last seen), for `ssb diagnose`, the dashboard and the `broker_nodes` view.
Everything here is synchronous (psycopg's blocking API) and runs on a thread of its own
(see `broker/_lease.py`); its session is apart from the store's reader and writer.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Final

import psycopg

from . import postgres_schema
from .errors import StoreError, StoreUnavailable, describe_failure
from .postgres import DatabaseInUse, Session, cannot_open, describe_url

TAKE_LOCK_TIMEOUT: Final = "2s"  # how long a takeover waits for an old commit to end
_TRY_LOCK: Final = "SELECT pg_try_advisory_lock(?)"
_READ: Final = (
    "SELECT epoch, holder, expires > clock_timestamp(),"
    " CASE WHEN isfinite(renewed) THEN extract(epoch FROM clock_timestamp() - renewed) END"
    " FROM broker_lease WHERE id = 1"
)
_HOLD: Final = "SELECT epoch FROM broker_lease WHERE id = 1 FOR UPDATE"
_TAKE: Final = (
    "UPDATE broker_lease SET epoch = epoch + 1, holder = ?,"
    " expires = clock_timestamp() + make_interval(secs => ?), renewed = clock_timestamp(),"
    " taken = clock_timestamp() WHERE id = 1 RETURNING epoch"
)
_RENEW: Final = (
    "UPDATE broker_lease SET expires = clock_timestamp() + make_interval(secs => ?),"
    " renewed = clock_timestamp() WHERE id = 1 AND epoch = ?"
)
_RENEW_RETURNING: Final = _RENEW + " RETURNING epoch"
_RELEASE: Final = (
    "UPDATE broker_lease SET expires = '-infinity' WHERE id = 1 AND epoch = ? AND holder = ?"
)
# the sessions of a node: every one of its sessions names it (see `session_name`)
_END_NODE: Final = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND application_name LIKE 'ssb %' AND split_part(application_name, ' ', 3) = ?"
)
# whoever holds BROKER_LOCK (a holder whose deadline has passed, or a standby that took
# the lock and froze before it took the lease): the lock's key is split in two oids
_END_LOCKER: Final = (
    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND classid::bigint = ? AND objid::bigint = ? AND objsubid = 1"
    " AND pid <> pg_backend_pid()"
)
_SEEN: Final = (
    "INSERT INTO broker_nodes (node, name, role, pid, address, started, seen)"
    " VALUES (?, ?, ?, ?, ?, clock_timestamp(), clock_timestamp())"
    " ON CONFLICT (node) DO UPDATE SET role = excluded.role, address = excluded.address,"
    " seen = excluded.seen"
)
_NODES: Final = (
    "SELECT node, name, role, pid, address, extract(epoch FROM started),"
    " extract(epoch FROM clock_timestamp() - seen) FROM broker_nodes ORDER BY started"
)
_FORGET_NODES: Final = (
    "DELETE FROM broker_nodes WHERE seen < clock_timestamp() - make_interval(secs => ?)"
)
_INSTANCE: Final = "SELECT value FROM meta WHERE key = ?"
_FILES: Final = "SELECT name, body FROM broker_files"
NODE_MEMORY: Final = 86400.0  # seconds a node not seen since is forgotten


def session_name(role: str, node: str) -> str:
    """The application_name of a node's session in `role`: "ssb ROLE NODE"."""
    return f"{role} {node}"


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the lease, as a standby sees it."""

    epoch: int
    node: str  # "" before any daemon has held it
    live: bool  # its deadline has not passed
    renewed_age: float | None  # seconds since its last renewal (None: never renewed)


@dataclass(frozen=True, slots=True)
class Node:
    """A daemon that has used the database (a row of `broker_nodes`)."""

    node: str
    name: str
    role: str
    pid: int
    address: str
    started: float  # seconds since the epoch
    seen_age: float  # seconds since it was last seen


class DatabaseLease:
    """The lease, through a session of its own (see the module's comment).

    `DatabaseLease(url, node)` connects (its schema and the broker's instance id made if
    need be); `take`, `renew`, `release`, `seen` and `nodes` are one or a few round
    trips each, on whichever thread calls them (one at a time: each holds `guard`).

    Raises:
        StoreUnavailable: the database cannot be used (the message says why).
    """

    def __init__(self, url: str, node: str, name: str, timeout: float) -> None:
        self.url = url
        self.where = describe_url(url)
        self.node = node
        self.name = name
        self.timeout = timeout  # seconds a round trip may take before the session is lost
        self.locked = False  # this session holds BROKER_LOCK
        self.guard = threading.Lock()
        try:
            self.session = Session(url, session_name("lease", node), keepalive=timeout)
            try:
                postgres_schema.create(self.session.conn, self.where)
                postgres_schema.make_identity(self.session.conn)
                row = self.session.execute(_INSTANCE, (postgres_schema.BROKER_INSTANCE,))
                self.instance = str(row.fetchone()[0])  # the broker's instance id
            except BaseException:
                self.session.close()
                raise
        except psycopg.Error as exc:
            raise StoreUnavailable(cannot_open(self.where, exc)) from None

    # ---- round trips ------------------------------------------------------------------

    def _connected(self) -> Session:
        """The session, connected again if it was lost (and then without the lock)."""
        if self.session.broken:
            self.locked = False
            self.session.reconnect()
        return self.session

    def _lock(self) -> bool:
        if not self.locked:
            row = self._connected().execute(_TRY_LOCK, (postgres_schema.BROKER_LOCK,))
            self.locked = bool(row.fetchone()[0])
        return self.locked

    def holder(self) -> Holder:
        """Who holds the lease now."""
        with self.guard:
            return self._holder()

    def _holder(self) -> Holder:
        epoch, node, live, age = self._connected().execute(_READ).fetchone()
        return Holder(int(epoch), str(node), bool(live), None if age is None else float(age))

    def take(self, duration: float) -> int | Holder:
        """One attempt at the lease for `duration` seconds: the new epoch, or who holds it.

        A holder whose deadline has passed has its sessions ended here, so that a later
        attempt finds the lock free.

        Raises:
            psycopg.Error: the database failed (a lost connection: try again).
        """
        with self.guard:
            if not self._lock():
                holder = self._holder()
                if not holder.live and holder.node != self.node:
                    if holder.node:
                        self._end_node(holder.node)
                    key = postgres_schema.BROKER_LOCK
                    self._connected().execute(_END_LOCKER, (key >> 32, key & 0xFFFF_FFFF))
                return holder
            session = self._connected()
            holder = self._holder()
            if holder.node and holder.node != self.node:
                self._end_node(holder.node)  # what is left of it: a late commit is ended
            conn = session.conn
            with conn.transaction():
                session.execute(f"SET LOCAL lock_timeout = '{TAKE_LOCK_TIMEOUT}'")
                session.execute(_HOLD).fetchone()
                (epoch,) = session.execute(_TAKE, (self.node, duration)).fetchone()
            return int(epoch)

    def renew(self, epoch: int, duration: float) -> bool:
        """Push the deadline of lease `epoch` `duration` seconds past now; False when the
        lease has passed to another."""
        with self.guard:
            session = self._connected()
            if not self.locked:
                self._lock()  # after a lost connection: keep others from taking it early
            renewed = session.execute(_RENEW_RETURNING, (duration, epoch)).fetchone()
            return renewed is not None

    def release(self, epoch: int) -> None:
        """Give the lease up at once (a clean stop): a standby takes over at its next
        poll, not after the deadline."""
        with self.guard, contextlib.suppress(psycopg.Error):
            self._connected().execute(_RELEASE, (epoch, self.node))
            if self.locked:
                self.session.execute(
                    "SELECT pg_advisory_unlock(?)", (postgres_schema.BROKER_LOCK,)
                ).fetchone()
                self.locked = False

    def _end_node(self, node: str) -> None:
        """End every session of daemon `node` on the server (its transactions roll back
        unless they had committed already)."""
        self._connected().execute(_END_NODE, (node,)).fetchall()

    def seen(self, role: str, address: str) -> None:
        """Note that this daemon is alive, in `role`, reachable at `address`."""
        with self.guard:
            self._connected().execute(_SEEN, (self.node, self.name, role, os.getpid(), address))

    def nodes(self) -> list[Node]:
        """Every daemon that has used the database lately, oldest first."""
        with self.guard:
            session = self._connected()
            session.execute(_FORGET_NODES, (NODE_MEMORY,))
            rows = session.execute(_NODES).fetchall()
        return [
            Node(str(n), str(name), str(r), int(p), str(a), float(s), float(age))
            for n, name, r, p, a, s, age in rows
        ]

    def load_broker_files(self) -> dict[str, str]:
        """The broker's files kept in the store (see `broker/_broker_files.py`), for a
        standby's HTTPS port."""
        with self.guard:
            return dict(self._connected().execute(_FILES).fetchall())

    def close(self) -> None:
        with self.guard, contextlib.suppress(psycopg.Error):
            self.session.close()


def take_now(url: str, node: str, duration: float) -> tuple[DatabaseLease, int]:
    """The lease taken at once, for a store opened outside a daemon (tools, tests).

    Raises:
        DatabaseInUse: a daemon holds it.
        StoreUnavailable: the database cannot be used.
    """
    lease = DatabaseLease(url, node, f"{os.uname().nodename} pid {os.getpid()}", duration)
    try:
        taken = lease.take(duration)
    except psycopg.Error as exc:
        lease.close()
        raise StoreError(describe_failure(exc)) from exc
    if isinstance(taken, Holder):
        lease.close()
        raise DatabaseInUse(
            f"another ssb daemon is serving the store {lease.where} (node {taken.node});"
            " stop it, or give this one another database"
        )
    return lease, taken
