"""Slow consumer: a producer at full speed, a consumer at 1% of its rate; daemon memory.

The issue's figure: slow consumer, producer at full speed, consumer at 1% of it, 60 s:
RSS growth <= 100 MB; with a quota the producer gets the quota error instead.

Two runs, each on a fresh daemon (durability "os" unless --durability; the default
`message_cache_bytes` unless --cache-bytes), each --seconds long:

  no quota   a producer process sends as fast as it can: `send_many` of --batch bodies of
             --body-size bytes, round the --conversations conversations, --in-flight calls
             pipelined on one connection. A consumer process receives (autocommitted
             RECEIVE TOP n) at --fraction (1%) of the producer's rate: a token bucket that
             allows it --fraction of what the producer has sent so far (the producer
             publishes its count through shared memory). The queue grows by ~99% of what
             is sent;
  quota      the same, but the target queue has max_messages = --quota. The producer gets
             QueueFullError once the queue is full (it counts them and pauses 10 ms after
             each, pacing, so it does not spin); the consumer is paced at --fraction of the
             first run's producer rate (this run's producer is held back by the quota).

Meanwhile this process samples the daemon's RSS (VmRSS) and the queue's depth
(`service_queues.messages_stored`) every second. RSS growth is the peak (the samples,
and VmHWM when it rose during the run) minus the RSS just before the start. At the end
the queue must hold exactly what was sent and not received, and no message may arrive
twice (every body carries the producer's index).

Gated (exit status 1 when missed): RSS growth <= 100 MB in both runs; in the quota run,
at least one QueueFullError and a queue depth that never exceeds the quota. Every loop is
bounded in count and time; everything stays on 127.0.0.1.

Run from the repository root:

    python -m bench.slow_consumer                    # 60 s per run (about 2.5 min in all)
    python -m bench.slow_consumer --seconds 10 --json out.json
    python -m bench.slow_consumer --smoke            # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import struct
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from ssb import client

from ._common import (
    BenchFailure,
    Catalog,
    CommandLine,
    Work,
    Workers,
    broker,
    option,
    print_header,
    rate,
    run,
    started_together,
)
from ._memory import (
    MB,
    BrokerProcess,
    cache_config,
    daemon_peak,
    daemon_rss,
    mb,
    peak_since,
    queue_row,
    queue_state,
    rss_bytes,
    store_sizes,
)

CATALOG = Catalog("Slow")
TAG = struct.Struct(">Q")  # the producer's index of the message
TARGET_GROWTH = 100 * MB
QUOTA_PAUSE = 0.01  # seconds the producer pauses after a QueueFullError (pacing)
SMOKE = {"seconds": 1.0, "quota": 200, "batch": 20}


@dataclass
class Options:
    seconds: float = option(60.0)
    quota: int = option(100_000, "max_messages, run 2", at_least=1)
    fraction: float = option(0.01)
    batch: int = option(100, at_least=1)
    body_size: int = option(1024, at_least=TAG.size)
    conversations: int = option(10, at_least=1)
    in_flight: int = option(4, at_least=1)
    durability: str = option("os")
    cache_bytes: int | None = option(None, parse=int)
    interval: float = 1.0


@dataclass
class RunResult:
    name: str
    quota: int | None
    seconds: float = 0.0
    sent: int = 0
    producer_msgs_s: float = 0.0
    quota_errors: int = 0
    received: int = 0
    consumer_msgs_s: float = 0.0
    consumer_fraction: float = 0.0
    queued_end: int = 0
    max_depth: int = 0
    rss_start: int = 0
    rss_peak: int = 0
    rss_end: int = 0
    rss_growth: int = 0
    store_end: dict[str, int] = field(default_factory=dict)
    resources_end: dict[str, Any] = field(default_factory=dict)
    rss_samples: list[int] = field(default_factory=list)
    depth_samples: list[int] = field(default_factory=list)
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    met: bool = False


# ---- the producer and the consumer (each in its own process) ------------------------------


async def produce(url: str, opts: Options, counter: Any, go: Any, ready: Any) -> dict[str, Any]:
    pad = b"s" * max(0, opts.body_size - TAG.size)
    async with await client.connect(url) as conn:
        handles = [await CATALOG.begin_dialog(conn) for _ in range(opts.conversations)]
        started = await started_together("producer", go, ready, 120.0)
        end = started + opts.seconds
        sent = errors = calls = 0
        in_flight: deque[tuple[asyncio.Future[None], int]] = deque()

        async def settle() -> None:
            nonlocal sent, errors
            future, count = in_flight.popleft()
            try:
                await asyncio.wait_for(future, 60.0)
            except client.QueueFullError:
                errors += 1
                await asyncio.sleep(QUOTA_PAUSE)
            else:
                sent += count
                counter.value = sent

        index = 0
        while time.monotonic() < end:
            bodies = [TAG.pack(index + i) + pad for i in range(opts.batch)]
            index += opts.batch
            handle = handles[calls % len(handles)]
            calls += 1
            in_flight.append(
                (
                    asyncio.ensure_future(conn.send_many(handle, CATALOG.message_type, bodies)),
                    opts.batch,
                )
            )
            if len(in_flight) >= opts.in_flight:
                await settle()
        while in_flight:
            await settle()
        finished = time.monotonic()
    return {"sent": sent, "errors": errors, "calls": calls, "seconds": finished - started}


async def consume(
    url: str, opts: Options, counter: Any, reference_rate: float | None, go: Any, ready: Any
) -> dict[str, Any]:
    """Receive at opts.fraction of the producer's rate: of its running count, or of
    `reference_rate` msgs/s when given."""
    seen: set[int] = set()
    async with await client.connect(url) as conn:
        await conn.ping()
        started = await started_together("consumer", go, ready, 120.0)
        end = started + opts.seconds
        received = receives = 0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if reference_rate is None:
                allowed = opts.fraction * counter.value
            else:
                allowed = opts.fraction * reference_rate * (now - started)
            want = int(allowed) - received
            if want < 1:
                await asyncio.sleep(0.02)  # pacing: the token bucket is empty
                continue
            messages = await conn.receive(
                CATALOG.target_queue, top=min(opts.batch, want), timeout=0.2
            )
            receives += 1
            for m in messages:
                (index,) = TAG.unpack_from(m.message_body)
                if index in seen:
                    raise BenchFailure(f"consumer: message {index} received twice")
                seen.add(index)
            received += len(messages)
        finished = time.monotonic()
    return {"received": received, "receives": receives, "seconds": finished - started}


# ---- one run -------------------------------------------------------------------------------


async def monitor(
    d: BrokerProcess, workers: Workers, limit: float, interval: float
) -> tuple[list[int], list[int]]:
    """Sample RSS and queue depth every `interval` s until both workers reported."""
    rss: list[int] = []
    depth: list[int] = []
    async with await client.connect(d.url) as conn:
        while True:
            value = rss_bytes(d.pid)
            if value is not None:
                rss.append(value)
            depth.append(int((await queue_row(conn, CATALOG.target_queue))["messages_stored"]))
            if workers.reported(limit):
                return rss, depth
            await asyncio.sleep(interval)  # pacing of the samples


def one_run(name: str, quota: int | None, reference_rate: float | None, opts: Options) -> RunResult:
    r = RunResult(name=name, quota=quota)
    with broker(opts.durability, cache_config(opts.cache_bytes), stop_timeout=60.0) as d:
        run(CATALOG.create(d.url, quota))
        counter = mp.get_context("spawn").Value("q", 0, lock=False)
        work: dict[str, tuple[Work, tuple[Any, ...]]] = {
            "producer": (produce, (d.url, opts, counter)),
            "consumer": (consume, (d.url, opts, counter, reference_rate)),
        }
        with Workers(work) as workers:
            workers.ready()
            time.sleep(1.0)  # pacing: let the daemon settle before the baseline
            r.rss_start = daemon_rss(d)
            hwm_start = daemon_peak(d)
            print(f"[{name}] {opts.seconds:g} s ...", flush=True)
            started = workers.release()
            rss, depth = run(monitor(d, workers, started + opts.seconds + 120, opts.interval))
        outcomes = workers.outcomes
        r.rss_end = daemon_rss(d)
        r.rss_peak = peak_since(d, hwm_start, *rss, r.rss_end)
        r.rss_growth = r.rss_peak - r.rss_start
        r.rss_samples = rss
        r.depth_samples = depth
        producer, consumer = outcomes["producer"], outcomes["consumer"]
        r.seconds = producer["seconds"]
        r.sent = producer["sent"]
        r.quota_errors = producer["errors"]
        r.producer_msgs_s = rate(r.sent, producer["seconds"])
        r.received = consumer["received"]
        r.consumer_msgs_s = rate(r.received, consumer["seconds"])
        r.consumer_fraction = r.received / r.sent if r.sent else 0.0
        row, r.resources_end = run(queue_state(d.url, CATALOG.target_queue))
        r.queued_end = int(row["messages_stored"])
        r.max_depth = max([*depth, r.queued_end])
        r.store_end = store_sizes(d)
        if r.queued_end != r.sent - r.received:
            raise BenchFailure(
                f"[{name}] the queue holds {r.queued_end} messages; sent {r.sent} - received "
                f"{r.received} = {r.sent - r.received}"
            )
    r.targets = {
        "rss_growth": {
            "value": r.rss_growth,
            "target": f"<= {TARGET_GROWTH // MB} MB",
            "met": r.rss_growth <= TARGET_GROWTH,
        }
    }
    if quota is not None:
        r.targets["quota_errors"] = {
            "value": r.quota_errors,
            "target": ">= 1",
            "met": r.quota_errors >= 1,
        }
        r.targets["max_depth"] = {
            "value": r.max_depth,
            "target": f"<= {quota}",
            "met": r.max_depth <= quota,
        }
    r.met = all(t["met"] for t in r.targets.values())
    return r


# ---- report --------------------------------------------------------------------------------


def print_table(results: list[RunResult], opts: Options) -> None:
    cache = "default" if opts.cache_bytes is None else f"{opts.cache_bytes:,} B"
    print()
    print(
        f"{opts.seconds:g} s per run; send_many of {opts.batch} x {opts.body_size} B on "
        f"{opts.conversations} conversations, {opts.in_flight} in flight; consumer at "
        f"{100 * opts.fraction:g}%; durability={opts.durability}, message_cache_bytes={cache}, "
        f"{os.cpu_count()} CPUs; MB = 10^6 bytes"
    )
    header = (
        f"{'run':<14} {'sent':>10} {'prod/s':>8} {'recv':>8} {'recv %':>7} {'queued':>10} "
        f"{'max depth':>10} {'quota err':>9} {'RSS start':>9} {'RSS peak':>9} {'growth':>7} "
        f"{'store MB':>9} {'met':>4}"
    )
    print_header(header)
    for r in results:
        size = r.store_end.get("db", 0) + r.store_end.get("wal", 0)
        print(
            f"{r.name:<14} {r.sent:>10,} {r.producer_msgs_s:>8,.0f} {r.received:>8,} "
            f"{100 * r.consumer_fraction:>6.2f}% {r.queued_end:>10,} {r.max_depth:>10,} "
            f"{r.quota_errors:>9,} {mb(r.rss_start):>9} {mb(r.rss_peak):>9} "
            f"{mb(r.rss_growth):>7} {mb(size):>9} {'yes' if r.met else 'NO':>4}"
        )
    print()
    print("targets: RSS growth <= 100 MB; with the quota: >= 1 QueueFullError, depth <= quota")
    for r in results:
        for key, t in r.targets.items():
            value = t["value"]
            shown = mb(value) + " MB" if key == "rss_growth" else f"{value:,}"
            print(
                f"  {r.name:<14} {key:<12} {shown:>12} (target {t['target']}): "
                f"{'met' if t['met'] else 'MISSED'}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("slow_consumer", __doc__, Options)
    args, opts = parser.read(argv, SMOKE)
    if not 0 < args.seconds <= 3600:
        parser.error("--seconds must be in (0, 3600]")
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    free = one_run("no quota", None, None, opts)
    quota = one_run(f"quota {opts.quota:,}", opts.quota, free.producer_msgs_s, opts)
    results = [free, quota]
    print_table(results, opts)
    met = all(r.met for r in results)
    return parser.conclude(args, opts, met, results=[asdict(r) for r in results])


if __name__ == "__main__":
    sys.exit(main())
