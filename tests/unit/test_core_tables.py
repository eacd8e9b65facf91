"""Users' tables in the core, without a daemon (fake clock, in-memory store): statements
in a transaction commit with its messages, table locks are held until the commit is
durable, waits end at statement_timeout, and a savepoint takes its later statements
back."""

from __future__ import annotations

import asyncio

import pytest

from ssb.broker._errors import BrokerError
from ssb.protocol import ErrorCode

from .core_harness import Core


async def _execute(core: Core, sql: str, *params: object, session: object = None) -> dict:
    result: dict = await core.aop("execute", sql, list(params) or None, session=session)
    return result


async def test_a_change_commits_with_the_receive_and_its_lock_holds_until_durable() -> None:
    core = Core(statement_timeout=5.0)
    core.services()
    handle = core.dialog()
    core.op("send", handle, "DEFAULT", [b"m"])
    await _execute(core, "CREATE TABLE T (k INT PRIMARY KEY)")
    core.flush()
    core.op("begin_transaction")
    [message] = core.op("receive", "Target")
    await _execute(core, "INSERT INTO T VALUES (@p1)", 1)
    core.op("commit")
    other = core.new_session()
    # the commit is not durable yet: the table is still locked, a reader waits
    reading = asyncio.ensure_future(_execute(core, "SELECT k FROM T", session=other))
    await asyncio.sleep(0)
    assert not reading.done()
    core.flush()  # durable: the lock goes, the reader runs on the committed rows
    assert (await reading)["rows"] == [[1]]
    assert message and core.op("receive", "Target") == []


async def test_a_statement_is_answered_at_once_unless_it_waits_for_a_lock() -> None:
    core = Core(statement_timeout=5.0)
    core.op("execute", "CREATE TABLE T (k INT PRIMARY KEY)")
    core.flush()
    core.op("begin_transaction")
    assert core.op("execute_many", "INSERT INTO T VALUES (@p1)", [[1], [2]])["rowcount"] == 2
    assert core.op("execute", "SELECT COUNT(*) FROM T")["rows"] == [[2]]
    other = core.new_session()
    waiting = core.engine.operations()["execute"](other, "SELECT COUNT(*) FROM T")
    assert asyncio.iscoroutine(waiting)
    core.op("commit")
    core.flush()
    assert (await waiting)["rows"] == [[2]]


async def test_a_wait_ends_at_statement_timeout_and_a_cycle_at_once() -> None:
    core = Core(statement_timeout=5.0)
    await _execute(core, "CREATE TABLE A (x INT)")
    await _execute(core, "CREATE TABLE B (x INT)")
    core.flush()
    first, second = core.session, core.new_session()
    core.op("begin_transaction", session=first)
    core.op("begin_transaction", session=second)
    await _execute(core, "INSERT INTO A VALUES (1)", session=first)
    await _execute(core, "INSERT INTO B VALUES (2)", session=second)
    waiting = asyncio.ensure_future(_execute(core, "SELECT x FROM B", session=first))
    await asyncio.sleep(0)
    with pytest.raises(BrokerError, match="deadlock") as caught:
        await _execute(core, "SELECT x FROM A", session=second)
    assert caught.value.code is ErrorCode.LOCK_TIMEOUT
    core.clock.advance(5.0)
    with pytest.raises(BrokerError, match="statement_timeout"):
        await waiting
    core.op("rollback", session=second)
    assert (await _execute(core, "SELECT x FROM B", session=first))["rows"] == []
    core.op("commit", session=first)
    core.flush()
    assert (await _execute(core, "SELECT x FROM A", session=second))["rows"] == [[1]]


