"""The tests' brokers: `ssb.tools.BrokerProcess` with the tests' settings, and `ssb` commands
run to their end.

Every test broker may run the tests' procedures, and a test machine with less free disk
than the daemon's 1 GiB guard still starts it: tests about free space set `min_free_disk`
themselves. Where the environment names a PostgreSQL server (`pg_server.DATABASE_ENV`:
`pytest --store postgresql`), a broker's store is a database of its own on that server,
made at its first start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

from pg_server import DATABASE_ENV, fresh_database

from ssb import tools

# what the tests' brokers may run (the operator's `procedures` list)
TEST_PROCEDURES = [
    "activation_procs:*",
    "spark_funcs:*",
    "myprocs:*",
    "time:sleep",
    "operator:truediv",
]


class BrokerProcess(tools.BrokerProcess):
    """A broker daemon on free ports, with the tests' settings under the test's own."""

    # no disk reserve (the full-disk tests set one): hundreds of test daemons would each
    # hold one in the test run's directories
    defaults: ClassVar[dict[str, Any]] = {
        "min_free_disk": 0,
        "disk_reserve": 0,
        "procedures": TEST_PROCEDURES,
    }

    def start(self) -> BrokerProcess:
        server = os.environ.get(DATABASE_ENV)
        if server and self.store is None:
            self.store = fresh_database(server)
        return super().start()


def run_ssb(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    timeout: float = 60.0,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m ssb.broker ARGS` (after `prefix`, e.g. a wrapper), run to its end, with
    `stdin` as its input."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "ssb.broker", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def serve_once(
    data_dir: Path, *args: str, prefix: tuple[str, ...] = (), timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`ssb serve` on `data_dir`, on any free ports unless `args` give them, run to its
    end (a start-up that fails)."""
    ports = ("--client-port", "0") if "--client-port" not in args else ()
    return run_ssb(
        "serve",
        "--data-dir",
        str(data_dir),
        *ports,
        "--broker-port",
        "0",
        *args,
        prefix=prefix,
        timeout=timeout,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a command that failed as a mistake should."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]
