"""Activation latency and scheduler task throughput.

Latency: message committed -> activated procedure running. A queue whose procedure
(`stamp` below) notes the time it was entered, takes its message, answers with that
time and returns at once. For each sample the bench waits until the queue has no
activated task (so the next message meets condition (a): an idle queue), notes the
time, SENDs (an autocommitted statement), and reads the answer. Cold: no idle
workers are kept (`idle_workers = 0`), so every activation starts a worker process.
Warm: idle workers are kept, so an activation reuses one.

Throughput: the seed-000 scheduler runs --tasks empty tasks (`noop`) from one
client, exec_async for all of them then synchronize, with MAX_QUEUE_READERS = 2 and
8 (warm workers prestarted, one warm-up round first); tasks/s = tasks / (first
exec_async to synchronize returning).

Run from the repository root:

    python -m bench.activation                  # durability fsync, the default
    python -m bench.activation --durability os --tasks 2000 --json act.json
    python -m bench.activation --smoke          # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import json
import operator
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from ssb import client
from ssb.tools import wait_until

from ._common import (
    REPO_ROOT,
    CommandLine,
    broker,
    option,
    percentile,
    run,
)

SMOKE = {"cold": 2, "warm": 3, "tasks": 20}


@dataclass
class Options:
    durability: str = option("fsync")
    cold: int = option(30, "cold latency samples")
    warm: int = option(200, "warm latency samples")
    tasks: int = option(1000, "scheduler tasks per run")


def stamp(conn: client.SyncConnection, task: Any) -> None:
    """The latency probe's activated procedure."""
    entered = time.time()
    for message in conn.receive(task.queue, top=1, timeout=0):
        conn.send(message.conversation_handle, "DEFAULT", repr(entered))


def noop() -> None:
    """An empty scheduler task."""


async def _wait_idle(conn: client.Connection, queue: str) -> None:
    async def busy() -> bool:
        return any(t["queue"] == queue for t in await conn.view("activated_tasks"))

    await wait_until(busy, "the probe's activated task to end", 30, 0.005, until=operator.not_)


async def latency(url: str, samples: int, warmup: int) -> list[float]:
    async with await client.connect(url) as conn:
        await conn.create_queue("ReplyQueue")
        await conn.create_service("ReplyService", queue="ReplyQueue")
        await conn.create_queue(
            "ProbeQueue",
            activation={
                "status": "ON",
                "procedure": "bench.activation:stamp",
                "max_queue_readers": 1,
            },
        )
        await conn.create_service("ProbeService", queue="ProbeQueue", contracts=["DEFAULT"])
        handle = await conn.begin_dialog("ReplyService", "ProbeService")
        found = []
        for i in range(warmup + samples):
            await _wait_idle(conn, "ProbeQueue")
            sent = time.time()
            await conn.send(handle, "DEFAULT", b"go")
            reply = await conn.receive("ReplyQueue", top=1, timeout=30)
            if not reply:
                raise RuntimeError("the probe did not answer within 30 s")
            if i >= warmup:
                found.append(float(reply[0].text()) - sent)
        return found


async def throughput(url: str, readers: int, tasks: int) -> float:
    async with await client.connect(url) as conn:

        async def idle_workers() -> int:
            return sum(w["state"] == "IDLE" for w in await conn.view("activation_workers"))

        await wait_until(idle_workers, "warm workers", 60, until=lambda idle: idle >= readers)
        scheduler = await conn.get_scheduler(f"Bench{readers}", max_queue_readers=readers)
        for _ in range(min(tasks, 200)):  # warm-up: readers started, modules imported
            await scheduler.exec_async("bench.activation:noop")
        await scheduler.synchronize(timeout=120)
        started = time.perf_counter()
        for _ in range(tasks):
            await scheduler.exec_async("bench.activation:noop")
        outcomes = await scheduler.synchronize(timeout=600)
        elapsed = time.perf_counter() - started
        if len(outcomes) != tasks or not all(o.ok for o in outcomes):
            raise RuntimeError("some tasks failed")
        await scheduler.release()
        return tasks / elapsed


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p99_ms": percentile(ordered, 0.99) * 1000,
        "min_ms": ordered[0] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("activation", __doc__, Options)
    args, opts = parser.read(argv, SMOKE)
    runs: list[tuple[str, dict[str, Any], Any]] = [
        ("latency_cold", {"idle_workers": 0}, lambda url: latency(url, opts.cold, 1)),
        (
            "latency_warm",
            {"idle_workers": 2, "prestart_workers": 1},
            lambda url: latency(url, opts.warm, 5),
        ),
    ]
    for readers in (2, 8):
        runs.append(
            (
                f"scheduler_tasks_per_s_readers_{readers}",
                {"idle_workers": readers, "prestart_workers": readers},
                lambda url, r=readers: throughput(url, r, opts.tasks),
            )
        )
    results: dict[str, Any] = {}
    for name, activation, measure in runs:
        settings = {"check_interval": 1.0, "python_path": [str(REPO_ROOT)], **activation}
        with broker(opts.durability, {"activation": settings}) as process:
            value = run(measure(process.url))
        results[name] = _summary(value) if isinstance(value, list) else round(value, 1)
        print(f"{name:40} {json.dumps(results[name])}", flush=True)
    return parser.conclude(args, opts, True, **results)


if __name__ == "__main__":
    sys.exit(main())
