"""Failover under load: kill -9 of the active daemon, again and again, while work flows.

Two daemons of one broker share a PostgreSQL database (a server this run starts on
127.0.0.1): one serves, the other stands by. A producer process and a consumer process,
both connected with the URL that names both daemons, run every transaction through
`run_transaction`: the producer sends batches of numbered 1 KiB messages over a few
conversations, the consumer receives them in transactions. Meanwhile this process kills
(kill -9) whichever daemon is active, `--kills` times, each once the consumer has made
progress since the last takeover, and starts the killed one again as a standby.

Figures: each kill's takeover time (from the kill until the standby prints its ready
line: it serves), their median and worst, and the run's messages per second. Checks
(the run fails loudly otherwise): every message sent is received exactly once, each
conversation's in order, the queue empty at the end. All traffic stays on 127.0.0.1;
every loop is bounded in count and time.

Run from the repository root:

    python -m bench.failover                  # 10 kills, 20,000 messages
    python -m bench.failover --kills 3 --messages 5000 --json out.json
    python -m bench.failover --smoke           # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ssb import client, tools

from ._common import (
    BenchFailure,
    BrokerProcess,
    Catalog,
    CommandLine,
    Outcomes,
    Work,
    Workers,
    option,
    postgres_databases,
    rate,
    run,
    started_together,
)

CATALOG = Catalog("Failover")
TAG = struct.Struct(">IQ")  # (conversation, its message number) at the start of a body
SMOKE = {"messages": 300, "kills": 2, "batch": 20, "failover_timeout": 2.0}
TARGET_SECONDS = "failover_timeout"  # every takeover within it
STALL_SECONDS = 60.0  # no message received for this long: the run fails, with stacks


@dataclass
class Options:
    messages: int = option(20_000, at_least=1)
    kills: int = option(10, at_least=0)
    batch: int = option(50, at_least=1)
    conversations: int = option(4, at_least=1)
    body_size: int = 1024
    failover_timeout: float = option(5.0)
    durability: str = option("fsync")
    timeout: float = 900.0  # seconds the whole run may take


@dataclass
class Result:
    messages: int
    kills: int
    takeover_seconds: list[float] = field(default_factory=list)
    takeover_median: float = 0.0
    takeover_worst: float = 0.0
    seconds: float = 0.0
    msgs_s: float = 0.0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    target_met: bool = False


# ---- the producer and the consumer (each in its own process) -----------------------------


async def produce(url: str, opts: Options, sent: Any, go: Any, ready: Any) -> dict[str, Any]:
    """Send opts.messages bodies, batch by batch, each batch one run_transaction."""
    _stacks_on_signal("producer")
    async with await client.connect(url, reconnect_deadline=opts.timeout) as conn:

        async def begin(c: client.Connection) -> Any:
            return await CATALOG.begin_dialog(c)

        handles = [await conn.run_transaction(begin) for _ in range(opts.conversations)]
        pad = b"p" * max(0, opts.body_size - TAG.size)
        await started_together("producer", go, ready, opts.timeout)
        numbers = [0] * opts.conversations
        done = 0
        turn = 0
        while done < opts.messages:
            which = turn % opts.conversations
            turn += 1
            count = min(opts.batch, opts.messages - done)
            first = numbers[which]
            bodies = [TAG.pack(which, first + i) + pad for i in range(count)]

            async def send(c: client.Connection, h: Any = handles[which], b: Any = bodies) -> None:
                await c.send_many(h, CATALOG.message_type, b)

            await conn.run_transaction(send, retries=1000)
            numbers[which] += count
            done += count
            sent.value = done
    return {"sent": done, "per_conversation": numbers}


async def consume(url: str, opts: Options, received: Any, go: Any, ready: Any) -> dict[str, Any]:
    """Receive until opts.messages have come, each in a run_transaction; check each."""
    _stacks_on_signal("consumer")
    expected = [0] * opts.conversations
    seen: set[tuple[int, int]] = set()
    duplicated = out_of_order = 0
    count = 0
    async with await client.connect(url, reconnect_deadline=opts.timeout) as conn:

        async def take(c: client.Connection) -> list[client.Message]:
            return await c.receive(CATALOG.target_queue, top=opts.batch, timeout=1.0)

        deadline = await started_together("consumer", go, ready, opts.timeout) + opts.timeout
        while count < opts.messages:
            if time.monotonic() > deadline:
                raise BenchFailure(f"consumer: {count} of {opts.messages} in time")
            for m in await conn.run_transaction(take, retries=1000):
                which, number = TAG.unpack_from(m.message_body)
                if (which, number) in seen:
                    duplicated += 1
                    continue
                seen.add((which, number))
                if number != expected[which]:
                    out_of_order += 1
                expected[which] = number + 1
                count += 1
                received.value = count
        left = await conn.receive(CATALOG.target_queue, top=1, timeout=0)
    return {
        "received": count,
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "left": len(left),
    }


def _print_tasks(role: str) -> None:
    """Where every task waits, on stderr (on SIGUSR1: the run has stalled)."""
    lines = [f"--- {role} (pid {os.getpid()}):"]
    for task in asyncio.all_tasks():
        lines.append(f"task {task.get_name()}:")
        step: Any = task.get_coro()
        while step is not None and hasattr(step, "cr_frame"):  # down the await chain
            frame = step.cr_frame
            if frame is not None:
                lines.append(
                    f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
                )
            step = step.cr_await
        if step is not None:
            lines.append(f"  waits on {step!r}"[:300])
    print("\n".join(lines), file=sys.stderr, flush=True)


def _stacks_on_signal(role: str) -> None:
    """On SIGUSR1, print where every task of this worker waits (see Progress)."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _print_tasks, role)


