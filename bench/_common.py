"""Shared plumbing for the benchmarks: a daemon in a temp dir, an event loop, stats, and
the command line every benchmark has (`--smoke`).

The daemon is `ssb.tools.BrokerProcess`, the helper the tests and the examples start their
brokers with. Everything listens on 127.0.0.1.

Smoke mode. Every benchmark takes `--smoke`: tiny sizes that run in seconds, so the test
command can run each one and none can rot unnoticed. Its figures mean nothing and its
targets are not judged (the exit status says only whether it ran and its checks held);
options given on the command line still win over the smoke sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import multiprocessing.process
import os
import platform
import queue
import shutil
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from ssb import client, tools

REPO_ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")


class BrokerProcess(tools.BrokerProcess):
    """A benchmark's daemon: it may run the benchmarks' own procedures, and a small free
    disk does not stop it (the daemon's 1 GiB guard is off)."""

    defaults: ClassVar[dict[str, Any]] = {"min_free_disk": 0, "procedures": ["bench.*"]}


class BenchFailure(RuntimeError):
    """A benchmark's own check failed (lost, duplicated, misordered or foreign messages)."""


@dataclass(frozen=True)
class Catalog:
    """What a benchmark creates on its broker, named after it (`prefix`): one message
    type, sent by the initiator of one contract, and an initiator and a target service,
    each on its own queue."""

    prefix: str

    @property
    def message_type(self) -> str:
        return f"{self.prefix}Message"

    @property
    def contract(self) -> str:
        return f"{self.prefix}Contract"

    @property
    def initiator_queue(self) -> str:
        return f"{self.prefix}InitiatorQueue"

    @property
    def target_queue(self) -> str:
        return f"{self.prefix}TargetQueue"

    @property
    def initiator_service(self) -> str:
        return f"{self.prefix}Initiator"

    @property
    def target_service(self) -> str:
        return f"{self.prefix}Target"

    async def begin_dialog(self, conn: Any) -> Any:
        """BEGIN DIALOG from the initiator service to the target service on `conn`."""
        return await conn.begin_dialog(
            self.initiator_service, self.target_service, contract=self.contract
        )

    async def begin_dialogs(
        self, conn: Any, count: int, per_transaction: int, timeout: float
    ) -> AsyncIterator[list[Any]]:
        """BEGIN DIALOG `count` times on `conn`, in explicit transactions of
        `per_transaction` (the calls of one written together, answered in order): each
        transaction's handles once it has committed. BenchFailure when they are not all
        begun within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        done = 0
        while done < count:
            if time.monotonic() > deadline:
                raise BenchFailure(f"only {done} of {count} dialogs in {timeout:g} s")
            n = min(per_transaction, count - done)
            async with conn.transaction():
                handles = await asyncio.gather(*(self.begin_dialog(conn) for _ in range(n)))
            done += n
            yield handles

    async def create(self, url: str, max_messages: int | None = None) -> None:
        """Create it all on the broker at `url` (`max_messages`: the target queue's quota)."""
        from ssb import client

        async with await client.connect(url) as conn:
            await conn.create_message_type(self.message_type, validation="NONE")
            await conn.create_contract(self.contract, {self.message_type: "INITIATOR"})
            await conn.create_queue(self.initiator_queue)
            await conn.create_queue(self.target_queue, max_messages=max_messages)
            await conn.create_service(self.initiator_service, queue=self.initiator_queue)
            await conn.create_service(
                self.target_service, queue=self.target_queue, contracts=[self.contract]
            )


@dataclass(frozen=True)
class Option:
    """How a field of a benchmark's options is given on its command line (see `option`)."""

    help: str | None = None
    at_least: int | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None


def option(
    default: T,
    help: str | None = None,
    *,
    at_least: int | None = None,
    choices: tuple[str, ...] | None = None,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
) -> T:
    """A field of a benchmark's options that is also an argument of its command line,
    `--a-name` for the field `a_name`, with the field's default and `help`.

    Args:
        default: the field's default, and the argument's; a bool is a flag (`--a-name`
            sets it), anything else takes a value of the default's type unless `parse`
            says how.
        help: what the argument means, for `--help`.
        at_least: the smallest value allowed (a usage error names the option otherwise).
        choices: the values allowed; a `durability` field takes one of the broker's
            (fsync, os) unless they are given.
        parse: how the argument's text becomes a value (for a default of None).
        metavar: the value's name in `--help`.
    """
    spec = Option(help, at_least, choices, parse, metavar)
    return field(default=default, metadata={Option: spec})


class CommandLine(argparse.ArgumentParser, Generic[T]):
    """The command line of `python -m bench.<module>`, described by its docstring's first
    paragraph: `--json [PATH]` (stdout without a path), `--smoke`, and an argument for
    each field of the options dataclass `options` declared with `option` (only those in
    `names`, when some are named). A benchmark adds its other arguments as to any parser,
    then `read`s it, and ends with `conclude`."""

    def __init__(self, module: str, doc: str | None, options: type[T], *names: str) -> None:
        description = (doc or "").split("\n\n")[0]
        super().__init__(prog=f"python -m bench.{module}", description=description)
        self.benchmark = module
        self.options = options
        self.minimums: dict[str, int] = {}
        for f in fields(options):  # type: ignore[arg-type]
            spec = f.metadata.get(Option)
            if spec is None or (names and f.name not in names):
                continue
            self._add_option(f.name, f.default, spec)
        self.add_argument(
            "--json",
            nargs="?",
            const="-",
            metavar="PATH",
            help="also write the results as JSON (to PATH, or to stdout without one)",
        )

    def _add_option(self, name: str, default: Any, spec: Option) -> None:
        flag = f"--{name.replace('_', '-')}"
        if spec.at_least is not None:
            self.minimums[name] = spec.at_least
        choices = spec.choices or (("fsync", "os") if name == "durability" else None)
        if isinstance(default, bool):
            self.add_argument(flag, action="store_true", help=spec.help)
        elif choices is not None:
            self.add_argument(flag, choices=choices, default=default, help=spec.help)
        else:
            parse = spec.parse or type(default)
            self.add_argument(
                flag, type=parse, default=default, help=spec.help, metavar=spec.metavar
            )

    def read(
        self, argv: list[str] | None, smoke: dict[str, Any], *counts: str, **least: int
    ) -> tuple[argparse.Namespace, T]:
        """The arguments (see `parse_args`: `smoke`, and `counts` and `least` for the
        arguments the benchmark added itself; its options hold their own minimums), and
        the options dataclass of every field they name (the rest keep their defaults)."""
        args = parse_args(self, argv, smoke, *counts, **self.minimums, **least)
        named = [f.name for f in fields(self.options) if hasattr(args, f.name)]  # type: ignore[arg-type]
        return args, self.options(**{name: getattr(args, name) for name in named})

    def conclude(self, args: argparse.Namespace, options: T, met: bool, /, **results: Any) -> int:
        """The benchmark's end: the results as JSON where `--json` asks, and its exit
        status: 0 when its targets are met (or in smoke mode, where they are not judged),
        else 1."""
        if args.json:
            write_json(args.json, self.benchmark, options, **results)
        return 0 if met or args.smoke else 1


def parse_args(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    smoke: dict[str, Any],
    *counts: str,
    **least: int,
) -> argparse.Namespace:
    """The benchmark's command line, with `--smoke`: then the options in `smoke` (by
    their destinations) replace the defaults; options given still win.

    The options named in `counts` (by destination) must be at least 1, and each named in
    `least` at least its value there: the first that is not stops the run with a usage
    error that names it (exit status 2)."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, seconds: does it still run? (figures mean nothing; targets not judged)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args(argv)
    for name, minimum in {**dict.fromkeys(counts, 1), **least}.items():
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}")
    return args


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


async def in_one_round_trip(conn: client.Connection, statement: Awaitable[T]) -> T:
    """`statement` (a call on `conn` not yet awaited) in a transaction of its own, BEGIN,
    it and COMMIT written together: the broker runs them in order, so the transaction
    costs one round trip instead of three; returns the statement's answer once the
    commit's has come."""
    begin = asyncio.ensure_future(conn.begin_transaction())
    answer = asyncio.ensure_future(statement)
    commit = asyncio.ensure_future(conn.commit())
    await begin
    result = await answer
    await commit
    return result


async def pipelined(
    calls: Iterable[Awaitable[T]], in_flight: int, deadline: float, what: str
) -> list[T]:
    """Await `calls` with at most `in_flight` of them outstanding (each started as it is
    taken, the oldest awaited first): their results, in order. BenchFailure, naming `what`,
    when one is not answered by `deadline` (a time.monotonic())."""
    results: list[T] = []
    pending: deque[asyncio.Future[T]] = deque()

    async def oldest() -> None:
        left = max(0.0, deadline - time.monotonic())
        try:
            results.append(await asyncio.wait_for(pending.popleft(), left))
        except TimeoutError:
            raise BenchFailure(f"{what}: not done by the deadline") from None

    for call in calls:
        pending.append(asyncio.ensure_future(call))
        if len(pending) >= in_flight:
            await oldest()
    while pending:
        await oldest()
    return results


@dataclass(eq=False)
class Watchdog:
    """A consumer's limits while it takes `total` messages, from `started` (a
    time.monotonic()): all of them within `phase_timeout` seconds, and never `idle_timeout`
    seconds without one. `check` fails the run (BenchFailure, naming `who`) once either is
    passed; `heard` notes that messages came."""

    who: str
    total: int
    started: float
    phase_timeout: float
    idle_timeout: float
    last_message: float = field(init=False)

    def __post_init__(self) -> None:
        self.last_message = self.started

    def check(self, count: int) -> None:
        """Fail the run if the limits are passed with `count` messages taken."""
        now = time.monotonic()
        if now - self.started > self.phase_timeout:
            raise BenchFailure(
                f"{self.who}: only {count} of {self.total} after {self.phase_timeout:g} s"
            )
        if now - self.last_message > self.idle_timeout:
            raise BenchFailure(
                f"{self.who}: no message for {self.idle_timeout:g} s with {count} of"
                f" {self.total} received (messages lost or stuck in the queue)"
            )

    def heard(self) -> float:
        """Messages came now; returns the time (a time.monotonic())."""
        self.last_message = time.monotonic()
        return self.last_message


# a worker process's work: a module-level coroutine function (a spawned process finds it by
# name), called with its arguments and then (go, results): it puts (role, "ready") on
# `results` once set up, waits for the event `go`, and returns its outcome
Work = Callable[..., Coroutine[Any, Any, dict[str, Any]]]
Outcomes = dict[str, dict[str, Any]]  # what each worker process reported, by role


def _worker(role: str, work: Work, args: tuple[Any, ...], go: Any, results: Any) -> None:
    try:
        results.put((role, run(work(*args, go, results))))
    except BaseException:
        results.put((role, {"error": traceback.format_exc()}))


class Workers:
    """Worker processes, one a role, each running its `work[role]`, (function, arguments):
    started on entering the context, reaped on leaving it, released together once each is
    ready. `released_together` is the usual use; a benchmark that does something between
    their readiness and their release, or samples while they run, takes the steps itself:
    `ready()`, `release()`, then `reported(limit)` or `finish(limit)`.

    A worker that fails, or dies without a word, fails the run at once (BenchFailure, which
    names `name` and the role), and so does one that is not ready within a minute, or not
    done by the limit given.
    """

    def __init__(self, work: Mapping[str, tuple[Work, tuple[Any, ...]]], name: str = "") -> None:
        self.who = f"{name} " if name else ""
        ctx = mp.get_context("spawn")
        self.go = ctx.Event()
        self.results = ctx.Queue()
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(role, function, args, self.go, self.results),
                name=f"bench-{role}",
            )
            for role, (function, args) in work.items()
        ]
        self.outcomes: Outcomes = {}

    def __enter__(self) -> Workers:
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        reap(self.procs)

    def ready(self) -> None:
        """Until every worker has said it is ready."""
        for _ in self.procs:
            role, what = self._next_report(time.monotonic() + 60)
            if what != "ready":
                why = what.get("error", what) if isinstance(what, dict) else what
                raise BenchFailure(f"{self.who}{role} failed before the start: {why}")

    def release(self) -> float:
        """Release them all at once; returns the time of the release."""
        go_time = time.monotonic()
        self.go.set()
        return go_time

    def finish(self, limit: float) -> Outcomes:
        """Until every worker has reported its outcome (by `limit`, a time.monotonic())."""
        while len(self.outcomes) < len(self.procs):
            self._take(*self._next_report(limit))
        return self.outcomes

    def reported(self, limit: float, wait: float = 0.0) -> bool:
        """Take the outcomes reported by now (waiting up to `wait` seconds for one while
        some are missing); whether every worker has reported (it is an error to be still
        waiting at `limit`)."""
        while len(self.outcomes) < len(self.procs):
            if (report := self._report(wait, limit)) is None:
                break
            self._take(*report)
            wait = 0.0
        return len(self.outcomes) == len(self.procs)

    def _take(self, role: str, outcome: dict[str, Any]) -> None:
        if "error" in outcome:
            raise BenchFailure(f"{self.who}{role} failed:\n{outcome['error']}")
        self.outcomes[role] = outcome

    def _next_report(self, limit: float) -> tuple[str, Any]:
        while (report := self._report(0.5, limit)) is None:
            pass
        return report

    def _report(self, wait: float, limit: float) -> tuple[str, Any] | None:
        # poll, so a child that dies without a word fails the run at once
        try:
            return self.results.get(timeout=wait)  # type: ignore[no-any-return]
        except queue.Empty:
            pass
        dead = [
            p
            for p in self.procs
            if p.exitcode is not None and p.name.removeprefix("bench-") not in self.outcomes
        ]
        if dead and self.results.empty():
            raise BenchFailure(f"{self.who}{dead[0].name} exited with code {dead[0].exitcode}")
        if time.monotonic() > limit:
            raise BenchFailure(f"{self.who}timed out waiting for the worker processes")
        return None


