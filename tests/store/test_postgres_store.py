"""The PostgreSQL store's own machinery, on the session's real server: opening a
database (and its refusals, each one line), lost connections, and a commit whose answer
was lost, which is settled by its mark and never written twice."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon import BrokerProcess, one_error_line, run_ssb, serve_once
from pg_server import PostgresServer, fresh_database
from setup_objects import receive_bodies, seed000

from ssb import client
from ssb.broker._core.ports import TableError, TableRuns
from ssb.broker._store import StoreUnavailable, open_store
from ssb.broker._store.postgres import DatabaseInUse, PostgresStore
from ssb.broker._store.postgres_schema import SCHEMA_VERSION

from .rows import FirstLease, message

CHUNK = 65536


@pytest.fixture
def database(postgres_server: PostgresServer) -> str:
    return fresh_database(postgres_server.url)


def _sessions(database: str, role: str) -> list[int]:
    """The server pids of the store's sessions of `role` ("reader" or "writer")."""
    with psycopg.connect(database, autocommit=True) as db:
        rows = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", (f"ssb {role} %",)
        ).fetchall()
    return [int(row[0]) for row in rows]


def _end_sessions(database: str, role: str) -> None:
    """End the store's sessions of `role` on the server, as a server restart would."""
    pids = _sessions(database, role)
    assert pids
    with psycopg.connect(database, autocommit=True) as db:
        for pid in pids:
            db.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))


