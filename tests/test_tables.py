"""Users' tables on a live daemon, from Python: statements in the session's transaction,
committed or rolled back with RECEIVE and SEND, isolation by table locks, permissions,
and what outlives a kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from daemon import BrokerProcess
from setup_objects import new_logins

from ssb import client

PASSWORD = "a-long-password"

# a broker on which a statement gives up waiting for a lock after a second
impatient = pytest.mark.parametrize(
    "broker_settings", [{"config": {"statement_timeout": 1}}], indirect=True, ids=["timeout=1"]
)


@pytest.fixture
def broker_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The broker's settings: the defaults, or those a test names (`impatient`)."""
    return getattr(request, "param", {})


@contextlib.asynccontextmanager
async def two_sessions(
    broker: BrokerProcess,
) -> AsyncIterator[tuple[client.Connection, client.Connection]]:
    """Two connections of the admin login to `broker`, closed on exit."""
    async with (
        await client.connect(broker.url) as first,
        await client.connect(broker.url) as second,
    ):
        yield first, second


async def _queue_and_service(conn: client.Connection) -> None:
    await conn.create_queue("Q")
    await conn.create_service("S", queue="Q", contracts=["DEFAULT"])


async def test_table_statements_answer_and_commit_with_the_messages(
    broker: BrokerProcess,
) -> None:
    async with await client.connect(broker.url) as conn:
        await _queue_and_service(conn)
        await conn.execute(
            "CREATE TABLE dbo.Orders (id INT IDENTITY(1,1) PRIMARY KEY,"
            " conversation_group_id UNIQUEIDENTIFIER NOT NULL, body NVARCHAR(100) NOT NULL,"
            " CONSTRAINT uq_body UNIQUE (body))"
        )
        handle = await conn.begin_dialog("S", "S")
        await conn.send(handle, "DEFAULT", b"one")
        async with conn.transaction():
            [message] = await conn.receive("Q", timeout=5)
            inserted = await conn.execute(
                "INSERT INTO Orders (conversation_group_id, body) OUTPUT inserted.id"
                " VALUES (@g, @body)",
                g=message.conversation_group_id,
                body=message.message_body.decode(),
            )
            assert inserted.columns == ("id",) and inserted.rows == [(1,)]
            assert (await conn.execute("SELECT COUNT(*) FROM Orders")).scalar() == 1
            await conn.send(message.conversation_handle, "DEFAULT", b"reply")
        rows = await conn.execute("SELECT id, body FROM dbo.Orders ORDER BY id")
        assert rows.rows == [(1, "one")] and rows.rowcount == 1
        # a rollback takes the row back with the RECEIVE
        await conn.send(handle, "DEFAULT", b"two")
        await conn.begin_transaction()
        got = await conn.receive("Q", timeout=5)
        assert [m.message_body for m in got] == [b"reply"]  # the initiator's group
        changed = await conn.execute(
            "INSERT INTO Orders (conversation_group_id, body) VALUES (@p1, @p2), (@p1, @p3)",
            got[0].conversation_group_id,
            "two",
            "three",
        )
        assert changed.rowcount == 2
        await conn.rollback()
        assert (await conn.execute("SELECT COUNT(*) FROM Orders")).scalar() == 1
        again = await conn.receive("Q", timeout=5)
        assert [m.message_body for m in again] == [b"reply"]  # it came back
        # a failed statement changes nothing; the transaction goes on
        await conn.begin_transaction()
        await conn.execute("UPDATE Orders SET body = 'uno' WHERE id = 1")
        with pytest.raises(client.SqlError, match="UNIQUE constraint failed"):
            await conn.execute(
                "INSERT INTO Orders (conversation_group_id, body) VALUES (NEWID(), 'uno')"
            )
        await conn.save_transaction("before")
        await conn.execute("DELETE FROM Orders")
        await conn.rollback_to_savepoint("before")
        await conn.commit()
        assert (await conn.execute("SELECT body FROM Orders")).rows == [("uno",)]
        broker.restart()  # kill -9: what was acknowledged stays
        assert (await conn.execute("SELECT body FROM Orders")).rows == [("uno",)]


