"""A (nearly) full disk never crashes the daemon or loses what it acknowledged.

Each test puts the data directory on a private 64 MiB tmpfs and fills it with a ballast
file. Below `min_free_disk` SEND and BEGIN DIALOG are refused with DiskFullError naming
the setting, while RECEIVE and END CONVERSATION go on; with the disk truly full the store
cannot commit, the daemon stays up, refuses new messages with SQLite's own reason and
takes them again by itself once space returns, and every acknowledged message is
received exactly once. A commit that still cannot be written after `disk_full_timeout`
is answered DiskFullError within it and rolled back (nothing of it ever applied, its
outcome "rolled_back"), and the broker starts again in its own process from what is
durable. A broker with a store starts on a full disk (it gives up its disk reserve):
new messages refused, RECEIVE, END CONVERSATION, the views and the dashboard working,
until there is room again; one without a store yet exits at once with one line.

Mounting needs root; without it these tests skip (tests/unit/test_core_capacity.py
covers the core with a failing journal).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from daemon import BrokerProcess, one_error_line, serve_once
from setup_objects import initiator_and_target

from ssb import client
from ssb.broker._store import RESERVE_FILE
from ssb.protocol import ErrorCode
from ssb.tools import wait_until

MIB = 1024 * 1024
DISK_SIZE = 64 * MIB
STORE_FAILED_LOG = "store commit failed"  # the daemon's log line when a commit fails
ANSWER_TIMEOUT = 5.0  # an answer that needs no write comes in well under this


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A private 64 MiB tmpfs (the broker's log and config stay outside it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a private tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE // MIB}m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _free(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(ballast: Path, leave: int = 0) -> None:
    """Grow `ballast` until at most `leave` bytes are free; 0: until a write fails."""
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (MIB, 4096, 512):
            chunk = bytes(size)
            for _ in range(DISK_SIZE // size + 1):
                if leave and _free(ballast.parent) - size < leave:
                    break
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)


async def _resources(conn: client.Connection) -> dict[str, Any]:
    (row,) = await conn.view("broker_resources")
    return row


async def _drain(conn: client.Connection, queue: str, expected: int) -> list[client.Message]:
    got: list[client.Message] = []
    for _ in range(expected + 1):  # bounded
        if len(got) >= expected:
            break
        batch = await conn.receive(queue, top=100, timeout=10)
        assert batch, f"{queue} ran dry after {len(got)} of {expected} messages"
        got += batch
    assert await conn.receive(queue, timeout=0) == []
    return got


async def _accepting_again(conn: client.Connection, timeout: float) -> None:
    """Until the broker says it accepts new messages again."""

    async def accepting() -> bool:
        return bool((await _resources(conn))["accepting_messages"])

    await wait_until(accepting, "the broker to accept new messages again", timeout=timeout)


async def _log_says(broker: BrokerProcess, text: str, timeout: float) -> None:
    async def probe() -> bool:
        return text in broker.log_text()

    await wait_until(probe, f"the daemon's log to say {text!r}", timeout=timeout)


async def test_low_disk_refuses_new_messages_until_space_returns(small_disk: Path) -> None:
    broker = BrokerProcess(small_disk, config={"min_free_disk": 24 * MIB}).start()
    ballast = small_disk / "ballast"
    try:
        conn = await client.connect(broker.url)
        await initiator_and_target(conn)
        h = await conn.begin_dialog("InitSvc", "TargetSvc")
        ended = await conn.begin_dialog("InitSvc", "TargetSvc")
        await conn.send_many(h, "DEFAULT", [f"before:{i}" for i in range(10)])
        await conn.send(ended, "DEFAULT", b"to be ended")
        assert (await _resources(conn))["accepting_messages"] is True
        committer = await client.connect(broker.url)  # a transaction that sent before
        await committer.begin_transaction()
        await committer.send(h, "DEFAULT", b"in a transaction")

        fill(ballast, leave=16 * MIB)

        async def refusing() -> dict[str, Any] | None:
            row = await _resources(conn)
            return None if row["accepting_messages"] else row

        row = await wait_until(refusing, "the broker to refuse new messages", timeout=15)
        assert row["min_free_disk"] == 24 * MIB
        assert row["free_disk_bytes"] < 24 * MIB
        assert "min_free_disk" in row["refusal"]

        with pytest.raises(client.DiskFullError) as refused:
            await conn.send(h, "DEFAULT", b"refused")
        assert refused.value.code == ErrorCode.DISK_FULL
        assert "min_free_disk" in refused.value.message
        with pytest.raises(client.DiskFullError, match="min_free_disk"):
            await conn.send_many(h, "DEFAULT", [b"refused 1", b"refused 2"])
        with pytest.raises(client.DiskFullError, match="min_free_disk"):
            await conn.begin_dialog("InitSvc", "TargetSvc")
        with pytest.raises(client.DiskFullError, match="min_free_disk"):
            await committer.commit()  # nothing of it applied
        await committer.close()

        # what frees space goes on
        first = await conn.receive("TargetQ", top=3, timeout=5)  # the oldest group first
        assert [m.message_body for m in first] == [b"before:0", b"before:1", b"before:2"]
        await conn.end_conversation(ended)
        assert await conn.ping() == "pong"

        ballast.unlink()

        await _accepting_again(conn, 15)
        await conn.send(h, "DEFAULT", b"after")
        new = await conn.begin_dialog("InitSvc", "TargetSvc")
        await conn.send(new, "DEFAULT", b"new dialog")

        rest = await _drain(conn, "TargetQ", 7 + 1 + 1 + 2)
        bodies = [m.message_body for m in rest]
        assert [b for b in bodies if b.startswith(b"before:") or b == b"after"] == [
            *(f"before:{i}".encode() for i in range(3, 10)),
            b"after",
        ]
        assert bodies.count(b"to be ended") == 1
        assert b"new dialog" in bodies
        assert [m.message_type_name for m in rest].count(client.END_DIALOG) == 1
        assert not [b for b in bodies if b.startswith(b"refused") or b == b"in a transaction"]
        await conn.close()
    finally:
        broker.kill()
        ballast.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def _two_dialogs(
    small_disk: Path,
) -> AsyncIterator[tuple[BrokerProcess, client.Connection, uuid.UUID, uuid.UUID]]:
    """A broker on the small disk (no free-space guard, a 1 MiB message cache), the test
    objects and two dialogs on one connection; killed on exit."""
    broker = BrokerProcess(
        small_disk,
        # space comes back within the timeout here: the failed commits then succeed
        config={"min_free_disk": 0, "message_cache_bytes": MIB, "disk_full_timeout": 120},
    ).start()
    try:
        conn = await client.connect(broker.url)
        await initiator_and_target(conn)
        h = await conn.begin_dialog("InitSvc", "TargetSvc")
        other_dialog = await conn.begin_dialog("InitSvc", "TargetSvc")
        yield broker, conn, h, other_dialog
    finally:
        broker.kill()


async def _until_the_store_fails(
    broker: BrokerProcess, conn: client.Connection, h: Any, acked: list[int]
) -> tuple[asyncio.Task[None], asyncio.Event]:
    """Send numbered 32 KiB messages one at a time (recording each acknowledged one) until
    a commit fails for want of space; then top the disk up to completely full. Returns the
    producer (its last SEND waits for the store) and the event that stops it."""
    stop = asyncio.Event()

    async def produce() -> None:
        for n in range(4 * DISK_SIZE // (32 * 1024)):  # bounded: far more than fits
            if stop.is_set():
                return
            await conn.send(h, "DEFAULT", f"{n}:".encode().ljust(32 * 1024, b"."))
            acked.append(n)

    fill(broker.data_dir / "ballast", leave=2 * MIB)
    producer = asyncio.create_task(produce())
    await _log_says(broker, STORE_FAILED_LOG, timeout=60)
    assert not producer.done(), "the producer stopped before the store failed"
    fill(broker.data_dir / "ballast2")
    return producer, stop


async def test_full_disk_keeps_the_daemon_alive_and_loses_nothing(small_disk: Path) -> None:
    async with _two_dialogs(small_disk) as (broker, conn, h, other_dialog):
        other = await client.connect(broker.url)
        acked: list[int] = []
        producer, stop = await _until_the_store_fails(broker, conn, h, acked)
        assert broker.proc is not None and broker.proc.poll() is None, "the daemon died"

        refused = asyncio.create_task(other.send(other_dialog, "DEFAULT", b"refused"))
        await _log_says(broker, "refused SEND", timeout=30)
        assert broker.proc.poll() is None, "the daemon died"
        stop.set()
        for name in ("ballast", "ballast2"):
            (small_disk / name).unlink()

        with pytest.raises(client.DiskFullError) as info:
            await asyncio.wait_for(refused, 60)
        assert info.value.code in (ErrorCode.DISK_FULL, ErrorCode.STORE_FAILED)
        assert "database or disk is full" in info.value.message
        assert "cannot rollback" not in info.value.message
        await asyncio.wait_for(producer, 60)  # its last SEND is answered once it is stored
        assert broker.proc.poll() is None, "the daemon died"
        assert await asyncio.wait_for(other.ping(), 30) == "pong"

        await _accepting_again(conn, 30)
        await conn.send(h, "DEFAULT", b"after")
        await other.send(other_dialog, "DEFAULT", b"other after")

        got = await _drain(conn, "TargetQ", len(acked) + 2)
        numbered = [m for m in got if m.conversation_handle == got[0].conversation_handle]
        if numbered[0].message_body == b"other after":
            numbered = [m for m in got if m.conversation_handle != got[0].conversation_handle]
        assert [m.message_body.split(b":")[0] for m in numbered[:-1]] == [
            str(n).encode() for n in acked
        ], "acknowledged messages lost, repeated or out of order"
        assert numbered[-1].message_body == b"after"
        assert [m.message_sequence_number for m in numbered] == list(range(len(acked) + 1))
        assert sorted(m.message_body for m in got if m not in numbered) == [b"other after"]
        await other.close()
        await conn.close()


async def test_full_disk_answers_what_needs_no_write(small_disk: Path) -> None:
    """While the store cannot write, a session that writes nothing is still answered: a
    ping, a view, and a SEND refused with the store's reason (README: 9004 "the store
    cannot write"; answers that depend on the failed commit wait)."""
    async with _two_dialogs(small_disk) as (broker, conn, h, other_dialog):
        pinger, viewer, sender = [await client.connect(broker.url) for _ in range(3)]
        acked: list[int] = []
        producer, stop = await _until_the_store_fails(broker, conn, h, acked)

        outcomes: dict[str, Any] = {}

        async def ask(name: str, call: Any) -> None:
            try:
                outcomes[name] = await asyncio.wait_for(call, ANSWER_TIMEOUT)
            except TimeoutError:
                outcomes[name] = f"no answer within {ANSWER_TIMEOUT:g} s"
            except client.BrokerError as exc:
                outcomes[name] = exc

        send = asyncio.create_task(sender.send(other_dialog, "DEFAULT", b"refused"))
        await asyncio.gather(
            ask("ping", pinger.ping()),
            ask("view", viewer.view("broker_resources")),
            asyncio.wait({send}, timeout=ANSWER_TIMEOUT),
        )
        send_answered_while_full = send.done()
        still_full = _free(small_disk) < 64 * 1024
        alive = broker.proc is not None and broker.proc.poll() is None
        stop.set()
        for name in ("ballast", "ballast2"):
            (small_disk / name).unlink()
        await asyncio.wait_for(producer, 60)
        try:  # answered by now in any case: what was the answer?
            await asyncio.wait_for(send, 60)
            outcomes["send"] = "accepted"
        except client.BrokerError as exc:
            outcomes["send"] = exc
        for c in (pinger, viewer, sender, conn):
            await c.close()

    assert alive and still_full
    problems = []
    if outcomes["ping"] != "pong":
        problems.append(f"ping: {outcomes['ping']!r}")
    view = outcomes["view"]
    if not (
        isinstance(view, list)
        and view[0]["accepting_messages"] is False
        and "database or disk is full" in (view[0]["refusal"] or "")
    ):
        problems.append(f"view broker_resources: {view!r}")
    if not send_answered_while_full:
        problems.append(f"SEND: no answer within {ANSWER_TIMEOUT:g} s")
    refusal = outcomes["send"]
    if not (
        isinstance(refusal, client.DiskFullError)
        and refusal.code == ErrorCode.STORE_FAILED
        and "database or disk is full" in refusal.message
    ):
        problems.append(f"SEND refused with {refusal!s} (README: 9004 the store cannot write)")
    assert not problems, "while the store cannot write: " + "; ".join(problems)