def test_a_database_written_by_a_newer_ssb_is_refused_and_left_alone(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as db:
        db.execute("CREATE TABLE ssb_schema (version integer NOT NULL)")
        db.execute("INSERT INTO ssb_schema VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreUnavailable, match="written by a newer ssb"):
        open_store(Path("unused"), "fsync", database)
    with psycopg.connect(database, autocommit=True) as db:
        assert db.execute("SELECT version FROM ssb_schema").fetchall() == [(SCHEMA_VERSION + 1,)]
        made = db.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'messages'")
        assert made.fetchone() == (0,)


async def test_one_store_commits_to_a_database_and_its_identity_stays(database: str) -> None:
    first = open_store(Path("unused"), "fsync", database)
    instance = first.load_meta()["broker_instance"]
    uuid.UUID(instance)
    try:
        with pytest.raises(DatabaseInUse, match="another ssb daemon is serving the store"):
            open_store(Path("unused"), "fsync", database)  # a second one, same database
    finally:
        await first.close()
    second = open_store(Path("unused"), "fsync", database)
    try:
        assert second.load_meta()["broker_instance"] == instance
    finally:
        await second.close()


def test_a_database_that_cannot_be_opened_is_one_line_without_the_password(
    postgres_server: PostgresServer, database: str
) -> None:
    host = f"127.0.0.1:{postgres_server.port}"
    cases = {
        f"postgresql://postgres@{host}/no_such_db": "create the database",
        "postgresql://postgres:secret@127.0.0.1:1/db": "Connection refused",
        f"postgresql://nobody:secret@{host}/postgres": "check the user and password",
        "postgresql://u:secret@[::1": "not one PostgreSQL understands",
    }
    for url, expected in cases.items():
        with pytest.raises(StoreUnavailable) as caught:
            open_store(Path("unused"), "fsync", url)
        text = str(caught.value)
        assert expected in text and "\n" not in text and "secret" not in text, text
    with psycopg.connect(database, autocommit=True) as db:
        db.execute("CREATE ROLE weak LOGIN")
    weak = database.replace("postgresql://postgres@", "postgresql://weak@")
    with pytest.raises(StoreUnavailable, match="may not create the broker's tables"):
        open_store(Path("unused"), "fsync", weak)


def test_ssb_serve_on_a_missing_database_says_so_in_one_line(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = f"{postgres_server.url}/no_such_db"
    result = serve_once(tmp_path / "data", "--store", url)
    assert result.returncode == 2
    line = one_error_line(result)
    assert line.startswith("ssb: cannot open the store postgresql://") and "createdb" in line


def test_ssb_backup_of_a_broker_on_postgresql_points_to_postgresqls_tools(
    database: str, tmp_path: Path
) -> None:
    broker = BrokerProcess(tmp_path / "data", store=database).start()
    try:
        for args in (("--data-dir", str(broker.data_dir)), ("--store", database)):
            result = run_ssb("backup", str(tmp_path / "copy"), *args)
            assert result.returncode == 1
            line = one_error_line(result)
            assert "pg_dump" in line and "pg_basebackup" in line, line
        assert not (tmp_path / "copy").exists()
    finally:
        broker.kill()


def test_durability_os_commits_without_waiting_for_the_servers_disk(database: str) -> None:
    for durability, expected in (("os", "off"), ("fsync", "on")):
        store = PostgresStore(database, durability, FirstLease(), threaded=False)
        try:
            shown = store._writer.execute("SHOW synchronous_commit").fetchone()
            assert shown == (expected,)
        finally:
            store._release()


def test_a_commit_on_a_lost_connection_is_tried_again_on_a_new_one(database: str) -> None:
    store = PostgresStore(database, "fsync", FirstLease(), threaded=False)
    try:
        handle = uuid.uuid4()
        store.insert_message(message(1, handle))
        store.flush()
        _end_sessions(database, "writer")
        store.insert_message(message(2, handle))
        ran: list[int] = []
        store.when_durable(store.watermark(), lambda: ran.append(2))
        store.flush()  # the connection is gone: trouble, the batch kept
        assert store.trouble is not None and store.failed is None and ran == []
        store.flush()  # on a new connection
        assert store.trouble is None and store.failed is None and ran == [2]
        rows = store.read_queue_messages("q", None, 10, 1 << 20)
        assert [row[0] for row in rows] == [1, 2]
    finally:
        store._release()


def test_a_read_on_a_lost_connection_is_made_again_on_a_new_one(database: str) -> None:
    store = PostgresStore(database, "fsync", FirstLease(), threaded=False)
    try:
        store.insert_message(message(1, uuid.uuid4()))
        store.flush()
        _end_sessions(database, "reader")
        assert store.read_message(1) is not None
    finally:
        store._release()


class AnswerCutter:
    """A TCP proxy to the server that, once armed, lets a client's COMMIT through and cuts
    the connection when the server's answer comes back: the commit happens on the
    server, and the client never learns it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.armed = threading.Event()
        self.cut = threading.Event()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]

    def url(self, database: str) -> str:
        """`database`'s URL through the proxy."""
        name = database.rsplit("/", 1)[1]
        return f"postgresql://postgres@127.0.0.1:{self.listener.getsockname()[1]}/{name}"

    def __enter__(self) -> AnswerCutter:
        self.threads[0].start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port))
            self.sockets += [client, server]
            committed = threading.Event()
            for source, target, up in ((client, server, True), (server, client, False)):
                thread = threading.Thread(
                    target=self._pump, args=(source, target, up, committed), daemon=True
                )
                thread.start()

    def _pump(
        self, source: socket.socket, target: socket.socket, up: bool, committed: threading.Event
    ) -> None:
        try:
            while data := source.recv(CHUNK):
                if up and self.armed.is_set() and b"COMMIT" in data:
                    committed.set()
                if not up and committed.is_set() and not self.cut.is_set():
                    self.cut.set()  # the answer to the COMMIT: lost with the connection
                    self.armed.clear()
                    for sock in (source, target):
                        sock.shutdown(socket.SHUT_RDWR)
                    return
                target.sendall(data)
        except OSError:
            pass
        finally:
            target.close()


def test_a_commit_whose_answer_was_lost_is_settled_and_not_written_twice(
    postgres_server: PostgresServer, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    with AnswerCutter(postgres_server.port) as proxy:
        store = PostgresStore(proxy.url(database), "fsync", FirstLease(), threaded=False)
        try:
            handle = uuid.uuid4()
            store.insert_message(message(1, handle))
            store.put_meta("k", "v")
            batch = store.watermark()
            proxy.armed.set()
            with caplog.at_level(logging.INFO, "ssb.store"):
                store.flush()
            assert proxy.cut.is_set()
            assert "had committed" in caplog.text
            # settled as committed: durable, no trouble, nothing written twice (a second
            # insert of message 1 would break its key: a fatal failure)
            assert store.failed is None and store.trouble is None and store.durable == batch
            store.insert_message(message(2, handle))
            store.flush()
            assert store.failed is None and store.trouble is None
            rows = store.read_queue_messages("q", None, 10, 1 << 20)
            assert [row[0] for row in rows] == [1, 2]
        finally:
            store._release()


async def _send_through_trouble(conn: client.Connection, handle: uuid.UUID, body: bytes) -> None:
    """SEND, again while the broker refuses new messages because its store cannot write
    (a refused SEND changed nothing); bounded."""
    for _ in range(200):
        try:
            await conn.send(handle, "AsyncSent", body)
            return
        except client.DiskFullError:
            await asyncio.sleep(0.05)
    raise AssertionError("the broker refused messages for 10 s")


async def test_a_broker_whose_database_sessions_are_lost_loses_and_repeats_nothing(
    database: str, tmp_path: Path
) -> None:
    """The daemon's sessions are ended on the server while a client sends: commits fail,
    the broker refuses new messages meanwhile, reconnects, and every acknowledged
    message is received once, in order."""
    broker = BrokerProcess(tmp_path / "data", store=database).start()
    try:
        async with await client.connect(broker.url) as conn:
            init_svc, target_svc, _, target_q = await seed000(conn)
            handle = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
            for i in range(100):
                if i == 50:
                    _end_sessions(database, "writer")
                    _end_sessions(database, "reader")
                await _send_through_trouble(conn, handle, str(i).encode())
            received = await receive_bodies(conn, target_q, 100)
            assert received == [str(i).encode() for i in range(100)]
            assert await conn.receive(target_q, top=1, timeout=0) == []
        assert len(_sessions(database, "writer")) == 1  # a new one, the old one ended
        assert "store commit failed" in broker.log_text()
    finally:
        broker.kill()


async def test_a_table_transaction_outlives_the_loss_of_its_connection(database: str) -> None:
    """The statement that meets a lost connection fails, saying so; the next runs the
    transaction's earlier statements again on a new connection (with the identities they
    gave), and the commit writes what was answered."""
    store = PostgresStore(database, "os", FirstLease(), threaded=False)
    txn: list[tuple[Any, dict[str, Any]]] = []

    async def run(sql: str) -> Any:
        statement = store.translate_table_statement(sql, "master")
        answer = await store.run_table_statements(TableRuns(txn, txn, statement, [{}], 5.0))
        txn.append((statement, {}))
        return answer

    try:
        await run("CREATE TABLE T (id INT IDENTITY(1,1) PRIMARY KEY, v INT)")
        assert (await run("INSERT INTO T (v) OUTPUT inserted.id VALUES (10), (20)")).rows == [
            (1,),
            (2,),
        ]
        _end_sessions(database, "tables")
        with pytest.raises(TableError, match="connection to the store was lost"):
            await run("INSERT INTO T (v) VALUES (30)")
        assert (await run("INSERT INTO T (v) OUTPUT inserted.id VALUES (30)")).rows == [(3,)]
        store.write_table_statements(txn)
        store.forget_table_statements(txn)
        store.flush()
        with psycopg.connect(database) as db:
            rows = db.execute('SELECT id, v FROM "u:master"."t" ORDER BY id').fetchall()
        assert rows == [(1, 10), (2, 20), (3, 30)]
    finally:
        await store.close()


async def test_a_statement_given_up_keeps_its_connection_until_it_ends(database: str) -> None:
    """A caller that stops waiting for a statement (its session closed) and rolls back
    does not wait for the statement: the connection is freed once the statement ends,
    and serves the next transaction."""
    store = PostgresStore(database, "os", FirstLease(), threaded=False)

    async def run(owner: list[Any], sql: str, timeout: float = 5.0) -> Any:
        statement = store.translate_table_statement(sql, "master")
        answer = await store.run_table_statements(TableRuns(owner, owner, statement, [{}], timeout))
        owner.append((statement, {}))
        return answer

    try:
        setup: list[Any] = []
        await run(setup, "CREATE TABLE T (k INT PRIMARY KEY)")
        store.write_table_statements(setup)
        store.forget_table_statements(setup)
        store.flush()
        holder: list[Any] = []
        await run(holder, "INSERT INTO T VALUES (1)")
        waiter: list[Any] = []
        waiting = asyncio.ensure_future(run(waiter, "INSERT INTO T VALUES (1)", 20.0))
        deadline = time.monotonic() + 20
        with psycopg.connect(database, autocommit=True) as db:
            while not db.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchall():
                assert time.monotonic() < deadline, "the second INSERT never waited"
                await asyncio.sleep(0.02)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        started = time.monotonic()
        store.forget_table_statements(waiter)
        store.forget_table_statements(holder)
        assert time.monotonic() - started < 2  # (not the 20 s the statement may run)
        after: list[Any] = []
        assert (await run(after, "SELECT COUNT(*) FROM T")).rows == [(0,)]
        store.forget_table_statements(after)
    finally:
        await store.close()


async def test_the_tables_view_does_not_wait_for_a_transactions_alter(database: str) -> None:
    """A table an uncommitted ALTER holds is counted by PostgreSQL's estimate: the view,
    read on the event loop, never waits for a transaction that needs that loop to end."""
    store = PostgresStore(database, "os", FirstLease(), threaded=False)

    async def run(owner: list[Any], sql: str) -> None:
        statement = store.translate_table_statement(sql, "master")
        await store.run_table_statements(TableRuns(owner, owner, statement, [{}], 5.0))
        owner.append((statement, {}))

    try:
        setup: list[Any] = []
        await run(setup, "CREATE TABLE T (k INT PRIMARY KEY)")
        await run(setup, "INSERT INTO T VALUES (1), (2)")
        store.write_table_statements(setup)
        store.forget_table_statements(setup)
        store.flush()
        assert store.table_sizes() == [("master", "t", 2)]
        altering: list[Any] = []
        await run(altering, "ALTER TABLE T ADD note NVARCHAR(10)")
        started = time.monotonic()
        [(database_name, table, rows)] = store.table_sizes()
        assert (database_name, table) == ("master", "t") and rows >= 0
        assert time.monotonic() - started < 5
        store.forget_table_statements(altering)
        assert store.table_sizes() == [("master", "t", 2)]
    finally:
        await store.close()


async def test_an_older_databases_columns_named_in_capitals_are_found_after_the_upgrade(
    database: str, tmp_path: Path
) -> None:
    """A database of schema 2 kept a user's column as declared ("OrderId"), where
    statements now write names in lower case: starting on it renames such columns,
    keeping the declared names for `*`, and leaves columns of one table whose names
    differ only in case, saying so."""
    broker = BrokerProcess(tmp_path / "data", store=database).start()
    try:
        async with await client.connect(broker.url) as conn:
            await conn.execute("CREATE TABLE Orders (OrderId INT, Note NVARCHAR(10))")
            await conn.execute("INSERT INTO Orders VALUES (7, N'seven')")
            await conn.execute("CREATE TABLE Pairs (Code INT)")
    finally:
        broker.stop()
    with psycopg.connect(database, autocommit=True) as db:  # as schema 2 left them
        db.execute('ALTER TABLE "u:master".orders RENAME COLUMN orderid TO "OrderId"')
        db.execute('COMMENT ON COLUMN "u:master".orders."OrderId" IS NULL')
        db.execute('ALTER TABLE "u:master".pairs RENAME COLUMN code TO "Code"')
        db.execute('ALTER TABLE "u:master".pairs ADD COLUMN "CODE" integer')
        db.execute("UPDATE ssb_schema SET version = 2")
    broker.start()
    try:
        async with await client.connect(broker.url) as conn:
            found = await conn.execute("SELECT orderid, ORDERID AS again FROM orders")
            assert found.rows == [(7, 7)]
            everything = await conn.execute("SELECT * FROM Orders")
            assert list(everything.columns) == ["OrderId", "Note"]
        for kept in ("'Code'", "'CODE'"):
            said = f"column {kept} of table u:master.pairs keeps its name: another column"
            assert said in broker.log_text()
    finally:
        broker.kill()
    with psycopg.connect(database, autocommit=True) as db:
        assert db.execute("SELECT max(version) FROM ssb_schema").fetchone() == (SCHEMA_VERSION,)
