"""Memory and disk figures of a daemon, for the backlog, slow-consumer and endpoint benchmarks.

The daemon's memory is its resident set (VmRSS in /proc/<pid>/status) and its peak
(VmHWM, the high-water mark since the process started). `RssSampler` samples VmRSS on a
background thread every `interval` seconds, following the daemon across restarts (it
reads the pid anew each time). The store is `<data_dir>/broker.db` plus its `-wal` file.

The memory benchmarks start their daemon with `_common.broker()`, whose config (a dict of
settings) sets `message_cache_bytes`, and read the daemon's own account of what it holds
from its views (`queue_state`: a queue's `service_queues` row and `broker_resources`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ssb import client

from ._common import BenchFailure, BrokerProcess

__all__ = [
    "MB",
    "BrokerProcess",
    "RssSampler",
    "StoreSize",
    "cache_config",
    "daemon_peak",
    "daemon_pid",
    "daemon_rss",
    "mb",
    "now_line",
    "peak_rss_bytes",
    "peak_since",
    "queue_row",
    "queue_state",
    "rss_bytes",
    "store_size",
    "store_sizes",
    "timed_restart",
]

MB = 1_000_000  # the "MB": figures are reported in 10^6 bytes


def _status_bytes(pid: int, field: str) -> int | None:
    """A size in /proc/<pid>/status (given there in kB), in bytes; None where it cannot be
    read (the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def rss_bytes(pid: int) -> int | None:
    """The process's resident set size now (VmRSS), in bytes; None if it is gone."""
    return _status_bytes(pid, "VmRSS")


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident set size since it started (VmHWM), in bytes."""
    return _status_bytes(pid, "VmHWM")


def daemon_pid(process: BrokerProcess) -> int:
    if process.proc is None or process.proc.poll() is not None:
        raise RuntimeError("the daemon is not running")
    return int(process.proc.pid)


def _daemon_status(process: BrokerProcess, field: str) -> int:
    value = _status_bytes(daemon_pid(process), field)
    if value is None:
        raise RuntimeError(f"cannot read the daemon's {field}")
    return value


def daemon_rss(process: BrokerProcess) -> int:
    """The running daemon's VmRSS, in bytes."""
    return _daemon_status(process, "VmRSS")


def daemon_peak(process: BrokerProcess) -> int:
    """The running daemon's VmHWM (its peak resident set), in bytes."""
    return _daemon_status(process, "VmHWM")


def peak_since(process: BrokerProcess, peak_before: int, *readings: int) -> int:
    """The daemon's peak RSS over a phase: the largest of `readings` (its RSS sampled and
    read during the phase) and its VmHWM now, if that rose above `peak_before` (its
    VmHWM as the phase began; one that did not rise was reached before it)."""
    peak = daemon_peak(process)
    return max([*readings, peak if peak > peak_before else 0])


class RssSampler:
    """Samples a process's VmRSS every `interval` s on a thread, between start() and stop().

    `pid` is called at every sample, so the sampler follows a restarted daemon. Bounded:
    it stops by itself after `limit` seconds.
    """

    def __init__(self, pid: Callable[[], int | None], interval: float = 1.0, limit: float = 7200.0):
        self._pid = pid
        self.interval = interval
        self.limit = limit
        self.samples: list[tuple[float, int]] = []  # (monotonic time, bytes)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit
        while not self._stop.is_set() and time.monotonic() < deadline:
            pid = self._pid()
            value = rss_bytes(pid) if pid else None
            if value is not None:
                self.samples.append((time.monotonic(), value))
            self._stop.wait(self.interval)

    def stop(self) -> RssSampler:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self

    @property
    def peak(self) -> int:
        return max((v for _, v in self.samples), default=0)

    def __enter__(self) -> RssSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class StoreSize:
    db: int  # broker.db
    wal: int  # broker.db-wal

    @property
    def total(self) -> int:
        return self.db + self.wal


def store_size(data_dir: Path) -> StoreSize:
    def size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0

    return StoreSize(db=size(data_dir / "broker.db"), wal=size(data_dir / "broker.db-wal"))


def store_sizes(process: BrokerProcess) -> dict[str, int]:
    """The daemon's store size as a result records it: {"db": bytes, "wal": bytes}."""
    return asdict(store_size(process.data_dir))


def cache_config(cache_bytes: int | None) -> dict[str, Any]:
    """The daemon's config for a --cache-bytes option: its `message_cache_bytes`, or
    nothing (the daemon's default) for None."""
    return {} if cache_bytes is None else {"message_cache_bytes": cache_bytes}


def now_line(process: BrokerProcess) -> str:
    """The running daemon's RSS and store size now, for a progress line."""
    return f"RSS {mb(daemon_rss(process))} MB, store {mb(store_size(process.data_dir).total)} MB"


async def queue_row(conn: client.Connection, queue: str) -> dict[str, Any]:
    """The `service_queues` row of `queue` (BenchFailure when it has none)."""
    rows: list[dict[str, Any]] = await conn.view("service_queues")
    for row in rows:
        if row.get("name") == queue:
            return row
    raise BenchFailure(f"{queue} is not in service_queues")


async def queue_state(url: str, queue: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the `service_queues` row of `queue`, the `broker_resources` row) of the daemon at
    `url`."""
    async with await client.connect(url) as conn:
        return await queue_row(conn, queue), (await conn.view("broker_resources"))[0]


def timed_restart(process: BrokerProcess) -> float:
    """kill -9 and start again on the same data dir and ports; seconds until "ssb ready"."""
    started = time.perf_counter()
    process.restart()
    return time.perf_counter() - started


def mb(value: float | None) -> str:
    """Bytes as MB (10^6) for a table."""
    return "n/a" if value is None else f"{value / MB:,.1f}"
