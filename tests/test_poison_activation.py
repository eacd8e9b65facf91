"""A poison message under an activated procedure: the policy moves it, the rest drains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from daemon import BrokerProcess

from ssb import client

FAST = {
    "check_interval": 0.2,
    "empty_rowset_window": 0.5,
    "python_path": [str(Path(__file__).parent)],
}


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    """The tests' broker: fast activation checks."""
    return {"config": {"activation": FAST}}


async def test_raising_procedure_with_dead_letter_policy_drains_the_queue(
    broker: BrokerProcess,
) -> None:
    conn = await client.connect(broker.url)
    try:
        await conn.create_queue("DLQ")
        await conn.create_queue("Replies")
        await conn.create_service("Client", queue="Replies")
        await conn.create_queue(
            "Work",
            activation={
                "status": "ON",
                "procedure": "activation_procs:picky",
                "max_queue_readers": 2,
            },
            poison_policy={"threshold": 3, "action": "dead_letter", "dead_letter_queue": "DLQ"},
        )
        await conn.create_service("WorkService", queue="Work", contracts=["DEFAULT"])
        bad = await conn.begin_dialog("Client", "WorkService")
        await conn.send(bad, body="poison")
        good = [await conn.begin_dialog("Client", "WorkService") for _ in range(5)]
        for n, h in enumerate(good):
            await conn.send_many(h, "DEFAULT", [f"{n}:{i}" for i in range(4)])

        answers: dict[str, list[int]] = {}
        while sum(len(v) for v in answers.values()) < 20:
            got = await conn.receive("Replies", timeout=30)
            assert got, f"the queue stalled after {answers}"
            for m in got:
                conv, i = m.message_body.decode().split(":")
                answers.setdefault(conv, []).append(int(i))
        assert answers == {str(n): [0, 1, 2, 3] for n in range(5)}

        (letter,) = await conn.peek("DLQ")
        assert letter.message_body == b"poison"
        assert "cannot process this message" in (letter.dead_letter_reason or "")
        (incident,) = await conn.view("poison_messages")
        assert incident["action"] == "dead_letter" and "ValueError" in incident["error"]
        assert next(q for q in await conn.view("service_queues") if q["name"] == "Work")[
            "is_receive_enabled"
        ]
    finally:
        await conn.close()
