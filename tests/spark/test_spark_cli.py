"""`ssb spark-bridge` as a process, configured from TOML, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from daemon import BrokerProcess
from spark_setup import collect_replies, replies_to_load, send_load, work_queue

from ssb import client
from ssb.tools import read_ready_line, wait_until_sync

pytestmark = pytest.mark.slow  # a local Spark session

HERE = Path(__file__).parent


def test_the_command_serves_queues_from_a_toml_config(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    config = tmp_path / "bridge.toml"
    config.write_text(
        f'broker = "{broker.url}"\n'
        'master = "local[2]"\n'
        f"python_path = [{str(HERE)!r}]\n"
        "stop_grace = 5.0\n"
        "[spark]\n"
        '"spark.ui.enabled" = "false"\n'
        '"spark.driver.host" = "127.0.0.1"\n'
        '"spark.driver.bindAddress" = "127.0.0.1"\n'
        "[[queue]]\n"
        'name = "Cli"\n'
        'function = "spark_funcs:reply"\n'
        "idle_timeout = 1.0\n"
    )
    with client.connect_sync(broker.url) as conn:
        work_queue(conn, "Cli", readers=2)
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        proc = subprocess.Popen(
            [sys.executable, "-m", "ssb.broker", "spark-bridge", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            ready = read_ready_line(proc, "ssb spark-bridge ready", 60)
            assert ready is not None, f"the bridge did not start (exit code {proc.poll()})"
            assert "queues=Cli" in ready
            send_load(conn, "Cli", conversations=4, per_conversation=10)
            seen = collect_replies(conn, "Cli", 40, timeout=60)
            assert seen == replies_to_load(4, 10)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        notes = conn.view("event_notifications")
        assert [(n["queue_name"], n["service_name"]) for n in notes] == [
            ("Cli", "spark-bridge/NotificationService")
        ]
        wait_until_sync(
            lambda: conn.view("activated_tasks"), "no reader left", 20, until=lambda rows: not rows
        )
