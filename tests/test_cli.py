"""The `ssb` command line."""

from __future__ import annotations

import subprocess
import sys

from daemon import BrokerProcess

from ssb import client


def _ssb(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ssb.broker", *args], capture_output=True, text=True, timeout=60
    )


def test_serve_help_documents_the_options() -> None:
    out = _ssb("serve", "--help").stdout
    for option in ("--data-dir", "--config", "--host", "--client-port", "--broker-port"):
        assert option in out


async def test_view_and_status_print_tables(broker: BrokerProcess, conn: client.Connection) -> None:
    await conn.create_queue("Orders")
    await conn.create_service("OrderService", queue="Orders", contracts=["DEFAULT"])
    h = await conn.begin_dialog("OrderService", "OrderService")
    await conn.send(h, body="hello")
    url = broker.url
    out = _ssb("view", "service_queues", "--url", url).stdout
    assert "Orders" in out and "messages_ready" in out
    out = _ssb("view", "queue:Orders", "--url", url).stdout
    assert "hello" in out and "conversation_handle" in out
    result = _ssb("view", "nonsense", "--url", url)
    assert result.returncode == 1 and "there is no view 'nonsense'" in result.stderr
    out = _ssb("status", "--url", url).stdout
    assert broker.instance in out


def test_bad_config_is_reported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.toml"
    bad.write_text("durabilty = 'os'\n")
    result = _ssb("serve", "--config", str(bad), "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert "unknown setting 'durabilty'" in result.stderr


def test_second_daemon_on_same_data_dir_is_refused(broker: BrokerProcess) -> None:
    result = _ssb(
        "serve", "--data-dir", str(broker.data_dir), "--client-port", "0", "--broker-port", "0"
    )
    assert result.returncode == 2
    assert "another ssb daemon is using" in result.stderr
