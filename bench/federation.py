"""Cross-broker end-to-end throughput, and its ratio to the same run within one broker.

Two runs of bench.e2e's end-to-end phase (one producer process sending 1 KiB bodies
with `send_many` in batches of 100, a few calls in flight; one consumer process
receiving in transactions of up to 100; both started together; the time is from "go"
until the last message's receive is committed):

  one broker   producer and consumer on the same daemon, target service local;
  two brokers  producer on broker A, consumer on broker B: A's transmission queue,
               the adjacent-broker connection (certificates trusted both ways, routes
               both ways) and B's acks after its durable store are in the path.

Both runs use fresh daemons with the same durability (default fsync) and the
transport's default settings. The consumer checks every message arrives exactly
once; after the cross-broker run A's transmission queue must drain (every message
acked). Reported: msgs/s of both runs, the ratio (target >= 0.6), producer-side
rates and the daemons' CPU time per message. Exit status 1 when the ratio misses the
target. Everything listens on 127.0.0.1; every wait is bounded.

Run from the repository root:

    python -m bench.federation                    # 100,000 messages, fsync
    python -m bench.federation --messages 20000 --json            # JSON on stdout
    python -m bench.federation --durability os --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ssb import client

from . import e2e
from ._common import (  # type: ignore[attr-defined]
    BrokerProcess,
    broker,
    cpu_seconds,
    options_from,
    rate,
    run,
)

TARGET_RATIO = 0.6
DRAIN_TIMEOUT = 60.0


@dataclass
class Run:
    """One end-to-end run."""

    brokers: int
    messages: int
    e2e_seconds: float = 0.0
    e2e_msgs_s: float = 0.0
    producer_msgs_s: float = 0.0
    receive_batches: int = 0
    daemon_cpu_us_per_message: float | None = None
    connections: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Outcome:
    durability: str
    one_broker: Run
    two_brokers: Run
    ratio: float
    target_ratio: float = TARGET_RATIO
    target_met: bool = False


def _fill(result: Run, go_time: float, out: dict[str, dict[str, Any]], opts: e2e.Options) -> None:
    result.e2e_seconds = out["consumer"]["finished"] - go_time
    result.e2e_msgs_s = rate(out["consumer"]["received"], result.e2e_seconds)
    sent = out["producer"]
    result.producer_msgs_s = rate(opts.messages, sent["finished"] - sent["started"])
    result.receive_batches = out["consumer"]["batches"]


def _cpu(pids: list[int]) -> float | None:
    values = [cpu_seconds(pid) for pid in pids]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _pid(process: BrokerProcess) -> int:
    return process.proc.pid if process.proc is not None else 0


# ---- one broker ---------------------------------------------------------------------------


def one_broker(durability: str, opts: e2e.Options) -> Run:
    result = Run(brokers=1, messages=opts.messages)
    with broker(durability) as daemon:
        run(e2e.CATALOG.create(daemon.url))
        print(f"[{durability}] one broker: {opts.messages} messages ...", flush=True)
        before = _cpu([_pid(daemon)])
        go_time, out = e2e.run_processes(daemon.url, e2e.PHASE_E2E, ["consumer", "producer"], opts)
        after = _cpu([_pid(daemon)])
        _fill(result, go_time, out, opts)
        if before is not None and after is not None:
            result.daemon_cpu_us_per_message = (after - before) * 1e6 / opts.messages
        run(e2e.check_empty(daemon.url))
    return result


# ---- two brokers --------------------------------------------------------------------------


async def federate(a: BrokerProcess, b: BrokerProcess) -> None:
    """Trust both ways; initiator service on A, target service on B; routes both ways."""
    async with await client.connect(a.url) as ca, await client.connect(b.url) as cb:
        await ca.create_certificate("bench_peer_b", await cb.broker_certificate())
        await cb.create_certificate("bench_peer_a", await ca.broker_certificate())
        for conn in (ca, cb):
            await conn.create_message_type(e2e.CATALOG.message_type, validation="NONE")
            await conn.create_contract(
                e2e.CATALOG.contract, {e2e.CATALOG.message_type: "INITIATOR"}
            )
        await ca.create_queue(e2e.CATALOG.initiator_queue)
        await ca.create_service(e2e.CATALOG.initiator_service, queue=e2e.CATALOG.initiator_queue)
        await cb.create_queue(e2e.CATALOG.target_queue)
        await cb.create_service(
            e2e.CATALOG.target_service,
            queue=e2e.CATALOG.target_queue,
            contracts=[e2e.CATALOG.contract],
        )
        await ca.create_route(
            "bench_to_b", e2e.CATALOG.target_service, f"tcp://127.0.0.1:{b.broker_port}"
        )
        await cb.create_route(
            "bench_to_a", e2e.CATALOG.initiator_service, f"tcp://127.0.0.1:{a.broker_port}"
        )


async def drained(a: BrokerProcess, b: BrokerProcess) -> list[dict[str, Any]]:
    """Wait until A's transmission queue is empty (B acked all); return A's connections."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    async with await client.connect(a.url) as ca:
        while rows := await ca.view("transmission_queue"):
            if time.monotonic() > deadline:
                raise e2e.BenchFailure(
                    f"{len(rows)} messages still in A's transmission queue after "
                    f"{DRAIN_TIMEOUT:g} s; first: {rows[0]}"
                )
            await asyncio.sleep(0.05)  # polling a view, with a deadline
        connections = await ca.view("broker_connections")
    await e2e.check_empty(b.url)
    return connections


