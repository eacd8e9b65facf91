"""Users' tables in the store, without a daemon: the translation and what it refuses, a
statement run provisionally then again at commit with the same results, a transaction's
statements kept applied while it goes on, and commits that meet provisional work on the
store thread."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ssb.broker._core.ports import TableError, TableRuns
from ssb.broker._store import CommitHooks, ManualStore, SQLiteStore, Store, postgres_sql
from ssb.broker._store.postgres import PostgresStore
from ssb.broker._store.user_sql import translate
from ssb.broker._store.user_tables import TableAnswer

Done = list[tuple[Any, dict[str, Any]]]


async def _run(store: Any, done: Done, sql: str, **values: Any) -> Any:
    """Run a statement as the core does: provisionally, then kept for the commit, in the
    transaction whose statements are `done` (which is its owner too)."""
    statement = store.translate_table_statement(sql, "master")
    answer = await store.run_table_statements(TableRuns(done, done, statement, [values], 5.0))
    done.append((statement, values))
    return answer


def _commit(store: ManualStore, done: Done) -> None:
    """Commit as the core does: the statements join the batch, the provisional run ends
    (each test's transactions are their own owners)."""
    store.write_table_statements(done, done)
    store.forget_table_statements(done)
    store.flush()
    done.clear()


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("MERGE INTO t USING u ON t.a = u.a WHEN MATCHED THEN DELETE;", "THEN DELETE"),
        ("MERGE t USING u ON t.a = u.a WHEN NOT MATCHED THEN INSERT VALUES (u.a);", "MERGE"),
        ("MERGE t USING u ON t.a > u.a WHEN NOT MATCHED THEN INSERT (a) VALUES (u.a);", "ON"),
        ("MERGE t USING u ON t.a = u.b WHEN NOT MATCHED THEN INSERT (a) VALUES (u.a);", "ON"),
        ("SELECT * FROM sys.objects", "catalog view"),
        ("CREATE TABLE ##t (a INT)", "global temporary table"),
        ("CREATE INDEX ix ON #t (a)", "an index on a temporary table"),
        ("SELECT a INTO #t FROM (SELECT a INTO #u FROM t) AS s", "INTO"),
        ("SELECT a INTO t2 FROM t", "SELECT ... INTO"),
        ("SELECT NOPE(a) FROM t", "the function NOPE"),
        ("SELECT @@IDENTITY", "system variable"),
        ("UPDATE t SET a = 1 FROM t JOIN u ON t.a = u.a", "UPDATE ... FROM"),
        ("CREATE TABLE t (a INT IDENTITY(5, 2) PRIMARY KEY)", "IDENTITY"),
        ("CREATE TABLE t (a INT IDENTITY)", "IDENTITY"),
        ("CREATE TABLE t (a SQL_VARIANT)", "SQL_VARIANT"),
        ("CREATE TABLE t (a UNIQUEIDENTIFIER DEFAULT NEWID())", "in a DEFAULT"),
        ("CREATE INDEX ix ON t (a) INCLUDE (b)", "INCLUDE"),
        ("CREATE VIEW v AS SELECT 1", "CREATE VIEW"),
        ("DROP TABLE a, b", "one table per statement"),
        ("DROP INDEX t.ix", "ON table"),
        ("ALTER TABLE t DROP COLUMN a", "ALTER TABLE"),
        ("CREATE TABLE sales.dbo.t (a INT)", "another database"),
        ("CREATE TABLE guest.t (a INT)", "schema 'guest'"),
        ('CREATE TABLE "u:x:y" (a INT)', "regular identifier"),
        ("SELECT 1; SELECT 2", "one statement"),
        ("SELEC 1", "cannot read"),
        ("OUTPUT x", "not supported"),
        ("CREATE TABLE #t (a INT REFERENCES t (a))", "FOREIGN KEY on or to a temporary table"),
        ("ALTER TABLE t ADD b INT REFERENCES #t (a)", "FOREIGN KEY on or to a temporary table"),
    ],
)
def test_what_the_translation_refuses_before_anything_runs(sql: str, words: str) -> None:
    with pytest.raises(TableError, match=words):
        translate(sql, "master")


def test_names_live_in_their_database_and_keep_their_alias() -> None:
    statement = translate("SELECT t.a, o.b FROM dbo.T JOIN Other AS o ON t.a = o.a", "Sales")
    assert statement.sql == (
        "SELECT `t`.`a` AS `a`, `o`.`b` AS `b` FROM `u:Sales:t` AS `T`"
        " JOIN `u:Sales:other` AS `o` ON `t`.`a` = `o`.`a`"
    )
    assert statement.reads == {"t", "other"} and statement.writes == {}
    change = translate("UPDATE T SET a = a + @Step WHERE b IN (SELECT b FROM U)", "master")
    assert change.writes == {"t": "UPDATE"} and change.reads == {"u"}
    assert change.parameters == ("step",)
    index = translate("CREATE INDEX ix ON T (a)", "master")
    assert "`u:master:t:ix`" in index.sql and index.writes == {"t": "ALTER"}


async def test_a_statement_answers_at_once_and_commits_with_the_same_result(
    storage: ManualStore,
) -> None:
    txn: Done = []
    await _run(
        storage,
        txn,
        "CREATE TABLE Orders (id INT IDENTITY(1,1) PRIMARY KEY, item NVARCHAR(20) UNIQUE,"
        " at DATETIME2, amount DECIMAL(9,2) NOT NULL DEFAULT 0)",
    )
    first = await _run(
        storage,
        txn,
        "INSERT INTO Orders (item, at) OUTPUT inserted.id, inserted.at VALUES (@p1, GETDATE())",
        p1="apple",
    )
    second = await _run(
        storage, txn, "INSERT INTO Orders (item) OUTPUT inserted.id VALUES (@p1)", p1="pear"
    )
    assert [first.rows[0][0], second.rows[0][0]] == [1, 2]
    # its own changes are what the transaction reads
    seen = await _run(storage, txn, "SELECT COUNT(*) FROM Orders")
    assert seen.rows == [(2,)]
    _commit(storage, txn)
    assert storage.load_table_names() == [("master", "orders")]
    assert storage.table_sizes() == [("master", "orders", 2)]
    later: Done = []
    rows = await _run(storage, later, "SELECT id, item, at FROM Orders ORDER BY id")
    # the row committed is the row answered: the identity, and GETDATE() evaluated once
    assert rows.rows == [(1, "apple", first.rows[0][1]), (2, "pear", None)]


