"""Broker priorities between brokers: a low-priority dialog is not starved by a large
high-priority backlog (seed 002: the transmission queue serves higher priorities first,
but every message is sent within a bounded wait, `starvation_bound`)."""

from __future__ import annotations

import time
from pathlib import Path

from federation_setup import (
    CONTRACT,
    REQUEST,
    TRANSPORT,
    Federation,
    create_contract,
    create_initiator,
    create_target,
    route,
)

HIGH_DIALOGS = 200
PER_DIALOG = 250
BOUND = 0.5


async def test_a_low_message_committed_with_a_high_backlog_waits_at_most_the_bound(
    tmp_path: Path,
) -> None:
    transport = {**TRANSPORT, "starvation_bound": BOUND}
    async with Federation(tmp_path, ["A", "B"], transport=transport) as fed:
        a, b = fed["A"], fed["B"]
        await create_contract(a, b)
        await create_initiator(a, "High")
        await create_initiator(a, "Low")
        target_q = await create_target(b, "TargetB")
        await route(a, "TargetB", b)
        await a.conn.create_broker_priority("hi", CONTRACT, "High", level=10)
        await a.conn.create_broker_priority("lo", CONTRACT, "Low", level=1)
        # B receives the low dialog's group first once it has a message (priorities are each
        # endpoint's own): what B hands out before it is what arrived before it, not the
        # high groups that merely began earlier
        await b.conn.create_broker_priority("lo_first", CONTRACT, "TargetB", "Low", level=10)
        highs = [
            await a.conn.begin_dialog("High", "TargetB", contract=CONTRACT)
            for _ in range(HIGH_DIALOGS)
        ]
        low = await a.conn.begin_dialog("Low", "TargetB", contract=CONTRACT)
        body = b"h" * 1024
        async with a.conn.transaction():  # committed together: the low one is not older
            for handle in highs:
                await a.conn.send_many(handle, REQUEST, [body] * PER_DIALOG)
            await a.conn.send(low, REQUEST, b"low")
        committed = time.monotonic()

        total = HIGH_DIALOGS * PER_DIALOG
        highs_before = 0
        deadline = committed + 120
        while True:
            got = await b.conn.receive(target_q, top=1000, timeout=5)
            bodies = [m.message_body for m in got]
            if b"low" in bodies:
                highs_before += bodies.index(b"low")
                waited = time.monotonic() - committed
                break
            highs_before += len(bodies)
            assert time.monotonic() < deadline, f"low message not there; {highs_before} highs"
        # sent last, it would come after the whole backlog; the bound lets it go far sooner
        assert highs_before < total * 0.3, (highs_before, total, waited)
