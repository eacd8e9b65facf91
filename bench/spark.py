"""Spark bridge benchmark: throughput of Spark-activated readers, activation latency.

    python -m bench.spark                       # 3 rounds of 20,000 messages, local[4], 4 readers
    python -m bench.spark --messages 50000 --readers 8 --master local[8] --rounds 5
    python -m bench.spark --smoke               # tiny sizes, seconds: does it still run?

Throughput, in rounds; each round has two interleaved halves (their order alternates
from round to round), on the same broker:
- Spark: a queue is loaded with 1 KiB messages on readers x 10 conversations, then a
  SparkActivator starts (its warm-up job included); readers call a trivial function,
  RECEIVE TOP(100) per transaction. Messages/s = messages / (first reader registered ->
  last commit), and also from the bridge's start() returning. Every message is checked
  to be gone from the queue.
- the reference: what the broker gives one plain reader, bench.e2e's receive-only
  phase (a consumer process draining as many 1 KiB messages, sent beforehand, in
  transactions of TOP(100)).
The share is the median over rounds of Spark / reference; a first round is not counted
(`--warm-rounds`): in it the JVM compiles the paths of a reader's job, which a bridge
that has run a while has done. With each half the daemon's
CPU per message, and for Spark the executors' (JVM, PySpark's daemon and workers, the
driver's bridge), so a machine too small for both shows as such. The load average is
printed with every figure.

Targets: the Spark readers take at least 0.8 of the reference's rate; activation
(QUEUE_ACTIVATION -> first reader) within 50 ms warm and 1 s cold, at the median. Exit
status 1 when one is missed (not in smoke mode).

Activation latency: one message into an idle queue; from the bridge receiving the
QUEUE_ACTIVATION event to the first reader registered with the broker (and from the
SEND's commit), split into the bridge's part (event -> job submitted), Spark's (job ->
task running) and the reader's (connect, log in, register). "Cold" is the first
activation in a fresh SparkContext, after start() and its warm-up job (whose time is
shown); "cold, no warm-up" the same with `warm_up=False` (PySpark's daemon and worker
start with the first reader); "warm" reuses the workers.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Final

from bench import e2e
from bench._common import (
    CommandLine,
    broker,
    cpu_meter,
    cpu_seconds,
    option,
    rate,
    run,
)
from ssb import client
from ssb.tools import wait_until_sync

HERE = Path(__file__).resolve().parent
FUNCTIONS = "bench.spark:trivial"
SMOKE = {
    "messages": 200,
    "readers": 2,
    "master": "local[2]",
    "rounds": 1,
    "warm_rounds": 0,
    "warm_samples": 2,
    "cold_samples": 1,
}
TARGET_OF_RECEIVE: Final = 0.8  # the Spark readers' rate / one plain reader's
TARGET_WARM_MS: Final = 50.0  # activation to the first reader, median
TARGET_COLD_MS: Final = 1000.0


@dataclasses.dataclass
class Options:
    messages: int = option(20_000)
    readers: int = option(4, at_least=1)
    batch: int = option(100, at_least=1)
    master: str = option("local[4]")
    rounds: int = option(3, at_least=1)
    warm_rounds: int = option(1, "rounds run first and not counted", at_least=0)
    warm_samples: int = option(10, at_least=1)
    cold_samples: int = option(3, at_least=1)


def trivial(message: client.Message, conn: client.SyncConnection) -> None:
    """The benchmark's reader function: nothing."""