async def test_a_failed_statement_leaves_the_transaction_as_it_was(
    storage: ManualStore,
) -> None:
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (k INT PRIMARY KEY)")
    await _run(storage, txn, "INSERT INTO T VALUES (1)")
    with pytest.raises(TableError, match=r"UNIQUE constraint failed: t\.k"):
        await _run(storage, txn, "INSERT INTO T VALUES (2), (1)")
    with pytest.raises(TableError, match="not given a value"):
        await _run(storage, txn, "INSERT INTO T VALUES (@p1)")
    assert (await _run(storage, txn, "SELECT COUNT(*) FROM T")).rows == [(1,)]
    _commit(storage, txn)
    check: Done = []
    assert (await _run(storage, check, "SELECT k FROM T")).rows == [(1,)]


async def test_another_transaction_and_a_rollback_start_from_the_durable_rows(
    storage: ManualStore,
) -> None:
    setup: Done = []
    await _run(storage, setup, "CREATE TABLE T (k INT PRIMARY KEY, v INT)")
    await _run(storage, setup, "INSERT INTO T VALUES (1, 10)")
    _commit(storage, setup)
    first: Done = []
    second: Done = []
    await _run(storage, first, "UPDATE T SET v = v + 1")
    # another owner's statement rolls the first's back first, and finds the durable rows
    assert (await _run(storage, second, "SELECT v FROM T")).rows == [(10,)]
    # the first's next statement replays its earlier ones
    await _run(storage, first, "UPDATE T SET v = v * 2")
    assert (await _run(storage, first, "SELECT v FROM T")).rows == [(22,)]
    storage.forget_table_statements(first)  # rolled back
    assert (await _run(storage, second, "SELECT v FROM T")).rows == [(10,)]
    # a rollback to a savepoint: the statements after it are dropped, the rest replayed
    del first[1:]
    assert (await _run(storage, first, "SELECT v FROM T")).rows == [(11,)]


@pytest.mark.parametrize("meanwhile", ["nothing", "another statement", "a failed commit"])
async def test_a_commit_keeps_the_provisional_run_or_replays_it(
    tmp_path: Path, meanwhile: str
) -> None:
    """A transaction's statements run once when nothing used the writer between their
    provisional run and their commit (the commit goes on in its transaction); they run
    again at commit when something did, or when the first try of the commit failed.
    Either way the rows committed are the rows answered."""
    store = SQLiteStore(tmp_path / "broker.db", "os", threaded=False)
    runs: list[str] = []
    store._db.set_trace_callback(runs.append)  # what the writer runs
    try:
        setup: Done = []
        await _run(store, setup, "CREATE TABLE T (k INT IDENTITY(1,1) PRIMARY KEY, v INT)")
        _commit(store, setup)
        txn: Done = []
        answer = await _run(store, txn, "INSERT INTO T (v) OUTPUT inserted.k VALUES (7)")
        update = store.translate_table_statement("UPDATE T SET v = v + @d", "master")
        runs_of_update = [{"d": 1}, {"d": 2}]
        await store.run_table_statements(TableRuns(txn, txn, update, runs_of_update, 5.0))
        txn += [(update, values) for values in runs_of_update]
        store.write_table_statements(txn, txn)
        store.forget_table_statements(txn)
        if meanwhile == "another statement":
            other: Done = []
            assert (await _run(store, other, "SELECT COUNT(*) FROM T")).rows == [(0,)]
        elif meanwhile == "a failed commit":
            store.fail_next = sqlite3.OperationalError("database or disk is full")
            store.flush()
            assert store.trouble is not None
        runs.clear()
        store.flush()
        assert store.trouble is None
        changes = [sql for sql in runs if sql.startswith(("INSERT", "UPDATE"))]
        assert len(changes) == (0 if meanwhile == "nothing" else 3)
        check: Done = []
        assert (await _run(store, check, "SELECT k, v FROM T")).rows == [(answer.rows[0][0], 10)]
    finally:
        await store.close()


async def test_commits_wait_for_provisional_work_on_the_store_thread(tmp_path: Path) -> None:
    """A store committing by itself: a commit that comes while a transaction's statement
    is on the thread, or its provisional transaction is open, runs after it and rolls it
    back first; what it commits is only what was written to the batch."""
    path = tmp_path / "broker.db"
    store = SQLiteStore(path, "os")
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))

    async def durable() -> None:
        done = asyncio.get_running_loop().create_future()
        store.when_durable(store.watermark(), lambda: done.set_result(None))
        await asyncio.wait_for(done, 30)

    try:
        setup: Done = []
        await _run(store, setup, "CREATE TABLE T (k INT PRIMARY KEY)")
        store.write_table_statements(setup)
        await durable()
        txn: Done = []
        for k in range(50):
            running = asyncio.ensure_future(_run(store, txn, "INSERT INTO T VALUES (@k)", k=k))
            store.put_meta("beat", str(k))  # a commit meets the statement on its way
            await running
            await durable()
        other = sqlite3.connect(path)
        try:
            assert other.execute('SELECT COUNT(*) FROM "u:master:t"').fetchone() == (0,)
            store.write_table_statements(txn)
            await durable()
            assert other.execute('SELECT COUNT(*) FROM "u:master:t"').fetchone() == (50,)
        finally:
            other.close()
        assert not failures
    finally:
        await store.close()


async def test_foreign_keys_hold_and_the_store_tells_them(storage: ManualStore) -> None:
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE Parent (id INT PRIMARY KEY)")
    await _run(
        storage,
        txn,
        "CREATE TABLE Child (id INT PRIMARY KEY, parent INT REFERENCES dbo.Parent (id)"
        " ON DELETE CASCADE)",
    )
    await _run(
        storage,
        txn,
        "CREATE TABLE Note (child INT, FOREIGN KEY (child) REFERENCES Child (id))",
    )
    await _run(storage, txn, "ALTER TABLE Note ADD parent INT REFERENCES Parent (id)")
    await _run(storage, txn, "INSERT INTO Parent VALUES (1)")
    with pytest.raises(TableError, match="FOREIGN KEY"):
        await _run(storage, txn, "INSERT INTO Child VALUES (1, 2)")
    await _run(storage, txn, "INSERT INTO Child VALUES (1, 1)")
    _commit(storage, txn)
    assert sorted(storage.table_foreign_keys("master")) == [
        ("child", "parent", True),
        ("note", "child", False),
        ("note", "parent", False),
    ]
    assert storage.table_foreign_keys("other") == []
    later: Done = []
    await _run(storage, later, "DELETE FROM Parent")
    assert (await _run(storage, later, "SELECT COUNT(*) FROM Child")).rows == [(0,)]