def _refused_start(data_dir: Path) -> str:
    """`ssb serve` on a full disk: it must not start, and say why in one line."""
    done = serve_once(data_dir, "--host", "127.0.0.1", "--durability", "fsync", timeout=30.0)
    assert "ssb ready" not in done.stdout, "the broker started on a full disk"
    return one_error_line(done)


def test_starting_on_a_full_disk_exits_with_one_line(small_disk: Path) -> None:
    fill(small_disk / "ballast")
    assert _free(small_disk) < 4096
    line = _refused_start(small_disk / "data")
    assert str(small_disk / "data") in line
    words = line.replace(str(small_disk / "data"), "DATA_DIR").lower()  # the path has "full"
    assert "full" in words, line


@pytest.mark.parametrize("setting", ["min_free_disk", "disk_reserve"])
def test_a_disk_setting_with_a_postgresql_store_is_refused_at_start(
    tmp_path: Path, setting: str
) -> None:
    """The broker cannot see a PostgreSQL server's disk: a disk setting given with such a
    store would be accepted and do nothing, so the start refuses it, in one line, before
    it connects (the server named here does not exist)."""
    config = tmp_path / "ssb.toml"
    config.write_text(f'store = "postgresql://ssb@127.0.0.1:1/ssb"\n{setting} = {32 * MIB}\n')
    line = one_error_line(serve_once(tmp_path / "data", "--config", str(config)))
    assert f"{setting} does not apply to a PostgreSQL store" in line, line


