"""What bench.peers' peers share: the options of a run, a running peer (`Target`), what a
peer must offer (`Peer`), and the plumbing of another broker's workloads: its server
started as a child process and waited for, its producer and consumer run as two
processes released together."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from . import e2e
from ._common import BenchFailure, Work, option, released_together

START_TIMEOUT: Final = 90.0  # seconds a peer may take to start


@dataclass
class Options:
    messages: int = option(50_000, at_least=1)
    batch: int = option(100, at_least=1)
    body_size: int = option(1024, at_least=e2e.TAG.size)
    # batches (ssb) or windows of `batch` messages (others) in flight
    in_flight: int = option(4, at_least=1)
    durability: str = option(  # "both": each in turn
        "both",
        "ssb's (the other brokers run as they acknowledge: see the module's comment)",
        choices=("fsync", "os", "both"),
    )
    round_trips: int = option(2_000, at_least=1)
    round_trip_warmup: int = 20  # in each turn of round trips (see peers.measure)
    rounds: int = option(3, "end-to-end runs of each peer", at_least=1)  # the median counts
    phase_timeout: float = 600.0


@dataclass
class Target:
    """A running peer: where its clients connect, and its server processes."""

    url: str
    pids: list[int] = field(default_factory=list)


class Peer(Protocol):
    name: str

    def missing(self) -> str | None: ...

    def durabilities(self, opts: Options) -> list[str]:
        """What the peer runs at: ssb at the run's durabilities, another broker at what
        its acknowledgement means ("fsync": synced; "os": written, synced later)."""
        ...

    def running(
        self, opts: Options, durability: str
    ) -> contextlib.AbstractContextManager[Target]: ...

    def end_to_end(self, target: Target, opts: Options) -> tuple[float, int]:
        """(seconds, messages) of the end-to-end run."""
        ...

    def round_trip(self, target: Target, opts: Options) -> list[float] | None:
        """One message at a time: sent (acknowledged once stored), received, acknowledged;
        microseconds per round trip after the warm-up (None: not measured for this peer)."""
        ...


def two_processes(
    name: str, work: Mapping[str, Work], url: str, opts: Options
) -> tuple[float, int]:
    """Run `work["consumer"]` and `work["producer"]`, each as `work(role, url, opts, go,
    results)` (see `_common.Work`), in two processes released together; (seconds from the
    release until the consumer took the last message, messages taken)."""
    started, outcomes = released_together(
        {role: (work[role], (role, url, opts)) for role in ("consumer", "producer")},
        opts.phase_timeout,
        name,
    )
    return outcomes["consumer"]["finished"] - started, int(outcomes["consumer"]["received"])


def not_installed(server: Path, package: str, module: str, client: str) -> str | None:
    """Why another broker cannot run here (its Debian package or its Python client is
    missing), or None."""
    if not server.exists():
        return f"Debian's {package} is not installed (apt-get install {package})"
    if importlib.util.find_spec(module) is None:
        return f"its client {client} is not installed (pip install -e '.[bench]')"
    return None


def wait_for_port(
    name: str, port: int, proc: subprocess.Popen[bytes], log: Path, ready: Callable[[], bool]
) -> None:
    """Until the server `proc` accepts connections on `port` and `ready()` holds; a server
    that exits or takes longer than START_TIMEOUT fails the run with its log's end."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")[-3000:]
            raise BenchFailure(f"{name} exited with {proc.returncode}:\n{text}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            if ready():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchFailure(f"{name} did not listen within {START_TIMEOUT:g} s")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen[bytes], timeout: float, ask: Callable[[], None]) -> None:
    """Stop the server `proc` if it still runs: `ask` it to stop (a signal), wait up to
    `timeout` seconds for it to end, then kill it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(OSError):
        ask()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