async def test_what_is_refused_is_refused_clearly(conn: client.Connection) -> None:
    for sql, words in [
        ("MERGE INTO t USING u ON t.a = u.a WHEN MATCHED THEN DELETE;", "THEN DELETE in MERGE"),
        ("SELECT * FROM sys.tables", "catalog view sys.tables in a statement sent to the broker"),
        ("SELECT * FROM #work", "no such table: #work"),
        ("CREATE TABLE ##everyone (a INT)", "global temporary table"),
        ("SELECT a INTO Copy FROM t", "SELECT ... INTO #name"),
        ("SELECT 1; SELECT 2", "one statement per call"),
        ("SELECT MY_FUNCTION(a) FROM t", "the function MY_FUNCTION"),
        ('CREATE TABLE "broker:x" (a INT)', "not a regular identifier"),
        ("CREATE TABLE other.dbo.t (a INT)", "another database"),
        ("SELECT * FROM nowhere", "no such table: nowhere"),
        ("CREATE TABLE t (a GEOGRAPHY)", "GEOGRAPHY"),
        ("CREATE TABLE #t (a INT REFERENCES t (a))", "a FOREIGN KEY on or to a temporary table"),
    ]:
        with pytest.raises(client.SqlError, match=words):
            await conn.execute(sql)
    with pytest.raises(client.InvalidArgumentError, match="values are numbers"):
        await conn.execute("SELECT @p1", [1])
    with pytest.raises(client.SqlError, match="@p2, which was not given a value"):
        await conn.execute("SELECT @p1 + @p2", 1)


@impatient
async def test_a_table_locked_by_a_transaction_waits_for_its_commit(broker: BrokerProcess) -> None:
    async with two_sessions(broker) as (first, second):
        await first.execute("CREATE TABLE Totals (id INT PRIMARY KEY, total INT NOT NULL)")
        await first.execute("INSERT INTO Totals VALUES (1, 0)")
        await first.begin_transaction()
        await first.execute("UPDATE Totals SET total = total + 5 WHERE id = 1")
        with pytest.raises(client.LockTimeoutError, match="statement_timeout"):
            await second.execute("SELECT total FROM Totals")
        await first.commit()
        assert (await second.execute("SELECT total FROM Totals")).scalar() == 5
        # a reader's shared lock keeps writers out until it ends, not other readers
        await second.begin_transaction()
        assert (await second.execute("SELECT total FROM Totals")).scalar() == 5
        assert (await first.execute("SELECT total FROM Totals")).scalar() == 5
        with pytest.raises(client.LockTimeoutError, match="statement_timeout"):
            await first.execute("UPDATE Totals SET total = 0")
        await second.commit()
        await first.execute("UPDATE Totals SET total = 0")


async def test_transactions_waiting_for_each_other_end_in_a_deadlock_error(
    broker: BrokerProcess,
) -> None:
    async with two_sessions(broker) as (first, second):
        await first.execute("CREATE TABLE A (x INT)")
        await first.execute("CREATE TABLE B (x INT)")
        await first.begin_transaction()
        await second.begin_transaction()
        await first.execute("INSERT INTO A VALUES (1)")
        await second.execute("INSERT INTO B VALUES (2)")
        # whichever comes second closes the cycle, and fails at once
        statements = {
            asyncio.ensure_future(first.execute("INSERT INTO B VALUES (1)")): first,
            asyncio.ensure_future(second.execute("INSERT INTO A VALUES (2)")): second,
        }
        done, pending = await asyncio.wait(statements, return_when=asyncio.FIRST_COMPLETED)
        [failed] = done
        with pytest.raises(client.LockTimeoutError, match="deadlock"):
            failed.result()
        await statements[failed].rollback()
        [winner] = pending
        await winner
        await statements[winner].commit()
        rows = (await first.execute("SELECT x FROM A UNION ALL SELECT x FROM B")).rows
        assert sorted(rows) == ([(1,), (1,)] if statements[winner] is first else [(2,), (2,)])


