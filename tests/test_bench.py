"""Every benchmark still runs: each in its smoke mode (`--smoke`: tiny sizes, seconds),
checked to end well and to print its figures, so that none can rot unnoticed.

The figures of a smoke run mean nothing and its targets are not judged; the benchmark's
own checks (every message once, in order, the queue empty at the end) still hold. A new
benchmark in bench/ fails `test_every_benchmark_is_run_here` until it is listed below with
the words its figures are printed under.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# each benchmark: its arguments besides --smoke, and words of its printed figures
BENCHMARKS = {
    "activation": ((), "scheduler_tasks_per_s_readers_8"),
    "backlog": ((), "drain rate ratio deep / short"),
    "compare": ((".", ".", "--module", "bench.reconnect"), "B/A"),
    "e2e": ((), "lat p50 us"),
    "endpoints": ((), "RSS per endpoint (B)"),
    "failover": ((), "takeover s: median"),
    "federation": ((), "ratio forwarded/one"),
    "peers": ((), "persistent messages of"),
    "priorities": ((), "ratio multi/single"),
    "reconnect": ((), "of clean;"),
    "slow_consumer": ((), "targets: RSS growth"),
    "spark": ((), "activation latency cold"),
    "tables": ((), "(executemany) + COMMIT"),
    "tsql": ((), "T-SQL"),
}
TIMEOUT = 600.0  # a smoke run takes seconds; this only bounds a run that hangs


def test_every_benchmark_is_run_here() -> None:
    found = sorted(p.stem for p in (REPO / "bench").glob("*.py") if not p.stem.startswith("_"))
    assert found == sorted(BENCHMARKS)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_the_benchmark_runs_in_smoke_mode(name: str) -> None:
    args, figures = BENCHMARKS[name]
    if name == "compare" and not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("bench.compare runs each side's .venv, and this checkout has none")
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args, "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    output = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, output
    assert figures in done.stdout, output
