"""ssb beside other brokers, in one run: end-to-end persistent messaging and the round trip
of one message at a time.

End to end is bench.e2e's end-to-end phase: a producer process and a consumer process
start together; the producer sends N persistent messages of 1 KiB, a window of them in
flight, each acknowledged only once stored (ssb: `send_many` batches, each one durable
statement; RabbitMQ: publisher confirms; JetStream: a PubAck per message); the consumer
takes them in batches and acknowledges each batch (ssb: RECEIVE in a transaction, then
COMMIT; RabbitMQ: a prefetch window, acked in batches; JetStream: a pull consumer's
fetched batches, each batch's acks written together and the last one waited for). The
figure is messages per second from the start until the consumer has taken the last one;
every message is checked to arrive once.
The round trip is one message at a time: sent and acknowledged once stored, then taken
and acknowledged (ssb: SEND, then BEGIN, RECEIVE TOP 1, COMMIT, as bench.e2e's latency
phase; JetStream: publish with its PubAck, fetch 1, ack_sync); its median and p99.

Each system ("peer") runs in turn on 127.0.0.1, started by this run as a child process
in a temp directory and stopped at the end: ssb on its SQLite store and on PostgreSQL (a
server this run starts, as the tests do), at each durability asked for; RabbitMQ from
Debian's `rabbitmq-server` package (its confirms follow an fsync) and NATS JetStream from
Debian's `nats-server` (its file store acknowledges what is written to the OS, as ssb's
durability "os"), if installed, never as system services; their Python clients,
aio-pika and nats-py, are in the `bench` extra. A peer that is not installed is skipped
with a line saying so (in `--smoke` mode too; nothing is ever downloaded), and a ratio
that needs it is not judged. Printed: each peer's rate, daemon CPU per message and round
trip, and the ratios the issues set targets for: ssb on PostgreSQL at least 2x RabbitMQ
persistent with confirms, and at least 0.5x ssb on SQLite (fsync); ssb on SQLite end to
end at least 1.5x JetStream, and its round trip's median at most 0.9x JetStream's (os).

Adding a peer: a class with `name`, `missing()` (why it cannot run here, or None),
`durabilities(opts)`, `running(opts, durability)` (a context that starts it and yields a
`Target`), `end_to_end(target, opts)` and `round_trip(target, opts)` (see `_peer.Peer`),
and an entry in PEERS.

Run from the repository root:

    python -m bench.peers                        # 50,000 messages, every peer installed
    python -m bench.peers --peers ssb-sqlite,jetstream --durability os
    python -m bench.peers --peers ssb-postgresql,rabbitmq --messages 20000 --json out.json
    python -m bench.peers --smoke                # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Final

from ssb import tools

from . import e2e
from ._common import (
    BenchFailure,
    CommandLine,
    broker,
    cpu_meter,
    percentile,
    postgres_databases,
    print_header,
    rate,
    run,
    started_together,
)
from ._jetstream import JetStream
from ._peer import (
    Options,
    Peer,
    Target,
    not_installed,
    stop_server,
    two_processes,
    wait_for_port,
)

SMOKE = {"messages": 400, "batch": 50, "round_trips": 20, "round_trip_warmup": 5, "rounds": 1}
ROUND_TRIP_TURN: Final = 200  # round trips of one peer before the next one's turn
TARGET_OVER_RABBITMQ: Final = 2.0  # ssb on PostgreSQL / RabbitMQ persistent with confirms
TARGET_OVER_SQLITE: Final = e2e.POSTGRESQL_TARGET
TARGET_OVER_JETSTREAM: Final = 1.5  # ssb on SQLite end to end / JetStream (os)
TARGET_ROUND_TRIP: Final = 0.9  # ssb on SQLite's round trip median / JetStream's, at most
RABBITMQ_SERVER: Final = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


@dataclass
class Result:
    peer: str
    durability: str = ""
    messages: int = 0
    seconds: float = 0.0
    msgs_s: float = 0.0
    daemon_cpu_us: float | None = None
    round_trip_p50_us: float | None = None
    round_trip_p99_us: float | None = None
    skipped: str = ""  # why the peer did not run


# ---- ssb -----------------------------------------------------------------------------------


class Ssb:
    """ssb, on its SQLite store or on PostgreSQL (a database on a server of this run)."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.name = f"ssb-{store}"

    def missing(self) -> str | None:
        if self.store == "postgresql" and not (
            shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        ):
            return "PostgreSQL (initdb) is not installed"
        return None

    def durabilities(self, opts: Options) -> list[str]:
        return ["fsync", "os"] if opts.durability == "both" else [opts.durability]

    @contextlib.contextmanager
    def running(self, opts: Options, durability: str) -> Iterator[Target]:
        with contextlib.ExitStack() as stack:
            database = None
            if self.store == "postgresql":
                database = stack.enter_context(postgres_databases())()
            daemon = stack.enter_context(broker(durability, store=database))
            run(e2e.CATALOG.create(daemon.url))
            yield Target(daemon.url, [daemon.pid])

    def end_to_end(self, target: Target, opts: Options) -> tuple[float, int]:
        go, out = e2e.run_processes(
            target.url, e2e.PHASE_E2E, ["consumer", "producer"], self._e2e_options(opts)
        )
        return out["consumer"]["finished"] - go, int(out["consumer"]["received"])

    def round_trip(self, target: Target, opts: Options) -> list[float] | None:
        return run(e2e.latency(target.url, self._e2e_options(opts)))

    def _e2e_options(self, opts: Options) -> e2e.Options:
        return e2e.Options(
            messages=opts.messages,
            batch=opts.batch,
            body_size=opts.body_size,
            in_flight=opts.in_flight,
            latency_iterations=opts.round_trips,
            latency_warmup=opts.round_trip_warmup,
            phase_timeout=opts.phase_timeout,
        )


