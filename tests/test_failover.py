"""Active and standby: daemons given one PostgreSQL database are one broker, one serving.

On the session's real PostgreSQL server: a standby started with an empty data directory
is the same broker (instance, keys, certificates, admin password) and keeps its ports
closed; it takes over when the active daemon is killed; a daemon frozen (SIGSTOP) until
a standby has taken over serves nothing when it runs again, says why and stops; clients
that name both addresses follow, and what they committed is neither lost nor repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon import BrokerProcess, run_ssb
from pg_server import PostgresServer, fresh_database
from setup_objects import receive_bodies, seed000

from ssb import client, tools
from ssb.broker._store import postgres_sql
from ssb.client._recovery import uuid7

FAILOVER = 3.0  # seconds: failover_timeout of the tests' pairs


@pytest.fixture
def database(postgres_server: PostgresServer) -> str:
    return fresh_database(postgres_server.url)


def _daemon(data_dir: Path) -> BrokerProcess:
    return BrokerProcess(data_dir, config={"failover_timeout": FAILOVER, "http_port": 0})


@pytest.fixture
def pair(tmp_path: Path, database: str) -> Iterator[tools.DaemonPair]:
    daemons = tools.DaemonPair(tmp_path, database, _daemon).start()
    yield daemons
    daemons.stop()


def _healthz(daemon: BrokerProcess, path: str = "/healthz") -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{daemon.http_url}{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _metric(daemon: BrokerProcess, name: str) -> dict[str, float]:
    """The samples of one metric family: labels text -> value."""
    with urllib.request.urlopen(f"{daemon.http_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            found[key[len(name) :]] = float(value)
    return found


async def test_a_standby_with_an_empty_data_directory_is_the_same_broker(
    pair: tools.DaemonPair,
) -> None:
    active, standby = pair.active, pair.standby
    assert standby.instance == active.instance
    assert [p.name for p in standby.data_dir.iterdir()] == ["LOCK"]  # nothing copied
    # the standby waits: ports closed, /healthz says so, /metrics its role
    assert _refused(standby.client_port) and _refused(standby.broker_port or 0)
    status, body = _healthz(standby)
    assert status == 503 and body["role"] == "standby" and not body["ready"]
    assert "standby" in body["reason"]
    assert _healthz(standby, "/healthz/live") == (200, {"live": True, "role": "standby"})
    assert _metric(standby, "ssb_daemon_role") == {
        '{role="active"}': 0.0,
        '{role="standby"}': 1.0,
        '{role="stopping"}': 0.0,
    }
    status, body = _healthz(active)
    assert status == 200 and body["role"] == "active"
    assert _metric(active, "ssb_daemon_role")['{role="active"}'] == 1.0
    assert 0 <= _metric(active, "ssb_lease_age_seconds")[""] < FAILOVER
    assert "standby" in standby.log_text() and "ports stay closed" in standby.log_text()

    async with await client.connect(pair.url) as conn:
        _, _, _, target_q = await seed000(conn)
        certificate = await conn.broker_certificate()
        nodes = await conn.view("broker_nodes")
        assert sorted(n["role"] for n in nodes) == ["active", "standby"]
        assert [n["node"] for n in nodes if n["this_daemon"]] == [active.node]
    diagnosed = run_ssb("diagnose", pair.url)
    assert f"daemon {active.node} " in diagnosed.stdout, diagnosed.stdout
    assert ": active (answered this diagnosis, lease renewed" in diagnosed.stdout
    assert f"daemon {standby.node} " in diagnosed.stdout and ": standby, seen" in diagnosed.stdout
    password = active.admin_password()

    took = pair.fail_over("kill")
    assert took < FAILOVER + 5, f"took over in {took:.1f} s"
    assert standby.role == "active" and standby.instance == active.instance
    # the first start's files, written from the store into the empty data directory
    assert standby.admin_password() == password
    assert standby.tls_fingerprint == active.tls_fingerprint
    async with await client.connect(pair.url) as conn:
        assert await conn.broker_certificate() == certificate
        assert await conn.receive(target_q, top=1, timeout=0) == []
        assert "took the broker's lease" in standby.log_text()


async def test_a_frozen_active_daemon_serves_nothing_once_it_runs_again(
    pair: tools.DaemonPair, database: str
) -> None:
    """SIGSTOP the active daemon with a client's SEND on its way to it, until the standby
    has taken over; once it runs again, that SEND gets no answer and is not stored, the
    daemon says why in its log and stops (exit code 4), and the broker serves on."""
    frozen, standby = pair.active, pair.standby
    async with await client.connect(pair.url) as conn:
        init_svc, target_svc, _, target_q = await seed000(conn)
        handle = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
        await conn.send(handle, "AsyncSent", b"before")
    old = await client.connect(frozen.url, reconnect=False)
    try:
        took = pair.fail_over("freeze")
        print(f"takeover after SIGSTOP: {took:.2f} s (failover_timeout {FAILOVER:g} s)")
        assert took < FAILOVER + 5
        assert standby.role == "active"
        # sent to the frozen daemon after the takeover: it may never be acknowledged
        late = asyncio.ensure_future(old.send(handle, "AsyncSent", b"late"))
        await asyncio.sleep(0)
        frozen.thaw()
        with pytest.raises(client.ConnectionLostError):
            await asyncio.wait_for(late, 30)
        assert frozen.proc is not None
        assert await asyncio.to_thread(frozen.proc.wait, 30) == 4
    finally:
        await old.close()
    log = frozen.log_text()
    assert "lost the broker's lease" in log, log[-3000:]
    async with await client.connect(pair.url) as conn:
        async with conn.transaction():
            got = await conn.receive(target_q, top=10, timeout=1)
        assert [m.message_body for m in got] == [b"before"]
        await conn.send(handle, "AsyncSent", b"after")  # the broker serves on
    with psycopg.connect(database, autocommit=True) as db:
        holder = db.execute("SELECT holder, epoch FROM broker_lease").fetchone()
    assert holder is not None and holder[0] == standby.node and holder[1] >= 2


async def test_a_client_naming_both_daemons_follows_the_takeover(
    pair: tools.DaemonPair,
) -> None:
    """run_transaction across a kill -9 of the active daemon: every message once."""
    async with await client.connect(pair.url, reconnect_deadline=60) as conn:
        init_svc, target_svc, _, target_q = await seed000(conn)
        handle = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")

        async def send(i: int) -> None:
            async def work(c: client.Connection) -> None:
                await c.send(handle, "AsyncSent", str(i).encode())

            await conn.run_transaction(work)

        for i in range(20):
            await send(i)
        committed, never = uuid7(), uuid7()  # a transaction committed, one never begun
        await conn.begin_transaction(txn_id=committed)
        await conn.send(handle, "AsyncSent", b"named")
        await conn.commit()
        kill = asyncio.get_running_loop().run_in_executor(None, pair.fail_over, "kill")
        for i in range(20, 60):
            await send(i)
        await kill
        received = await receive_bodies(conn, target_q, 61)
        assert received == [
            *(str(i).encode() for i in range(20)),
            b"named",
            *(str(i).encode() for i in range(20, 60)),
        ]
        assert conn.reconnects >= 1
        # the new active daemon reads the window of outcomes the old one committed
        assert await conn.transaction_outcome(committed) == "committed"
        assert await conn.transaction_outcome(never) == "rolled_back"


def _temporary_tables(database: str) -> list[str]:
    """The tables of the schema that holds every session's temporary tables (#name)."""
    with psycopg.connect(database, autocommit=True) as db:
        rows = db.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename",
            (postgres_sql.TEMPORARY_SCHEMA,),
        ).fetchall()
    return [str(name) for (name,) in rows]