# ---- the run -------------------------------------------------------------------------------


def _daemon(opts: Options) -> Any:
    def make(data_dir: Path) -> BrokerProcess:
        config = {"failover_timeout": opts.failover_timeout}
        return BrokerProcess(data_dir, durability=opts.durability, config=config)

    return make


@dataclass(eq=False)
class Progress:
    """The producer and the consumer, watched: their outcomes as they come (a failure, or
    a worker's death, is raised at once: see `Workers`), and the consumer's count
    (`counter`: a run that stops moving fails within STALL_SECONDS, with both workers'
    task stacks on stderr, rather than waiting out the run's `deadline`)."""

    workers: Workers
    counter: Any  # the consumer's count of messages received (a shared Value)
    deadline: float  # a time.monotonic()
    seen: int = field(init=False, default=-1)
    moved: float = field(init=False, default_factory=time.monotonic)

    def check(self, waiting_for: str, wait: float = 0.05) -> bool:
        """Take the outcomes that came (waiting up to `wait` seconds for one); whether both
        have come. Raises when a worker failed, or nothing moved for too long."""
        done = self.workers.reported(math.inf, wait)
        now = time.monotonic()
        if self.counter.value != self.seen:
            self.seen, self.moved = self.counter.value, now
        stalled = now - self.moved > STALL_SECONDS
        if stalled or now > self.deadline:
            for p in self.workers.procs:
                if p.exitcode is None and p.pid is not None:
                    os.kill(p.pid, signal.SIGUSR1)
            time.sleep(1.0)  # the stacks reach stderr (a diagnostic's pause, not a wait)
            why = f"nothing received for {STALL_SECONDS:g} s" if stalled else "out of time"
            raise BenchFailure(f"{why}: {self.seen} received, waiting for {waiting_for}")
        return done

    def wait_for(self, at_least: int) -> None:
        """Until the consumer has received `at_least` messages."""
        while self.counter.value < at_least:
            if self.check(f"{at_least} received"):
                raise BenchFailure(
                    f"the producer and the consumer ended with {self.counter.value} received,"
                    f" short of {at_least}"
                )

    def finish(self) -> Outcomes:
        """Both workers' outcomes."""
        while not self.check("the producer's and the consumer's results", wait=1.0):
            pass
        return self.workers.outcomes


def bench(opts: Options, database: str) -> Result:
    result = Result(messages=opts.messages, kills=opts.kills)
    root = Path(tempfile.mkdtemp(prefix="ssb-bench-failover-"))
    pair = tools.DaemonPair(root, database, _daemon(opts))
    try:
        pair.start()
        run(CATALOG.create(pair.url))
        ctx = mp.get_context("spawn")
        sent, received = ctx.Value("q", 0), ctx.Value("q", 0)
        work: dict[str, tuple[Work, tuple[Any, ...]]] = {
            "consumer": (consume, (pair.url, opts, received)),
            "producer": (produce, (pair.url, opts, sent)),
        }
        with Workers(work, "failover") as workers:
            workers.ready()
            started = workers.release()
            progress = Progress(workers, received, started + opts.timeout)
            step = max(1, opts.messages // (opts.kills + 2))
            for kill in range(opts.kills):
                progress.wait_for(min(opts.messages - 1, (kill + 1) * step))
                took = pair.fail_over("kill")
                result.takeover_seconds.append(took)
                print(f"kill {kill + 1}: the standby served after {took:.2f} s", flush=True)
                pair.restart()
            outcomes = progress.finish()
            result.seconds = time.monotonic() - started
    except BaseException:
        for daemon in pair.daemons:
            print(
                f"--- log of {daemon.data_dir.name}:\n{daemon.log_text()[-3000:]}", file=sys.stderr
            )
        raise
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)
    got = outcomes["consumer"]
    result.duplicated = got["duplicated"]
    result.out_of_order = got["out_of_order"]
    result.lost = outcomes["producer"]["sent"] - got["received"] + got["left"]
    result.msgs_s = rate(got["received"], result.seconds)
    takes = result.takeover_seconds
    if takes:
        result.takeover_median = statistics.median(takes)
        result.takeover_worst = max(takes)
    result.target_met = result.takeover_worst <= opts.failover_timeout
    if result.lost or result.duplicated or result.out_of_order or got["left"]:
        raise BenchFailure(
            f"lost {result.lost}, duplicated {result.duplicated}, out of order"
            f" {result.out_of_order}, left in the queue {got['left']}"
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("failover", __doc__, Options)
    args, opts = parser.read(argv, SMOKE)
    with postgres_databases() as database:
        result = bench(opts, database())
    print()
    print(
        f"{result.messages} messages, {result.kills} kills (kill -9 of the active daemon),"
        f" failover_timeout {opts.failover_timeout:g} s, durability {opts.durability}"
    )
    print(
        f"takeover s: median {result.takeover_median:.2f}, worst {result.takeover_worst:.2f}"
        f" (target <= {opts.failover_timeout:g}: {'met' if result.target_met else 'NOT met'})"
    )
    print(f"all: {', '.join(f'{t:.2f}' for t in result.takeover_seconds)}")
    print(
        f"{result.msgs_s:,.0f} msgs/s end to end through the kills; lost {result.lost},"
        f" duplicated {result.duplicated}, out of order {result.out_of_order}"
    )
    return parser.conclude(args, opts, result.target_met, result=asdict(result))


if __name__ == "__main__":
    sys.exit(main())
