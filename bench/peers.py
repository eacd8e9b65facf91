"""ssb beside other brokers, on one workload, in one run: end-to-end persistent messaging.

The workload is bench.e2e's end-to-end phase: a producer process and a consumer process
start together; the producer sends N persistent messages of 1 KiB, a window of them in
flight, each acknowledged only once durable (ssb: `send_many` batches, each one durable
statement; RabbitMQ: publisher confirms); the consumer takes them in batches and
acknowledges each batch (ssb: RECEIVE in a transaction, then COMMIT; RabbitMQ: a
prefetch window, acked in batches). The figure is messages per second from the start
until the consumer has taken the last one; every message is checked to arrive once.

Each system ("peer") runs in turn on 127.0.0.1, started by this run as a child process
in a temp directory and stopped at the end: ssb on its SQLite store and on PostgreSQL (a
server this run starts, as the tests do), and RabbitMQ from Debian's `rabbitmq-server`
package if it is installed (never as a system service; its Python client is aio-pika,
in the `bench` extra). A peer that is not installed is skipped with a line saying so
(in `--smoke` mode too; nothing is ever downloaded), and a ratio that needs it is not
judged. Printed: each peer's rate and daemon CPU per message, and the ratios the issue
sets targets for: ssb on PostgreSQL at least 2x RabbitMQ persistent with confirms, and
at least 0.5x ssb on SQLite.

Adding a peer (say NATS JetStream): a class with `name`, `missing()` (why it cannot run
here, or None), `running()` (a context that starts it and yields a `Target`) and
`end_to_end(target, opts)`, and an entry in PEERS.

Run from the repository root:

    python -m bench.peers                        # 50,000 messages, every peer installed
    python -m bench.peers --peers ssb-postgresql,rabbitmq --messages 20000 --json out.json
    python -m bench.peers --smoke                # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, Protocol

from ssb import tools

from . import e2e
from ._common import (
    BenchFailure,
    broker,
    conclude,
    cpu_meter,
    options_from,
    parse_args,
    postgres_databases,
    print_header,
    rate,
    run,
)

SMOKE = {"messages": 400, "batch": 50}
TARGET_OVER_RABBITMQ: Final = 2.0  # ssb on PostgreSQL / RabbitMQ persistent with confirms
TARGET_OVER_SQLITE: Final = e2e.POSTGRESQL_TARGET
RABBITMQ_SERVER: Final = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
START_TIMEOUT: Final = 90.0  # seconds a peer may take to start


@dataclass
class Options:
    messages: int = 50_000
    batch: int = 100
    body_size: int = 1024
    in_flight: int = 4  # batches (ssb) or windows of `batch` messages (RabbitMQ) in flight
    durability: str = "fsync"
    phase_timeout: float = 600.0


@dataclass
class Result:
    peer: str
    messages: int = 0
    seconds: float = 0.0
    msgs_s: float = 0.0
    daemon_cpu_us: float | None = None
    skipped: str = ""  # why the peer did not run


@dataclass
class Target:
    """A running peer: where its clients connect, and its server processes."""

    url: str
    pids: list[int] = field(default_factory=list)


class Peer(Protocol):
    name: str

    def missing(self) -> str | None: ...

    def running(self, opts: Options) -> contextlib.AbstractContextManager[Target]: ...

    def end_to_end(self, target: Target, opts: Options) -> tuple[float, int]:
        """(seconds, messages) of the end-to-end run."""
        ...


# ---- ssb -----------------------------------------------------------------------------------


class Ssb:
    """ssb, on its SQLite store or on PostgreSQL (a database on a server of this run)."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.name = f"ssb-{store}"
        self._databases: contextlib.ExitStack | None = None

    def missing(self) -> str | None:
        if self.store == "postgresql" and not (
            shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        ):
            return "PostgreSQL (initdb) is not installed"
        return None

    @contextlib.contextmanager
    def running(self, opts: Options) -> Iterator[Target]:
        with contextlib.ExitStack() as stack:
            database = None
            if self.store == "postgresql":
                database = stack.enter_context(postgres_databases())()
            daemon = stack.enter_context(broker(opts.durability, store=database))
            run(e2e.CATALOG.create(daemon.url))
            yield Target(daemon.url, [daemon.pid])

    def end_to_end(self, target: Target, opts: Options) -> tuple[float, int]:
        e2e_opts = e2e.Options(
            messages=opts.messages,
            batch=opts.batch,
            body_size=opts.body_size,
            in_flight=opts.in_flight,
            phase_timeout=opts.phase_timeout,
        )
        go, out = e2e.run_processes(target.url, e2e.PHASE_E2E, ["consumer", "producer"], e2e_opts)
        return out["consumer"]["finished"] - go, int(out["consumer"]["received"])


