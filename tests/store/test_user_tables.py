"""Users' tables in the store, without a daemon: the translation and what it refuses, a
statement run provisionally then again at commit with the same results, a transaction's
statements kept applied while it goes on, and commits that meet provisional work on the
store thread."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from ssb.broker._core.ports import TableError, TableRuns
from ssb.broker._store import CommitHooks, ManualStore, SQLiteStore, Store, postgres_sql
from ssb.broker._store.postgres import PostgresStore
from ssb.broker._store.user_sql import translate
from ssb.broker._store.user_tables import TableAnswer

Done = list[tuple[Any, dict[str, Any]]]


class Transaction:
    """A transaction on `store`, whose statements run as the core runs them: each at once,
    provisionally, then kept for the commit. `done`, the statements it ran, is its owner
    too (each test's transactions are their own owners)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.done: Done = []

    async def __call__(self, sql: str, **values: Any) -> TableAnswer:
        """Run the statement `sql` with `values`: its answer."""
        return await self.runs(sql, [values])

    async def in_session(self, session: int, sql: str, **values: Any) -> TableAnswer:
        """Run a statement of session number `session` (its temporary tables are its own)."""
        return await self.runs(sql, [values], session=session)

    async def rows(self, sql: str, **values: Any) -> list[tuple[Any, ...]]:
        """The rows the query `sql` answers."""
        return (await self(sql, **values)).rows

    async def runs(
        self, sql: str, many: list[dict[str, Any]], *, session: int = 0, timeout: float = 5.0
    ) -> TableAnswer:
        """Run the statement `sql` once with each values of `many`, in one step, in at most
        `timeout` seconds; kept for the commit only when it succeeds."""
        statement = self.store.translate_table_statement(sql, "master", session)
        answer = await self.store.run_table_statements(
            TableRuns(self.done, self.done, statement, many, timeout)
        )
        self.done += [(statement, values) for values in many]
        return answer

    def commit(self) -> None:
        """Commit as the core does: the statements join the batch, the provisional run
        ends."""
        self.store.write_table_statements(self.done, self.done)
        self.store.forget_table_statements(self.done)
        self.store.flush()
        self.done.clear()

    def end(self) -> None:
        """The transaction ends, or goes back to a savepoint (`done` cut to it): its
        provisional run ends, undone."""
        self.store.forget_table_statements(self.done)


@pytest.fixture
def txn(storage: ManualStore) -> Transaction:
    """A transaction on each store."""
    return Transaction(storage)


@contextlib.asynccontextmanager
async def _attached(store: Store) -> AsyncIterator[list[BaseException]]:
    """`store` committing by itself on the running loop, until it is closed on the way
    out: the failures its commits tell."""
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))
    try:
        yield failures
    finally:
        await store.close()


async def _durable(store: Store) -> None:
    """Wait until all `store` has written so far is durable."""
    done = asyncio.get_running_loop().create_future()
    store.when_durable(store.watermark(), lambda: done.set_result(None))
    await asyncio.wait_for(done, 30)


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
    txn: Transaction,
) -> None:
    await txn(
        "CREATE TABLE Orders (id INT IDENTITY(1,1) PRIMARY KEY, item NVARCHAR(20) UNIQUE,"
        " at DATETIME2, amount DECIMAL(9,2) NOT NULL DEFAULT 0)"
    )
    first = await txn(
        "INSERT INTO Orders (item, at) OUTPUT inserted.id, inserted.at VALUES (@p1, GETDATE())",
        p1="apple",
    )
    second = await txn("INSERT INTO Orders (item) OUTPUT inserted.id VALUES (@p1)", p1="pear")
    assert [first.rows[0][0], second.rows[0][0]] == [1, 2]
    # its own changes are what the transaction reads
    assert await txn.rows("SELECT COUNT(*) FROM Orders") == [(2,)]
    txn.commit()
    assert storage.load_table_names() == [("master", "orders")]
    assert storage.table_sizes() == [("master", "orders", 2)]
    rows = await Transaction(storage).rows("SELECT id, item, at FROM Orders ORDER BY id")
    # the row committed is the row answered: the identity, and GETDATE() evaluated once
    assert rows == [(1, "apple", first.rows[0][1]), (2, "pear", None)]


async def test_a_failed_statement_leaves_the_transaction_as_it_was(
    storage: ManualStore,
    txn: Transaction,
) -> None:
    await txn("CREATE TABLE T (k INT PRIMARY KEY)")
    await txn("INSERT INTO T VALUES (1)")
    with pytest.raises(TableError, match=r"UNIQUE constraint failed: t\.k"):
        await txn("INSERT INTO T VALUES (2), (1)")
    with pytest.raises(TableError, match="not given a value"):
        await txn("INSERT INTO T VALUES (@p1)")
    assert await txn.rows("SELECT COUNT(*) FROM T") == [(1,)]
    txn.commit()
    assert await Transaction(storage).rows("SELECT k FROM T") == [(1,)]


