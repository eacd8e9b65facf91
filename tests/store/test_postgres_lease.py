"""The lease on a PostgreSQL database (broker/_store/lease.py), on the session's real
server: a takeover fences the old holder's commits, a holder whose deadline has passed
is ended, and so is whoever sits on the lock without the lease."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from pg_server import PostgresServer, fresh_database

from ssb.broker._store import lease_lost
from ssb.broker._store.lease import DatabaseLease, Holder
from ssb.broker._store.postgres import PostgresStore
from ssb.broker._store.postgres_schema import BROKER_LOCK

from .rows import message


@pytest.fixture
def database(postgres_server: PostgresServer) -> str:
    return fresh_database(postgres_server.url)


class Held:
    """A fence for a store made by hand: the epoch a lease gave."""

    def __init__(self, epoch: int, node: str) -> None:
        self.epoch = epoch
        self.node = node

    def held(self) -> bool:
        return True


def _take_when_free(lease: DatabaseLease, duration: float, deadline: float) -> int:
    """Try the lease until it is taken (bounded by `deadline`, monotonic)."""
    while True:
        taken = lease.take(duration)
        if isinstance(taken, int):
            return taken
        assert time.monotonic() < deadline, f"not taken; held by {taken}"
        time.sleep(0.05)


def test_a_takeover_fences_the_old_holders_commits(database: str) -> None:
    first = DatabaseLease(database, "first", "tests", 5.0)
    epoch = first.take(60.0)
    assert isinstance(epoch, int)
    store = PostgresStore(database, "fsync", Held(epoch, "first"), threaded=False)
    second = DatabaseLease(database, "second", "tests", 5.0)
    try:
        handle = uuid.uuid4()
        store.insert_message(message(1, handle))
        store.flush()
        assert store.failed is None and store.durable == 1
        assert isinstance(second.take(60.0), Holder)  # the first holds it, live
        first.close()  # its lease session ends: the lock is free, the deadline is not
        taken = _take_when_free(second, 60.0, time.monotonic() + 10)
        assert taken == epoch + 1
        ran: list[int] = []
        store.insert_message(message(2, handle))
        store.when_durable(store.watermark(), lambda: ran.append(2))
        store.flush()  # the takeover ended its writer session: a lost connection ...
        assert store.failed is None and store.trouble is not None
        store.flush()  # ... and on a new one the fence refuses the commit, for good
        assert store.failed is not None and lease_lost(store.failed), store.failed
        assert ran == []  # nothing acknowledged
        with psycopg.connect(database, autocommit=True) as db:
            rows = db.execute("SELECT queuing_order FROM messages ORDER BY 1").fetchall()
        assert rows == [(1,)]  # the fenced commit wrote nothing
    finally:
        store._release()
        second.close()


def test_a_holder_past_its_deadline_and_a_lock_without_the_lease_are_ended(
    database: str,
) -> None:
    first = DatabaseLease(database, "first", "tests", 5.0)
    assert first.take(1.0) == 1
    first.close()  # as if it died: its lock is freed ...
    # ... and a frozen standby took the lock, but not the lease
    stuck = psycopg.connect(database, autocommit=True, application_name="ssb lease stuck")
    stuck.execute("SELECT pg_advisory_lock(%s)", (BROKER_LOCK,))
    third = DatabaseLease(database, "third", "tests", 5.0)
    try:
        deadline = time.monotonic() + 30
        assert _take_when_free(third, 1.0, deadline) == 2
        assert stuck.broken or stuck.closed or _ended(stuck)
    finally:
        stuck.close()
        third.close()


def _ended(conn: psycopg.Connection[object]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False