async def _waits_for_a_commit_that_breaks_its_key(
    holder: client.Connection, held: str, waiter: client.Connection, waiting: str
) -> None:
    """Each in a transaction, `holder` runs `held`; then `waiter`'s `waiting` waits for the
    end of the holder's transaction (giving up at the statement timeout), and run while the
    holder commits, fails on the foreign key. The waiter's transaction is rolled back."""
    await holder.begin_transaction()
    await waiter.begin_transaction()
    await holder.execute(held)
    with pytest.raises(client.LockTimeoutError, match="statement_timeout"):
        await waiter.execute(waiting)
    waited = asyncio.ensure_future(waiter.execute(waiting))
    await holder.commit()
    with pytest.raises(client.SqlError, match="FOREIGN KEY"):
        await waited  # (it ran after the holder committed)
    await waiter.rollback()


@impatient
async def test_a_foreign_key_locks_the_table_it_refers_to_and_those_referring(
    broker: BrokerProcess,
) -> None:
    """A statement on a table checks (or changes) the rows of the tables its foreign keys
    connect it to: they are locked too, so that its run at commit finds what its first
    run found, and a transaction that would break another's key waits for it."""
    async with two_sessions(broker) as (first, second):
        await first.execute("CREATE TABLE Parent (id INT PRIMARY KEY)")
        await first.execute(
            "CREATE TABLE Child (id INT PRIMARY KEY, parent INT NOT NULL,"
            " CONSTRAINT to_parent FOREIGN KEY (parent) REFERENCES Parent (id))"
        )
        await first.execute("INSERT INTO Parent VALUES (1), (2)")
        with pytest.raises(client.SqlError, match="FOREIGN KEY"):
            await first.execute("INSERT INTO Child VALUES (1, 3)")
        # a parent's DELETE first: a child's INSERT waits for its end
        await _waits_for_a_commit_that_breaks_its_key(
            first, "DELETE FROM Parent WHERE id = 1", second, "INSERT INTO Child VALUES (1, 1)"
        )
        # a child's INSERT first: the parent's DELETE waits for its end
        await _waits_for_a_commit_that_breaks_its_key(
            second, "INSERT INTO Child VALUES (2, 2)", first, "DELETE FROM Parent WHERE id = 2"
        )
        rows = await first.execute(
            "SELECT p.id, c.id FROM Parent p JOIN Child c ON c.parent = p.id"
        )
        assert rows.rows == [(2, 2)]
    assert "Traceback" not in broker.log_text()


async def test_who_may_create_and_use_a_table(broker: BrokerProcess) -> None:
    async with new_logins(broker, PASSWORD, "owner", "reader") as (admin, owner, reader):
        with pytest.raises(client.PermissionDeniedError, match="CREATE on database"):
            await owner.execute("CREATE TABLE T (a INT)")
        await admin.grant("CREATE", "owner", kind="database", name="master")
        await owner.execute("CREATE TABLE T (a INT)")
        await owner.execute("INSERT INTO T VALUES (1)")
        with pytest.raises(client.PermissionDeniedError, match="SELECT on table"):
            await reader.execute("SELECT a FROM T")
        await owner.grant("SELECT", "reader", kind="table", name="T")
        assert (await reader.execute("SELECT a FROM t")).rows == [(1,)]
        with pytest.raises(client.PermissionDeniedError, match="INSERT on table"):
            await reader.execute("INSERT INTO T VALUES (2)")
        owners = [r for r in await admin.view("permissions") if r["kind"] == "table"]
        assert {(r["login"], r["permission"], r["name"]) for r in owners} == {
            ("owner", "CONTROL", "t"),
            ("reader", "SELECT", "t"),
        }


async def test_tables_live_in_their_database(broker: BrokerProcess) -> None:
    async with await client.connect(broker.url) as conn:
        await conn.execute("CREATE TABLE T (a INT)")
        await conn.execute("INSERT INTO T VALUES (1)")
        await conn.create_database("Sales")
        await conn.use("Sales")
        with pytest.raises(client.SqlError, match="no such table: t"):
            await conn.execute("SELECT a FROM T")
        await conn.execute("CREATE TABLE T (b NVARCHAR(10))")
        await conn.execute("INSERT INTO T VALUES ('x')")
        assert (await conn.execute("SELECT * FROM T")).rows == [("x",)]
        await conn.use("master")
        assert (await conn.execute("SELECT * FROM T")).rows == [(1,)]