async def test_plus_joins_text_and_adds_numbers_as_t_sql_does(storage: ManualStore) -> None:
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (a NVARCHAR(10), n INT, b VARBINARY(10))")
    await _run(storage, txn, "INSERT INTO T VALUES (N'ab', 2, 0x01)")
    rows = await _run(storage, txn, "SELECT a + N'c', n + 1, n + '40', b + 0x02, a + NULL FROM T")
    assert rows.rows == [("abc", 3, 42, b"\x01\x02", None)]
    with pytest.raises(TableError):
        await _run(storage, txn, "SELECT n + 'x' FROM T")


async def test_an_average_is_of_its_arguments_type(storage: ManualStore) -> None:
    """AVG of integers is an integer, the quotient cut toward zero; of DECIMAL or FLOAT
    it keeps its fraction, whole though the values are (as SQL Server's AVG)."""
    txn: Done = []
    await _run(
        storage,
        txn,
        "CREATE TABLE T (g INT, i INT, s SMALLINT, b BIGINT, d DECIMAL(10, 2), f FLOAT)",
    )
    await _run(storage, txn, "CREATE TABLE #g (g INT, n INT)")
    await _run(
        storage,
        txn,
        "INSERT INTO T VALUES (1, 1, 1, 1, 1, 1), (1, 2, 2, 2, 2, 2),"
        " (2, -3, -3, -3, -3, -3), (2, -4, -4, -4, -4, -4)",
    )
    await _run(storage, txn, "INSERT INTO #g VALUES (1, 1), (1, 2)")
    averages = await _run(
        storage,
        txn,
        "SELECT AVG(i), AVG(s), AVG(b), AVG(d), AVG(f), AVG(t.i * 2 + 1),"
        " AVG(CASE WHEN i > 1 THEN 1 ELSE 0 END), AVG(CAST(i AS FLOAT)) FROM T AS t GROUP BY g"
        " ORDER BY g",
    )
    assert averages.rows == [
        (1, 1, 1, 1.5, 1.5, 4, 0, 1.5),
        (-3, -3, -3, -3.5, -3.5, -6, 0, -3.5),
    ]
    joined = await _run(
        storage, txn, "SELECT AVG(n), AVG(DISTINCT x.d) FROM #g JOIN T x ON x.g = #g.g"
    )
    assert joined.rows == [(1, 1.5)]
    inserted = await _run(storage, txn, "INSERT INTO #g SELECT 3, AVG(i) FROM T WHERE g = 1")
    assert inserted.rowcount == 1
    assert (await _run(storage, txn, "SELECT n FROM #g WHERE g = 3")).rows == [(1,)]
    windowed = await _run(
        storage, txn, "SELECT DISTINCT g, AVG(i) OVER (PARTITION BY g) FROM T ORDER BY g"
    )
    assert windowed.rows == [(1, 1), (2, -3)]
    empty = await _run(storage, txn, "SELECT AVG(i), AVG(d) FROM T WHERE g = 9")
    assert empty.rows == [(None, None)]


async def test_a_sum_or_average_of_text_is_refused(storage: ManualStore) -> None:
    """SUM and AVG take numbers only: of a text column or a text they fail with SQL
    Server's Msg 8117, whatever the text holds."""
    txn: Done = []
    await _run(
        storage, txn, "CREATE TABLE T (k INT PRIMARY KEY, v VARCHAR(10), u UNIQUEIDENTIFIER)"
    )
    await _run(storage, txn, "INSERT INTO T VALUES (1, '1', NEWID())")
    for sql, kind, operator in (
        ("SELECT SUM(v) FROM T", "varchar", "sum"),
        ("SELECT k, AVG(v) FROM T GROUP BY k", "varchar", "avg"),
        ("SELECT SUM(t.v) OVER (PARTITION BY k) FROM T AS t", "varchar", "sum"),
        ("SELECT SUM('1') FROM T", "varchar", "sum"),
        ("SELECT AVG(u) FROM T", "uniqueidentifier", "avg"),
    ):
        said = f"Operand data type {kind} is invalid for {operator} operator."
        with pytest.raises(TableError, match=r"\A" + re.escape(said) + r"\Z"):
            await _run(storage, txn, sql)
    assert (await _run(storage, txn, "SELECT SUM(k), AVG(k) FROM T")).rows == [(1, 1)]


async def test_a_value_longer_than_its_column_is_refused(storage: ManualStore) -> None:
    """Text or bytes longer than a sized column fail the statement, whole (trailing
    spaces of a text may go), as SQL Server's do."""
    txn: Done = []
    await _run(
        storage,
        txn,
        "CREATE TABLE T (k INT PRIMARY KEY, n NVARCHAR(10), v VARCHAR(3), c CHAR(2),"
        " b VARBINARY(2), m NVARCHAR(MAX))",
    )
    await _run(storage, txn, "INSERT INTO T VALUES (1, N'0123456789', 'abc', 'ab', 0x0102, N'')")
    await _run(storage, txn, "INSERT INTO T (k, v) VALUES (2, 'ab   ')")
    for sql in (
        "INSERT INTO T (k, n) VALUES (3, N'fourteen chars')",
        "INSERT INTO T (k, v) VALUES (3, 'abcd')",
        "INSERT INTO T (k, c) VALUES (3, 'abc')",
        "INSERT INTO T (k, b) VALUES (3, 0x010203)",
        "INSERT INTO T (k, n) VALUES (3, N'short'), (4, N'much too long')",
        "UPDATE T SET n = n + N'!'",
    ):
        with pytest.raises(TableError, match=r"\AString or binary data would be truncated\."):
            await _run(storage, txn, sql)
    await _run(storage, txn, "UPDATE T SET m = @m", m="x" * 9000)
    rows = await _run(storage, txn, "SELECT k, n FROM T ORDER BY k")
    assert rows.rows == [(1, "0123456789"), (2, None)]