async def test_a_savepoint_takes_back_the_statements_after_it() -> None:
    core = Core()
    await _execute(core, "CREATE TABLE T (x INT)")
    core.flush()  # (its lock holds until then)
    core.op("begin_transaction")
    await _execute(core, "INSERT INTO T VALUES (1)")
    core.op("save_transaction", "s")
    await _execute(core, "INSERT INTO T VALUES (2)")
    core.op("rollback_to_savepoint", "s")
    await _execute(core, "INSERT INTO T VALUES (3)")
    core.op("commit")
    core.flush()
    rows = (await _execute(core, "SELECT x FROM T ORDER BY x"))["rows"]
    assert rows == [[1], [3]]
    restarted = core.restart()
    assert (await _execute(restarted, "SELECT x FROM T ORDER BY x"))["rows"] == [[1], [3]]
    assert restarted.engine.tables.names == {"t"}


async def test_bad_values_are_refused_before_anything_runs() -> None:
    core = Core()
    with pytest.raises(BrokerError, match="sql must be the text"):
        await core.aop("execute", 42)
    with pytest.raises(BrokerError, match="a list"):
        await core.aop("execute", "SELECT 1", "x")
    with pytest.raises(BrokerError, match="values are numbers"):
        await core.aop("execute", "SELECT @p1", [[1]])
    with pytest.raises(BrokerError, match="not supported") as caught:
        await core.aop("execute", "MERGE INTO t USING u ON 1 = 1 WHEN MATCHED THEN DELETE;")
    assert caught.value.code is ErrorCode.SQL_ERROR


async def test_queries_and_repeated_statements_commit_in_one_batch() -> None:
    """A batch writes consecutive writes of one statement together: queries are not
    written at all, DDL one by one, the same INSERT twice as one executemany."""
    core = Core()
    core.op("begin_transaction")
    for _ in range(2):
        await _execute(core, "CREATE TABLE IF NOT EXISTS T (x INT)")
    for x in (1, 2):
        await _execute(core, "SELECT COUNT(*) FROM T")
        await _execute(core, "SELECT COUNT(*) FROM T")
        await _execute(core, "INSERT INTO T VALUES (@p1)", x)
        await _execute(core, "INSERT INTO T VALUES (@p1)", x + 10)
    core.op("commit")
    core.flush()
    assert core.store.failed is None
    rows = (await _execute(core, "SELECT x FROM T ORDER BY x"))["rows"]
    assert rows == [[1], [2], [11], [12]]


def _temporary_tables(core: Core) -> list[str]:
    """The SQLite TEMP tables of the store's writer connection (where #tables live)."""
    rows = core.store._db.execute("SELECT name FROM sqlite_temp_master WHERE type = 'table'")
    return sorted(name for (name,) in rows)


async def test_a_sessions_temporary_tables_go_when_it_closes() -> None:
    core = Core(statement_timeout=5.0)
    other = core.new_session()
    await _execute(core, "CREATE TABLE #t (a INT)")
    await _execute(core, "CREATE TABLE #gone (a INT)")
    core.flush()  # (the table's lock is held until its CREATE is durable)
    await _execute(core, "DROP TABLE #gone")
    await _execute(core, "CREATE TABLE #t (b INT)", session=other)
    core.op("begin_transaction")
    await _execute(core, "CREATE TABLE #never (a INT)")
    core.op("rollback")
    core.flush()
    mine, theirs = f"u:tempdb:#t#{core.session.ident}", f"u:tempdb:#t#{other.ident}"
    assert _temporary_tables(core) == sorted([mine, theirs])
    core.engine.transactions.close_session(core.session)
    core.flush()
    assert _temporary_tables(core) == [theirs]
    assert core.store.load_table_names() == []  # never the broker's own tables
    # a detached transaction may outlive its session: it cannot use the session's own
    core.op("begin_transaction", detached=True, session=other)
    with pytest.raises(BrokerError, match="detached transaction"):
        await _execute(core, "INSERT INTO #t VALUES (1)", session=other)