def two_brokers(durability: str, opts: e2e.Options, plain_link: bool = False) -> Run:
    result = Run(brokers=2, messages=opts.messages)
    root = Path(tempfile.mkdtemp(prefix=f"ssb-bench-federation-{durability}-"))
    config = {"transport": {"tls": False}} if plain_link else None
    daemons = [
        BrokerProcess(root / name, durability=durability, config=config) for name in ("A", "B")
    ]
    try:
        for daemon in daemons:
            daemon.start()
            if not daemon.broker_port:
                raise e2e.BenchFailure("the daemon did not report a broker port (no transport?)")
        a, b = daemons
        run(federate(a, b))
        print(f"[{durability}] two brokers: {opts.messages} messages A -> B ...", flush=True)
        pids = [_pid(a), _pid(b)]
        before = _cpu(pids)
        go_time, out = e2e.run_processes(
            {"consumer": b.url, "producer": a.url}, e2e.PHASE_E2E, ["consumer", "producer"], opts
        )
        after = _cpu(pids)
        _fill(result, go_time, out, opts)
        if before is not None and after is not None:
            result.daemon_cpu_us_per_message = (after - before) * 1e6 / opts.messages
        result.connections = run(drained(a, b))
    except BaseException:
        for daemon in daemons:
            if daemon.log_path.exists():
                print(
                    f"daemon {daemon.data_dir.name} log tail:\n{daemon.log_text()[-3000:]}",
                    file=sys.stderr,
                )
        raise
    finally:
        for daemon in daemons:
            try:
                daemon.stop(timeout=30.0)
            except Exception:
                daemon.kill()
        shutil.rmtree(root, ignore_errors=True)
    return result


# ---- report -----------------------------------------------------------------------------------


def print_table(outcome: Outcome, opts: e2e.Options) -> None:
    print()
    print(
        f"{opts.messages} messages of {opts.body_size} B, send_many batches of {opts.batch}, "
        f"receive transactions of up to {opts.batch}, {opts.conversations} conversations, "
        f"{opts.in_flight} sends in flight, durability {outcome.durability}, "
        f"{os.cpu_count()} CPUs"
    )
    header = f"{'run':<12} {'e2e msg/s':>10} {'producer msg/s':>15} {'daemon CPU us/msg':>18}"
    print(header)
    print("-" * len(header))
    for name, r in (("one broker", outcome.one_broker), ("two brokers", outcome.two_brokers)):
        cpu = "n/a" if r.daemon_cpu_us_per_message is None else f"{r.daemon_cpu_us_per_message:.1f}"
        print(f"{name:<12} {r.e2e_msgs_s:>10,.0f} {r.producer_msgs_s:>15,.0f} {cpu:>18}")
    print(
        f"ratio two/one: {outcome.ratio:.2f} (target >= {outcome.target_ratio:.2f}: "
        f"{'met' if outcome.target_met else 'NOT met'})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.federation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=e2e.Options.messages)
    parser.add_argument("--durability", choices=["fsync", "os"], default="fsync")
    parser.add_argument("--batch", type=int, default=e2e.Options.batch)
    parser.add_argument("--body-size", type=int, default=e2e.Options.body_size)
    parser.add_argument("--conversations", type=int, default=e2e.Options.conversations)
    parser.add_argument("--in-flight", type=int, default=e2e.Options.in_flight)
    parser.add_argument("--consumer", choices=["txn", "pipelined"], default="txn")
    parser.add_argument("--phase-timeout", type=float, default=e2e.Options.phase_timeout)
    parser.add_argument(
        "--plain-link", action="store_true", help="brokers talk plain TCP ([transport] tls = false)"
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="also write the results as JSON (to PATH, or to stdout without one)",
    )
    args = parser.parse_args(argv)
    if min(args.messages, args.batch, args.conversations, args.in_flight) < 1:
        parser.error("--messages, --batch, --conversations and --in-flight must be >= 1")
    if args.body_size < e2e.TAG.size:
        parser.error(f"--body-size must be >= {e2e.TAG.size}")
    opts = options_from(e2e.Options, args)
    single = one_broker(args.durability, opts)
    cross = two_brokers(args.durability, opts, args.plain_link)
    ratio = cross.e2e_msgs_s / single.e2e_msgs_s if single.e2e_msgs_s else 0.0
    outcome = Outcome(args.durability, single, cross, ratio, target_met=ratio >= TARGET_RATIO)
    print_table(outcome, opts)
    if args.json:
        payload = {
            "benchmark": "federation",
            "options": asdict(opts),
            "machine": {
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
                "platform": platform.platform(),
            },
            **asdict(outcome),
        }
        text = json.dumps(payload, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0 if outcome.target_met else 1


if __name__ == "__main__":
    sys.exit(main())