async def test_a_text_or_binary_column_without_a_length_holds_one(storage: ManualStore) -> None:
    """CHAR, VARCHAR, NCHAR, NVARCHAR, BINARY and VARBINARY declared without a length
    are of length 1, as SQL Server's are."""
    txn: Done = []
    await _run(
        storage,
        txn,
        "CREATE TABLE T (k INT PRIMARY KEY, v VARCHAR, n NVARCHAR, c CHAR, b VARBINARY)",
    )
    await _run(storage, txn, "ALTER TABLE T ADD a NCHAR")
    await _run(storage, txn, "INSERT INTO T VALUES (1, 'v', N'n', 'c', 0x01, N'a')")
    for column, value in (
        ("v", "'vv'"),
        ("n", "N'nn'"),
        ("c", "'cc'"),
        ("b", "0x0102"),
        ("a", "N'aa'"),
    ):
        with pytest.raises(TableError, match=r"\AString or binary data would be truncated\."):
            await _run(storage, txn, f"INSERT INTO T (k, {column}) VALUES (2, {value})")
    rows = await _run(storage, txn, "SELECT * FROM T")
    assert rows.rows == [(1, "v", "n", "c", b"\x01", "a")]


async def test_an_integer_past_its_types_range_is_refused(storage: ManualStore) -> None:
    """A value past its integer column's range, and a SUM or AVG of INTs whose total is
    past INT's, fail the statement, whole, as SQL Server's arithmetic overflow."""
    txn: Done = []
    await _run(
        storage, txn, "CREATE TABLE N (k INT PRIMARY KEY, i INT, s SMALLINT, t TINYINT, b BIGINT)"
    )
    await _run(storage, txn, "INSERT INTO N VALUES (1, 2147483647, 32767, 255, 1), (2, 1, 0, 0, 0)")
    for sql, kind in (
        ("SELECT SUM(i) FROM N", "int"),
        ("SELECT AVG(i) FROM N", "int"),
        ("INSERT INTO N (k, i) VALUES (3, 2147483648)", "int"),
        ("INSERT INTO N (k, i) VALUES (3, 1), (4, -2147483649)", "int"),
        ("UPDATE N SET i = i + 1", "int"),
        ("INSERT INTO N (k, s) VALUES (3, 32768)", "smallint"),
        ("INSERT INTO N (k, t) VALUES (3, 256)", "tinyint"),
        ("UPDATE N SET t = t - 1", "tinyint"),
        ("INSERT INTO N (k, b) VALUES (3, 9223372036854775808)", "bigint"),
    ):
        said = f"Arithmetic overflow error converting expression to data type {kind}."
        with pytest.raises(TableError, match=re.escape(said)):
            await _run(storage, txn, sql)
    sums = await _run(storage, txn, "SELECT SUM(CAST(i AS BIGINT)), SUM(s), SUM(b) FROM N")
    assert sums.rows == [(2147483648, 32767, 1)]
    rows = await _run(storage, txn, "SELECT k, i, t FROM N ORDER BY k")
    assert rows.rows == [(1, 2147483647, 255), (2, 1, 0)]


async def test_a_cast_to_tinyint_runs_on_both_stores(storage: ManualStore) -> None:
    """CAST and CONVERT to TINYINT give the number, as to any other integer type."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (k INT PRIMARY KEY, d DECIMAL(5, 2))")
    await _run(storage, txn, "INSERT INTO T VALUES (1, 7)")
    rows = await _run(storage, txn, "SELECT CAST(k AS TINYINT), CONVERT(TINYINT, d) FROM T")
    assert rows.rows == [(1, 7)]


async def test_text_in_an_integer_column_converts_or_fails_as_sql_servers_does(
    storage: ManualStore,
) -> None:
    """A number given as text goes into an integer column as that number; other text
    fails the statement, whole, with SQL Server's Msg 245."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE N (k INT PRIMARY KEY, i INT, b BIGINT)")
    await _run(storage, txn, "INSERT INTO N VALUES (1, '42', @b)", b="7")
    for sql, values in (
        ("INSERT INTO N (k, i) VALUES (2, 'abc')", {}),
        ("INSERT INTO N (k, i) VALUES (2, 3), (3, @i)", {"i": "x1"}),
        ("UPDATE N SET b = 'seven'", {}),
    ):
        said = "Conversion failed when converting the varchar value '"
        with pytest.raises(
            TableError,
            match=r"\A" + re.escape(said) + r"(abc|x1|seven)' to data type (int|bigint)\.\Z",
        ):
            await _run(storage, txn, sql, **values)
    rows = await _run(storage, txn, "SELECT k, i, b FROM N")
    assert rows.rows == [(1, 42, 7)]