async def test_another_transaction_and_a_rollback_start_from_the_durable_rows(
    storage: ManualStore,
) -> None:
    setup = Transaction(storage)
    await setup("CREATE TABLE T (k INT PRIMARY KEY, v INT)")
    await setup("INSERT INTO T VALUES (1, 10)")
    setup.commit()
    first = Transaction(storage)
    second = Transaction(storage)
    await first("UPDATE T SET v = v + 1")
    # another owner's statement rolls the first's back first, and finds the durable rows
    assert await second.rows("SELECT v FROM T") == [(10,)]
    # the first's next statement replays its earlier ones
    await first("UPDATE T SET v = v * 2")
    assert await first.rows("SELECT v FROM T") == [(22,)]
    first.end()  # rolled back
    assert await second.rows("SELECT v FROM T") == [(10,)]
    # a rollback to a savepoint: the statements after it are dropped, the rest replayed
    del first.done[1:]
    assert await first.rows("SELECT v FROM T") == [(11,)]


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
        setup = Transaction(store)
        await setup("CREATE TABLE T (k INT IDENTITY(1,1) PRIMARY KEY, v INT)")
        setup.commit()
        txn = Transaction(store)
        answer = await txn("INSERT INTO T (v) OUTPUT inserted.k VALUES (7)")
        await txn.runs("UPDATE T SET v = v + @d", [{"d": 1}, {"d": 2}])
        store.write_table_statements(txn.done, txn.done)
        store.forget_table_statements(txn.done)
        if meanwhile == "another statement":
            assert await Transaction(store).rows("SELECT COUNT(*) FROM T") == [(0,)]
        elif meanwhile == "a failed commit":
            store.fail_next = sqlite3.OperationalError("database or disk is full")
            store.flush()
            assert store.trouble is not None
        runs.clear()
        store.flush()
        assert store.trouble is None
        changes = [sql for sql in runs if sql.startswith(("INSERT", "UPDATE"))]
        assert len(changes) == (0 if meanwhile == "nothing" else 3)
        assert await Transaction(store).rows("SELECT k, v FROM T") == [(answer.rows[0][0], 10)]
    finally:
        await store.close()


async def test_commits_wait_for_provisional_work_on_the_store_thread(tmp_path: Path) -> None:
    """A store committing by itself: a commit that comes while a transaction's statement
    is on the thread, or its provisional transaction is open, runs after it and rolls it
    back first; what it commits is only what was written to the batch."""
    path = tmp_path / "broker.db"
    store = SQLiteStore(path, "os")
    async with _attached(store) as failures:
        setup = Transaction(store)
        await setup("CREATE TABLE T (k INT PRIMARY KEY)")
        store.write_table_statements(setup.done)
        await _durable(store)
        txn = Transaction(store)
        for k in range(50):
            running = asyncio.ensure_future(txn("INSERT INTO T VALUES (@k)", k=k))
            store.put_meta("beat", str(k))  # a commit meets the statement on its way
            await running
            await _durable(store)
        other = sqlite3.connect(path)
        try:
            assert other.execute('SELECT COUNT(*) FROM "u:master:t"').fetchone() == (0,)
            store.write_table_statements(txn.done)
            await _durable(store)
            assert other.execute('SELECT COUNT(*) FROM "u:master:t"').fetchone() == (50,)
        finally:
            other.close()
        assert not failures


async def test_foreign_keys_hold_and_the_store_tells_them(
    storage: ManualStore, txn: Transaction
) -> None:
    await txn("CREATE TABLE Parent (id INT PRIMARY KEY)")
    await txn(
        "CREATE TABLE Child (id INT PRIMARY KEY, parent INT REFERENCES dbo.Parent (id)"
        " ON DELETE CASCADE)"
    )
    await txn("CREATE TABLE Note (child INT, FOREIGN KEY (child) REFERENCES Child (id))")
    await txn("ALTER TABLE Note ADD parent INT REFERENCES Parent (id)")
    await txn("INSERT INTO Parent VALUES (1)")
    with pytest.raises(TableError, match="FOREIGN KEY"):
        await txn("INSERT INTO Child VALUES (1, 2)")
    await txn("INSERT INTO Child VALUES (1, 1)")
    txn.commit()
    assert sorted(storage.table_foreign_keys("master")) == [
        ("child", "parent", True),
        ("note", "child", False),
        ("note", "parent", False),
    ]
    assert storage.table_foreign_keys("other") == []
    later = Transaction(storage)
    await later("DELETE FROM Parent")
    assert await later.rows("SELECT COUNT(*) FROM Child") == [(0,)]


async def test_plus_joins_text_and_adds_numbers_as_t_sql_does(txn: Transaction) -> None:
    await txn("CREATE TABLE T (a NVARCHAR(10), n INT, b VARBINARY(10))")
    await txn("INSERT INTO T VALUES (N'ab', 2, 0x01)")
    rows = await txn.rows("SELECT a + N'c', n + 1, n + '40', b + 0x02, a + NULL FROM T")
    assert rows == [("abc", 3, 42, b"\x01\x02", None)]
    with pytest.raises(TableError):
        await txn("SELECT n + 'x' FROM T")