def test_the_blocking_client_runs_table_statements(broker: BrokerProcess) -> None:
    conn = client.connect_sync(broker.url)
    try:
        conn.execute("CREATE TABLE Kv (k UNIQUEIDENTIFIER PRIMARY KEY, v VARBINARY(MAX))")
        key = uuid.uuid4()
        assert conn.execute("INSERT INTO Kv VALUES (@p1, @p2)", key, b"\x00\x01").rowcount == 1
        assert conn.execute("SELECT v FROM Kv WHERE k = @k", k=key).scalar() == b"\x00\x01"
        rows = [(uuid.uuid4(), b"%d" % i) for i in range(3)]
        assert conn.executemany("INSERT INTO Kv VALUES (@p1, @p2)", rows).rowcount == 3
    finally:
        conn.close()


async def test_executemany_runs_a_statement_per_row_in_one_request(
    conn: client.Connection,
) -> None:
    await conn.execute("CREATE TABLE Seen (k BIGINT PRIMARY KEY, body VARBINARY(MAX))")
    insert = "INSERT INTO Seen (k, body) VALUES (@p1, @p2)"
    async with conn.transaction():
        done = await conn.executemany(insert, [(k, b"%d" % k) for k in range(300)])
        assert done.rowcount == 300
        # one failed row: none of the rows is applied, and the transaction goes on
        with pytest.raises(client.SqlError, match="UNIQUE"):
            await conn.executemany(insert, [(1000, b""), (5, b"again")])
        changed = await conn.executemany(
            "UPDATE Seen SET body = @body WHERE k = @k",
            [{"k": 1, "body": b"one"}, {"k": 9999, "body": b""}],
        )
        assert changed.rowcount == 1 and (await conn.executemany(insert, [])).rowcount == 0
    assert (await conn.execute("SELECT COUNT(*), SUM(k) FROM Seen")).rows == [(300, 44850)]
    assert (await conn.execute("SELECT body FROM Seen WHERE k = 1")).scalar() == b"one"
    with pytest.raises(client.SqlError, match="with execute"):
        await conn.executemany("SELECT k FROM Seen WHERE k = @p1", [(1,)])
    with pytest.raises(client.SqlError, match="with execute"):
        await conn.executemany("UPDATE Seen SET k = k OUTPUT inserted.k WHERE k = @p1", [(1,)])
    with pytest.raises(TypeError, match="sequence or a mapping"):
        await conn.executemany(insert, ["ab"])


async def test_statements_sent_together_are_answered_in_order_and_commit_together(
    conn: client.Connection,
) -> None:
    """A statement per message sent without waiting for each answer, then COMMIT, as a
    consumer writes them: each gets its own answer, a failed one changes nothing and the
    transaction goes on, and the COMMIT writes the others with the RECEIVE."""
    await _queue_and_service(conn)
    await conn.execute("CREATE TABLE Seen (k BIGINT PRIMARY KEY, body VARBINARY(MAX))")
    handle = await conn.begin_dialog("S", "S")
    await conn.send_many(handle, "DEFAULT", [b"%d" % k for k in range(50)])
    insert = "INSERT INTO Seen (k, body) VALUES (@p1, @p2)"
    await conn.begin_transaction()
    got = await conn.receive("Q", top=50, timeout=5)
    keys = [int(m.message_body) for m in got]
    keys[20] = keys[10]  # one is refused: its key is taken by an earlier statement
    pending = [
        asyncio.ensure_future(conn.execute(insert, k, m.message_body))
        for k, m in zip(keys, got, strict=True)
    ]
    counted = asyncio.ensure_future(conn.execute("SELECT COUNT(*) FROM Seen"))
    committed = asyncio.ensure_future(conn.commit())
    answers = await asyncio.gather(*pending, return_exceptions=True)
    failed = [i for i, answer in enumerate(answers) if isinstance(answer, BaseException)]
    assert failed == [20] and "UNIQUE" in str(answers[20])
    assert all(a.rowcount == 1 for a in answers if isinstance(a, client.Result))
    assert (await counted).scalar() == 49
    await committed
    assert (await conn.execute("SELECT COUNT(*), SUM(k) FROM Seen")).rows == [
        (49, sum(range(50)) - 20)
    ]
    assert await conn.receive("Q", timeout=0) == []


