"""The broker's tables from T-SQL beyond plain statements: temporary tables (#name, the
session's own, gone when the procedure that made one returns, or else with the
session), joins with the catalog views, and MERGE."""

from __future__ import annotations

from daemon import BrokerProcess

from ssb import client
from ssb.tsql import Collect, Session

from .helpers import new_session, ran, run, table

JOBS = (
    "CREATE TABLE Jobs (id INT PRIMARY KEY, state NVARCHAR(10));\n"
    "INSERT INTO Jobs VALUES (1, N'new'), (2, N'done'), (3, N'done');\n"
)


async def ran_as_admin(conn: client.Connection, text: str) -> tuple[Session, Collect]:
    """A new session of the broker's admin on `conn` that has run the script `text`, every
    batch of it succeeding (else AssertionError, with the errors)."""
    return await ran(text, conn, login="admin")


async def test_a_temporary_table_lives_in_its_session(conn: client.Connection) -> None:
    session, out = await ran_as_admin(
        conn,
        JOBS + "CREATE TABLE #work (id INT PRIMARY KEY, note NVARCHAR(10));\n"
        "INSERT INTO #work (id, note) SELECT id, state FROM Jobs WHERE state = N'done';\n"
        "UPDATE #work SET note = N'seen' WHERE id = 3;\n"
        "DELETE FROM #work WHERE id = 2;\n"
        "SELECT id, note FROM #work;\n"
        "SELECT j.id, j.state INTO #copy FROM Jobs j JOIN #work w ON w.id = j.id;\n"
        "SELECT id, state FROM #copy;\n"
        "DROP TABLE #copy;\n"
        "GO\n"
        "DECLARE @n INT;\n"
        "SELECT @n = COUNT(*) FROM #work;\n"
        "SELECT @n AS n;\n",
    )
    assert [table(r) for r in out.results] == [[[3, "seen"]], [[3, "done"]], [[1]]]
    assert not await run(session, "SELECT * FROM #copy"), "the table was dropped"
    assert "#copy" in str(out.errors[-1])


async def test_select_into_counts_the_rows_it_made(conn: client.Connection) -> None:
    """SELECT ... INTO #name answers the rows it put in its new table, as SQL Server does:
    @@ROWCOUNT, and the rows-affected message unless NOCOUNT is on."""
    _, out = await ran_as_admin(
        conn,
        JOBS + "SELECT id INTO #done FROM Jobs WHERE state = N'done';\n"
        "SELECT @@ROWCOUNT AS made;\n"
        "SET NOCOUNT ON;\n"
        "SELECT id INTO #lost FROM Jobs WHERE state = N'lost';\n"
        "SELECT @@ROWCOUNT AS made;\n",
    )
    assert [table(r) for r in out.results] == [[[2]], [[0]]]
    assert out.messages == ["(3 rows affected)", "(2 rows affected)"]


async def test_a_procedures_temporary_table_goes_when_it_returns(
    broker: BrokerProcess, conn: client.Connection
) -> None:
    session, out = await ran_as_admin(
        conn,
        "CREATE TABLE #caller (n INT);\n"
        "INSERT INTO #caller VALUES (1), (2);\n"
        "GO\n"
        "CREATE PROCEDURE Stage AS\n"
        "BEGIN\n"
        "  CREATE TABLE #staged (n INT);\n"
        "  INSERT INTO #staged SELECT n * 10 FROM #caller;\n"  # the caller's table is seen
        "  SELECT n INTO #copy FROM #staged;\n"
        "  SELECT SUM(n) AS total FROM #copy;\n"
        "END\n"
        "GO\n"
        "EXEC Stage;\n"
        "EXEC Stage;\n"  # (again: the tables were dropped, CREATE works again)
        "SELECT COUNT(*) AS n FROM #caller;\n",
    )
    assert [table(r) for r in out.results] == [[[30]], [[30]], [[2]]]
    for name in ("#staged", "#copy"):
        assert not await run(session, f"SELECT * FROM {name}")
        assert f"no such table: {name}" in str(out.errors[-1])
    # another session (connection) sees none of this session's tables
    async with await client.connect(broker.url) as other_conn:
        other, other_out = new_session(other_conn, login="admin")
        assert not await run(other, "SELECT * FROM #caller")
        assert "no such table: #caller" in str(other_out.errors[-1])