async def test_a_broker_with_a_store_starts_on_a_full_disk_and_drains_it(
    small_disk: Path,
) -> None:
    """The disk filled while the broker was down: it starts (giving up its disk reserve),
    refuses new messages, lets readers drain and END CONVERSATION, answers views and the
    dashboard, and takes new messages again by itself once there is room."""
    data_dir = small_disk / "data"
    config = {"min_free_disk": 0, "disk_reserve": 4 * MIB, "http_port": 0}
    broker = BrokerProcess(data_dir, config=config).start()
    try:
        conn = await client.connect(broker.url)
        await initiator_and_target(conn)
        h = await conn.begin_dialog("InitSvc", "TargetSvc")
        await conn.send_many(h, "DEFAULT", [b"kept"] * 10)
        await conn.close()
        assert broker.stop() == 0
        fill(small_disk / "ballast")
        assert _free(small_disk) < 64 * 1024
        broker.start()
        conn = await client.connect(broker.url)
        row = await _resources(conn)
        assert row["accepting_messages"] is False and "disk reserve" in row["refusal"]
        with pytest.raises(client.DiskFullError, match="RECEIVE and END CONVERSATION"):
            await conn.send(h, "DEFAULT", b"refused")
        with pytest.raises(client.DiskFullError):
            await conn.begin_dialog("InitSvc", "TargetSvc")
        got = await conn.receive("TargetQ", top=100, timeout=5)
        assert [m.message_body for m in got] == [b"kept"] * 10
        await conn.end_conversation(h)
        assert await conn.view("conversation_endpoints") != []  # the target's side is open
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{broker.http_url}/dashboard/login") as page:
                assert page.status == 200
            async with http.get(f"{broker.http_url}/healthz") as health:
                assert health.status == 503 and "disk" in (await health.json())["reason"]

        (small_disk / "ballast").unlink()

        await _accepting_again(conn, 15)
        assert (data_dir / "disk-reserve").stat().st_size == 4 * MIB  # in place again
        again = await conn.begin_dialog("InitSvc", "TargetSvc")
        await conn.send(again, "DEFAULT", b"after")
        (end, after) = await _drain(conn, "TargetQ", 2)
        assert end.message_type_name == client.END_DIALOG and after.message_body == b"after"
        await conn.close()
    finally:
        broker.kill()