async def test_a_temporary_table_is_its_sessions_own_until_it_ends(
    broker: BrokerProcess,
) -> None:
    async with await client.connect(broker.url) as conn:
        await conn.create_login("clerk", PASSWORD)  # no permission on the database
        await conn.execute("CREATE TABLE Jobs (id INT PRIMARY KEY, state NVARCHAR(10))")
        await conn.executemany("INSERT INTO Jobs VALUES (@p1, @p2)", [(1, "new"), (2, "done")])
        async with await client.connect(broker.url) as other:
            await other.execute("CREATE TABLE #work (id INT PRIMARY KEY, note NVARCHAR(10))")
            # another session has a #work of its own, or none
            with pytest.raises(client.SqlError, match="no such table: #work"):
                await conn.execute("SELECT * FROM #work")
            await conn.execute("CREATE TABLE #work (n INT)")
            async with other.transaction():
                await other.execute("INSERT INTO #work VALUES (1, 'a'), (2, 'b')")
                await other.execute("UPDATE #work SET note = 'c' WHERE id = 2")
            await other.begin_transaction()
            await other.execute("DELETE FROM #work WHERE id = 1")
            await other.rollback()  # a temporary table's changes roll back too
            joined = await other.execute(
                "SELECT w.id, w.note, j.state FROM #work w JOIN Jobs j ON j.id = w.id"
            )
            assert joined.rows == [(1, "a", "new"), (2, "c", "done")]
            with pytest.raises(client.SqlError, match=r"UNIQUE constraint failed: #work\.id"):
                await other.execute("INSERT INTO #work VALUES (1, 'again')")
            await other.execute("SELECT id, state INTO #copy FROM Jobs WHERE state = 'done'")
            assert (await other.execute("SELECT * FROM #copy")).rows == [(2, "done")]
            await other.execute("DROP TABLE #copy")
            with pytest.raises(client.SqlError, match="no such table: #copy"):
                await other.execute("SELECT * FROM #copy")
        assert (await conn.execute("SELECT COUNT(*) FROM #work")).scalar() == 0
        # a new session (the same number on a restarted broker, or a reused one) starts
        # without the closed session's tables
        async with await client.connect(broker.url) as again:
            await again.execute("CREATE TABLE #work (other INT)")
        async with await client.connect(broker.url_for("clerk", PASSWORD)) as clerk:
            await clerk.execute("CREATE TABLE #mine (a INT)")  # no CREATE permission needed
            await clerk.execute("INSERT INTO #mine VALUES (1)")
            with pytest.raises(client.PermissionDeniedError):
                await clerk.execute("INSERT INTO #mine SELECT id FROM Jobs")
        assert [t["name"] for t in await conn.view("tables")] == ["jobs"]


async def test_merge_on_a_key_inserts_or_updates(conn: client.Connection) -> None:
    await conn.execute(
        "CREATE TABLE Totals (g INT PRIMARY KEY, n INT NOT NULL, times INT NOT NULL)"
    )
    merge = (
        "MERGE INTO dbo.Totals AS t USING (SELECT @g AS g, @n AS n) AS s ON t.g = s.g"
        " WHEN MATCHED THEN UPDATE SET t.n = t.n + s.n, times = t.times + 1"
        " WHEN NOT MATCHED THEN INSERT (g, n, times) VALUES (s.g, s.n, 1);"
    )
    async with conn.transaction():
        for g, n in [(1, 10), (2, 5), (1, 7)]:
            assert (await conn.execute(merge, g=g, n=n)).rowcount == 1
    assert (await conn.execute("SELECT * FROM Totals ORDER BY g")).rows == [
        (1, 17, 2),
        (2, 5, 1),
    ]
    inserted = await conn.execute(
        "MERGE Totals t USING (VALUES (2, 100), (3, 30)) AS s (g, n) ON s.g = t.g"
        " WHEN NOT MATCHED THEN INSERT (g, n, times) VALUES (s.g, s.n, 0);"
    )
    assert inserted.rowcount == 1
    assert (await conn.execute("SELECT g, n FROM Totals WHERE g > 1 ORDER BY g")).rows == [
        (2, 5),
        (3, 30),
    ]
    for sql, words in [
        (
            "MERGE Totals t USING (SELECT 1 AS n) s ON t.n = s.n WHEN NOT MATCHED THEN"
            " INSERT (g, n, times) VALUES (9, s.n, 0);",
            "ON CONFLICT clause does not match",  # n is no key: SQLite says so
        ),
        (
            "MERGE Totals t USING (SELECT 1 AS g) s ON t.g = s.g WHEN MATCHED AND t.n > 1"
            " THEN DELETE;",
            "WHEN ... AND",
        ),
        (
            "MERGE Totals t USING (SELECT 1 AS g, 2 AS m) s ON t.g = s.g WHEN MATCHED THEN"
            " UPDATE SET n = s.m WHEN NOT MATCHED THEN INSERT (g, n, times) VALUES (s.g, 0, 0);",
            "s.m in MERGE's UPDATE",
        ),
    ]:
        with pytest.raises(client.SqlError, match=words):
            await conn.execute(sql)


