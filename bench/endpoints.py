"""Idle conversations: the daemon's memory per open conversation endpoint.

The issue's figure: 1,000,000 open conversations with no messages: report memory per
endpoint; target <= 300 bytes.

Procedure, on a fresh daemon (durability "os" unless --durability):

  before     one queue/service pair; after a short settle, the daemon's RSS (VmRSS) and
             the store's size (broker.db + -wal);
  begin      --dialogs BEGIN DIALOGs, in explicit transactions of --per-transaction calls
             each (the calls of one transaction are pipelined: written together, answered
             in order), with a progress line every 10%; RSS sampled every second;
  after      after a short settle: RSS, its peak (the samples and VmHWM), the store size;
             bytes per endpoint = (RSS after - RSS before) / dialogs, and the same for the
             store. Also the marginal cost: RSS growth over the second half of the dialogs
             divided by their number (fixed costs, such as the endpoint cache filling up,
             fall in the first half). `broker_resources.conversation_endpoints` (a count of
             store rows) must equal --dialogs: no messages are sent, so only initiator
             endpoints exist;
  restart    kill -9 and start, --restarts times: median time to ready, RSS right after,
             and the endpoint count again.

Gated (exit status 1 when missed): bytes per endpoint (RSS after the settle) <= 300. At a
small --dialogs the fixed costs dominate that figure; the marginal cost is the one that
predicts the full-size run. Every loop is bounded in count and time; everything stays on
127.0.0.1.

Run from the repository root (the default is the full-size run):

    python -m bench.endpoints
    python -m bench.endpoints --dialogs 20000 --json out.json
    python -m bench.endpoints --smoke     # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ssb import client

from ._common import (
    BenchFailure,
    Catalog,
    CommandLine,
    broker,
    figure_table,
    option,
    rate,
    run,
)
from ._memory import (
    BrokerProcess,
    RssSampler,
    daemon_peak,
    daemon_rss,
    mb,
    now_line,
    peak_since,
    store_size,
    timed_restart,
)

CATALOG = Catalog("Endpoints")
TARGET_BYTES_PER_ENDPOINT = 300
SMOKE = {"dialogs": 200, "per_transaction": 50, "restarts": 1, "settle": 0.0}


@dataclass
class Options:
    dialogs: int = option(1_000_000, at_least=2)
    per_transaction: int = option(2_000, at_least=1)
    durability: str = option("os")
    restarts: int = option(3, at_least=1)
    settle: float = option(3.0)
    phase_timeout: float = option(3600.0)


@dataclass
class Result:
    dialogs: int = 0
    begin_seconds: float = 0.0
    dialogs_per_s: float = 0.0
    rss_before: int = 0
    rss_half: int = 0
    half_at: int = 0  # dialogs begun when rss_half was read
    rss_after: int = 0
    rss_peak: int = 0
    bytes_per_endpoint: float = 0.0
    peak_bytes_per_endpoint: float = 0.0
    marginal_bytes_per_endpoint: float = 0.0
    store_before: int = 0
    store_after: int = 0
    store_bytes_per_endpoint: float = 0.0
    conversation_endpoints: int = 0
    endpoints_in_memory: int = 0
    restart_s: list[float] = field(default_factory=list)
    restart_median_s: float = 0.0
    rss_after_restart: list[int] = field(default_factory=list)
    conversation_endpoints_after_restart: int = 0
    target_met: bool = False


async def begin_dialogs(d: BrokerProcess, opts: Options, r: Result) -> float:
    """Begin opts.dialogs dialogs; records the RSS at half way; returns seconds taken."""
    total = opts.dialogs
    step = max(opts.per_transaction, total // 10)
    next_report = step
    half_done = False
    async with await client.connect(d.url) as conn:
        started = time.monotonic()
        done = 0
        dialogs = CATALOG.begin_dialogs(conn, total, opts.per_transaction, opts.phase_timeout)
        async for handles in dialogs:
            if len(set(handles)) != len(handles):
                raise BenchFailure("begin_dialog returned a handle twice")
            done += len(handles)
            if not half_done and done >= total // 2:
                half_done = True
                r.rss_half = daemon_rss(d)
                r.half_at = done
            if done >= next_report and done < total:
                elapsed = time.monotonic() - started
                print(
                    f"  {done:,}/{total:,} ({100 * done / total:.0f}%) "
                    f"{rate(done, elapsed):,.0f} dialogs/s, {now_line(d)}",
                    flush=True,
                )
                next_report += step
        return time.monotonic() - started


async def resources(url: str) -> dict[str, Any]:
    async with await client.connect(url) as conn:
        return (await conn.view("broker_resources"))[0]


def bench(opts: Options) -> Result:
    r = Result(dialogs=opts.dialogs)
    with broker(opts.durability, stop_timeout=60.0) as d:
        run(CATALOG.create(d.url))
        time.sleep(opts.settle)  # pacing: an idle daemon before the baseline
        r.rss_before = daemon_rss(d)
        hwm_before = daemon_peak(d)
        r.store_before = store_size(d.data_dir).total

        print(f"[begin] {opts.dialogs:,} dialogs, {opts.per_transaction:,} per transaction ...")
        with RssSampler(lambda: d.pid) as sampler:
            r.begin_seconds = run(begin_dialogs(d, opts, r))
        r.dialogs_per_s = rate(opts.dialogs, r.begin_seconds)
        rss_now = daemon_rss(d)
        time.sleep(opts.settle)  # pacing: let the last batches become durable and unpinned
        r.rss_after = daemon_rss(d)
        r.rss_peak = peak_since(d, hwm_before, sampler.peak, rss_now, r.rss_after)
        r.store_after = store_size(d.data_dir).total
        n = opts.dialogs
        r.bytes_per_endpoint = (r.rss_after - r.rss_before) / n
        r.peak_bytes_per_endpoint = (r.rss_peak - r.rss_before) / n
        if n - r.half_at > 0 and r.rss_half:
            r.marginal_bytes_per_endpoint = (r.rss_after - r.rss_half) / (n - r.half_at)
        r.store_bytes_per_endpoint = (r.store_after - r.store_before) / n
        res = run(resources(d.url))
        r.conversation_endpoints = int(res["conversation_endpoints"])
        r.endpoints_in_memory = int(res["endpoints_in_memory"])
        if r.conversation_endpoints != n:
            raise BenchFailure(
                f"broker_resources shows {r.conversation_endpoints} conversation endpoints, not {n}"
            )

        print(f"[restart] {opts.restarts} restarts ...", flush=True)
        for _ in range(opts.restarts):
            r.restart_s.append(timed_restart(d))
            r.rss_after_restart.append(daemon_rss(d))
        r.restart_median_s = statistics.median(r.restart_s)
        r.conversation_endpoints_after_restart = int(
            run(resources(d.url))["conversation_endpoints"]
        )
        if r.conversation_endpoints_after_restart != n:
            raise BenchFailure(
                f"after a restart: {r.conversation_endpoints_after_restart} endpoints, not {n}"
            )
    r.target_met = r.bytes_per_endpoint <= TARGET_BYTES_PER_ENDPOINT
    return r


def print_table(r: Result, opts: Options) -> None:
    print()
    print(
        f"{opts.dialogs:,} idle conversations (BEGIN DIALOG, no messages), "
        f"{opts.per_transaction:,} per transaction, durability={opts.durability}, "
        f"{os.cpu_count()} CPUs; MB = 10^6 bytes"
    )

    line = figure_table(44, 8)
    line("begin rate (dialogs/s)", f"{r.dialogs_per_s:,.0f}")
    line("RSS before (MB)", mb(r.rss_before))
    line("RSS after (MB)", mb(r.rss_after))
    line("RSS peak (MB)", mb(r.rss_peak))
    line("RSS per endpoint (B)", f"{r.bytes_per_endpoint:,.0f}", "<= 300", r.target_met)
    line("  peak RSS per endpoint (B)", f"{r.peak_bytes_per_endpoint:,.0f}")
    line("  marginal, second half (B)", f"{r.marginal_bytes_per_endpoint:,.0f}")
    line("store per endpoint (B)", f"{r.store_bytes_per_endpoint:,.0f}")
    line("store after (MB)", mb(r.store_after))
    line("conversation_endpoints (store rows)", f"{r.conversation_endpoints:,}")
    line("endpoints_in_memory", f"{r.endpoints_in_memory:,}")
    line("restart to ready (median, s)", f"{r.restart_median_s:.2f}")
    line(
        "RSS right after a restart (MB)",
        mb(statistics.median(r.rss_after_restart)) if r.rss_after_restart else "n/a",
    )
    print()
    print("target met" if r.target_met else "TARGET MISSED")


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("endpoints", __doc__, Options)
    args, opts = parser.read(argv, SMOKE)
    if not 0 <= args.settle <= 600 or not 0 < args.phase_timeout <= 86400:
        parser.error("--settle must be 0..600 s, --phase-timeout 0..86400 s")
    result = bench(opts)
    print_table(result, opts)
    return parser.conclude(args, opts, result.target_met, result=asdict(result))


if __name__ == "__main__":
    sys.exit(main())