async def test_an_average_is_of_its_arguments_type(txn: Transaction) -> None:
    """AVG of integers is an integer, the quotient cut toward zero; of DECIMAL or FLOAT
    it keeps its fraction, whole though the values are (as SQL Server's AVG)."""
    await txn("CREATE TABLE T (g INT, i INT, s SMALLINT, b BIGINT, d DECIMAL(10, 2), f FLOAT)")
    await txn("CREATE TABLE #g (g INT, n INT)")
    await txn(
        "INSERT INTO T VALUES (1, 1, 1, 1, 1, 1), (1, 2, 2, 2, 2, 2),"
        " (2, -3, -3, -3, -3, -3), (2, -4, -4, -4, -4, -4)"
    )
    await txn("INSERT INTO #g VALUES (1, 1), (1, 2)")
    averages = await txn.rows(
        "SELECT AVG(i), AVG(s), AVG(b), AVG(d), AVG(f), AVG(t.i * 2 + 1),"
        " AVG(CASE WHEN i > 1 THEN 1 ELSE 0 END), AVG(CAST(i AS FLOAT)) FROM T AS t GROUP BY g"
        " ORDER BY g"
    )
    assert averages == [
        (1, 1, 1, 1.5, 1.5, 4, 0, 1.5),
        (-3, -3, -3, -3.5, -3.5, -6, 0, -3.5),
    ]
    joined = await txn.rows("SELECT AVG(n), AVG(DISTINCT x.d) FROM #g JOIN T x ON x.g = #g.g")
    assert joined == [(1, 1.5)]
    inserted = await txn("INSERT INTO #g SELECT 3, AVG(i) FROM T WHERE g = 1")
    assert inserted.rowcount == 1
    assert await txn.rows("SELECT n FROM #g WHERE g = 3") == [(1,)]
    windowed = await txn.rows("SELECT DISTINCT g, AVG(i) OVER (PARTITION BY g) FROM T ORDER BY g")
    assert windowed == [(1, 1), (2, -3)]
    assert await txn.rows("SELECT AVG(i), AVG(d) FROM T WHERE g = 9") == [(None, None)]


async def test_a_sum_or_average_of_text_is_refused(txn: Transaction) -> None:
    """SUM and AVG take numbers only: of a text column or a text they fail with SQL
    Server's Msg 8117, whatever the text holds."""
    await txn("CREATE TABLE T (k INT PRIMARY KEY, v VARCHAR(10), u UNIQUEIDENTIFIER)")
    await txn("INSERT INTO T VALUES (1, '1', NEWID())")
    for sql, kind, operator in (
        ("SELECT SUM(v) FROM T", "varchar", "sum"),
        ("SELECT k, AVG(v) FROM T GROUP BY k", "varchar", "avg"),
        ("SELECT SUM(t.v) OVER (PARTITION BY k) FROM T AS t", "varchar", "sum"),
        ("SELECT SUM('1') FROM T", "varchar", "sum"),
        ("SELECT AVG(u) FROM T", "uniqueidentifier", "avg"),
    ):
        said = f"Operand data type {kind} is invalid for {operator} operator."
        with pytest.raises(TableError, match=r"\A" + re.escape(said) + r"\Z"):
            await txn(sql)
    assert await txn.rows("SELECT SUM(k), AVG(k) FROM T") == [(1, 1)]


async def test_a_value_longer_than_its_column_is_refused(txn: Transaction) -> None:
    """Text or bytes longer than a sized column fail the statement, whole (trailing
    spaces of a text may go), as SQL Server's do."""
    await txn(
        "CREATE TABLE T (k INT PRIMARY KEY, n NVARCHAR(10), v VARCHAR(3), c CHAR(2),"
        " b VARBINARY(2), m NVARCHAR(MAX))"
    )
    await txn("INSERT INTO T VALUES (1, N'0123456789', 'abc', 'ab', 0x0102, N'')")
    await txn("INSERT INTO T (k, v) VALUES (2, 'ab   ')")
    for sql in (
        "INSERT INTO T (k, n) VALUES (3, N'fourteen chars')",
        "INSERT INTO T (k, v) VALUES (3, 'abcd')",
        "INSERT INTO T (k, c) VALUES (3, 'abc')",
        "INSERT INTO T (k, b) VALUES (3, 0x010203)",
        "INSERT INTO T (k, n) VALUES (3, N'short'), (4, N'much too long')",
        "UPDATE T SET n = n + N'!'",
    ):
        with pytest.raises(TableError, match=r"\AString or binary data would be truncated\."):
            await txn(sql)
    await txn("UPDATE T SET m = @m", m="x" * 9000)
    assert await txn.rows("SELECT k, n FROM T ORDER BY k") == [(1, "0123456789"), (2, None)]


