"""The examples run as a user would run them, each starting its own broker.

`examples/spark_pipeline.py` moves 10,000 messages through a Spark session and is left to
the Spark tests' own coverage of the bridge.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.timeout(120)
def test_the_seed_000_scheduler_runs_every_wave_and_prints_its_log() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "seed000_scheduler.py"), "--scale", "0.01"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    waves = [line for line in done.stdout.splitlines() if line.startswith("wave of")]
    assert len(waves) == 5 and not any("failed" in line for line in waves), done.stdout
    assert "ExecutionLog" in done.stdout
    assert done.stdout.count(" DONE") == 10 and "FAILED" not in done.stdout, done.stdout
