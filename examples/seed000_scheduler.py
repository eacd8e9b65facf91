"""Seed 000's test script on ssb: a scheduler, five waves of tasks, the execution log.

The seed runs `waitfor delay` tasks of 10.1, 9.2, 8.3, 7.4 and 6.5 seconds in waves
of 4, 2, 1, 2 and 1, synchronising after each wave; here each task is
`time.sleep(delay * scale)` run by an activated reader of the scheduler's target
queue (five readers, like MAX_QUEUE_READERS = 5), and the script prints the
ExecutionLog and ExecutionStatus views at the end.

    python examples/seed000_scheduler.py                 # starts a private broker
    python examples/seed000_scheduler.py --url "$SSB_URL"

A broker of your own runs the tasks only if its config lists them:
`procedures = ["time:sleep"]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ssb import client
from ssb.broker.cli import format_table
from ssb.tools import BrokerProcess

WAVES = [(4, 10.1), (2, 9.2), (1, 8.3), (2, 7.4), (1, 6.5)]


@contextlib.contextmanager
def private_broker() -> Iterator[str]:
    """A throwaway daemon on a free port that may run `time.sleep`, with two warm
    activation workers."""
    with tempfile.TemporaryDirectory(prefix="ssb-seed000-") as tmp:
        config = {
            "procedures": ["time:sleep"],
            "activation": {"check_interval": 1.0, "prestart_workers": 2},
        }
        broker = BrokerProcess(
            Path(tmp) / "data",
            durability="os",
            config=config,
            extra_args=["--log-level", "WARNING"],
        )
        with broker:
            yield broker.url  # admin, with the password the start wrote


async def seed_test(url: str, scale: float) -> None:
    async with await client.connect(url) as conn:
        async with await conn.get_scheduler("Seed000", max_queue_readers=5) as scheduler:
            print(f"scheduler handle {scheduler.handle}")
            for count, delay in WAVES:
                started = time.monotonic()
                for _ in range(count):
                    await scheduler.exec_async("time:sleep", round(delay * scale, 3))
                outcomes = await scheduler.synchronize()
                failed = [o for o in outcomes if not o.ok]
                print(
                    f"wave of {count} x {delay * scale:.2f} s: synchronized after "
                    f"{time.monotonic() - started:.2f} s"
                    + (f", {len(failed)} failed: {failed[0].error}" if failed else "")
                )
            print("\nExecutionStatus (activated readers, idle now)")
            print(format_table(await conn.view("execution_status")))
        rows = [
            {
                k: r[k]
                for k in (
                    "log_id",
                    "caller",
                    "activated_task",
                    "pid",
                    "task",
                    "queued_time",
                    "start_time",
                    "end_time",
                    "status",
                )
            }
            for r in await conn.view("execution_log")
            if r["scheduler_handle"] == scheduler.handle
        ]
        print("\nExecutionLog")
        print(format_table(rows))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("SSB_URL"), help="a running broker")
    parser.add_argument(
        "--scale", type=float, default=0.1, help="multiply the seed's delays by this (default 0.1)"
    )
    args = parser.parse_args()
    if args.url:
        await seed_test(args.url, args.scale)
    else:
        with private_broker() as url:
            await seed_test(url, args.scale)


if __name__ == "__main__":
    asyncio.run(main())