@pytest.mark.parametrize(
    ("column", "value"),
    [("v", "'vv'"), ("n", "N'nn'"), ("c", "'cc'"), ("b", "0x0102"), ("a", "N'aa'")],
)
async def test_a_text_or_binary_column_without_a_length_holds_one(
    txn: Transaction, column: str, value: str
) -> None:
    """CHAR, VARCHAR, NCHAR, NVARCHAR, BINARY and VARBINARY declared without a length
    are of length 1, as SQL Server's are."""
    await txn("CREATE TABLE T (k INT PRIMARY KEY, v VARCHAR, n NVARCHAR, c CHAR, b VARBINARY)")
    await txn("ALTER TABLE T ADD a NCHAR")
    await txn("INSERT INTO T VALUES (1, 'v', N'n', 'c', 0x01, N'a')")
    with pytest.raises(TableError, match=r"\AString or binary data would be truncated\."):
        await txn(f"INSERT INTO T (k, {column}) VALUES (2, {value})")
    assert await txn.rows("SELECT * FROM T") == [(1, "v", "n", "c", b"\x01", "a")]


async def test_an_integer_past_its_types_range_is_refused(txn: Transaction) -> None:
    """A value past its integer column's range, and a SUM or AVG of INTs whose total is
    past INT's, fail the statement, whole, as SQL Server's arithmetic overflow."""
    await txn("CREATE TABLE N (k INT PRIMARY KEY, i INT, s SMALLINT, t TINYINT, b BIGINT)")
    await txn("INSERT INTO N VALUES (1, 2147483647, 32767, 255, 1), (2, 1, 0, 0, 0)")
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
            await txn(sql)
    sums = await txn.rows("SELECT SUM(CAST(i AS BIGINT)), SUM(s), SUM(b) FROM N")
    assert sums == [(2147483648, 32767, 1)]
    assert await txn.rows("SELECT k, i, t FROM N ORDER BY k") == [(1, 2147483647, 255), (2, 1, 0)]


@pytest.mark.parametrize(
    ("create", "insert", "query", "values", "rows"),
    [
        # to TINYINT as to any other integer type
        pytest.param(
            "CREATE TABLE T (k INT PRIMARY KEY, d DECIMAL(5, 2))",
            "INSERT INTO T VALUES (1, 7)",
            "SELECT CAST(k AS TINYINT), CONVERT(TINYINT, d) FROM T",
            {},
            [(1, 7)],
            id="tinyint",
        ),
        # a number's fraction is cut toward zero (PostgreSQL's own CAST rounds 4.5 to 5)
        pytest.param(
            "CREATE TABLE N (k INT PRIMARY KEY, d DECIMAL(5, 2), f FLOAT)",
            "INSERT INTO N VALUES (1, 4.5, -4.5)",
            "SELECT CAST(4.5 AS INT), CAST(-4.5 AS INT), CONVERT(BIGINT, 2.99), CAST(d AS INT),"
            " CAST(f AS SMALLINT), CAST(d * 3 AS TINYINT), CAST(k AS INT) FROM N",
            {},
            [(4, -4, 2, 4, -4, 13, 1)],
            id="fraction",
        ),
        # text of no digits at all, empty or spaces, is 0 (PostgreSQL's own CAST refuses it)
        pytest.param(
            "CREATE TABLE E (k INT PRIMARY KEY, s VARCHAR(10))",
            "INSERT INTO E VALUES (1, '')",
            "SELECT CAST('' AS INT), CAST('   ' AS BIGINT), CONVERT(SMALLINT, @p),"
            " CAST(s AS TINYINT) FROM E",
            {"p": ""},
            [(0, 0, 0, 0)],
            id="empty-text",
        ),
        # TRY_CAST and TRY_CONVERT give NULL where CAST would fail (text that is no whole
        # number, a value past the range; SQLite's own CAST made 0 of 'abc'), and the
        # number where it converts
        pytest.param(
            "CREATE TABLE T (k INT PRIMARY KEY, s VARCHAR(20), b BIGINT)",
            "INSERT INTO T VALUES (1, 'abc', 3000000000), (2, ' 42 ', 7)",
            "SELECT TRY_CAST('abc' AS INT), TRY_CONVERT(INT, 'abc'), TRY_CAST('3000000000' AS INT),"
            " TRY_CONVERT(TINYINT, 300), TRY_CAST(4.5 AS INT), TRY_CAST(s AS INT),"
            " TRY_CONVERT(INT, b), TRY_CAST(@p AS SMALLINT) FROM T ORDER BY k",
            {"p": "1e2"},
            [
                (None, None, None, None, 4, None, None, None),
                (None, None, None, None, 4, 42, 7, None),
            ],
            id="try-cast",
        ),
    ],
)
async def test_a_cast_to_an_integer_type_gives_sql_servers_value(
    txn: Transaction,
    create: str,
    insert: str,
    query: str,
    values: dict[str, Any],
    rows: list[tuple[Any, ...]],
) -> None:
    """CAST and CONVERT to an integer type, and TRY_CAST and TRY_CONVERT, give on every
    store the value SQL Server gives."""
    await txn(create)
    await txn(insert)
    assert await txn.rows(query, **values) == rows