async def test_a_takeover_leaves_no_temporary_table_behind(
    pair: tools.DaemonPair, database: str
) -> None:
    """A session's temporary tables live in the database until the session ends, and
    sessions end with their daemon: the one that takes over after a kill -9 drops those
    the killed one's sessions had made, and a session of its own makes its #work anew."""
    killed = pair.active
    old = await client.connect(killed.url, reconnect=False)
    try:
        await old.execute("CREATE TABLE #work (k INT PRIMARY KEY)")
        await old.execute("INSERT INTO #work VALUES (1)")
        async with await client.connect(killed.url) as ended:
            await ended.execute("CREATE TABLE #work (k INT PRIMARY KEY)")
            assert len(_temporary_tables(database)) == 2
        tools.wait_until_sync(
            lambda: _temporary_tables(database),
            "the closed session's temporary table to go",
            until=lambda tables: len(tables) == 1,
        )
        pair.fail_over("kill")
    finally:
        with contextlib.suppress(client.ConnectionLostError):
            await old.close()
    assert _temporary_tables(database) == []
    async with await client.connect(pair.url) as conn:
        with pytest.raises(client.SqlError, match="no such table: #work"):
            await conn.execute("SELECT k FROM #work")
        await conn.execute("CREATE TABLE #work (k INT PRIMARY KEY)")
        assert (await conn.execute("SELECT COUNT(*) FROM #work")).scalar() == 0
        assert await conn.view("tables") == []