# ---- RabbitMQ ------------------------------------------------------------------------------

QUEUE: Final = "ssb-bench"


class RabbitMQ:
    """Debian's rabbitmq-server, as a child process with everything in a temp directory."""

    name = "rabbitmq"
    env_keys: ClassVar[tuple[str, ...]] = ()

    def missing(self) -> str | None:
        return not_installed(RABBITMQ_SERVER, "rabbitmq-server", "aio_pika", "aio-pika")

    def durabilities(self, opts: Options) -> list[str]:
        return ["fsync"]  # a durable queue's confirm follows an fsync

    @contextlib.contextmanager
    def running(self, opts: Options, durability: str) -> Iterator[Target]:
        root = Path(tempfile.mkdtemp(prefix="ssb-bench-rabbitmq-"))
        port, dist, epmd = tools.free_port(), tools.free_port(), tools.free_port()
        (root / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n"
        )
        (root / "enabled_plugins").write_text("[].\n")
        (root / "rabbitmq-env.conf").write_text("")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(root / "log"),
            "RABBITMQ_PID_FILE": str(root / "rabbitmq.pid"),
            "RABBITMQ_NODENAME": f"ssbbench{os.getpid()}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd),
        }
        log = open(root / "server.out", "wb")  # noqa: SIM115 - the child's
        proc = subprocess.Popen(
            [str(RABBITMQ_SERVER)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root
        )
        log.close()
        url = f"amqp://guest:guest@127.0.0.1:{port}/"
        server = proc.pid  # until the Erlang VM's own pid is known
        try:
            wait_for_port(
                "rabbitmq-server", port, proc, root / "server.out", _pid_file(root).exists
            )
            server = int(_pid_file(root).read_text().split()[0])
            run(_declare_queue(url))
            yield Target(url, [server])
        finally:
            # the Erlang VM stops cleanly on SIGTERM
            stop_server(proc, 60, lambda: os.kill(server, signal.SIGTERM))
            epmd_binary = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [epmd_binary, "-kill"], env=env, capture_output=True, timeout=10
                )  # the port mapper this server started, on its own port
            shutil.rmtree(root, ignore_errors=True)

    def end_to_end(self, target: Target, opts: Options) -> tuple[float, int]:
        work = {"producer": _rabbit_produce, "consumer": _rabbit_consume}
        return two_processes(self.name, work, target.url, opts)

    def round_trip(self, target: Target, opts: Options) -> list[float] | None:
        return None  # no target is set against RabbitMQ's


def _pid_file(root: Path) -> Path:
    return root / "rabbitmq.pid"