async def test_text_in_an_integer_column_converts_or_fails_as_sql_servers_does(
    txn: Transaction,
) -> None:
    """A number given as text goes into an integer column as that number; other text
    fails the statement, whole, with SQL Server's Msg 245."""
    await txn("CREATE TABLE N (k INT PRIMARY KEY, i INT, b BIGINT)")
    await txn("INSERT INTO N VALUES (1, '42', @b)", b="7")
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
            await txn(sql, **values)
    assert await txn.rows("SELECT k, i, b FROM N") == [(1, 42, 7)]


async def test_a_cast_of_text_to_an_integer_converts_or_fails_as_sql_servers_does(
    txn: Transaction,
) -> None:
    """CAST and CONVERT of text to an integer type take a whole number, spaces around it
    allowed; anything else ('abc', '4.5', '1e2') fails the statement with Msg 245, where
    SQLite's own CAST would give 0, 4 or 100."""
    await txn("CREATE TABLE C (k INT PRIMARY KEY, s VARCHAR(10))")
    await txn("INSERT INTO C VALUES (1, ' 12 '), (2, 'x1')")
    rows = await txn.rows(
        "SELECT CAST('42' AS INT), CAST(' 42 ' AS BIGINT), CONVERT(SMALLINT, '-7'),"
        " CAST('+5' AS TINYINT), CAST(s AS INT), CAST(@p AS BIGINT) FROM C WHERE k = 1",
        p="8",
    )
    assert rows == [(42, 42, -7, 5, 12, 8)]
    for sql, values, value, kind in (
        ("SELECT CAST('abc' AS INT)", {}, "abc", "int"),
        ("SELECT CAST('4.5' AS INT)", {}, "4.5", "int"),
        ("SELECT CONVERT(BIGINT, s) FROM C", {}, "x1", "bigint"),
        ("SELECT CAST(@p AS SMALLINT)", {"p": "1e2"}, "1e2", "smallint"),
        ("INSERT INTO C VALUES (3, CAST('4.0' AS INT))", {}, "4.0", "int"),
    ):
        said = f"Conversion failed when converting the varchar value '{value}' to data type {kind}."
        with pytest.raises(TableError, match=r"\A" + re.escape(said) + r"\Z"):
            await txn(sql, **values)
    assert await txn.rows("SELECT COUNT(*) FROM C") == [(2,)]


async def test_a_cast_past_an_integer_types_range_fails_as_sql_servers_does(
    txn: Transaction,
) -> None:
    """A cast to an integer type of a value past its range fails the statement in SQL
    Server's words: text with Msg 248 (int), 244 (tinyint, smallint: INT1, INT2) or 8114
    (bigint), an integer with Msg 220 (to tinyint or smallint, with the value), any
    other number with Msg 8115; a value in range converts."""
    await txn("CREATE TABLE R (k INT PRIMARY KEY, b BIGINT, d DECIMAL(12, 1))")
    await txn("INSERT INTO R VALUES (1, 3000000000, 300.5), (2, 255, 255.9)")
    rows = await txn.rows(
        "SELECT CAST('255' AS TINYINT), CAST(b AS TINYINT), CAST(d AS TINYINT),"
        " CAST(-2147483648 AS INT), CAST(@p AS SMALLINT) FROM R WHERE k = 2",
        p=-32768,
    )
    assert rows == [(255, 255, 255, -2147483648, -32768)]
    rows = await txn.rows("SELECT CASE WHEN k = 9 THEN CAST(300 AS TINYINT) ELSE k END FROM R")
    assert rows == [(1,), (2,)]  # (a failure not reached is none)
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
            await txn(sql, **values)
    assert await txn.rows("SELECT COUNT(*) FROM R") == [(2,)]


async def test_names_and_keys_as_sql_server_has_them(txn: Transaction) -> None:
    """A column that does not exist is an error, never its name as text (SQLite's
    double-quoted fallback); a primary key takes no NULL, whatever its type and however
    it is declared, and is never numbered for the caller as a rowid would be."""
    await txn("CREATE TABLE T (id INT PRIMARY KEY, note NVARCHAR(10))")
    await txn("CREATE TABLE P (a INT, b INT, PRIMARY KEY (a, b))")
    await txn("INSERT INTO T VALUES (1, N'x')")
    for sql in (
        "SELECT nope FROM T",
        "INSERT INTO T (note) VALUES (N'no key')",
        "INSERT INTO P (a) VALUES (1)",
        "CREATE TABLE N (a INT NULL PRIMARY KEY)",
    ):
        with pytest.raises(TableError):
            await txn(sql)
    assert await txn.rows("SELECT id, note FROM T") == [(1, "x")]


