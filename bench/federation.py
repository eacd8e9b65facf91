"""Cross-broker end-to-end throughput, and its ratio to the same run within one broker.

Runs of bench.e2e's end-to-end phase (one producer process sending 1 KiB bodies with
`send_many` in batches of 100, a few calls in flight; one consumer process receiving
in transactions of up to 100; both started together; the time is from "go" until the
last message's receive is committed):

  one broker   producer and consumer on the same daemon, target service local;
  two brokers  producer on broker A, consumer on broker B: A's transmission queue,
               the adjacent-broker connection (certificates trusted both ways, routes
               both ways) and B's acks after its durable store are in the path;
  forwarded    the same through a third broker F that hosts neither service
               (`forwarding = true`): A -> F -> B, acks back B -> F -> A.

Every run uses fresh daemons with the same durability (default fsync) and the
transport's default settings. The consumer checks every message arrives exactly
once; after a cross-broker run A's transmission queue must drain (every message
acked). With `--runs N` the kinds are run N times, interleaved (one, two, forwarded,
one, ...), and medians are compared. Reported: msgs/s, the ratios to one broker
(targets: two brokers >= 0.7, forwarded >= 0.7: a forwarder relays bundles as they
come), producer-side rates and all daemons' CPU time per message. Exit status 1 when a
ratio misses its target. Everything listens on 127.0.0.1; every wait is bounded.

Where the time goes, per kind: each daemon's CPU per message (A, B and F), and the
consumer's tail: how long the consumer went on receiving after the producer's last
commit was answered (a long tail: the consumer is what limits the run; none: the
producer, or the path to the consumer, is).

Run from the repository root:

    python -m bench.federation --runs 5 --plain-link       # 100,000 messages, fsync
    python -m bench.federation --messages 20000 --json            # JSON on stdout
    python -m bench.federation --durability os --json out.json
    python -m bench.federation --smoke                   # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ssb import client
from ssb.tools import wait_until

from . import e2e
from ._common import (
    BenchFailure,
    BrokerProcess,
    CommandLine,
    broker,
    cpu_meter,
    print_header,
    rate,
    run,
)

TARGET_RATIO = 0.7
TARGET_FORWARDED_RATIO = 0.7
DRAIN_TIMEOUT = 60.0
SMOKE = {"messages": 200, "batch": 50, "durability": "os"}


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
    # each daemon's share (A, B, F; "broker" for one), microseconds a message
    cpu_us_by_daemon: dict[str, float | None] = field(default_factory=dict)
    consumer_tail_s: float = 0.0  # the consumer's receiving after the producer finished
    connections: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Outcome:
    """Medians over the runs of each kind (every run kept in `runs`)."""

    durability: str
    one_broker: Run
    two_brokers: Run
    forwarded: Run | None
    ratio: float
    forwarded_ratio: float | None = None
    target_ratio: float = TARGET_RATIO
    target_forwarded_ratio: float = TARGET_FORWARDED_RATIO
    target_met: bool = False
    runs: dict[str, list[Run]] = field(default_factory=dict)


def _fill(result: Run, go_time: float, out: dict[str, dict[str, Any]], opts: e2e.Options) -> None:
    result.e2e_seconds = out["consumer"]["finished"] - go_time
    result.e2e_msgs_s = rate(out["consumer"]["received"], result.e2e_seconds)
    sent = out["producer"]
    result.producer_msgs_s = rate(opts.messages, sent["finished"] - sent["started"])
    result.receive_batches = out["consumer"]["batches"]
    result.consumer_tail_s = max(0.0, out["consumer"]["finished"] - sent["finished"])


# ---- one broker ---------------------------------------------------------------------------


def one_broker(durability: str, opts: e2e.Options) -> Run:
    result = Run(brokers=1, messages=opts.messages)
    with broker(durability) as daemon:
        run(e2e.CATALOG.create(daemon.url))
        print(f"[{durability}] one broker: {opts.messages} messages ...", flush=True)
        go_time, out, result.daemon_cpu_us_per_message = e2e.timed_phase(
            daemon.url, e2e.PHASE_E2E, ["consumer", "producer"], opts, [daemon.pid]
        )
        result.cpu_us_by_daemon = {"broker": result.daemon_cpu_us_per_message}
        _fill(result, go_time, out, opts)
        run(e2e.check_empty(daemon.url))
    return result


# ---- two brokers --------------------------------------------------------------------------


def _address(process: BrokerProcess) -> str:
    return f"tcp://127.0.0.1:{process.broker_port}"


async def federate(a: BrokerProcess, b: BrokerProcess, f: BrokerProcess | None = None) -> None:
    """Trust both ways; initiator service on A, target service on B; routes both ways,
    directly or (with `f`) through the forwarder F."""
    daemons = [a, b] if f is None else [a, b, f]
    conns = [await client.connect(d.url) for d in daemons]
    try:
        certificates = [await c.broker_certificate() for c in conns]
        for i, conn in enumerate(conns):
            for j, pem in enumerate(certificates):
                if i != j:
                    await conn.create_certificate(f"bench_peer_{j}", pem)
        ca, cb = conns[0], conns[1]
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
        # other brokers' messages act as PUBLIC (their certificates name no login)
        await ca.grant("SEND", "public", "service", e2e.CATALOG.initiator_service)
        await cb.grant("SEND", "public", "service", e2e.CATALOG.target_service)
        if f is None:
            await ca.create_route("bench_to_b", e2e.CATALOG.target_service, _address(b))
            await cb.create_route("bench_to_a", e2e.CATALOG.initiator_service, _address(a))
            return
        a_id, b_id = await ca.broker_instance(), await cb.broker_instance()
        cf = conns[2]
        await ca.create_route(
            "bench_to_b", e2e.CATALOG.target_service, _address(f), broker_instance=b_id
        )
        await cf.create_route("bench_to_b", e2e.CATALOG.target_service, _address(b))
        await cf.create_route("bench_to_a", e2e.CATALOG.initiator_service, _address(a))
        await cb.create_route(
            "bench_to_a", e2e.CATALOG.initiator_service, _address(f), broker_instance=a_id
        )
    finally:
        for conn in conns:
            await conn.close()


async def drained(a: BrokerProcess, b: BrokerProcess) -> list[dict[str, Any]]:
    """Wait until A's transmission queue is empty (B acked all); return A's connections."""
    async with await client.connect(a.url) as ca:

        async def waiting() -> int:
            return len(await ca.view("transmission_queue"))

        await wait_until(
            waiting, "A's transmission queue to drain", DRAIN_TIMEOUT, until=lambda left: left == 0
        )
        connections = await ca.view("broker_connections")
    await e2e.check_empty(b.url)
    return connections


def two_brokers(
    durability: str, opts: e2e.Options, plain_link: bool = False, forwarder: bool = False
) -> Run:
    result = Run(brokers=3 if forwarder else 2, messages=opts.messages)
    root = Path(tempfile.mkdtemp(prefix=f"ssb-bench-federation-{durability}-"))
    transport: dict[str, Any] = {"tls": False} if plain_link else {}
    names = ("A", "B", "F") if forwarder else ("A", "B")
    daemons = [
        BrokerProcess(
            root / name,
            durability=durability,
            config={"transport": {**transport, "forwarding": name == "F"}},
        )
        for name in names
    ]
    try:
        for daemon in daemons:
            daemon.start()
            if not daemon.broker_port:
                raise BenchFailure("the daemon did not report a broker port (no transport?)")
        a, b = daemons[:2]
        run(federate(a, b, daemons[2] if forwarder else None))
        path = "A -> F -> B" if forwarder else "A -> B"
        print(
            f"[{durability}] {len(daemons)} brokers: {opts.messages} messages {path} ...",
            flush=True,
        )
        meters = {name: cpu_meter(d.pid) for name, d in zip(names, daemons, strict=True)}
        go_time, out, result.daemon_cpu_us_per_message = e2e.timed_phase(
            {"consumer": b.url, "producer": a.url},
            e2e.PHASE_E2E,
            ["consumer", "producer"],
            opts,
            [d.pid for d in daemons],
        )
        result.cpu_us_by_daemon = {name: meter(opts.messages) for name, meter in meters.items()}
        _fill(result, go_time, out, opts)
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


def _median_run(runs: list[Run]) -> Run:
    """The run with the median throughput (the lower middle one of an even count)."""
    ordered = sorted(runs, key=lambda r: r.e2e_msgs_s)
    return ordered[(len(ordered) - 1) // 2]


def print_table(outcome: Outcome, opts: e2e.Options) -> None:
    print()
    print(
        f"{opts.messages} messages of {opts.body_size} B, send_many batches of {opts.batch}, "
        f"receive transactions of up to {opts.batch}, {opts.conversations} conversations, "
        f"{opts.in_flight} sends in flight, durability {outcome.durability}, "
        f"{os.cpu_count()} CPUs"
    )
    runs = len(outcome.runs.get("one broker", [])) or 1
    print(f"medians of {runs} interleaved run(s) of each kind")
    header = (
        f"{'run':<12} {'e2e msg/s':>10} {'producer msg/s':>15} {'daemons CPU us/msg':>19}"
        f" {'consumer tail s':>16}"
    )
    print_header(header)
    kinds = [("one broker", outcome.one_broker), ("two brokers", outcome.two_brokers)]
    if outcome.forwarded is not None:
        kinds.append(("forwarded", outcome.forwarded))
    for name, r in kinds:
        cpu = "n/a" if r.daemon_cpu_us_per_message is None else f"{r.daemon_cpu_us_per_message:.1f}"
        every = ", ".join(f"{x.e2e_msgs_s:,.0f}" for x in outcome.runs.get(name, []))
        shares = ", ".join(
            f"{daemon} {'n/a' if us is None else f'{us:.1f}'}"
            for daemon, us in r.cpu_us_by_daemon.items()
        )
        print(
            f"{name:<12} {r.e2e_msgs_s:>10,.0f} {r.producer_msgs_s:>15,.0f} {cpu:>19}"
            f" {r.consumer_tail_s:>16.2f}   [{every}] (CPU: {shares})"
        )
    print(f"ratio two/one: {outcome.ratio:.2f} (target >= {outcome.target_ratio:.2f})")
    if outcome.forwarded_ratio is not None:
        print(
            f"ratio forwarded/one: {outcome.forwarded_ratio:.2f}"
            f" (target >= {outcome.target_forwarded_ratio:.2f})"
        )
    print("targets " + ("met" if outcome.target_met else "NOT met"))


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine(
        "federation",
        __doc__,
        e2e.Options,
        "messages",
        "batch",
        "body_size",
        "conversations",
        "in_flight",
        "consumer",
        "phase_timeout",
    )
    parser.add_argument("--durability", choices=["fsync", "os"], default="fsync")
    parser.add_argument(
        "--plain-link", action="store_true", help="brokers talk plain TCP ([transport] tls = false)"
    )
    parser.add_argument("--runs", type=int, default=1, help="interleaved runs of each kind")
    parser.add_argument(
        "--no-forwarder", action="store_true", help="skip the run through a forwarding broker"
    )
    args, opts = parser.read(argv, SMOKE, "runs")
    runs: dict[str, list[Run]] = {"one broker": [], "two brokers": []}
    if not args.no_forwarder:
        runs["forwarded"] = []
    for _ in range(args.runs):
        runs["one broker"].append(one_broker(args.durability, opts))
        runs["two brokers"].append(two_brokers(args.durability, opts, args.plain_link))
        if "forwarded" in runs:
            runs["forwarded"].append(
                two_brokers(args.durability, opts, args.plain_link, forwarder=True)
            )
    single = _median_run(runs["one broker"])
    cross = _median_run(runs["two brokers"])
    relayed = _median_run(runs["forwarded"]) if "forwarded" in runs else None
    base = statistics.median(r.e2e_msgs_s for r in runs["one broker"])
    ratio = cross.e2e_msgs_s / base if base else 0.0
    forwarded_ratio = None if relayed is None or not base else relayed.e2e_msgs_s / base
    met = ratio >= TARGET_RATIO and (
        forwarded_ratio is None or forwarded_ratio >= TARGET_FORWARDED_RATIO
    )
    outcome = Outcome(
        args.durability, single, cross, relayed, ratio, forwarded_ratio, target_met=met, runs=runs
    )
    print_table(outcome, opts)
    return parser.conclude(args, opts, outcome.target_met, **asdict(outcome))


if __name__ == "__main__":
    sys.exit(main())
