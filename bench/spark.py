"""Spark bridge benchmark: throughput of Spark-activated readers, activation latency.

    python -m bench.spark                       # 20,000 messages, local[4], 4 readers
    python -m bench.spark --messages 50000 --readers 8 --master local[8]
    python -m bench.spark --smoke               # tiny sizes, seconds: does it still run?

Throughput: the queue is loaded with 1 KiB messages on readers x 10 conversations,
then a SparkActivator starts; readers call a trivial function, RECEIVE TOP(100) per
transaction. Messages/s = messages / (first reader registered -> last commit), and
also from bridge start. Every message is checked to be gone from the queue.

The reference, on the same broker in the same run: what the broker gives one plain
reader, bench.e2e's receive-only phase (a consumer process draining as many 1 KiB
messages, sent beforehand, in transactions of TOP(100)). Targets: the Spark readers take
at least 0.8 of that rate; activation (QUEUE_ACTIVATION -> first reader) within 50 ms
warm and 1 s cold, at the median. Exit status 1 when one is missed (not in smoke mode).

Activation latency: one message into an idle queue; from the bridge receiving the
QUEUE_ACTIVATION event to the first reader registered with the broker (and from
the SEND's commit). "Cold" is the first activation in a fresh SparkContext (the
Python worker is forked); "warm" reuses the worker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Final

from bench import e2e
from bench._common import broker, parse_args, rate, run
from ssb import client
from ssb.tools import wait_until_sync

HERE = Path(__file__).resolve().parent
FUNCTIONS = "bench.spark:trivial"
SMOKE = {"messages": 200, "readers": 2, "master": "local[2]", "warm_samples": 2, "cold_samples": 1}
TARGET_OF_RECEIVE: Final = 0.8  # the Spark readers' rate / one plain reader's
TARGET_WARM_MS: Final = 50.0  # activation to the first reader, median
TARGET_COLD_MS: Final = 1000.0


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

    spark = (
        SparkSession.builder.master(master)
        .appName("ssb bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.python.task.killTimeout", "200ms")
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


def throughput(spark: Any, url: str, args: argparse.Namespace) -> dict[str, float]:
    from ssb.spark_bridge import QueueBinding, SparkActivator

    with client.connect_sync(url) as conn:
        objects(conn, "Bench", args.readers)
        total = (args.messages // (args.readers * 10)) * args.readers * 10
        load(conn, "Bench", total, args.readers * 10)
        # warm the executors' Python workers so the figure is the steady state
        spark.sparkContext.parallelize(range(args.readers), args.readers).count()
        activator = SparkActivator(
            spark,
            url,
            [QueueBinding("Bench", FUNCTIONS, batch_size=args.batch, idle_timeout=1.0)],
        )
        began = time.time()
        activator.start()
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                done = sum(job.processed for job in activator.jobs if not job.running)
                if done >= total and activator.wait_idle(0):
                    break
                activator.wait_idle(1.0)
        finally:
            activator.stop(grace=5)
        reports = [r for job in activator.jobs for r in job.reports]
        processed = sum(r["processed"] for r in reports)
        assert processed == total, f"processed {processed} of {total}"
        assert conn.view("queue_monitors")[0]["messages_ready"] == 0 or not conn.peek("Bench")
        first = min(r["registered_at"] for r in reports if r["registered_at"])
        last = max(r["last_processed_at"] for r in reports if r["last_processed_at"])
        return {
            "messages": total,
            "readers_max": max(job.readers for job in activator.jobs),
            "msgs_per_s": total / (last - first),
            "msgs_per_s_from_start": total / (last - began),
        }


def receive_only(url: str, messages: int, batch: int) -> float:
    """The reference: msgs/s of bench.e2e's receive-only phase on the broker at `url`."""
    run(e2e.CATALOG.create(url))
    opts = e2e.Options(messages=messages, batch=batch)
    e2e.run_processes(url, e2e.PHASE_SEND, ["producer"], opts)
    _, out = e2e.run_processes(url, e2e.PHASE_SEND, ["consumer"], opts)
    got = out["consumer"]
    return rate(got["received"], got["finished"] - got["started"])


def latency(spark: Any, url: str, queue: str, samples: int) -> list[tuple[float, float]]:
    """(event -> first reader, send -> first reader) seconds, per sample."""
    from ssb.spark_bridge import QueueBinding, SparkActivator

    out = []
    with client.connect_sync(url) as conn:
        activator = SparkActivator(
            spark, url, [QueueBinding(queue, FUNCTIONS, batch_size=1, idle_timeout=0.3)]
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
                    lambda n=jobs: len(activator.jobs) > n, "the activation's Spark job", 60, 0.005
                )
                if not activator.wait_idle(60):
                    raise RuntimeError("the reader did not end")
                job = activator.jobs[-1]
                registered = job.first_registered
                assert registered is not None and job.event_time is not None
                out.append((registered - job.event_time, registered - sent))
                conn.end_conversation(handle, cleanup=True)
        finally:
            activator.stop(grace=2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.spark", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--master", default="local[4]")
    parser.add_argument("--warm-samples", type=int, default=10)
    parser.add_argument("--cold-samples", type=int, default=3)
    args = parse_args(parser, argv, SMOKE)
    sys.path.insert(0, str(HERE.parent))
    with broker("os") as daemon:
        daemon_url = daemon.url  # the admin login: the broker refuses a URL without one
        with client.connect_sync(daemon_url) as conn:
            for n in range(args.cold_samples + 1):
                objects(conn, f"Ping{n}", 1)
        cold = []
        for n in range(args.cold_samples):
            spark = session(args.master)
            cold += latency(spark, daemon_url, f"Ping{n}", 1)
            spark.stop()
        spark = session(args.master)
        try:
            warm = latency(spark, daemon_url, f"Ping{args.cold_samples}", args.warm_samples + 1)[1:]
            figures = throughput(spark, daemon_url, args)
        finally:
            spark.stop()
        reference = receive_only(daemon_url, int(figures["messages"]), args.batch)
    print(
        f"throughput: {figures['messages']:.0f} messages, {figures['readers_max']:.0f} readers "
        f"(max_queue_readers {args.readers}, {args.master}, TOP {args.batch}, 1 KiB): "
        f"{figures['msgs_per_s']:,.0f} msgs/s while reading, "
        f"{figures['msgs_per_s_from_start']:,.0f} msgs/s from bridge start"
    )
    share = figures["msgs_per_s"] / reference
    print(
        f"one plain reader on the same broker (bench.e2e's receive-only, TOP {args.batch}):"
        f" {reference:,.0f} msgs/s; the Spark readers take {share:.2f} of it"
        f" (target >= {TARGET_OF_RECEIVE})"
    )
    met = share >= TARGET_OF_RECEIVE
    for name, values, target in (("warm", warm, TARGET_WARM_MS), ("cold", cold, TARGET_COLD_MS)):
        event = [v[0] * 1000 for v in values]
        send = [v[1] * 1000 for v in values]
        median = statistics.median(event)
        met = met and median < target
        print(
            f"activation latency {name} ({len(values)} samples): QUEUE_ACTIVATION -> first reader "
            f"median {median:.0f} ms (target < {target:g}), max {max(event):.0f} ms; "
            f"SEND -> first reader median {statistics.median(send):.0f} ms"
        )
    return 0 if met or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