async def test_a_table_joins_a_catalog_view(conn: client.Connection) -> None:
    """The view's rows reach the broker in a temporary table for the statement."""
    session, out = new_session(conn, login="admin")
    await conn.create_queue("Q")
    await conn.create_service("S", queue="Q", contracts=["DEFAULT"])
    handle = await conn.begin_dialog("S", "S")
    assert await run(
        session,
        "CREATE TABLE dbo.Jobs (handle UNIQUEIDENTIFIER PRIMARY KEY, note NVARCHAR(10));\n"
        "GO\n"
        f"DECLARE @h UNIQUEIDENTIFIER = '{handle}';\n"
        "INSERT INTO Jobs VALUES (@h, N'mine'), (NEWID(), N'none');\n"
        "SELECT t.note, e.state, e.is_initiator FROM dbo.Jobs t\n"
        "  JOIN sys.conversation_endpoints e ON e.conversation_handle = t.handle\n"
        "  WHERE t.note = N'mine' ORDER BY e.is_initiator;\n"
        "BEGIN TRANSACTION;\n"
        "SELECT COUNT(*) AS n FROM Jobs\n"
        "  WHERE handle IN (SELECT conversation_handle FROM sys.conversation_endpoints);\n"
        "COMMIT;\n"
        "SELECT COUNT(*) AS n FROM Jobs;\n",  # (again: the copy is made each time)
    ), out.errors
    assert [table(r) for r in out.results] == [[["mine", "SO", 1]], [[1]], [[2]]]
    assert not await run(session, "SELECT * FROM #ssb_sys_conversation_endpoints")


async def test_merge_keeps_a_running_total(conn: client.Connection) -> None:
    session, out = await ran_as_admin(
        conn,
        "CREATE TABLE Totals (g INT PRIMARY KEY, n INT NOT NULL);\n"
        "GO\n"
        "DECLARE @i INT = 0;\n"
        "WHILE @i < 3\n"
        "BEGIN\n"
        "  MERGE Totals AS t\n"
        "  USING (SELECT 1 AS g, @i + 1 AS n) AS s ON t.g = s.g\n"
        "  WHEN MATCHED THEN UPDATE SET n = t.n + s.n\n"
        "  WHEN NOT MATCHED THEN INSERT (g, n) VALUES (s.g, s.n);\n"
        "  SET @i += 1;\n"
        "END\n"
        "SELECT g, n FROM Totals;\n",
    )
    assert [table(r) for r in out.results] == [[[1, 6]]]
    assert "(1 row affected)" in out.messages
    assert not await run(session, "MERGE Totals t USING Totals s ON t.g = s.g")
    assert out.errors[-1].number == 10713


async def test_what_a_column_cannot_hold_fails_with_sql_servers_number(
    conn: client.Connection,
) -> None:
    session, out = await ran_as_admin(
        conn,
        "CREATE TABLE Notes (id INT PRIMARY KEY, note NVARCHAR(10));\n"
        "INSERT INTO Notes VALUES (1, N'short'), (2147483647, N'last');\n",
    )
    overflow = "Arithmetic overflow error converting expression to data type int."
    for statement, number, said in (
        (
            "INSERT INTO Notes VALUES (2, N'fourteen chars');",
            8152,
            "String or binary data would be truncated.",
        ),
        ("INSERT INTO Notes VALUES (2147483648, N'big');", 8115, overflow),
        ("SELECT SUM(id) FROM Notes;", 8115, overflow),
        (
            "INSERT INTO Notes VALUES ('abc', N'text');",
            245,
            "Conversion failed when converting the varchar value 'abc' to data type int.",
        ),
        (
            "SELECT CAST('3000000000' AS INT) FROM Notes WHERE id = 1;",
            248,
            "The conversion of the varchar value '3000000000' overflowed an int column.",
        ),
        (
            "SELECT CAST('300' AS TINYINT) FROM Notes WHERE id = 1;",
            244,
            "The conversion of the varchar value '300' overflowed an INT1 column."
            " Use a larger integer column.",
        ),
        (
            "SELECT CAST('99999999999999999999' AS BIGINT) FROM Notes WHERE id = 1;",
            8114,
            "Error converting data type varchar to bigint.",
        ),
        (
            "SELECT CAST(300 AS TINYINT) FROM Notes WHERE id = 1;",
            220,
            "Arithmetic overflow error for data type tinyint, value = 300.",
        ),
        ("SELECT CAST(3000000000 AS INT) FROM Notes WHERE id = 1;", 8115, overflow),
        (
            "SELECT AVG(CAST(note AS VARCHAR(10))) FROM Notes;",
            8117,
            "Operand data type varchar is invalid for avg operator.",
        ),
    ):
        assert not await run(session, statement)
        assert (out.errors[-1].number, out.errors[-1].text) == (number, said)
    assert not await run(
        session, "SELECT REPLICATE(CAST(note AS NVARCHAR(MAX)), 1000000000) FROM Notes;"
    )
    assert out.errors[-1].number == 7119
    assert await run(session, "SELECT COUNT(*) AS n FROM Notes;")
    assert table(out.results[-1]) == [[2]]