async def test_names_are_without_case_as_sql_servers_are(
    storage: ManualStore, txn: Transaction
) -> None:
    """A table, an alias or a column is the same name in any case, in every clause and
    on every store; a result's column is named as the query wrote it (`*`'s as they were
    declared)."""
    await txn("CREATE TABLE Orders (OrderId INT PRIMARY KEY, Item NVARCHAR(10))")
    await txn("CREATE INDEX IX_Item ON ORDERS (ITEM)")
    await txn("ALTER TABLE orders ADD Qty INT")
    inserted = await txn(
        "INSERT INTO orders (orderid, ITEM, qty) OUTPUT inserted.ORDERID"
        " VALUES (1, N'a', 1), (2, N'b', 2), (3, N'b', 3)"
    )
    assert inserted.columns == ["ORDERID"]
    await txn("UPDATE ORDERS SET item = N'c', QTY = qty + 1 WHERE OrderID = 3")
    await txn("DELETE FROM Orders WHERE ORDERID = 1")
    joined = await txn(
        "SELECT o.OrderId, O.item, P.QTY AS Quantity FROM Orders AS O"
        " JOIN orders p ON P.ORDERID = o.orderid ORDER BY O.orderID DESC"
    )
    assert joined.columns == ["OrderId", "item", "Quantity"]
    assert joined.rows == [(3, "c", 4), (2, "b", 2)]
    assert await txn.rows("SELECT orders.orderid FROM ORDERS WHERE Orders.Qty > 2") == [(3,)]
    grouped = await txn("SELECT ITEM, SUM(qty) AS Total FROM orders GROUP BY item ORDER BY total")
    assert grouped.columns == ["ITEM", "Total"] and grouped.rows == [("b", 2), ("c", 4)]
    starred = await txn("SELECT * FROM ORDERS ORDER BY orderid")
    assert starred.columns == ["OrderId", "Item", "Qty"]
    await txn("SELECT OrderId, qty AS Amount INTO #Copy FROM orders")
    copied = await txn("SELECT * FROM #copy ORDER BY AMOUNT")
    assert copied.columns == ["OrderId", "Amount"] and copied.rows == [(2, 2), (3, 4)]
    txn.commit()
    assert storage.trouble is None, storage.trouble
    later = Transaction(storage)
    assert await later.rows("SELECT orders.ITEM FROM Orders") == [("b",), ("c",)]


async def test_replicate_repeats_a_text_as_sql_server_does(txn: Transaction) -> None:
    """REPLICATE repeats its text, NULL for a negative count; a result longer than 8000
    bytes is cut there unless its text is of a (MAX) type."""
    await txn("CREATE TABLE T (k INT PRIMARY KEY, s VARCHAR(10))")
    await txn("INSERT INTO T VALUES (1, 'ab')")
    await txn("UPDATE T SET s = REPLICATE(s, 2) + REPLICATE('-', k)")
    rows = await txn.rows(
        "SELECT s, REPLICATE(s, 2), REPLICATE('x', 0), REPLICATE('x', -1), REPLICATE(5, 2),"
        " LEN(REPLICATE('abc', 5000)), LEN(REPLICATE(N'é', 5000)),"
        " LEN(REPLICATE(CAST('a' AS VARCHAR(MAX)), 9000)) FROM T"
    )
    assert rows == [("abab-", "abab-abab-", "", None, "55", 8000, 4000, 9000)]
    with pytest.raises(TableError, match=r"\AAttempting to grow LOB beyond maximum allowed size"):
        await txn("SELECT REPLICATE(CAST(s AS NVARCHAR(MAX)), 1000000000) FROM T")