async def test_a_cast_of_text_to_an_integer_converts_or_fails_as_sql_servers_does(
    storage: ManualStore,
) -> None:
    """CAST and CONVERT of text to an integer type take a whole number, spaces around it
    allowed; anything else ('abc', '4.5', '1e2') fails the statement with Msg 245, where
    SQLite's own CAST would give 0, 4 or 100."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE C (k INT PRIMARY KEY, s VARCHAR(10))")
    await _run(storage, txn, "INSERT INTO C VALUES (1, ' 12 '), (2, 'x1')")
    rows = await _run(
        storage,
        txn,
        "SELECT CAST('42' AS INT), CAST(' 42 ' AS BIGINT), CONVERT(SMALLINT, '-7'),"
        " CAST('+5' AS TINYINT), CAST(s AS INT), CAST(@p AS BIGINT) FROM C WHERE k = 1",
        p="8",
    )
    assert rows.rows == [(42, 42, -7, 5, 12, 8)]
    for sql, values, value, kind in (
        ("SELECT CAST('abc' AS INT)", {}, "abc", "int"),
        ("SELECT CAST('4.5' AS INT)", {}, "4.5", "int"),
        ("SELECT CONVERT(BIGINT, s) FROM C", {}, "x1", "bigint"),
        ("SELECT CAST(@p AS SMALLINT)", {"p": "1e2"}, "1e2", "smallint"),
        ("INSERT INTO C VALUES (3, CAST('4.0' AS INT))", {}, "4.0", "int"),
    ):
        said = f"Conversion failed when converting the varchar value '{value}' to data type {kind}."
        with pytest.raises(TableError, match=r"\A" + re.escape(said) + r"\Z"):
            await _run(storage, txn, sql, **values)
    rows = await _run(storage, txn, "SELECT COUNT(*) FROM C")
    assert rows.rows == [(2,)]


async def test_a_cast_of_a_number_to_an_integer_cuts_its_fraction(storage: ManualStore) -> None:
    """CAST and CONVERT of a number with a fraction to an integer type cut it toward
    zero, as SQL Server does (PostgreSQL's own CAST rounds 4.5 to 5)."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE N (k INT PRIMARY KEY, d DECIMAL(5, 2), f FLOAT)")
    await _run(storage, txn, "INSERT INTO N VALUES (1, 4.5, -4.5)")
    rows = await _run(
        storage,
        txn,
        "SELECT CAST(4.5 AS INT), CAST(-4.5 AS INT), CONVERT(BIGINT, 2.99), CAST(d AS INT),"
        " CAST(f AS SMALLINT), CAST(d * 3 AS TINYINT), CAST(k AS INT) FROM N",
    )
    assert rows.rows == [(4, -4, 2, 4, -4, 13, 1)]


async def test_a_cast_of_empty_text_to_an_integer_is_zero(storage: ManualStore) -> None:
    """Text of no digits at all, empty or spaces, is 0 cast to an integer type, as SQL
    Server makes it (PostgreSQL's own CAST refuses it)."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE E (k INT PRIMARY KEY, s VARCHAR(10))")
    await _run(storage, txn, "INSERT INTO E VALUES (1, '')")
    rows = await _run(
        storage,
        txn,
        "SELECT CAST('' AS INT), CAST('   ' AS BIGINT), CONVERT(SMALLINT, @p),"
        " CAST(s AS TINYINT) FROM E",
        p="",
    )
    assert rows.rows == [(0, 0, 0, 0)]


async def test_a_cast_past_an_integer_types_range_fails_as_sql_servers_does(
    storage: ManualStore,
) -> None:
    """A cast to an integer type of a value past its range fails the statement in SQL
    Server's words: text with Msg 248 (int), 244 (tinyint, smallint: INT1, INT2) or 8114
    (bigint), an integer with Msg 220 (to tinyint or smallint, with the value), any
    other number with Msg 8115; a value in range converts."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE R (k INT PRIMARY KEY, b BIGINT, d DECIMAL(12, 1))")
    await _run(storage, txn, "INSERT INTO R VALUES (1, 3000000000, 300.5), (2, 255, 255.9)")
    rows = await _run(
        storage,
        txn,
        "SELECT CAST('255' AS TINYINT), CAST(b AS TINYINT), CAST(d AS TINYINT),"
        " CAST(-2147483648 AS INT), CAST(@p AS SMALLINT) FROM R WHERE k = 2",
        p=-32768,
    )
    assert rows.rows == [(255, 255, 255, -2147483648, -32768)]
    rows = await _run(
        storage, txn, "SELECT CASE WHEN k = 9 THEN CAST(300 AS TINYINT) ELSE k END FROM R"
    )
    assert rows.rows == [(1,), (2,)]  # (a failure not reached is none)
    for sql, values, said in (
        (
            "SELECT CAST('3000000000' AS INT)",
            {},
            "The conversion of the varchar value '3000000000' overflowed an int column.",
        ),
        (
            "SELECT CONVERT(TINYINT, ' 300 ')",
            {},
            "The conversion of the varchar value ' 300 ' overflowed an INT1 column."
            " Use a larger integer column.",
        ),
        (
            "SELECT CAST(@p AS SMALLINT)",
            {"p": "70000"},
            "The conversion of the varchar value '70000' overflowed an INT2 column."
            " Use a larger integer column.",
        ),
        (
            "SELECT CAST('99999999999999999999' AS BIGINT)",
            {},
            "Error converting data type varchar to bigint.",
        ),
        (
            "SELECT CAST(300 AS TINYINT)",
            {},
            "Arithmetic overflow error for data type tinyint, value = 300.",
        ),
        (
            "SELECT CAST(@p AS SMALLINT)",
            {"p": 70000},
            "Arithmetic overflow error for data type smallint, value = 70000.",
        ),
        (
            "SELECT CAST(3000000000 AS INT)",
            {},
            "Arithmetic overflow error converting expression to data type int.",
        ),
        (
            "SELECT CAST(b AS INT) FROM R",
            {},
            "Arithmetic overflow error converting expression to data type int.",
        ),
        (
            "SELECT CAST(d AS TINYINT) FROM R",
            {},
            "Arithmetic overflow error converting expression to data type tinyint.",
        ),
        (
            "INSERT INTO R VALUES (3, CAST(-1 AS TINYINT), 0)",
            {},
            "Arithmetic overflow error for data type tinyint, value = -1.",
        ),
    ):
        with pytest.raises(TableError, match=r"\A" + re.escape(said) + r"\Z"):
            await _run(storage, txn, sql, **values)
    rows = await _run(storage, txn, "SELECT COUNT(*) FROM R")
    assert rows.rows == [(2,)]


async def test_try_cast_to_an_integer_is_null_where_a_cast_fails(storage: ManualStore) -> None:
    """TRY_CAST and TRY_CONVERT to an integer type give NULL where CAST would fail (text
    that is no whole number, a value past the range), as SQL Server's do (SQLite's own
    CAST made 0 of 'abc'), and the number where it converts."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (k INT PRIMARY KEY, s VARCHAR(20), b BIGINT)")
    await _run(storage, txn, "INSERT INTO T VALUES (1, 'abc', 3000000000), (2, ' 42 ', 7)")
    rows = await _run(
        storage,
        txn,
        "SELECT TRY_CAST('abc' AS INT), TRY_CONVERT(INT, 'abc'), TRY_CAST('3000000000' AS INT),"
        " TRY_CONVERT(TINYINT, 300), TRY_CAST(4.5 AS INT), TRY_CAST(s AS INT),"
        " TRY_CONVERT(INT, b), TRY_CAST(@p AS SMALLINT) FROM T ORDER BY k",
        p="1e2",
    )
    assert rows.rows == [
        (None, None, None, None, 4, None, None, None),
        (None, None, None, None, 4, 42, 7, None),
    ]


async def test_names_and_keys_as_sql_server_has_them(storage: ManualStore) -> None:
    """A column that does not exist is an error, never its name as text (SQLite's
    double-quoted fallback); a primary key takes no NULL, whatever its type and however
    it is declared, and is never numbered for the caller as a rowid would be."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (id INT PRIMARY KEY, note NVARCHAR(10))")
    await _run(storage, txn, "CREATE TABLE P (a INT, b INT, PRIMARY KEY (a, b))")
    await _run(storage, txn, "INSERT INTO T VALUES (1, N'x')")
    for sql in (
        "SELECT nope FROM T",
        "INSERT INTO T (note) VALUES (N'no key')",
        "INSERT INTO P (a) VALUES (1)",
        "CREATE TABLE N (a INT NULL PRIMARY KEY)",
    ):
        with pytest.raises(TableError):
            await _run(storage, txn, sql)
    rows = await _run(storage, txn, "SELECT id, note FROM T")
    assert rows.rows == [(1, "x")]