def test_a_stopped_active_daemon_gives_the_lease_up_and_a_standby_stops_at_once(
    pair: tools.DaemonPair,
) -> None:
    """SIGTERM: the active daemon gives its lease up, so the standby takes over at its next
    try, well before the lease would run out; a standby told to stop stops."""
    first, second = pair.active, pair.standby
    assert first.stop() == 0
    second.wait_active(FAILOVER / 2)
    third = pair.restart()
    assert third.role == "standby"
    assert third.stop() == 0
    assert "standby" in third.log_text()


def test_failover_timeout_needs_a_postgresql_store(tmp_path: Path) -> None:
    from daemon import one_error_line, serve_once

    config = tmp_path / "ssb.toml"
    config.write_text("failover_timeout = 5\n")
    line = one_error_line(serve_once(tmp_path / "data", "--config", str(config)))
    assert "failover_timeout applies to daemons sharing a PostgreSQL store" in line


async def test_another_broker_follows_a_takeover_through_a_routes_mirror_address(
    tmp_path: Path, database: str
) -> None:
    """A route to the pair names the active daemon's broker port as its ADDRESS and the
    standby's as its MIRROR_ADDRESS: messages sent before and after a kill -9 of the
    active daemon all arrive, once, in order."""
    transport = {"idle_timeout": 1.0, "retry_initial": 0.2, "retry_max": 1.0}

    def daemon(data_dir: Path) -> BrokerProcess:
        return BrokerProcess(
            data_dir, config={"failover_timeout": FAILOVER, "transport": transport}
        )

    pair = tools.DaemonPair(tmp_path / "pair", database, daemon).start()
    sender = BrokerProcess(tmp_path / "sender", config={"transport": transport}).start()
    try:
        first, second = pair.daemons
        async with (
            await client.connect(pair.url, reconnect_deadline=60) as far,
            await client.connect(sender.url) as near,
        ):
            _, target_svc, _, target_q = await seed000(far)
            init_svc, _, _, _ = await seed000(near)
            await far.create_certificate("Sender", await near.broker_certificate())
            await near.create_certificate("Pair", await far.broker_certificate())
            await far.grant("SEND", "public", "service", target_svc)  # the other broker's
            await near.grant("SEND", "public", "service", init_svc)  # its answers
            await near.create_route(
                "ToPair",
                target_svc,
                f"tcp://127.0.0.1:{first.broker_port}",
                broker_instance=first.instance,
                mirror_address=f"tcp://127.0.0.1:{second.broker_port}",
            )
            await far.create_route("ToSender", init_svc, f"tcp://127.0.0.1:{sender.broker_port}")
            (route,) = [r for r in await near.view("routes") if r["name"] == "ToPair"]
            assert route["mirror_address"] == f"tcp://127.0.0.1:{second.broker_port}"
            handle = await near.begin_dialog(init_svc, target_svc, contract="AsyncContract")
            for i in range(5):
                await near.send(handle, "AsyncSent", str(i).encode())
            received = await receive_bodies(far, target_q, 5)
            pair.fail_over("kill")
            for i in range(5, 10):
                await near.send(handle, "AsyncSent", str(i).encode())
            received += await receive_bodies(far, target_q, 5)
            assert received == [str(i).encode() for i in range(10)]
        assert "answers at" in sender.log_text()
    finally:
        sender.kill()
        pair.stop()


async def test_a_mirror_address_needs_the_broker_instance(conn: client.Connection) -> None:
    with pytest.raises(client.InvalidArgumentError, match="broker_instance"):
        await conn.create_route("R", "S", "tcp://127.0.0.1:1", mirror_address="tcp://127.0.0.1:2")
    with pytest.raises(client.InvalidArgumentError, match="mirror"):
        await conn.create_route(
            "R",
            "S",
            "LOCAL",
            broker_instance=str(uuid.uuid4()),
            mirror_address="tcp://127.0.0.1:2",
        )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ten_kills_of_the_active_daemon_under_load_lose_and_repeat_nothing(
    tmp_path: Path,
) -> None:
    """The failover benchmark's workload, in full: a producer and a consumer with
    run_transaction against two daemons of one broker, kill -9 of whichever serves, ten
    times; 0 messages lost, 0 duplicated, every conversation in order (the benchmark
    fails otherwise), and each takeover timed."""
    out = tmp_path / "failover.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bench.failover", "--kills", "10", "--messages", "4000"),
            *("--failover-timeout", "5", "--json", str(out)),
        ],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    result = json.loads(out.read_text())["result"]
    takes = result["takeover_seconds"]
    assert len(takes) == 10
    assert result["lost"] == result["duplicated"] == result["out_of_order"] == 0
    print(f"takeover s: median {result['takeover_median']:.2f}, worst {max(takes):.2f}")
    assert max(takes) <= 5