async def test_many_runs_answer_and_commit_as_the_runs_one_by_one(
    storage: ManualStore, txn: Transaction
) -> None:
    await txn(
        "CREATE TABLE Log (id INT IDENTITY(1,1) PRIMARY KEY, k INT UNIQUE, v NVARCHAR(10),"
        " at UNIQUEIDENTIFIER)"
    )
    insert = "INSERT INTO Log (k, v, at) VALUES (@p1, @p2, NEWID()), (@p1 + 1000, 'x?1', NULL)"
    many = [{"p1": k, "p2": f"v{k}"} for k in range(250)]  # more than one group's runs
    assert (await txn.runs(insert, many)).rowcount == 500
    # a failed run undoes all of them: the runs are one step
    again = [{"p1": 1000 + k, "p2": "again"} for k in range(3)]
    with pytest.raises(TableError, match="UNIQUE"):
        await txn.runs(insert, again)
    changes = [{"k": 7, "v": "seven"}, {"k": 5000, "v": "none"}, {"k": 8, "v": "eight"}]
    assert (await txn.runs("UPDATE Log SET v = @v WHERE k = @k", changes)).rowcount == 2
    # the runs count as statements of the transaction: the next one follows them in the
    # same provisional transaction, replaying nothing
    ran: list[str] = []
    if isinstance(storage, SQLiteStore):
        storage._db.set_trace_callback(ran.append)
    seen = await txn.rows("SELECT id, k, v, at FROM Log ORDER BY id")
    if isinstance(storage, SQLiteStore):
        storage._db.set_trace_callback(None)
        assert not [sql for sql in ran if sql.startswith(("INSERT", "UPDATE"))], ran
    txn.commit()
    rows = await Transaction(storage).rows("SELECT id, k, v, at FROM Log ORDER BY id")
    assert rows == seen and len(rows) == 500
    # in the runs' order, each run's own values (NEWID() once per run)
    assert [row[:3] for row in rows[:4]] == [
        (1, 0, "v0"),
        (2, 1000, "x?1"),
        (3, 1, "v1"),
        (4, 1001, "x?1"),
    ]
    assert rows[14][2] == "seven" and rows[16][2] == "eight"
    assert len({row[3] for row in rows if row[3] is not None}) == 250


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
async def test_a_statement_reaches_nothing_but_the_users_tables(txn: Transaction, sql: str) -> None:
    """The store's own tables, the database's catalogs and its functions that touch the
    server are out of a user's reach, on either store."""
    await txn("CREATE TABLE T (k INT PRIMARY KEY)")
    with pytest.raises(TableError):
        await txn(sql)
    assert await txn.rows("SELECT COUNT(*) FROM T") == [(0,)]
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
async def test_a_table_with_the_longest_name_takes_inserts(txn: Transaction, size: int) -> None:
    """A table whose name is as long as PostgreSQL keeps, and has no identity column,
    takes INSERTs on every store (its identity sequence's longer name is never asked for)."""
    name = "t" * size
    await txn(f"CREATE TABLE {name} (k INT)")
    await txn(f"INSERT INTO {name} VALUES (1)")
    assert await txn.rows(f"SELECT k FROM {name}") == [(1,)]
    txn.commit()


async def test_identities_committed_are_the_ones_answered(storage: ManualStore) -> None:
    """A transaction's identities are what its commit writes, after a statement that
    failed, after a rollback to a savepoint, and after another transaction rolled back
    its own (PostgreSQL's sequences are not rolled back: the store puts them back)."""
    setup = Transaction(storage)
    await setup("CREATE TABLE T (id INT IDENTITY(1,1) PRIMARY KEY, v NVARCHAR(10) UNIQUE)")
    setup.commit()
    gone = Transaction(storage)
    await gone("INSERT INTO T (v) VALUES ('gone')")
    gone.end()  # rolled back
    txn = Transaction(storage)
    ids = [
        (await txn(sql, v=v)).rows[0][0]
        for sql, v in (
            ("INSERT INTO T (v) OUTPUT inserted.id VALUES (@v)", "a"),
            ("INSERT INTO T (v) OUTPUT inserted.id VALUES (@v)", "b"),
        )
    ]
    with pytest.raises(TableError, match="UNIQUE constraint failed"):
        await txn("INSERT INTO T (v) VALUES (@v)", v="a")
    kept = len(txn.done)
    await txn("INSERT INTO T (v) VALUES (@v)", v="dropped")
    del txn.done[kept:]  # a rollback to a savepoint taken before it
    txn.end()
    ids += (await txn("INSERT INTO T (v) OUTPUT inserted.id VALUES ('c')")).rows[0]
    txn.commit()
    rows = await Transaction(storage).rows("SELECT id, v FROM T ORDER BY id")
    assert rows == list(zip(ids, "abc", strict=True))
    # and they never repeat
    assert len(set(ids)) == 3


async def test_a_statement_runs_at_most_statement_timeout(txn: Transaction) -> None:
    """A statement that runs too long is stopped and undone, on either store; the
    transaction goes on."""
    await txn("CREATE TABLE T (k INT PRIMARY KEY)")
    values = ", ".join(f"({k})" for k in range(200))
    await txn(f"INSERT INTO T VALUES {values}")
    slow = "SELECT COUNT(*) FROM T a, T b, T c, T d WHERE a.k + b.k + c.k + d.k > 0"
    started = time.monotonic()
    with pytest.raises(TableError, match="statement_timeout"):
        await txn.runs(slow, [{}], timeout=0.3)
    assert time.monotonic() - started < 10
    assert await txn.rows("SELECT COUNT(*) FROM T") == [(200,)]
    txn.commit()


async def test_a_change_stopped_by_statement_timeout_keeps_the_transactions_earlier_ones(
    storage: ManualStore,
    txn: Transaction,
) -> None:
    """A change (not only a query) stopped for running too long is undone alone: what the
    transaction wrote before it stays, and its commit writes it, on either store."""
    await txn("CREATE TABLE T (k INT PRIMARY KEY, n INT)")
    values = ", ".join(f"({k}, 0)" for k in range(200))
    await txn(f"INSERT INTO T VALUES {values}")
    slow = "UPDATE T SET n = (SELECT COUNT(*) FROM T a, T b, T c, T d WHERE a.k + b.k + c.k + d.k > T.k)"
    with pytest.raises(TableError, match="statement_timeout"):
        await txn.runs(slow, [{}], timeout=0.3)
    await txn("INSERT INTO T VALUES (200, 1)")
    assert await txn.rows("SELECT COUNT(*), SUM(n) FROM T") == [(201, 1)]
    txn.commit()
    assert await Transaction(storage).rows("SELECT COUNT(*), SUM(n) FROM T") == [(201, 1)]