async def _declare_queue(url: str) -> None:
    import aio_pika

    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        await channel.declare_queue(QUEUE, durable=True)


async def _rabbit_produce(
    role: str, url: str, opts: Options, go: Any, results: Any
) -> dict[str, Any]:
    """Publish persistent messages with publisher confirms, `in_flight` windows of
    `batch` unconfirmed at most."""
    import aio_pika

    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        pad = b"p" * max(0, opts.body_size - e2e.TAG.size)
        window = opts.batch * opts.in_flight
        await started_together(role, go, results, 60)
        pending: set[asyncio.Future[Any]] = set()
        for i in range(opts.messages):
            message = aio_pika.Message(
                e2e.body(e2e.PHASE_E2E, i, pad), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )
            pending.add(asyncio.ensure_future(exchange.publish(message, routing_key=QUEUE)))
            if len(pending) >= window:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    future.result()  # a nack raises
        if pending:
            for future in asyncio.as_completed(pending):
                await future
    return {"sent": opts.messages}


async def _rabbit_consume(
    role: str, url: str, opts: Options, go: Any, results: Any
) -> dict[str, Any]:
    """Take every message, acknowledging each batch of `batch` at once."""
    import aio_pika

    seen = bytearray(opts.messages)
    count = 0
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=opts.batch * 2)
        queue = await channel.declare_queue(QUEUE, durable=True)
        await started_together(role, go, results, 60)
        deadline = time.monotonic() + opts.phase_timeout
        unacked = 0
        async with queue.iterator() as messages:
            async for message in messages:
                phase, index = e2e.TAG.unpack_from(message.body)
                if phase != e2e.PHASE_E2E or index >= opts.messages or seen[index]:
                    raise BenchFailure(f"consumer: message {index} foreign or twice")
                seen[index] = 1
                count += 1
                unacked += 1
                if unacked >= opts.batch or count == opts.messages:
                    await message.ack(multiple=True)
                    unacked = 0
                if count == opts.messages:
                    break
                if time.monotonic() > deadline:
                    raise BenchFailure(f"consumer: {count} of {opts.messages} in time")
    return {"received": count, "finished": time.monotonic()}


# ---- the run -------------------------------------------------------------------------------

PEERS: Final[dict[str, Peer]] = {
    "ssb-sqlite": Ssb("sqlite"),
    "ssb-postgresql": Ssb("postgresql"),
    "rabbitmq": RabbitMQ(),
    "jetstream": JetStream(),
}


@dataclass
class _Running:
    """A peer running at one durability, and what it measured so far."""

    peer: Peer
    target: Target
    result: Result
    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    samples: list[float] = field(default_factory=list)


def measure(peers: list[Peer], opts: Options) -> list[Result]:
    """Every peer's figures at each of its durabilities (one result saying why, for a
    peer that is skipped). The peers run at once; the end-to-end runs take turns, peer
    after peer, `rounds` times (the median counts), and the round trips are measured in
    turns of ROUND_TRIP_TURN, so that a change of load on the machine weighs on every
    peer alike and the ratios of one run hold."""
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        running: list[_Running] = []
        for peer in peers:
            why = peer.missing()
            if why is not None:
                print(f"[{peer.name}] skipped: {why}", flush=True)
                results.append(Result(peer=peer.name, skipped=why))
                continue
            for durability in peer.durabilities(opts):
                print(f"[{peer.name} {durability}] starting ...", flush=True)
                target = stack.enter_context(peer.running(opts, durability))
                result = Result(peer=peer.name, durability=durability)
                results.append(result)
                running.append(_Running(peer, target, result))
        for turn in range(opts.rounds):
            for r in running:
                label = f"{r.peer.name} {r.result.durability}"
                print(f"[{label}] end to end {turn + 1}/{opts.rounds} ...", flush=True)
                cpu = cpu_meter(*r.target.pids)
                seconds, count = r.peer.end_to_end(r.target, opts)
                if count != opts.messages:
                    raise BenchFailure(f"{label}: {count} of {opts.messages} messages arrived")
                r.rates.append(rate(count, seconds))
                used = cpu(count)
                if used is not None:
                    r.cpu.append(used)
        print(f"round trips: {opts.round_trips} per peer, in turns ...", flush=True)
        done = 0
        while done < opts.round_trips:
            chunk = replace(opts, round_trips=min(ROUND_TRIP_TURN, opts.round_trips - done))
            for r in running:
                samples = r.peer.round_trip(r.target, chunk)
                if samples is not None:
                    r.samples += samples
            done += chunk.round_trips
    for r in running:
        r.result.messages = opts.messages
        r.result.msgs_s = statistics.median(r.rates)
        r.result.seconds = opts.messages / r.result.msgs_s
        r.result.daemon_cpu_us = statistics.median(r.cpu) if r.cpu else None
        if r.samples:
            r.samples.sort()
            r.result.round_trip_p50_us = percentile(r.samples, 0.50)
            r.result.round_trip_p99_us = percentile(r.samples, 0.99)
    return results