def session(master: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    root = str(HERE.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    from pyspark.sql import SparkSession

    from ssb.spark_bridge import DEFAULT_SPARK_SETTINGS

    settings: dict[str, bool | float | int | str | None] = dict(DEFAULT_SPARK_SETTINGS)

    spark = (
        SparkSession.builder.master(master)
        .appName("ssb bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.task.killTimeout", "200ms")
        .config(map=settings)  # those of `ssb spark-bridge`
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def load(conn: client.SyncConnection, queue: str, messages: int, conversations: int) -> None:
    body = b"x" * 1024
    per = messages // conversations
    for _ in range(conversations):
        with conn.transaction():
            handle = conn.begin_dialog(f"{queue}Sender", f"{queue}Service")
            for start in range(0, per, 1000):
                conn.send_many(handle, "DEFAULT", [body] * min(1000, per - start))


def objects(conn: client.SyncConnection, queue: str, readers: int) -> None:
    conn.create_queue(queue, activation={"status": "OFF", "max_queue_readers": readers})
    conn.create_service(f"{queue}Service", queue=queue, contracts=["DEFAULT"])
    conn.create_queue(f"{queue}Back")
    conn.create_service(f"{queue}Sender", queue=f"{queue}Back")


@dataclasses.dataclass
class Round:
    """One throughput round: the Spark readers' half and the plain reader's."""

    messages: int
    readers_max: int = 0
    spark_msgs_s: float = 0.0
    spark_msgs_s_from_ready: float = 0.0
    warm_up_s: float = 0.0
    spark_daemon_us: float | None = None  # the broker daemon's CPU per message
    spark_side_us: dict[str, float] = dataclasses.field(default_factory=dict)  # per message
    spark_load: float = 0.0
    plain_msgs_s: float = 0.0
    plain_daemon_us: float | None = None
    plain_reader_us: float = 0.0  # the consumer process's own CPU per message
    plain_load: float = 0.0

    @property
    def share(self) -> float:
        return self.spark_msgs_s / self.plain_msgs_s


def descendants(root: int) -> list[int]:
    """The processes under `root` (Linux /proc; none elsewhere)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def spark_side_cpu(daemon_pid: int) -> dict[str, float]:
    """CPU seconds so far of this process (the driver's bridge) and of what it started, the
    broker daemon left out: {"driver", "jvm", "python" (PySpark's daemon and workers)}."""
    out = {"driver": time.process_time(), "jvm": 0.0, "python": 0.0}
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                kind = "jvm" if f.read().strip() == "java" else "python"
        except OSError:
            continue
        seconds = cpu_seconds(pid) if pid != daemon_pid else None
        out[kind] += seconds or 0.0
    return out


def throughput(
    spark: Any, url: str, daemon_pid: int, queue: str, opts: Options, into: Round
) -> None:
    from ssb.spark_bridge import QueueBinding, SparkActivator

    with client.connect_sync(url) as conn:
        objects(conn, queue, opts.readers)
        load(conn, queue, into.messages, opts.readers * 10)
        activator = SparkActivator(
            spark,
            url,
            [QueueBinding(queue, FUNCTIONS, batch_size=opts.batch, idle_timeout=1.0)],
            name=f"bridge-{queue}",
        )
        daemon = cpu_meter(daemon_pid)
        before = spark_side_cpu(daemon_pid)
        into.spark_load = os.getloadavg()[0]
        activator.start()
        ready = time.time()
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                done = sum(job.processed for job in activator.jobs if not job.running)
                if done >= into.messages and activator.wait_idle(0):
                    break
                activator.wait_idle(1.0)
        finally:
            activator.stop(grace=5)
        into.spark_daemon_us = daemon(into.messages)
        after = spark_side_cpu(daemon_pid)
        into.spark_side_us = {
            kind: (seconds - before[kind]) * 1e6 / into.messages for kind, seconds in after.items()
        }
        reports = [r for job in activator.jobs for r in job.reports]
        processed = sum(r["processed"] for r in reports)
        assert processed == into.messages, f"processed {processed} of {into.messages}"
        assert not conn.peek(queue), f"messages left on {queue}"
        first = min(r["registered_at"] for r in reports if r["registered_at"])
        last = max(r["last_processed_at"] for r in reports if r["last_processed_at"])
        into.readers_max = max(job.readers for job in activator.jobs)
        into.spark_msgs_s = into.messages / (last - first)
        into.spark_msgs_s_from_ready = into.messages / (last - ready)
        into.warm_up_s = activator.warm_up_seconds or 0.0


def receive_only(url: str, daemon_pid: int, batch: int, into: Round) -> None:
    """The reference: bench.e2e's receive-only phase (its catalog made beforehand)."""
    opts = e2e.Options(messages=into.messages, batch=batch)
    e2e.run_processes(url, e2e.PHASE_SEND, ["producer"], opts)
    daemon = cpu_meter(daemon_pid)
    into.plain_load = os.getloadavg()[0]
    _, out = e2e.run_processes(url, e2e.PHASE_SEND, ["consumer"], opts)
    into.plain_daemon_us = daemon(into.messages)
    got = out["consumer"]
    into.plain_reader_us = got["cpu"] * 1e6 / into.messages
    into.plain_msgs_s = rate(got["received"], got["finished"] - got["started"])


@dataclasses.dataclass(frozen=True)
class Activation:
    """One activation's times, seconds."""

    event_to_reader: float  # QUEUE_ACTIVATION received -> first reader registered
    send_to_reader: float  # the SEND's commit -> first reader registered
    bridge: float  # event -> job submitted
    spark: float  # job submitted -> the task running
    reader: float  # the task running -> registered (connect, log in, register)


def _more_than(items: list[Any], count: int) -> bool:
    return len(items) > count


def latency(
    spark: Any, url: str, queue: str, samples: int, warm_up: bool = True
) -> tuple[list[Activation], float | None]:
    """Each sample's activation, and what start()'s warm-up took."""
    from ssb.spark_bridge import QueueBinding, SparkActivator

    out = []
    with client.connect_sync(url) as conn:
        activator = SparkActivator(
            spark,
            url,
            [QueueBinding(queue, FUNCTIONS, batch_size=1, idle_timeout=0.3)],
            name=f"bridge-{queue}",
            warm_up=warm_up,
        )
        activator.start()
        try:
            for _ in range(samples):
                jobs = len(activator.jobs)
                with conn.transaction():
                    handle = conn.begin_dialog(f"{queue}Sender", f"{queue}Service")
                    conn.send(handle, "DEFAULT", b"ping")
                sent = time.time()
                wait_until_sync(
                    functools.partial(_more_than, activator.jobs, jobs),
                    "the activation's Spark job",
                    60,
                    0.005,
                )
                if not activator.wait_idle(60):
                    raise RuntimeError("the reader did not end")
                job = activator.jobs[-1]
                report = min(job.reports, key=lambda r: r["registered_at"] or float("inf"))
                registered, started = report["registered_at"], report["started_at"]
                assert registered is not None and job.event_time is not None
                out.append(
                    Activation(
                        registered - job.event_time,
                        registered - sent,
                        job.submitted - job.event_time,
                        started - job.submitted,
                        registered - started,
                    )
                )
                conn.end_conversation(handle, cleanup=True)
        finally:
            activator.stop(grace=2)
    return out, activator.warm_up_seconds


def _us(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def print_rounds(rounds: list[Round], opts: Options) -> float:
    """Print each round and the medians of those after the warm rounds; returns the
    median share."""
    print(
        f"throughput: {rounds[0].messages} messages a half, {rounds[0].readers_max} Spark readers"
        f" (max_queue_readers {opts.readers}, {opts.master}, TOP {opts.batch}, 1 KiB) against"
        " one plain reader (bench.e2e's receive-only), interleaved"
    )
    if opts.warm_rounds:
        print("  rounds <= 0 are not counted (the JVM compiles the job's paths, as a new bridge's)")
    for n, r in enumerate(rounds, 1 - opts.warm_rounds):
        side = " ".join(f"{kind} {us:.1f}" for kind, us in r.spark_side_us.items())
        print(
            f"  round {n}: Spark {r.spark_msgs_s:,.0f} msgs/s while reading"
            f" ({r.spark_msgs_s_from_ready:,.0f} from start() returning; warm-up"
            f" {r.warm_up_s:.2f} s), load {r.spark_load:.1f}; CPU us/msg: daemon"
            f" {_us(r.spark_daemon_us)}, Spark side {sum(r.spark_side_us.values()):.1f} ({side})"
        )
        print(
            f"           plain {r.plain_msgs_s:,.0f} msgs/s, load {r.plain_load:.1f}; CPU us/msg:"
            f" daemon {_us(r.plain_daemon_us)}, reader {r.plain_reader_us:.1f}; share {r.share:.2f}"
        )
    rounds = rounds[opts.warm_rounds :]
    share = statistics.median(r.share for r in rounds)
    print(
        f"throughput medians over {len(rounds)} rounds: Spark"
        f" {statistics.median(r.spark_msgs_s for r in rounds):,.0f} msgs/s, plain reader"
        f" {statistics.median(r.plain_msgs_s for r in rounds):,.0f} msgs/s; the Spark readers"
        f" take {share:.2f} of it (target >= {TARGET_OF_RECEIVE})"
    )
    return share


def print_latency(name: str, values: list[Activation], warm_up: list[float], target: float) -> bool:
    """Print one kind of activation's figures; whether its median meets `target` (ms)."""
    ms = {
        field.name: statistics.median(getattr(v, field.name) * 1000 for v in values)
        for field in dataclasses.fields(Activation)
    }
    longest = max(v.event_to_reader for v in values) * 1000
    started = f"; start()'s warm-up {statistics.median(warm_up):.2f} s" if warm_up else ""
    print(
        f"activation latency {name} ({len(values)} samples, load {os.getloadavg()[0]:.1f}):"
        f" QUEUE_ACTIVATION -> first reader median {ms['event_to_reader']:.0f} ms"
        f" (target < {target:g}), max {longest:.0f} ms; of it bridge {ms['bridge']:.1f},"
        f" Spark {ms['spark']:.1f}, reader {ms['reader']:.1f} ms; SEND -> first reader"
        f" median {ms['send_to_reader']:.0f} ms{started}"
    )
    return bool(ms["event_to_reader"] < target)


def cold_activations(
    url: str, opts: Options, first: int, warm_up: bool
) -> tuple[list[Activation], list[float]]:
    """One activation per fresh SparkContext, `opts.cold_samples` times."""
    values: list[Activation] = []
    warm_ups: list[float] = []
    for n in range(first, first + opts.cold_samples):
        spark = session(opts.master)
        try:
            got, seconds = latency(spark, url, f"Ping{n}", 1, warm_up)
        finally:
            spark.stop()
        values += got
        warm_ups += [] if seconds is None else [seconds]
    return values, warm_ups


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("spark", __doc__, Options)
    args, opts = parser.read(argv, SMOKE)
    if args.messages < 10 * args.readers:
        parser.error("--messages must be >= 10 x --readers (ten conversations a reader)")
    sys.path.insert(0, str(HERE.parent))
    with broker("os") as daemon:
        url = daemon.url  # the admin login: the broker refuses a URL without one
        with client.connect_sync(url) as conn:
            for n in range(2 * opts.cold_samples + 1):
                objects(conn, f"Ping{n}", 1)
        cold, cold_warm_ups = cold_activations(url, opts, 0, warm_up=True)
        bare, _ = cold_activations(url, opts, opts.cold_samples, warm_up=False)
        run(e2e.CATALOG.create(url))
        messages = (opts.messages // (opts.readers * 10)) * opts.readers * 10
        rounds = [Round(messages) for _ in range(opts.warm_rounds + opts.rounds)]
        spark = session(opts.master)
        try:
            warm, _ = latency(spark, url, f"Ping{2 * opts.cold_samples}", opts.warm_samples + 1)
            for n, into in enumerate(rounds):
                halves = [
                    functools.partial(throughput, spark, url, daemon.pid, f"Bench{n}", opts, into),
                    functools.partial(receive_only, url, daemon.pid, opts.batch, into),
                ]
                for half in halves if n % 2 == 0 else reversed(halves):
                    half()
        finally:
            spark.stop()
    met = print_rounds(rounds, opts) >= TARGET_OF_RECEIVE
    met = print_latency("warm", warm[1:], [], TARGET_WARM_MS) and met
    met = print_latency("cold", cold, cold_warm_ups, TARGET_COLD_MS) and met
    print_latency("cold, no warm-up", bare, [], TARGET_COLD_MS)
    return parser.conclude(
        args,
        opts,
        met,
        rounds=[dataclasses.asdict(r) for r in rounds],
        activations={
            name: [dataclasses.asdict(a) for a in values]
            for name, values in (("warm", warm[1:]), ("cold", cold), ("cold_no_warm_up", bare))
        },
    )


if __name__ == "__main__":
    sys.exit(main())