async def test_postgresql_commits_while_a_statement_runs(
    open_background: Callable[[], Store],
) -> None:
    """On PostgreSQL a transaction's statements run on a connection of their own, off the
    store thread: a commit does not wait for a statement, and a rollback stops one."""
    store = open_background()
    if not isinstance(store, PostgresStore):
        await store.close()
        pytest.skip("SQLite's store runs statements on its store thread, before commits")
    async with _attached(store) as failures:
        setup = Transaction(store)
        await setup("CREATE TABLE T (k INT PRIMARY KEY)")
        store.write_table_statements(setup.done)
        setup.end()
        await _durable(store)
        holder = Transaction(store)
        await holder("INSERT INTO T VALUES (1)")
        # the waiter waits for the holder's row (the core's locks would not let it)
        waiter = Transaction(store)
        waiting = asyncio.ensure_future(waiter("INSERT INTO T VALUES (1)"))
        for beat in range(3):
            store.put_meta("beat", str(beat))
            await _durable(store)  # commits go on
        assert not waiting.done()
        waiter.end()  # a rollback stops it
        with pytest.raises(TableError):
            await asyncio.wait_for(waiting, 30)
        store.write_table_statements(holder.done)
        holder.end()
        await _durable(store)
        check = Transaction(store)
        assert await check.rows("SELECT k FROM T") == [(1,)]
        check.end()
        assert not failures


async def test_temporary_tables_are_their_sessions_own(storage: ManualStore) -> None:
    """A temporary table (#name) is its session's own, on either store: another session
    may have one of the same name; a rollback of its CREATE leaves nothing; it answers
    as a table does; it is no user's table (not listed, not counted)."""
    gone = Transaction(storage)
    await gone.in_session(4, "CREATE TABLE #work (k INT PRIMARY KEY)")
    gone.end()  # rolled back
    for session, declared, value in ((4, "v NVARCHAR(5) UNIQUE", "four"), (5, "v INT, w INT", 5)):
        txn = Transaction(storage)
        with pytest.raises(TableError, match="no such table: #work"):
            await txn.in_session(session, "SELECT * FROM #work")
        sql = f"CREATE TABLE #work (k INT IDENTITY(1,1) PRIMARY KEY, {declared})"
        await txn.in_session(session, sql)
        await txn.in_session(session, "INSERT INTO #work (v) VALUES (@v)", v=value)
        txn.commit()
    txn = Transaction(storage)
    with pytest.raises(TableError, match="already exists"):
        await txn.in_session(5, "CREATE TABLE #work (a INT)")
    added = "INSERT INTO #work (v) OUTPUT inserted.k VALUES (@v)"
    assert (await txn.in_session(4, added, v="more")).rows == [(2,)]
    with pytest.raises(TableError, match=r"UNIQUE constraint failed: #work\.v"):
        await txn.in_session(4, "INSERT INTO #work (v) VALUES ('four')")
    made = await txn.in_session(5, "SELECT k, v INTO #copy FROM #work WHERE v = 5")
    assert made.rowcount == 1, "a SELECT ... INTO answers the rows it made"
    txn.commit()
    check = Transaction(storage)
    assert (await check.in_session(4, "SELECT k, v FROM #work ORDER BY k")).rows == [
        (1, "four"),
        (2, "more"),
    ]
    assert (await check.in_session(5, "SELECT k, v, w FROM #work")).rows == [(1, 5, None)]
    assert (await check.in_session(5, "SELECT k, v FROM #copy")).rows == [(1, 5)]
    await check.in_session(5, "DROP TABLE #copy")
    check.commit()
    with pytest.raises(TableError, match="no such table: #copy"):
        await check.in_session(5, "SELECT * FROM #copy")
    check.end()
    assert storage.load_table_names() == [] and storage.table_sizes() == []


async def test_a_store_opened_again_has_no_temporary_table(
    open_background: Callable[[], Store],
) -> None:
    """Sessions end with their daemon: a store opened again (a restart, or a standby's
    takeover) has none of the temporary tables committed before, and the same session
    number may make its #work again."""
    for opened in range(2):
        store = open_background()
        async with _attached(store) as failures:
            txn = Transaction(store)
            with pytest.raises(TableError, match="no such table: #work"):
                await txn.in_session(1, "SELECT * FROM #work")
            await txn.in_session(1, "CREATE TABLE #work (k INT PRIMARY KEY)")
            await txn.in_session(1, "INSERT INTO #work VALUES (@k)", k=opened)
            store.write_table_statements(txn.done)
            txn.end()
            await _durable(store)
            assert not failures