async def test_names_are_without_case_as_sql_servers_are(storage: ManualStore) -> None:
    """A table, an alias or a column is the same name in any case, in every clause and
    on every store; a result's column is named as the query wrote it (`*`'s as they were
    declared)."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE Orders (OrderId INT PRIMARY KEY, Item NVARCHAR(10))")
    await _run(storage, txn, "CREATE INDEX IX_Item ON ORDERS (ITEM)")
    await _run(storage, txn, "ALTER TABLE orders ADD Qty INT")
    inserted = await _run(
        storage,
        txn,
        "INSERT INTO orders (orderid, ITEM, qty) OUTPUT inserted.ORDERID"
        " VALUES (1, N'a', 1), (2, N'b', 2), (3, N'b', 3)",
    )
    assert inserted.columns == ["ORDERID"]
    await _run(storage, txn, "UPDATE ORDERS SET item = N'c', QTY = qty + 1 WHERE OrderID = 3")
    await _run(storage, txn, "DELETE FROM Orders WHERE ORDERID = 1")
    joined = await _run(
        storage,
        txn,
        "SELECT o.OrderId, O.item, P.QTY AS Quantity FROM Orders AS O"
        " JOIN orders p ON P.ORDERID = o.orderid ORDER BY O.orderID DESC",
    )
    assert joined.columns == ["OrderId", "item", "Quantity"]
    assert joined.rows == [(3, "c", 4), (2, "b", 2)]
    qualified = await _run(storage, txn, "SELECT orders.orderid FROM ORDERS WHERE Orders.Qty > 2")
    assert qualified.rows == [(3,)]
    grouped = await _run(
        storage,
        txn,
        "SELECT ITEM, SUM(qty) AS Total FROM orders GROUP BY item ORDER BY total",
    )
    assert grouped.columns == ["ITEM", "Total"] and grouped.rows == [("b", 2), ("c", 4)]
    starred = await _run(storage, txn, "SELECT * FROM ORDERS ORDER BY orderid")
    assert starred.columns == ["OrderId", "Item", "Qty"]
    await _run(storage, txn, "SELECT OrderId, qty AS Amount INTO #Copy FROM orders")
    copied = await _run(storage, txn, "SELECT * FROM #copy ORDER BY AMOUNT")
    assert copied.columns == ["OrderId", "Amount"] and copied.rows == [(2, 2), (3, 4)]
    _commit(storage, txn)
    assert storage.trouble is None, storage.trouble
    later: Done = []
    assert (await _run(storage, later, "SELECT orders.ITEM FROM Orders")).rows == [("b",), ("c",)]


async def test_replicate_repeats_a_text_as_sql_server_does(storage: ManualStore) -> None:
    """REPLICATE repeats its text, NULL for a negative count; a result longer than 8000
    bytes is cut there unless its text is of a (MAX) type."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (k INT PRIMARY KEY, s VARCHAR(10))")
    await _run(storage, txn, "INSERT INTO T VALUES (1, 'ab')")
    await _run(storage, txn, "UPDATE T SET s = REPLICATE(s, 2) + REPLICATE('-', k)")
    rows = await _run(
        storage,
        txn,
        "SELECT s, REPLICATE(s, 2), REPLICATE('x', 0), REPLICATE('x', -1), REPLICATE(5, 2),"
        " LEN(REPLICATE('abc', 5000)), LEN(REPLICATE(N'é', 5000)),"
        " LEN(REPLICATE(CAST('a' AS VARCHAR(MAX)), 9000)) FROM T",
    )
    assert rows.rows == [("abab-", "abab-abab-", "", None, "55", 8000, 4000, 9000)]
    with pytest.raises(TableError, match=r"\AAttempting to grow LOB beyond maximum allowed size"):
        await _run(storage, txn, "SELECT REPLICATE(CAST(s AS NVARCHAR(MAX)), 1000000000) FROM T")