async def test_a_reserve_there_is_no_room_for_yet_says_so_not_that_the_disk_is_full(
    small_disk: Path,
) -> None:
    """A first start with less free space than the reserve needs (twice its size): new
    messages wait for the reserve, and the refusal says what it waits for (how much room,
    the setting), not that the disk filled and the reserve was given up, which never
    happened and which the free space the operator sees contradicts."""
    ballast = small_disk / "ballast"
    fill(ballast, leave=24 * MIB)
    config = {"min_free_disk": 0, "disk_reserve": 16 * MIB}
    broker = BrokerProcess(small_disk / "data", config=config).start()
    try:
        conn = await client.connect(broker.url)
        row = await _resources(conn)
        assert row["accepting_messages"] is False
        refusal = row["refusal"]
        assert "disk is full" not in refusal and "gave up" not in refusal, refusal
        assert "disk_reserve" in refusal and "32.0 MiB" in refusal, refusal
        await initiator_and_target(conn)
        with pytest.raises(client.DiskFullError, match="disk_reserve"):
            await conn.begin_dialog("InitSvc", "TargetSvc")
        assert "is full" not in broker.log_text()
        ballast.unlink()
        await _accepting_again(conn, 15)
        await conn.begin_dialog("InitSvc", "TargetSvc")
        await conn.close()
    finally:
        broker.kill()