def released_together(
    work: Mapping[str, tuple[Work, tuple[Any, ...]]], timeout: float, name: str = ""
) -> tuple[float, Outcomes]:
    """Run each role's `work[role]`, (function, arguments), in a process of its own (see
    `Workers`), all released together once each is ready; returns (the time of the
    release, the outcomes). A worker not done within `timeout` + 30 seconds of the release
    fails the run."""
    with Workers(work, name) as workers:
        workers.ready()
        go_time = workers.release()
        return go_time, workers.finish(go_time + timeout + 30)


async def started_together(role: str, go: Any, ready: Any, timeout: float) -> float:
    """A worker's side of `released_together`: say `role` is ready (on the queue `ready`),
    wait for the release `go` (which every worker hears at once) and return the time it
    came at; BenchFailure when none comes within `timeout` seconds."""
    ready.put((role, "ready"))
    if not await asyncio.get_running_loop().run_in_executor(None, go.wait, timeout):
        raise BenchFailure(f"{role}: never told to start")
    return time.monotonic()


def reap(processes: Iterable[multiprocessing.process.BaseProcess]) -> None:
    """Wait for the benchmark's worker processes to end (ten seconds each), killing any
    that does not."""
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


@contextlib.contextmanager
def broker(
    durability: str,
    config: dict[str, Any] | None = None,
    keep: bool = False,
    stop_timeout: float = 30.0,
    store: str | None = None,
) -> Iterator[BrokerProcess]:
    """A fresh daemon on free ports in a temp data dir, with `config` (and `store`, a
    PostgreSQL database URL, as its store); stopped (and removed) on exit."""
    root = Path(tempfile.mkdtemp(prefix=f"ssb-bench-{durability}-"))
    process = BrokerProcess(root / "data", durability=durability, config=config or None)
    process.store = store
    try:
        process.start()
        yield process
    except BaseException:
        exit_code = process.proc.poll() if process.proc is not None else None
        print(
            f"benchmark failed; daemon exit code {exit_code}; daemon log tail:\n"
            f"{process.log_text()[-3000:]}",
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


@contextlib.contextmanager
def postgres_databases() -> Iterator[Callable[[], str]]:
    """A PostgreSQL server for this run (on 127.0.0.1, in a temp dir, as the tests start
    theirs: tests/pg_server.py), stopped and removed on exit; yields the function that
    makes a new database on it and returns its URL."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from pg_server import PostgresServer, fresh_database

    root = Path(tempfile.mkdtemp(prefix="ssb-bench-postgres-"))
    server = PostgresServer(root).start()
    try:
        yield lambda: fresh_database(server.url)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(fraction * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def cpu_seconds(*pids: int) -> float | None:
    """User + system CPU time of processes so far, summed (Linux /proc; None elsewhere, or
    when one of them is gone).

    Less sensitive than wall time to other load on the machine: a benchmark can
    report the daemon's CPU cost per message next to its throughput.
    """
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def cpu_meter(*pids: int) -> Callable[[int], float | None]:
    """Start measuring the CPU time of processes `pids` (the daemons); the function
    returned gives the time spent since, in microseconds per item of a count (None where
    /proc cannot say, or of no items)."""
    before = cpu_seconds(*pids)

    def per(count: int) -> float | None:
        after = cpu_seconds(*pids)
        if before is None or after is None or count < 1:
            return None
        return (after - before) * 1e6 / count

    return per


def print_header(header: str) -> None:
    """A table's header line, underlined."""
    print(header)
    print("-" * len(header))


def figure_table(width: int, target_width: int) -> Callable[..., None]:
    """Print the head of a table of figures (name, value, the target it is held to, met or
    not), and return the function that prints one line of it."""
    print_header(f"{'figure':<{width}} {'value':>14} {'target':>{target_width}} {'met':>4}")

    def line(name: str, value: str, target: str = "", met: bool | None = None) -> None:
        flag = "" if met is None else ("yes" if met else "NO")
        print(f"{name:<{width}} {value:>14} {target:>{target_width}} {flag:>4}")

    return line


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
