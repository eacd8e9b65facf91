"""`ssb spark-bridge`: run a SparkActivator in its own Spark driver (options: broker/cli.py).

Options come from the command line and/or a TOML file; the command line wins:

    broker = "ssb://admin:secret@127.0.0.1:4021"
    master = "local[4]"                 # omit under spark-submit
    name = "spark-bridge"
    python_path = ["/srv/jobs"]         # where executors import the functions from
    stop_grace = 10.0

    [spark]                             # any Spark settings
    "spark.python.task.killTimeout" = "200ms"

    [[queue]]
    name = "Orders"
    function = "myjobs.orders:process"
    batch_size = 100
    idle_timeout = 2.0
    max_readers = 4                     # optional, below the queue's MAX_QUEUE_READERS

    [[scheduler]]
    name = "Jobs"
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from ssb import client

from ._reader import EXECUTOR_SETTINGS, QueueBinding

DEFAULT_BROKER: Final = "ssb://127.0.0.1:4021"
# the Spark settings of the bridge's own driver, under the [spark] table's: FAIR pools (one
# per queue), the executors' daemon with the reader imported, and only the JVM's quick
# compiler: this driver schedules small jobs and moves no data, and C2's compiling cost it
# more CPU than it returned (half its CPU per message read, on 2 cores; bench.spark)
DEFAULT_SPARK_SETTINGS: Final = {
    "spark.scheduler.mode": "FAIR",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    **EXECUTOR_SETTINGS,
}
_QUEUE_KEYS: Final = {"name", "function", "mode", "batch_size", "idle_timeout", "max_readers"}
_TOP_KEYS: Final = {
    "broker",
    "master",
    "name",
    "python_path",
    "stop_grace",
    "poll_interval",
    "spark",
    "queue",
    "scheduler",
}


class BridgeConfigError(ValueError):
    """The bridge's configuration is wrong; the message says how."""


def java_problem() -> str | None:
    """Why Spark could not start its JVM here (None: a `java` is there, or one already
    runs this driver under spark-submit). Spark looks in $JAVA_HOME/bin, else the PATH."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = Path(java_home) / "bin" / "java"
        if os.access(java, os.X_OK):
            return None
        where = f"JAVA_HOME={java_home} has no bin/java"
    elif shutil.which("java") is not None:
        return None
    else:
        where = "no java is on the PATH (and JAVA_HOME is not set)"
    return (
        f"Spark needs Java 17 or 21, but {where}; install one (Debian/Ubuntu: apt-get install"
        " openjdk-17-jre-headless) and check that `java -version` prints 17 or 21"
    )


def load_config(args: argparse.Namespace) -> dict[str, Any]:
    """The TOML file merged with the command line (which wins)."""
    config: dict[str, Any] = {}
    if args.config is not None:
        try:
            config = tomllib.loads(args.config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise BridgeConfigError(f"cannot read {args.config}: {exc}") from None
    unknown = set(config) - _TOP_KEYS
    if unknown:
        raise BridgeConfigError(
            f"unknown setting(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_TOP_KEYS))}"
        )
    queues: list[dict[str, Any]] = list(config.get("queue", []))
    for entry in queues:
        if not isinstance(entry, dict) or "name" not in entry or "function" not in entry:
            raise BridgeConfigError("each [[queue]] needs name and function")
        extra = set(entry) - _QUEUE_KEYS
        if extra:
            raise BridgeConfigError(f"unknown [[queue]] key(s) {', '.join(sorted(extra))}")
    for item in args.queue:
        queue, sep, function = item.partition("=")
        if not sep or ":" not in function:
            raise BridgeConfigError(f"--queue is QUEUE=package.module:function, got {item!r}")
        queues = [q for q in queues if q["name"] != queue] + [{"name": queue, "function": function}]
    for entry in queues:
        if args.batch_size is not None:
            entry["batch_size"] = args.batch_size
        if args.idle_timeout is not None:
            entry["idle_timeout"] = args.idle_timeout
    schedulers = [s["name"] for s in config.get("scheduler", [])] + list(args.scheduler)
    spark_conf = {str(k): str(v) for k, v in dict(config.get("spark", {})).items()}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise BridgeConfigError(f"--conf is KEY=VALUE, got {item!r}")
        spark_conf[key] = value
    if not queues and not schedulers:
        raise BridgeConfigError("nothing to serve: give --queue or --scheduler (or the TOML)")
    for entry in queues:  # checked before Spark takes seconds to start
        try:
            QueueBinding(**{k: v for k, v in entry.items() if k != "name"}, queue=entry["name"])
        except (TypeError, ValueError) as exc:
            raise BridgeConfigError(f"queue {entry['name']!r}: {exc}") from None
    broker = (
        args.broker
        or config.get("broker")
        or os.environ.get("SSB_URL")
        or client.local_url("ssb-data")
        or DEFAULT_BROKER
    )
    try:
        client.url_addresses(broker)
    except ValueError as exc:
        raise BridgeConfigError(str(exc)) from None
    return {
        "broker": broker,
        "master": args.master or config.get("master"),
        "name": args.name or config.get("name", "spark-bridge"),
        "python_path": [*config.get("python_path", []), *args.python_path],
        "stop_grace": float(config.get("stop_grace", 10.0)),
        "poll_interval": float(config.get("poll_interval", 1.0)),
        "spark": spark_conf,
        "queues": queues,
        "schedulers": schedulers,
    }


def main(args: argparse.Namespace) -> int:
    """`ssb spark-bridge` (the ssb command parses its options): run the bridge until
    SIGTERM / Ctrl-C; returns the exit code."""
    try:
        config = load_config(args)
    except BridgeConfigError as exc:
        print(f"ssb spark-bridge: {exc}", file=sys.stderr)
        return 2
    problem = java_problem()
    if problem is not None:
        print(f"ssb spark-bridge: {problem}", file=sys.stderr)
        return 2
    paths = [str(Path(p).resolve()) for p in config["python_path"]]
    if paths:
        sys.path[:0] = paths
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [*paths, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    from ._activator import SparkActivator

    builder = SparkSession.builder.appName(f"ssb {config['name']}")
    if config["master"]:
        builder = builder.master(config["master"])
    settings = {**DEFAULT_SPARK_SETTINGS, **config["spark"]}
    for key, value in settings.items():
        builder = builder.config(key, value)
    # a JVM starting takes seconds (15 or more the first time): say so rather than be silent
    master = config["master"] or "from spark-submit or Spark's defaults"
    print(f"ssb spark-bridge: starting a Spark session (master {master})", flush=True)
    began = time.monotonic()
    spark = builder.getOrCreate()
    print(f"ssb spark-bridge: Spark session ready in {time.monotonic() - began:.1f} s", flush=True)
    try:
        activator = SparkActivator(
            spark,
            config["broker"],
            [QueueBinding(q.pop("name"), **q) for q in config["queues"]],
            name=config["name"],
            poll_interval=config["poll_interval"],
            stop_grace=config["stop_grace"],
        )
        for scheduler in config["schedulers"]:
            activator.add_scheduler(scheduler)
        print(
            f"ssb spark-bridge ready broker={_shown(config['broker'])} "
            f"queues={','.join(activator.bindings)} master={spark.sparkContext.master}",
            flush=True,
        )
        activator.serve()
    finally:
        spark.stop()
    return 0


def _shown(url: str) -> str:
    """The broker URL as it may be printed: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username}:***@{host}").geturl()
