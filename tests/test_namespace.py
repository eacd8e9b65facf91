"""The packages install as `ssb.*`: a user's own `client.py`, `protocol.py` or
`broker.py` next to their program or in the daemon's working directory changes
nothing (before, `import client` found the user's file first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from daemon import BrokerProcess

from ssb import client
from ssb.tools import wait_until

SHADOWS = ("client", "protocol", "broker", "spark_bridge")


def _shadowed_workdir(tmp_path: Path) -> Path:
    """A working directory holding a user file of each of the packages' names."""
    work = tmp_path / "work"
    work.mkdir()
    for name in SHADOWS:
        (work / f"{name}.py").write_text(
            f"raise RuntimeError('the user file {name}.py was imported')\n"
        )
    return work


def test_a_program_named_client_py_talks_to_the_broker(
    tmp_path: Path, broker: BrokerProcess
) -> None:
    work = _shadowed_workdir(tmp_path)
    # the README's example, saved under the name a newcomer would pick
    (work / "client.py").write_text(
        "import asyncio\n"
        "from ssb import client\n"
        "async def main() -> None:\n"
        f"    conn = await client.connect({broker.url!r})\n"
        "    print(await conn.ping())\n"
        "    await conn.close()\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "client.py"], cwd=work, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pong"


async def test_activated_procedures_ignore_the_daemons_working_directory(tmp_path: Path) -> None:
    work = _shadowed_workdir(tmp_path)
    (work / "myprocs.py").write_text(
        "def drain(conn, task):\n"
        "    while conn.receive(task.queue, top=10, timeout=1.0):\n"
        "        pass\n"
    )
    broker = BrokerProcess(tmp_path / "data", cwd=work).start()
    try:
        conn = await client.connect(broker.url)
        await conn.create_queue(
            "Work", activation={"status": "ON", "procedure": "myprocs:drain", "execute_as": "admin"}
        )
        await conn.create_service("WorkService", queue="Work", contracts=["DEFAULT"])
        await conn.create_queue("From")
        await conn.create_service("FromService", queue="From")
        handle = await conn.begin_dialog("FromService", "WorkService")
        await conn.send_many(handle, "DEFAULT", [b"a", b"b", b"c"])

        async def finished() -> dict[str, object] | None:
            (row,) = [r for r in await conn.view("queue_monitors") if r["queue"] == "Work"]
            if row["last_task_error"] is not None:
                raise AssertionError(row["last_task_error"])
            done = row["tasks_started"] and row["messages_ready"] == 0 and not row["tasks_running"]
            return row if done else None

        row = await wait_until(finished, "the activated procedure to drain the queue", 60)
        assert row["tasks_failed"] == 0
        await conn.close()
    finally:
        broker.kill()
