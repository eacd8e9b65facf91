"""What the broker acknowledged survives kill -9 of the daemon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from daemon import BrokerProcess
from setup_objects import seed000

from ssb import client
from ssb.tools import wait_until_sync

pytestmark = pytest.mark.slow  # load clients and kill -9

HERE = Path(__file__).parent


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("durability", ["fsync", "os"])
async def test_kill_9_keeps_every_acknowledged_change(tmp_path: Path, durability: str) -> None:
    broker = BrokerProcess(tmp_path / "data", durability=durability).start()
    try:
        conn = await client.connect(broker.url)
        init_svc, target_svc, _, target_q = await seed000(conn)
        handles = [
            await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
            for _ in range(4)
        ]
        await conn.close()
        handle_file = tmp_path / "handles"
        handle_file.write_text("\n".join(str(h) for h in handles))
        sent_log, recv_log = tmp_path / "sent", tmp_path / "received"
        script = str(HERE / "load_client.py")
        producer = subprocess.Popen(
            [sys.executable, script, "producer", broker.url, str(sent_log), str(handle_file)]
        )
        consumer = subprocess.Popen(
            [sys.executable, script, "consumer", broker.url, str(recv_log), target_q]
        )
        wait_until_sync(lambda: len(_lines(sent_log)) >= 2000, "2,000 acknowledged sends")
        wait_until_sync(lambda: _lines(recv_log).count("commit") >= 50, "50 committed receives")
        broker.kill()
        assert producer.wait(timeout=30) == 0
        assert consumer.wait(timeout=30) == 0

        acked = _lines(sent_log)
        committed: list[str] = []
        in_doubt: list[str] = []
        for line in _lines(recv_log):
            if line == "commit":
                committed += in_doubt
                in_doubt = []
            else:
                in_doubt.append(line.removeprefix("pending "))

        broker.start()
        conn = await client.connect(broker.url)
        remaining: list[str] = []
        after = None
        for _ in range(100):  # bounded: the producer sends 40,000 messages at most
            page = await conn.peek(target_q, after=after)  # 10,000 a page at most
            if not page:
                break
            remaining += [m.message_body.decode() for m in page]
            after = page[-1].queuing_order
        await conn.close()

        assert len(set(acked)) == len(acked)
        assert len(remaining) == len(set(remaining)), "a message is in the queue twice"
        assert not set(remaining) & set(committed), "a committed receive came back"
        missing = set(acked) - set(remaining) - set(committed) - set(in_doubt)
        assert not missing, f"{len(missing)} acknowledged sends were lost"
        # at most the one unacknowledged batch may exist beyond what was acknowledged
        extra = set(remaining) | set(committed) | set(in_doubt)
        assert len(extra - set(acked)) <= 20
    finally:
        broker.kill()


async def test_restart_keeps_catalog_conversations_and_delivery_counts(
    broker: BrokerProcess,
) -> None:
    conn = await client.connect(broker.url)
    init_svc, target_svc, init_q, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send_many(h, "AsyncSent", [b"1", b"2"])
    for _ in range(2):
        await conn.begin_transaction()
        await conn.receive(target_q, timeout=5)
        await conn.rollback()
    await conn.begin_conversation_timer(h, timeout=1.0)
    instance = await conn.broker_instance()
    await conn.close()
    broker.kill()
    broker.start()
    conn = await client.connect(broker.url)
    assert await conn.broker_instance() == instance
    got = await conn.receive(target_q, timeout=5)
    assert [(m.message_body, m.delivery_count) for m in got] == [(b"1", 3), (b"2", 3)]
    await conn.send(got[0].conversation_handle, "AsyncDone", b"reply")
    # the reply and the timer, in whichever order (a slow restart lets the timer first)
    seen = await conn.receive(init_q, timeout=10, conversation_handle=h)
    if len(seen) < 2:
        seen += await conn.receive(init_q, timeout=10, conversation_handle=h)
    assert sorted((m.message_type_name, m.message_body) for m in seen) == [
        ("AsyncDone", b"reply"),
        (client.DIALOG_TIMER, b""),
    ]
    await conn.close()


async def test_sigterm_shuts_down_cleanly(broker: BrokerProcess) -> None:
    conn = await client.connect(broker.url, reconnect_deadline=0.5)
    await conn.create_queue("Q")
    await conn.begin_transaction()
    assert broker.stop() == 0
    with pytest.raises(client.ConnectionLostError):
        await conn.ping()
    broker.start()
    conn = await client.connect(broker.url)
    assert [q["name"] for q in await conn.view("service_queues")] == ["Q"]
    await conn.close()
    broker.stop()