# ---- RabbitMQ ------------------------------------------------------------------------------

QUEUE: Final = "ssb-bench"


class RabbitMQ:
    """Debian's rabbitmq-server, as a child process with everything in a temp directory."""

    name = "rabbitmq"
    env_keys: ClassVar[tuple[str, ...]] = ()

    def missing(self) -> str | None:
        if not RABBITMQ_SERVER.exists():
            return "Debian's rabbitmq-server is not installed (apt-get install rabbitmq-server)"
        try:
            import aio_pika  # noqa: F401
        except ImportError:
            return "its client aio-pika is not installed (pip install -e '.[bench]')"
        return None

    @contextlib.contextmanager
    def running(self, opts: Options) -> Iterator[Target]:
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
            _wait_for_port(port, proc, root)
            server = int((root / "rabbitmq.pid").read_text().split()[0])
            run(_declare_queue(url))
            yield Target(url, [server])
        finally:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.kill(server, signal.SIGTERM)  # the VM stops cleanly on SIGTERM
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            epmd_binary = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [epmd_binary, "-kill"], env=env, capture_output=True, timeout=10
                )  # the port mapper this server started, on its own port
            shutil.rmtree(root, ignore_errors=True)

    def end_to_end(self, target: Target, opts: Options) -> tuple[float, int]:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        go = ctx.Event()
        roles = ["consumer", "producer"]
        procs = [
            ctx.Process(target=_rabbit_child, args=(role, target.url, opts, go, results))
            for role in roles
        ]
        for p in procs:
            p.start()
        try:
            outcomes: dict[str, dict[str, Any]] = {}
            ready = 0
            while ready < len(roles):
                role, what = results.get(timeout=60)
                if what != "ready":
                    raise BenchFailure(f"rabbitmq {role} failed before the start: {what}")
                ready += 1
            started = time.monotonic()
            go.set()
            while len(outcomes) < len(roles):
                role, outcome = results.get(timeout=opts.phase_timeout + 30)
                if "error" in outcome:
                    raise BenchFailure(f"rabbitmq {role} failed:\n{outcome['error']}")
                outcomes[role] = outcome
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
        return outcomes["consumer"]["finished"] - started, int(outcomes["consumer"]["received"])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], root: Path) -> None:
    """Until the server accepts connections on `port` and has written its pid file."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            text = (root / "server.out").read_text(errors="replace")[-3000:]
            raise BenchFailure(f"rabbitmq-server exited with {proc.returncode}:\n{text}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            if (root / "rabbitmq.pid").read_text().strip():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchFailure(f"rabbitmq-server did not listen within {START_TIMEOUT:g} s")
        time.sleep(0.2)


async def _declare_queue(url: str) -> None:
    import aio_pika

    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        await channel.declare_queue(QUEUE, durable=True)


def _rabbit_child(role: str, url: str, opts: Options, go: Any, results: Any) -> None:
    try:
        work = _rabbit_produce if role == "producer" else _rabbit_consume
        results.put((role, run(work(url, opts, go, results, role))))
    except BaseException:
        results.put((role, {"error": traceback.format_exc()}))


async def _rabbit_produce(
    url: str, opts: Options, go: Any, results: Any, role: str
) -> dict[str, Any]:
    """Publish persistent messages with publisher confirms, `in_flight` windows of
    `batch` unconfirmed at most."""
    import aio_pika

    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        pad = b"p" * max(0, opts.body_size - e2e.TAG.size)
        window = opts.batch * opts.in_flight
        results.put((role, "ready"))
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 60)
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
    url: str, opts: Options, go: Any, results: Any, role: str
) -> dict[str, Any]:
    """Take every message, acknowledging each batch of `batch` at once."""
    import aio_pika

    seen = bytearray(opts.messages)
    count = 0
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=opts.batch * 2)
        queue = await channel.declare_queue(QUEUE, durable=True)
        results.put((role, "ready"))
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 60)
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
}


def measure(peer: Peer, opts: Options) -> Result:
    result = Result(peer=peer.name)
    why = peer.missing()
    if why is not None:
        result.skipped = why
        print(f"[{peer.name}] skipped: {why}", flush=True)
        return result
    print(f"[{peer.name}] end to end: {opts.messages} messages ...", flush=True)
    with peer.running(opts) as target:
        cpu = cpu_meter(*target.pids)
        seconds, count = peer.end_to_end(target, opts)
        result.daemon_cpu_us = cpu(count)
    if count != opts.messages:
        raise BenchFailure(f"{peer.name}: {count} of {opts.messages} messages arrived")
    result.messages, result.seconds = count, seconds
    result.msgs_s = rate(count, seconds)
    return result


def ratios(results: list[Result]) -> list[tuple[str, float | None, float]]:
    """(what, ratio or None when a side did not run, target)."""
    by = {r.peer: r for r in results if not r.skipped}

    def over(top: str, bottom: str) -> float | None:
        if top not in by or bottom not in by or by[bottom].msgs_s <= 0:
            return None
        return by[top].msgs_s / by[bottom].msgs_s

    return [
        ("ssb-postgresql / rabbitmq", over("ssb-postgresql", "rabbitmq"), TARGET_OVER_RABBITMQ),
        ("ssb-postgresql / ssb-sqlite", over("ssb-postgresql", "ssb-sqlite"), TARGET_OVER_SQLITE),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=Options.messages)
    parser.add_argument("--batch", type=int, default=Options.batch)
    parser.add_argument("--body-size", type=int, default=Options.body_size)
    parser.add_argument("--in-flight", type=int, default=Options.in_flight)
    parser.add_argument("--durability", choices=["fsync", "os"], default=Options.durability)
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"which, comma-separated: {', '.join(PEERS)}"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parse_args(parser, argv, SMOKE)
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    if min(args.messages, args.batch, args.in_flight) < 1 or args.body_size < e2e.TAG.size:
        parser.error("--messages, --batch and --in-flight must be >= 1, --body-size >= 12")
    opts = options_from(Options, args)
    results = [measure(PEERS[name], opts) for name in names]
    print()
    print(
        f"{opts.messages} persistent messages of {opts.body_size} B end to end, batches of"
        f" {opts.batch}, {opts.in_flight} in flight, durability {opts.durability},"
        f" {os.cpu_count()} CPUs"
    )
    print_header(f"{'peer':<16} {'msg/s':>10} {'cpu us/msg':>11}  note")
    for r in results:
        cpu = "n/a" if r.daemon_cpu_us is None else f"{r.daemon_cpu_us:.1f}"
        note = f"skipped: {r.skipped}" if r.skipped else ""
        print(f"{r.peer:<16} {r.msgs_s:>10,.0f} {cpu:>11}  {note}")
    met = True
    for what, value, target in ratios(results):
        if value is None:
            print(f"{what}: not measured (a side was skipped)")
            continue
        met = met and value >= target
        print(f"{what} (same run): {value:.2f}x (target >= {target:g})")
    return conclude(args, "peers", opts, met, results=[asdict(r) for r in results])


if __name__ == "__main__":
    sys.exit(main())