async def test_many_runs_answer_and_commit_as_the_runs_one_by_one(storage: ManualStore) -> None:
    txn: Done = []
    await _run(
        storage,
        txn,
        "CREATE TABLE Log (id INT IDENTITY(1,1) PRIMARY KEY, k INT UNIQUE, v NVARCHAR(10),"
        " at UNIQUEIDENTIFIER)",
    )
    insert = storage.translate_table_statement(
        "INSERT INTO Log (k, v, at) VALUES (@p1, @p2, NEWID()), (@p1 + 1000, 'x?1', NULL)",
        "master",
    )
    many = [{"p1": k, "p2": f"v{k}"} for k in range(250)]  # more than one group's runs
    answer = await storage.run_table_statements(TableRuns(txn, txn, insert, many, 5.0))
    assert answer.rowcount == 500
    txn += [(insert, values) for values in many]
    # a failed run undoes all of them: the runs are one step
    again = [{"p1": 1000 + k, "p2": "again"} for k in range(3)]
    with pytest.raises(TableError, match="UNIQUE"):
        await storage.run_table_statements(TableRuns(txn, txn, insert, again, 5.0))
    update = storage.translate_table_statement("UPDATE Log SET v = @v WHERE k = @k", "master")
    changes = [{"k": 7, "v": "seven"}, {"k": 5000, "v": "none"}, {"k": 8, "v": "eight"}]
    assert (
        await storage.run_table_statements(TableRuns(txn, txn, update, changes, 5.0))
    ).rowcount == 2
    txn += [(update, values) for values in changes]
    # the runs count as statements of the transaction: the next one follows them in the
    # same provisional transaction, replaying nothing
    ran: list[str] = []
    if isinstance(storage, SQLiteStore):
        storage._db.set_trace_callback(ran.append)
    seen = await _run(storage, txn, "SELECT id, k, v, at FROM Log ORDER BY id")
    if isinstance(storage, SQLiteStore):
        storage._db.set_trace_callback(None)
        assert not [sql for sql in ran if sql.startswith(("INSERT", "UPDATE"))], ran
    _commit(storage, txn)
    later: Done = []
    rows = await _run(storage, later, "SELECT id, k, v, at FROM Log ORDER BY id")
    assert rows.rows == seen.rows and len(rows.rows) == 500
    # in the runs' order, each run's own values (NEWID() once per run)
    assert [row[:3] for row in rows.rows[:4]] == [
        (1, 0, "v0"),
        (2, 1000, "x?1"),
        (3, 1, "v1"),
        (4, 1001, "x?1"),
    ]
    assert rows.rows[14][2] == "seven" and rows.rows[16][2] == "eight"
    assert len({row[3] for row in rows.rows if row[3] is not None}) == 250


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM pg_catalog.pg_authid",
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM pg_class",
        "SELECT * FROM commit_marks",
        "SELECT * FROM sqlite_master",
        "SELECT pg_read_file('/etc/passwd')",
        "SELECT set_config('statement_timeout', '0', false)",
        "SELECT current_setting('data_directory')",
        "SELECT dblink('host=localhost', 'SELECT 1')",
        "SELECT ssb_fence(1)",
        "SELECT SUSER_NAME()",
        "SELECT * FROM generate_series(1, 2)",
        "SELECT (SELECT COUNT(*) FROM pg_authid)",
        "COPY T FROM '/etc/passwd'",
        "SELECT 1; DROP TABLE T",
        "SELECT 1 FROM T; SELECT * FROM pg_authid",
    ],
)
async def test_a_statement_reaches_nothing_but_the_users_tables(
    storage: ManualStore, sql: str
) -> None:
    """The store's own tables, the database's catalogs and its functions that touch the
    server are out of a user's reach, on either store."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (k INT PRIMARY KEY)")
    with pytest.raises(TableError):
        await _run(storage, txn, sql)
    assert (await _run(storage, txn, "SELECT COUNT(*) FROM T")).rows == [(0,)]
    # a cast names only SQL Server's types (PostgreSQL's would look its catalogs up)
    with pytest.raises(TableError, match="REGCLASS"):
        translate("SELECT CAST('pg_class' AS regclass)", "master", write=postgres_sql.write)


@pytest.mark.parametrize(
    ("sql", "database", "said"),
    [
        ("CREATE TABLE T{long} (k INT)", "master", "the name 't{long}' is 64 bytes"),
        ("SELECT k AS K{long} FROM T", "master", "the name 'K{long}' is 64 bytes"),
        ("SELECT k AS [Kéé{half}] FROM T", "master", "is 64 bytes"),  # bytes, not characters
        ("CREATE INDEX ix ON T{most} (k)", "master", "with its index name 'ix'"),
        ("CREATE TABLE T{most} (k INT IDENTITY(1,1) PRIMARY KEY)", "master", "identity column"),
        ("SELECT k FROM T", "D{most}", "the database name 'D{most}'"),
    ],
)
def test_postgresql_names_longer_than_it_keeps_are_refused(
    sql: str, database: str, said: str
) -> None:
    """PostgreSQL keeps 63 bytes of a name and cuts the rest, so two long names that
    begin alike would reach one table: its store refuses such a name with the limit."""
    names = {"long": "x" * 63, "half": "x" * 59, "most": "x" * 62}
    with pytest.raises(TableError, match=re.escape(said.format(**names)) + ".*keeps 63"):
        translate(sql.format(**names), database.format(**names), write=postgres_sql.write)
    # the longest it keeps, and every length on SQLite's store
    shorter = {"long": "x" * 62, "half": "x" * 58, "most": "x" * 50}
    translate(sql.format(**shorter), database.format(**shorter), write=postgres_sql.write)
    translate(sql.format(**names), database.format(**names))


@pytest.mark.parametrize("size", [54, 55, 63])
async def test_a_table_with_the_longest_name_takes_inserts(storage: ManualStore, size: int) -> None:
    """A table whose name is as long as PostgreSQL keeps, and has no identity column,
    takes INSERTs on every store (its identity sequence's longer name is never asked for)."""
    name = "t" * size
    txn: Done = []
    await _run(storage, txn, f"CREATE TABLE {name} (k INT)")
    await _run(storage, txn, f"INSERT INTO {name} VALUES (1)")
    assert (await _run(storage, txn, f"SELECT k FROM {name}")).rows == [(1,)]
    _commit(storage, txn)


async def test_identities_committed_are_the_ones_answered(storage: ManualStore) -> None:
    """A transaction's identities are what its commit writes, after a statement that
    failed, after a rollback to a savepoint, and after another transaction rolled back
    its own (PostgreSQL's sequences are not rolled back: the store puts them back)."""
    setup: Done = []
    await _run(
        storage,
        setup,
        "CREATE TABLE T (id INT IDENTITY(1,1) PRIMARY KEY, v NVARCHAR(10) UNIQUE)",
    )
    _commit(storage, setup)
    gone: Done = []
    await _run(storage, gone, "INSERT INTO T (v) VALUES ('gone')")
    storage.forget_table_statements(gone)  # rolled back
    txn: Done = []
    ids = [
        (await _run(storage, txn, sql, v=v)).rows[0][0]
        for sql, v in (
            ("INSERT INTO T (v) OUTPUT inserted.id VALUES (@v)", "a"),
            ("INSERT INTO T (v) OUTPUT inserted.id VALUES (@v)", "b"),
        )
    ]
    with pytest.raises(TableError, match="UNIQUE constraint failed"):
        await _run(storage, txn, "INSERT INTO T (v) VALUES (@v)", v="a")
    kept = len(txn)
    await _run(storage, txn, "INSERT INTO T (v) VALUES (@v)", v="dropped")
    del txn[kept:]  # a rollback to a savepoint taken before it
    storage.forget_table_statements(txn)
    ids += (await _run(storage, txn, "INSERT INTO T (v) OUTPUT inserted.id VALUES ('c')")).rows[0]
    _commit(storage, txn)
    check: Done = []
    rows = (await _run(storage, check, "SELECT id, v FROM T ORDER BY id")).rows
    assert rows == list(zip(ids, "abc", strict=True))
    # and they never repeat
    assert len(set(ids)) == 3


async def test_a_statement_runs_at_most_statement_timeout(storage: ManualStore) -> None:
    """A statement that runs too long is stopped and undone, on either store; the
    transaction goes on."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (k INT PRIMARY KEY)")
    values = ", ".join(f"({k})" for k in range(200))
    await _run(storage, txn, f"INSERT INTO T VALUES {values}")
    statement = storage.translate_table_statement(
        "SELECT COUNT(*) FROM T a, T b, T c, T d WHERE a.k + b.k + c.k + d.k > 0", "master"
    )
    started = time.monotonic()
    with pytest.raises(TableError, match="statement_timeout"):
        await storage.run_table_statements(TableRuns(txn, txn, statement, [{}], 0.3))
    assert time.monotonic() - started < 10
    assert (await _run(storage, txn, "SELECT COUNT(*) FROM T")).rows == [(200,)]
    _commit(storage, txn)


async def test_a_change_stopped_by_statement_timeout_keeps_the_transactions_earlier_ones(
    storage: ManualStore,
) -> None:
    """A change (not only a query) stopped for running too long is undone alone: what the
    transaction wrote before it stays, and its commit writes it, on either store."""
    txn: Done = []
    await _run(storage, txn, "CREATE TABLE T (k INT PRIMARY KEY, n INT)")
    values = ", ".join(f"({k}, 0)" for k in range(200))
    await _run(storage, txn, f"INSERT INTO T VALUES {values}")
    slow = storage.translate_table_statement(
        "UPDATE T SET n = (SELECT COUNT(*) FROM T a, T b, T c, T d WHERE a.k + b.k + c.k + d.k > T.k)",
        "master",
    )
    with pytest.raises(TableError, match="statement_timeout"):
        await storage.run_table_statements(TableRuns(txn, txn, slow, [{}], 0.3))
    await _run(storage, txn, "INSERT INTO T VALUES (200, 1)")
    assert (await _run(storage, txn, "SELECT COUNT(*), SUM(n) FROM T")).rows == [(201, 1)]
    _commit(storage, txn)
    check: Done = []
    assert (await _run(storage, check, "SELECT COUNT(*), SUM(n) FROM T")).rows == [(201, 1)]


async def test_postgresql_commits_while_a_statement_runs(
    open_background: Callable[[], Store],
) -> None:
    """On PostgreSQL a transaction's statements run on a connection of their own, off the
    store thread: a commit does not wait for a statement, and a rollback stops one."""
    store = open_background()
    if not isinstance(store, PostgresStore):
        await store.close()
        pytest.skip("SQLite's store runs statements on its store thread, before commits")
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))
    try:
        setup: Done = []
        await _run(store, setup, "CREATE TABLE T (k INT PRIMARY KEY)")
        store.write_table_statements(setup)
        store.forget_table_statements(setup)
        await _durable(store)
        holder: Done = []
        await _run(store, holder, "INSERT INTO T VALUES (1)")
        waiter: Done = []  # waits for the holder's row (the core's locks would not let it)
        waiting = asyncio.ensure_future(_run(store, waiter, "INSERT INTO T VALUES (1)"))
        for beat in range(3):
            store.put_meta("beat", str(beat))
            await _durable(store)  # commits go on
        assert not waiting.done()
        store.forget_table_statements(waiter)  # a rollback stops it
        with pytest.raises(TableError):
            await asyncio.wait_for(waiting, 30)
        store.write_table_statements(holder)
        store.forget_table_statements(holder)
        await _durable(store)
        check: Done = []
        assert (await _run(store, check, "SELECT k FROM T")).rows == [(1,)]
        store.forget_table_statements(check)
        assert not failures
    finally:
        await store.close()


async def _durable(store: Store) -> None:
    done = asyncio.get_running_loop().create_future()
    store.when_durable(store.watermark(), lambda: done.set_result(None))
    await asyncio.wait_for(done, 30)


async def _in_session(
    store: Store, session: int, owner: Done, sql: str, **values: Any
) -> TableAnswer:
    """Run a statement of session number `session` (its temporary tables are its own)."""
    statement = store.translate_table_statement(sql, "master", session)
    answer = await store.run_table_statements(TableRuns(owner, owner, statement, [values], 5.0))
    owner.append((statement, values))
    return answer


async def test_temporary_tables_are_their_sessions_own(storage: ManualStore) -> None:
    """A temporary table (#name) is its session's own, on either store: another session
    may have one of the same name; a rollback of its CREATE leaves nothing; it answers
    as a table does; it is no user's table (not listed, not counted)."""
    gone: Done = []
    await _in_session(storage, 4, gone, "CREATE TABLE #work (k INT PRIMARY KEY)")
    storage.forget_table_statements(gone)  # rolled back
    for session, declared, value in ((4, "v NVARCHAR(5) UNIQUE", "four"), (5, "v INT, w INT", 5)):
        txn: Done = []
        with pytest.raises(TableError, match="no such table: #work"):
            await _in_session(storage, session, txn, "SELECT * FROM #work")
        sql = f"CREATE TABLE #work (k INT IDENTITY(1,1) PRIMARY KEY, {declared})"
        await _in_session(storage, session, txn, sql)
        await _in_session(storage, session, txn, "INSERT INTO #work (v) VALUES (@v)", v=value)
        _commit(storage, txn)
    txn = []
    with pytest.raises(TableError, match="already exists"):
        await _in_session(storage, 5, txn, "CREATE TABLE #work (a INT)")
    added = "INSERT INTO #work (v) OUTPUT inserted.k VALUES (@v)"
    assert (await _in_session(storage, 4, txn, added, v="more")).rows == [(2,)]
    with pytest.raises(TableError, match=r"UNIQUE constraint failed: #work\.v"):
        await _in_session(storage, 4, txn, "INSERT INTO #work (v) VALUES ('four')")
    made = await _in_session(storage, 5, txn, "SELECT k, v INTO #copy FROM #work WHERE v = 5")
    assert made.rowcount == 1, "a SELECT ... INTO answers the rows it made"
    _commit(storage, txn)
    check: Done = []
    assert (await _in_session(storage, 4, check, "SELECT k, v FROM #work ORDER BY k")).rows == [
        (1, "four"),
        (2, "more"),
    ]
    assert (await _in_session(storage, 5, check, "SELECT k, v, w FROM #work")).rows == [
        (1, 5, None)
    ]
    assert (await _in_session(storage, 5, check, "SELECT k, v FROM #copy")).rows == [(1, 5)]
    await _in_session(storage, 5, check, "DROP TABLE #copy")
    _commit(storage, check)
    with pytest.raises(TableError, match="no such table: #copy"):
        await _in_session(storage, 5, check, "SELECT * FROM #copy")
    storage.forget_table_statements(check)
    assert storage.load_table_names() == [] and storage.table_sizes() == []


async def test_a_store_opened_again_has_no_temporary_table(
    open_background: Callable[[], Store],
) -> None:
    """Sessions end with their daemon: a store opened again (a restart, or a standby's
    takeover) has none of the temporary tables committed before, and the same session
    number may make its #work again."""
    for opened in range(2):
        store = open_background()
        failures: list[BaseException] = []
        store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))
        try:
            txn: Done = []
            with pytest.raises(TableError, match="no such table: #work"):
                await _in_session(store, 1, txn, "SELECT * FROM #work")
            await _in_session(store, 1, txn, "CREATE TABLE #work (k INT PRIMARY KEY)")
            await _in_session(store, 1, txn, "INSERT INTO #work VALUES (@k)", k=opened)
            store.write_table_statements(txn)
            store.forget_table_statements(txn)
            await _durable(store)
            assert not failures
        finally:
            await store.close()
