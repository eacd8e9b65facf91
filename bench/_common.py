"""Shared plumbing for the benchmarks: a daemon in a temp dir, an event loop, stats.

The daemon comes from tests/daemon.py (`BrokerProcess`), imported by path so the
benchmarks and the tests start brokers the same way. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Coroutine, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "tests"))

from daemon import BrokerProcess  # type: ignore[import-not-found,unused-ignore]  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop when it is installed (as the daemon does)."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


@contextlib.contextmanager
def broker(
    durability: str,
    config: dict[str, Any] | None = None,
    keep: bool = False,
    stop_timeout: float = 30.0,
) -> Iterator[BrokerProcess]:
    """A fresh daemon on free ports in a temp data dir, with `config`; stopped (and
    removed) on exit."""
    root = Path(tempfile.mkdtemp(prefix=f"ssb-bench-{durability}-"))
    process = BrokerProcess(root / "data", durability=durability, config=config or None)
    try:
        process.start()
        yield process
    except BaseException:
        exit_code = process.proc.poll() if process.proc is not None else None
        tail = process.log_text()[-3000:] if process.log_path.exists() else ""
        print(
            f"benchmark failed; daemon exit code {exit_code}; daemon log tail:\n{tail}",
            file=sys.stderr,
        )
        raise
    finally:
        try:
            process.stop(timeout=stop_timeout)
        except Exception:
            process.kill()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(fraction * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc; None elsewhere).

    Less sensitive than wall time to other load on the machine: a benchmark can
    report the daemon's CPU cost per message next to its throughput.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_json(path: str, benchmark: str, options: object, **results: Any) -> None:
    """The benchmark's options, the machine and `results` as JSON to `path` ("-": stdout)."""
    payload = {
        "benchmark": benchmark,
        "options": asdict(options),  # type: ignore[call-overload]
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        **results,
    }
    text = json.dumps(payload, indent=2, default=str)
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n")
