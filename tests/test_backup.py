"""`ssb backup`: a copy of a running broker starts as the same broker, with its messages."""

from __future__ import annotations

import subprocess
from pathlib import Path

from daemon import BrokerProcess, one_error_line, run_ssb

from ssb import client

MESSAGES = 50


def _backup(target: Path, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return run_ssb("backup", str(target), "--data-dir", str(data_dir))


async def test_a_backup_of_a_running_broker_starts_as_the_same_broker(
    tmp_path: Path, broker: BrokerProcess, conn: client.Connection
) -> None:
    await conn.create_queue("Orders")
    await conn.create_service("OrderService", queue="Orders", contracts=["DEFAULT"])
    handle = await conn.begin_dialog("OrderService", "OrderService")
    await conn.send_many(handle, "DEFAULT", [f"order {n}".encode() for n in range(MESSAGES)])
    await conn.execute("CREATE TABLE Ledger (n INT PRIMARY KEY)")  # users' tables too
    await conn.execute("INSERT INTO Ledger VALUES (1), (2)")
    copy = tmp_path / "copy"

    result = _backup(copy, broker.data_dir)  # while the broker runs

    assert result.returncode == 0, result.stderr
    assert f"ssb serve --data-dir {copy}" in result.stdout
    for name in ("broker.db", "admin.password", "broker-key.pem", "broker-cert.pem"):
        assert name in result.stdout
        assert (copy / name).stat().st_mode & 0o077 == 0  # private, as the daemon's files
    assert not (copy / "LOCK").exists() and not (copy / "broker.json").exists()
    await conn.send(handle, "DEFAULT", b"after the backup")
    await conn.execute("INSERT INTO Ledger VALUES (3)")
    await conn.close()
    assert broker.stop() == 0

    restored = BrokerProcess(copy).start()
    try:
        assert restored.instance == broker.instance
        async with await client.connect(restored.url) as again:  # admin's copied password
            assert await again.broker_instance() == broker.instance
            bodies = [m.message_body for m in await again.peek("Orders")]
            assert bodies == [f"order {n}".encode() for n in range(MESSAGES)]
            certificate = (broker.data_dir / "broker-cert.pem").read_text()
            assert await again.broker_certificate() == certificate  # the same identity
            assert (await again.execute("SELECT n FROM Ledger ORDER BY n")).rows == [(1,), (2,)]
    finally:
        restored.kill()


def test_a_backup_never_overwrites(tmp_path: Path, broker: BrokerProcess) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("mine")
    assert "is not empty" in one_error_line(_backup(full, broker.data_dir))
    assert [p.name for p in full.iterdir()] == ["something"]
    afile = tmp_path / "afile"
    afile.write_text("")
    assert "is a file" in one_error_line(_backup(afile, broker.data_dir))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _backup(empty, broker.data_dir).returncode == 0
    assert (empty / "broker.db").exists()


def test_a_backup_needs_a_store(tmp_path: Path) -> None:
    line = one_error_line(_backup(tmp_path / "copy", tmp_path / "nothing"))
    assert "holds no broker store" in line and "--data-dir" in line
    assert not (tmp_path / "copy").exists()