# a ratio the issues set: (what, ratio or None when a side did not run, target, whether
# the ratio must be at least the target, rather than at most)
Ratio = tuple[str, float | None, float, bool]


def ratios(results: list[Result]) -> list[Ratio]:
    by = {(r.peer, r.durability): r for r in results if not r.skipped}

    def over(top: tuple[str, str], bottom: tuple[str, str], figure: str) -> float | None:
        a, b = by.get(top), by.get(bottom)
        if a is None or b is None:
            return None
        x, y = getattr(a, figure), getattr(b, figure)
        return None if x is None or not y else float(x / y)

    pg, lite = ("ssb-postgresql", "fsync"), ("ssb-sqlite", "fsync")
    lite_os, jetstream = ("ssb-sqlite", "os"), ("jetstream", "os")
    return [
        (
            "ssb-postgresql / rabbitmq, end to end (fsync)",
            over(pg, ("rabbitmq", "fsync"), "msgs_s"),
            TARGET_OVER_RABBITMQ,
            True,
        ),
        (
            "ssb-postgresql / ssb-sqlite, end to end (fsync)",
            over(pg, lite, "msgs_s"),
            TARGET_OVER_SQLITE,
            True,
        ),
        (
            "ssb-sqlite / jetstream, end to end (os)",
            over(lite_os, jetstream, "msgs_s"),
            TARGET_OVER_JETSTREAM,
            True,
        ),
        (
            "ssb-sqlite / jetstream, round trip p50 (os)",
            over(lite_os, jetstream, "round_trip_p50_us"),
            TARGET_ROUND_TRIP,
            False,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("peers", __doc__, Options)
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"which, comma-separated: {', '.join(PEERS)}"
    )
    args, opts = parser.read(argv, SMOKE)
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    results = measure([PEERS[name] for name in names], opts)
    print()
    print(
        f"{opts.messages} persistent messages of {opts.body_size} B end to end, batches of"
        f" {opts.batch}, {opts.in_flight} in flight, median of {opts.rounds} runs;"
        f" {opts.round_trips} round trips one at a time; {os.cpu_count()} CPUs"
    )
    print_header(
        f"{'peer':<16} {'durability':<10} {'msg/s':>10} {'cpu us/msg':>11}"
        f" {'rt p50 us':>10} {'rt p99 us':>10}  note"
    )
    for r in results:
        cpu = "n/a" if r.daemon_cpu_us is None else f"{r.daemon_cpu_us:.1f}"
        p50 = "n/a" if r.round_trip_p50_us is None else f"{r.round_trip_p50_us:,.0f}"
        p99 = "n/a" if r.round_trip_p99_us is None else f"{r.round_trip_p99_us:,.0f}"
        note = f"skipped: {r.skipped}" if r.skipped else ""
        print(
            f"{r.peer:<16} {r.durability:<10} {r.msgs_s:>10,.0f} {cpu:>11} {p50:>10} {p99:>10}"
            f"  {note}"
        )
    met = True
    for what, value, target, at_least in ratios(results):
        if value is None:
            print(f"{what}: not measured (a side was skipped)")
            continue
        met = met and (value >= target if at_least else value <= target)
        bound = ">=" if at_least else "<="
        print(f"{what} (same run): {value:.2f}x (target {bound} {target:g})")
    return parser.conclude(args, opts, met, results=[asdict(r) for r in results])


if __name__ == "__main__":
    sys.exit(main())