async def test_a_table_outlives_a_restart(broker: BrokerProcess) -> None:
    async with await client.connect(broker.url) as conn:
        await conn.execute("CREATE TABLE T (a INT)")
        await conn.execute("CREATE INDEX ix_a ON T (a)")
        await conn.execute("INSERT INTO T VALUES (1), (2)")
    broker.restart()
    async with await client.connect(broker.url) as conn:
        assert (await conn.execute("SELECT SUM(a) FROM T")).scalar() == 3
        await conn.execute("DROP INDEX ix_a ON T")
        await conn.execute("DROP TABLE T")
        with pytest.raises(client.SqlError, match="no such table"):
            await conn.execute("SELECT a FROM T")


async def test_a_dropped_database_takes_its_tables(broker: BrokerProcess) -> None:
    async with await client.connect(broker.url) as conn:
        await conn.create_database("Sales")
        await conn.use("Sales")
        await conn.execute("CREATE TABLE T (a INT PRIMARY KEY)")
        await conn.execute("INSERT INTO T VALUES (1)")
        # (a table is dropped before those it refers to, whatever their names)
        await conn.execute("CREATE TABLE U (a INT REFERENCES T (a))")
        await conn.execute("INSERT INTO U VALUES (1)")
        await conn.use("master")
        await conn.drop_database("Sales")
        await conn.create_database("Sales")
        await conn.use("Sales")
        with pytest.raises(client.SqlError, match="no such table: t"):
            await conn.execute("SELECT a FROM T")


async def test_an_answer_larger_than_a_page_comes_in_pages(conn: client.Connection) -> None:
    await conn.execute("CREATE TABLE Numbers (n INT PRIMARY KEY, pad VARBINARY(MAX))")
    for first in range(0, 25_000, 1_000):
        values = ", ".join(f"(@p{i + 1}, 0x00)" for i in range(1_000))
        await conn.execute(f"INSERT INTO Numbers VALUES {values}", *range(first, first + 1_000))
    result = await conn.execute("SELECT n FROM Numbers ORDER BY n")
    assert result.more and result.rowcount == 25_000 and len(result.rows) == 10_000
    rows = list(result.rows)
    while result.more:
        result = await conn.fetch_rows()
        assert result.columns == ("n",)
        rows += result.rows
    assert rows == [(n,) for n in range(25_000)]
    with pytest.raises(client.InvalidArgumentError, match="no rows are waiting"):
        await conn.fetch_rows()
    # a large row makes a page smaller: about 4 MiB
    await conn.execute("UPDATE Numbers SET pad = @p1 WHERE n < 10", b"x" * 1_000_000)
    result = await conn.execute("SELECT pad FROM Numbers WHERE n < 10")
    assert result.more and len(result.rows) == 5
    # T-SQL reads every page
    from ssb.tsql import Collect, Session, split_batches

    out = Collect()
    session = Session(conn, out)
    [batch] = split_batches("SELECT n FROM Numbers WHERE n >= 5000")
    assert await session.run_batch(batch), out.errors
    assert len(out.results[-1].rows) == 20_000