async def test_a_change_locks_the_tables_its_foreign_keys_connect_it_to() -> None:
    """An INSERT into a child checks its parent's rows, a DELETE of a parent's rows
    changes (cascade) or checks the children's: both runs of each must see the same
    rows there, so those tables are locked too, though the statement does not name them."""
    core = Core(statement_timeout=5.0)
    await _execute(core, "CREATE TABLE Parent (id INT PRIMARY KEY)")
    await _execute(core, "CREATE TABLE Other (id INT PRIMARY KEY)")
    await _execute(
        core,
        "CREATE TABLE Child (id INT PRIMARY KEY, parent INT, other INT, CONSTRAINT to_parent FOREIGN KEY"
        " (parent) REFERENCES Parent (id) ON DELETE CASCADE, CONSTRAINT to_other FOREIGN KEY"
        " (other) REFERENCES Other (id))",
    )
    await _execute(
        core,
        "CREATE TABLE Grandchild (child INT, CONSTRAINT to_child FOREIGN KEY"
        " (child) REFERENCES Child (id) ON DELETE SET NULL)",
    )
    core.flush()
    tables = core.engine.tables
    deleting = core.store.translate_table_statement("DELETE FROM Parent", "master", 0)
    # the cascade changes Child and, through it, Grandchild; Child's checks read Other
    assert tables._lock_modes(deleting) == {
        "parent": "X",
        "child": "X",
        "grandchild": "X",
        "other": "S",
    }
    inserting = core.store.translate_table_statement(
        "INSERT INTO Child VALUES (1, 1, 1)", "master", 0
    )
    assert tables._lock_modes(inserting) == {"child": "X", "parent": "S", "other": "S"}
    deleting_other = core.store.translate_table_statement("DELETE FROM Other", "master", 0)
    assert tables._lock_modes(deleting_other) == {"other": "X", "child": "S"}
    # so a transaction deleting parents makes one inserting children wait for its commit
    await _execute(core, "INSERT INTO Parent VALUES (1), (2)")
    await _execute(core, "INSERT INTO Other VALUES (1)")
    core.flush()
    first, second = core.session, core.new_session()
    core.op("begin_transaction", session=first)
    await _execute(core, "DELETE FROM Parent WHERE id = 1", session=first)
    inserting_child = asyncio.ensure_future(
        _execute(core, "INSERT INTO Child VALUES (1, 2, 1)", session=second)
    )
    await asyncio.sleep(0)
    assert not inserting_child.done()
    core.op("commit", session=first)
    core.flush()
    assert (await inserting_child)["rowcount"] == 1
    # a table made (or dropped) since is known once its DDL commits
    await _execute(
        core,
        "CREATE TABLE Note (child INT, CONSTRAINT n FOREIGN KEY (child) REFERENCES Child (id))",
    )
    core.flush()
    assert tables._lock_modes(deleting)["note"] == "S"


@pytest.mark.parametrize("waits", [False, True], ids=["at once", "after a wait"])
async def test_a_failed_statement_of_its_own_transaction_lets_its_locks_go(waits: bool) -> None:
    """An autocommitted statement that fails (a key broken) ends its transaction with it,
    whether it ran at once or had waited for a lock: its locks go, and the next writer of
    the table does not wait for them."""
    core = Core(statement_timeout=5.0)
    await _execute(core, "CREATE TABLE T (k INT PRIMARY KEY)")
    core.flush()  # (a change's locks go once it is durable)
    await _execute(core, "INSERT INTO T VALUES (1)")
    core.flush()
    holder = core.new_session()
    if waits:  # another transaction holds the table: the failing statement waits first
        core.op("begin_transaction", session=holder)
        await _execute(core, "SELECT k FROM T", session=holder)
    failing = asyncio.ensure_future(_execute(core, "INSERT INTO T VALUES (1)"))
    await asyncio.sleep(0)
    if waits:
        assert not failing.done()
        core.op("commit", session=holder)
        core.flush()
    with pytest.raises(BrokerError, match="UNIQUE"):
        await failing
    core.op("begin_transaction", session=holder)
    inserting = _execute(core, "INSERT INTO T VALUES (2)", session=holder)
    assert (await asyncio.wait_for(inserting, 1.0))["rowcount"] == 1, "no lock was left"
    core.op("commit", session=holder)
    core.flush()
