"""End-to-end throughput and latency: one producer process, one consumer process.

Measures, against a fresh daemon per durability setting ("fsync" and "os"):

  send     a producer process alone sends N messages of 1 KiB with `send_many` in
           batches (each call one autocommitted, durable statement), over a few
           conversations, keeping a few calls in flight (the protocol answers in order);
  receive  a consumer process alone drains them with transactional receives
           (`async with conn.transaction(): await conn.receive(queue, top=batch)`);
  e2e      producer and consumer run at the same time, as separate processes; the
           time is from "go" until the last message's receive is committed;
  latency  one connection, concurrency 1: send one message, receive it in a
           transaction, commit; median and p99 of that round trip.

`--busy-poll 0` turns off the daemon's and the clients' polling for what comes next
(see the Python client's page), to see what it gives: `python -m bench.compare . .
--runs 5 --b-args=--busy-poll=0 -- --durability os --messages 20000`.

Every message body carries (phase, index); the consumer checks that each message
arrives exactly once and the queue is empty at the end, and the run fails loudly
otherwise. Next to wall-clock rates it reports the daemon's CPU time per message,
which moves much less when other work shares the machine. Exit status 1 when an
end-to-end target (os >= 20,000, fsync >= 8,000 msgs/s) is missed. All traffic stays
on 127.0.0.1; every loop is bounded in count and time.

`--store postgresql` runs the same workload on brokers whose store is a PostgreSQL
database (a server this run starts on 127.0.0.1, as the tests do: tests/pg_server.py),
`--store both` on each store in turn: then the PostgreSQL store's end-to-end rate is
also given as a ratio of the SQLite store's at the same durability, from the same run,
and its target is half of it.

Run from the repository root:

    python -m bench.e2e                       # 100,000 messages, both durabilities
    python -m bench.e2e --messages 20000 --durability os --json out.json
    python -m bench.e2e --smoke                # tiny sizes, seconds: does it still run?
    python -m bench.e2e --messages 50000 --durability fsync --store both
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ssb import client
from ssb.protocol import check_poll_window

from ._common import (
    BenchFailure,
    Catalog,
    CommandLine,
    Outcomes,
    Watchdog,
    Work,
    broker,
    cpu_meter,
    in_one_round_trip,
    option,
    percentile,
    pipelined,
    postgres_databases,
    print_header,
    rate,
    released_together,
    run,
    started_together,
)

CATALOG = Catalog("Bench")
TAG = struct.Struct(">IQ")  # (phase, index) at the start of every body
TARGETS = {"os": 20_000.0, "fsync": 8_000.0}  # end-to-end msgs/s the issue asks for
SMOKE = {"messages": 400, "batch": 50, "durability": "os", "latency_iterations": 20}
POSTGRESQL_TARGET = 0.5  # of the SQLite store's end-to-end rate, the PostgreSQL store's

PHASE_SEND = 1
PHASE_E2E = 2
PHASE_LATENCY = 3


@dataclass
class Options:
    messages: int = option(100_000, at_least=1)
    batch: int = option(100, "send_many / receive top", at_least=1)
    body_size: int = option(1024, at_least=TAG.size)
    conversations: int = option(10, at_least=1)
    in_flight: int = option(4, at_least=1)
    consumer: str = option(
        "txn",
        "txn: async with conn.transaction() (3 round trips per batch); "
        "pipelined: begin, receive and commit written together (1 round trip)",
        choices=("txn", "pipelined"),
    )
    producer: str = option(
        "statement",
        "statement: each send_many commits by itself; txn: begin, send_many and commit"
        " pipelined (one explicit transaction per batch)",
        choices=("statement", "txn"),
    )
    latency_iterations: int = option(2_000)
    latency_warmup: int = 100
    phase_timeout: float = option(600.0)
    idle_timeout: float = 30.0
    # every client on ssbs:// (pinned to the broker's certificate)
    tls: bool = option(False, "clients connect with TLS (ssbs://)")
    scrape_interval: float = option(
        0.0, "turn the broker's HTTP port on and read /metrics every this many seconds"
    )
    busy_poll: float | None = option(
        None,
        "the daemon's busy_poll setting and its clients' (default: their own; 0: they"
        " sleep at once while waiting)",
        parse=float,
        metavar="SECONDS",
    )


@dataclass
class Result:
    durability: str
    messages: int
    store: str = "sqlite"
    send_seconds: float = 0.0
    receive_seconds: float = 0.0
    e2e_seconds: float = 0.0
    e2e_send_seconds: float = 0.0
    send_msgs_s: float = 0.0
    receive_msgs_s: float = 0.0
    e2e_msgs_s: float = 0.0
    e2e_producer_msgs_s: float = 0.0
    receive_batches: int = 0
    e2e_receive_batches: int = 0
    latency_median_us: float = 0.0
    latency_p99_us: float = 0.0
    latency_iterations: int = 0
    # the daemon's CPU time (user + system, all threads) per message, by phase
    send_daemon_cpu_us: float | None = None
    receive_daemon_cpu_us: float | None = None
    e2e_daemon_cpu_us: float | None = None
    target_e2e_msgs_s: float = 0.0
    target_met: bool = False
    # the PostgreSQL store's end-to-end rate over the SQLite store's (same durability,
    # same run); None: not measured
    e2e_ratio_to_sqlite: float | None = None
    daemon: dict[str, Any] = field(default_factory=dict)


# ---- setup ---------------------------------------------------------------------------


def body(phase: int, index: int, pad: bytes) -> bytes:
    return TAG.pack(phase, index) + pad


# ---- the producer and the consumer (each runs in its own process) ----------------------


async def connect(url: str, opts: Options) -> client.Connection:
    """A connection that polls for answers as `opts` says."""
    if opts.busy_poll is None:
        return await client.connect(url)
    return await client.connect(url, busy_poll=opts.busy_poll)


async def produce(url: str, phase: int, opts: Options, go: Any, ready: Any) -> dict[str, Any]:
    """Send opts.messages bodies in send_many batches, opts.in_flight calls at a time."""
    async with await connect(url, opts) as conn:
        handles = [await CATALOG.begin_dialog(conn) for _ in range(opts.conversations)]
        pad = b"p" * max(0, opts.body_size - TAG.size)

        def batches() -> Iterator[Awaitable[None]]:
            for number, first in enumerate(range(0, opts.messages, opts.batch)):
                last = min(opts.messages, first + opts.batch)
                bodies = [body(phase, i, pad) for i in range(first, last)]
                yield _send_batch(conn, handles[number % len(handles)], bodies, opts)

        started = await started_together("producer", go, ready, opts.phase_timeout)
        await pipelined(batches(), opts.in_flight, started + opts.phase_timeout, "producer")
        finished = time.monotonic()
    return {"sent": opts.messages, "started": started, "finished": finished}


async def _send_batch(
    conn: client.Connection, handle: Any, bodies: list[bytes], opts: Options
) -> None:
    send = conn.send_many(handle, CATALOG.message_type, bodies)
    if opts.producer == "txn":
        await in_one_round_trip(conn, send)
    else:
        await send


async def _receive_batch(conn: client.Connection, opts: Options) -> list[client.Message]:
    if opts.consumer == "pipelined":
        receive = conn.receive(CATALOG.target_queue, top=opts.batch, timeout=1.0)
        return await in_one_round_trip(conn, receive)
    async with conn.transaction():
        return await conn.receive(CATALOG.target_queue, top=opts.batch, timeout=1.0)


async def consume(url: str, phase: int, opts: Options, go: Any, ready: Any) -> dict[str, Any]:
    """Drain opts.messages bodies of `phase`, checking each arrives exactly once."""
    seen = bytearray(opts.messages)
    count = 0
    batches = 0
    async with await connect(url, opts) as conn:
        await conn.ping()
        started = await started_together("consumer", go, ready, opts.phase_timeout)
        cpu_started = time.process_time()
        watchdog = Watchdog(
            "consumer", opts.messages, started, opts.phase_timeout, opts.idle_timeout
        )
        while count < opts.messages:
            watchdog.check(count)
            messages = await _receive_batch(conn, opts)
            if not messages:
                continue
            watchdog.heard()
            batches += 1
            for m in messages:
                got_phase, index = TAG.unpack_from(m.message_body)
                if got_phase != phase or index >= opts.messages:
                    raise BenchFailure(f"consumer: foreign message phase={got_phase} index={index}")
                if seen[index]:
                    raise BenchFailure(f"consumer: message {index} received twice")
                if m.message_type_name != CATALOG.message_type:
                    raise BenchFailure(f"consumer: unexpected {m.message_type_name}")
                seen[index] = 1
                count += 1
        finished = time.monotonic()
        cpu = time.process_time() - cpu_started  # its own CPU while it received
        leftover = await conn.receive(CATALOG.target_queue, top=1, timeout=0)
        if leftover:
            raise BenchFailure(f"consumer: queue not empty after {count} messages")
    return {
        "received": count,
        "batches": batches,
        "started": started,
        "finished": finished,
        "cpu": cpu,
    }


def run_processes(
    url: str | dict[str, str], phase: int, roles: list[str], opts: Options
) -> tuple[float, Outcomes]:
    """Start one process per role, release them together, return (go time, outcomes).

    `url` is one broker for every role, or a map role -> broker URL.
    """
    urls = url if isinstance(url, dict) else dict.fromkeys(roles, url)
    work: dict[str, tuple[Work, tuple[Any, ...]]] = {
        role: (produce if role == "producer" else consume, (urls[role], phase, opts))
        for role in roles
    }
    return released_together(work, opts.phase_timeout)


def timed_phase(
    url: str | dict[str, str], phase: int, roles: list[str], opts: Options, pids: list[int]
) -> tuple[float, Outcomes, float | None]:
    """`run_processes`, and the CPU time the processes `pids` (the daemons) spent on it
    per message, in microseconds."""
    cpu = cpu_meter(*pids)
    go_time, out = run_processes(url, phase, roles, opts)
    return go_time, out, cpu(opts.messages)


# ---- latency (in this process) ---------------------------------------------------------


async def latency(url: str, opts: Options) -> list[float]:
    """send -> receive (in a transaction) -> commit, one at a time; microseconds."""
    pad = b"l" * max(0, opts.body_size - TAG.size)
    samples: list[float] = []
    total = opts.latency_warmup + opts.latency_iterations
    deadline = time.monotonic() + opts.phase_timeout
    async with await connect(url, opts) as conn:
        handle = await CATALOG.begin_dialog(conn)
        for i in range(total):
            if time.monotonic() > deadline:
                raise BenchFailure(f"latency: only {i} of {total} round trips in time")
            started = time.perf_counter()
            await conn.send(handle, CATALOG.message_type, body(PHASE_LATENCY, i, pad))
            async with conn.transaction():
                messages = await conn.receive(CATALOG.target_queue, top=1, timeout=10.0)
            elapsed = time.perf_counter() - started
            if len(messages) != 1 or TAG.unpack_from(messages[0].message_body) != (
                PHASE_LATENCY,
                i,
            ):
                raise BenchFailure(f"latency: round trip {i} got {len(messages)} messages")
            if i >= opts.latency_warmup:
                samples.append(elapsed * 1e6)
    return samples


async def check_empty(url: str) -> None:
    async with await client.connect(url) as conn:
        left = await conn.peek(CATALOG.target_queue)
        if left:
            raise BenchFailure(f"{len(left)} messages left in {CATALOG.target_queue}")


# ---- one durability setting ----------------------------------------------------------------


def bench_durability(durability: str, opts: Options, database: str | None = None) -> Result:
    """The four phases on a fresh broker (its store the PostgreSQL `database`, if given)."""
    store = "sqlite" if database is None else "postgresql"
    result = Result(durability=durability, messages=opts.messages, store=store)
    config: dict[str, Any] = {"http_port": 0} if opts.scrape_interval > 0 else {}
    if opts.busy_poll is not None:
        config["busy_poll"] = opts.busy_poll
    with (
        broker(durability, config, store=database) as daemon,
        Scraper(daemon.http_url, opts.scrape_interval),
    ):
        url = daemon.tls_url if opts.tls else daemon.url
        run(CATALOG.create(url))

        label = f"{store} {durability}"  # (in what is printed)

        def phase(what: str, number: int, roles: list[str]) -> tuple[float, Outcomes, float | None]:
            print(f"[{label}] {what} ...", flush=True)
            return timed_phase(url, number, roles, opts, [daemon.pid])

        send = f"send-only: {opts.messages} messages"
        _, out, result.send_daemon_cpu_us = phase(send, PHASE_SEND, ["producer"])
        sent = out["producer"]
        result.send_seconds = sent["finished"] - sent["started"]
        result.send_msgs_s = rate(opts.messages, result.send_seconds)

        _, out, result.receive_daemon_cpu_us = phase("receive-only", PHASE_SEND, ["consumer"])
        got = out["consumer"]
        result.receive_seconds = got["finished"] - got["started"]
        result.receive_msgs_s = rate(got["received"], result.receive_seconds)
        result.receive_batches = got["batches"]

        roles = ["consumer", "producer"]
        go_time, out, result.e2e_daemon_cpu_us = phase("end-to-end", PHASE_E2E, roles)
        result.e2e_seconds = out["consumer"]["finished"] - go_time
        result.e2e_msgs_s = rate(out["consumer"]["received"], result.e2e_seconds)
        result.e2e_send_seconds = out["producer"]["finished"] - out["producer"]["started"]
        result.e2e_producer_msgs_s = rate(opts.messages, result.e2e_send_seconds)
        result.e2e_receive_batches = out["consumer"]["batches"]

        print(f"[{label}] latency: {opts.latency_iterations} round trips ...", flush=True)
        samples = sorted(run(latency(url, opts)))
        result.latency_iterations = len(samples)
        result.latency_median_us = percentile(samples, 0.50)
        result.latency_p99_us = percentile(samples, 0.99)

        run(check_empty(url))
        result.daemon = {"url": url, "pid": daemon.pid}
    result.target_e2e_msgs_s = TARGETS.get(result.durability, 0.0)
    result.target_met = result.e2e_msgs_s >= result.target_e2e_msgs_s
    return result


def compare_stores(results: list[Result]) -> None:
    """Give each PostgreSQL result its ratio to the SQLite result of its durability, and
    half of that SQLite rate as its target."""
    sqlite = {r.durability: r for r in results if r.store == "sqlite"}
    for r in results:
        base = sqlite.get(r.durability)
        if r.store == "postgresql" and base is not None and base.e2e_msgs_s > 0:
            r.e2e_ratio_to_sqlite = r.e2e_msgs_s / base.e2e_msgs_s
            r.target_e2e_msgs_s = POSTGRESQL_TARGET * base.e2e_msgs_s
            r.target_met = r.e2e_msgs_s >= r.target_e2e_msgs_s


@contextlib.contextmanager
def databases(stores: list[str]) -> Iterator[Callable[[], str | None]]:
    """Makes a new database per broker on a PostgreSQL server started for this run, when
    `stores` has "postgresql" (otherwise it starts nothing)."""
    if "postgresql" not in stores:
        yield lambda: None
        return
    with postgres_databases() as database:
        yield database


class Scraper:
    """Reads /metrics every `interval` seconds on a thread, as Prometheus would, while
    the benchmark runs (nothing when the interval is 0)."""

    def __init__(self, http_url: str, interval: float) -> None:
        self.url = f"{http_url}/metrics"
        self.interval = interval
        self.stop = threading.Event()
        self.scrapes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        if self.interval > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
            print(f"/metrics read {self.scrapes} times", flush=True)

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            with urllib.request.urlopen(self.url, timeout=10) as answer:
                answer.read()
            self.scrapes += 1


def print_table(results: list[Result], opts: Options) -> None:
    print()
    print(
        f"{opts.messages} messages of {opts.body_size} B, batches of {opts.batch}, "
        f"{opts.conversations} conversations, {opts.in_flight} sends in flight, "
        f"consumer={opts.consumer}, {os.cpu_count()} CPUs"
    )
    header = (
        f"{'store':<10} {'durability':<10} {'send msg/s':>11} {'recv msg/s':>11} "
        f"{'e2e msg/s':>10} {'target':>7} {'met':>4} {'lat p50 us':>11} {'lat p99 us':>11}"
    )
    print_header(header)
    for r in results:
        print(
            f"{r.store:<10} {r.durability:<10} {r.send_msgs_s:>11,.0f} "
            f"{r.receive_msgs_s:>11,.0f} {r.e2e_msgs_s:>10,.0f} {r.target_e2e_msgs_s:>7,.0f} "
            f"{'yes' if r.target_met else 'NO':>4} {r.latency_median_us:>11,.0f} "
            f"{r.latency_p99_us:>11,.0f}"
        )
    print()
    print("daemon CPU per message (us, user+system, all threads; less load-sensitive):")
    for r in results:
        print(
            f"{r.store:<10} {r.durability:<10} send {_us(r.send_daemon_cpu_us):>6}   "
            f"receive {_us(r.receive_daemon_cpu_us):>6}   e2e {_us(r.e2e_daemon_cpu_us):>6}"
        )
    for r in results:
        if r.e2e_ratio_to_sqlite is not None:
            print(
                f"postgresql / sqlite, end to end, {r.durability} (same run):"
                f" {r.e2e_ratio_to_sqlite:.2f}x (target >= {POSTGRESQL_TARGET})"
            )


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("e2e", __doc__, Options)
    parser.add_argument("--durability", choices=["fsync", "os", "both"], default="both")
    parser.add_argument(
        "--store",
        choices=["sqlite", "postgresql", "both"],
        default="sqlite",
        help="the brokers' store: sqlite (default), postgresql (a database on a server this"
        " run starts), or both in turn (with the ratio of their end-to-end rates)",
    )
    args, opts = parser.read(argv, SMOKE)
    if args.busy_poll is not None:
        try:
            check_poll_window(args.busy_poll, "--busy-poll")
        except ValueError as exc:
            parser.error(str(exc))
    settings = ["fsync", "os"] if args.durability == "both" else [args.durability]
    stores = ["sqlite", "postgresql"] if args.store == "both" else [args.store]
    with databases(stores) as database:
        results = [
            bench_durability(d, opts, database() if store == "postgresql" else None)
            for d in settings
            for store in stores
        ]
    compare_stores(results)
    print_table(results, opts)
    met = all(r.target_met for r in results)
    return parser.conclude(args, opts, met, results=[asdict(r) for r in results])


if __name__ == "__main__":
    sys.exit(main())