async def test_a_commit_that_cannot_be_written_is_rolled_back_within_disk_full_timeout(
    small_disk: Path,
) -> None:
    """The disk is full and the commit is larger than the disk reserve: its client gets
    DiskFullError within disk_full_timeout, nothing of it is ever applied (its outcome is
    rolled_back), and the broker starts again in its own process from what is durable:
    new messages refused, readers draining, new messages again once there is room."""
    timeout = 2.0
    config = {
        "min_free_disk": 0,
        "disk_reserve": 4 * MIB,
        "disk_full_timeout": timeout,
        "message_cache_bytes": MIB,
    }
    broker = BrokerProcess(small_disk, config=config).start()
    ballast = small_disk / "ballast"
    try:
        conn = await client.connect(broker.url)
        await initiator_and_target(conn)
        h = await conn.begin_dialog("InitSvc", "TargetSvc")
        await conn.send_many(h, "DEFAULT", [b"kept 0", b"kept 1"])
        pid = broker.pid
        fill(ballast)  # every byte, the disk reserve aside

        committer = await client.connect(broker.url)
        await committer.begin_transaction()
        txn = committer.transaction_id
        assert txn is not None
        for n in range(3):  # 9 MiB: more than the reserve gives
            await committer.send(h, "DEFAULT", bytes([n]) * (3 * MIB))
        started = time.monotonic()
        with pytest.raises(client.DiskFullError) as refused:
            await committer.commit()
        assert time.monotonic() - started <= timeout + 1.0
        assert refused.value.code == ErrorCode.DISK_FULL
        assert "rolled back, nothing of it was applied" in refused.value.message
        assert await committer.transaction_outcome(txn) == "rolled_back"

        # the same process, started again from what is durable, refusing new messages
        await _log_says(broker, "starting again from what is durable", timeout=10)
        assert broker.pid == pid and broker.proc is not None and broker.proc.poll() is None
        with pytest.raises(client.DiskFullError, match="disk reserve"):
            await conn.send(h, "DEFAULT", b"refused")
        got = await conn.receive("TargetQ", top=10, timeout=5)
        assert [m.message_body for m in got] == [b"kept 0", b"kept 1"]  # none of the 9 MiB

        ballast.unlink()

        await _accepting_again(conn, 15)
        await conn.send(h, "DEFAULT", b"after")
        (after,) = await _drain(conn, "TargetQ", 1)
        assert after.message_body == b"after" and after.message_sequence_number == 2
        await committer.close()
        await conn.close()
    finally:
        broker.kill()
        ballast.unlink(missing_ok=True)


async def test_free_space_is_measured_again_once_the_reserve_can_be_read(tmp_path: Path) -> None:
    """A disk reserve the daemon cannot look at (here a link to itself, which fails as
    an I/O error would) is said once, and the daemon goes on measuring free space: once
    the path is mended, it makes the reserve again."""
    size = 1024 * 1024
    process = BrokerProcess(tmp_path / "data", config={"disk_reserve": size}).start()
    reserve = tmp_path / "data" / RESERVE_FILE

    async def made() -> bool:
        return not reserve.is_symlink() and reserve.is_file() and reserve.stat().st_size == size

    async def said() -> bool:
        return "cannot measure free space" in process.log_text()

    try:
        await wait_until(made, "the disk reserve made")
        loop = reserve.with_name("loop")
        loop.symlink_to(reserve.name)
        os.replace(loop, reserve)  # (at once: the daemon makes a missing reserve again)
        # now stat() of the reserve fails: too many levels of links
        await wait_until(said, "the failure to measure logged")
        reserve.unlink()
        await wait_until(made, "the disk reserve made again")
        text = process.log_text()
        assert text.count("cannot measure free space") == 1, text
        assert "free space is measured again" in text
        async with await client.connect(process.url) as conn:
            assert await conn.ping() == "pong"
    finally:
        process.kill()
