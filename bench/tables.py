"""What a table row costs a transaction: RECEIVE of a batch, an INSERT of one row per
message, COMMIT, beside the same RECEIVE and COMMIT alone, in the same run on the same
broker.

  plain       BEGIN, RECEIVE TOP (100), COMMIT: one transaction per batch of 100
              messages.
  statements  the same, with one INSERT statement per message received (its queuing
              order as the row's primary key, its body as a column) before the COMMIT,
              written as a program writes it: `executemany` of the one-row INSERT over
              the messages. The headline figure; target: at most 1.3x plain.
  rows        the same with one INSERT whose VALUES hold the batch's rows (figure only).
  calls       the same with an `execute` request per message, sent without waiting for
              each answer (figure only: each statement is a request of its own).

Every side is a consumer's transaction: BEGIN and RECEIVE written together, then, once
the messages are in, the rest written together (the broker runs a connection's
requests in order) and COMMIT's answer awaited. The rounds alternate between the sides
in one process; each side's time per batch is its median round, and each ratio is the
median of the rounds' own ratios. Beside the times, the daemon's CPU per batch (all its
threads, from Linux's scheduler statistics; less sensitive to other load on the
machine than the times are), each side's mean over its rounds and its ratio to plain's.
The messages are sent beforehand, outside the timing. At the end the table holds one
row per message.

Exit status 1 when the target is missed (not with --smoke, which only checks that the
benchmark runs). All traffic stays on 127.0.0.1.

    python -m bench.tables                 # 20 rounds of 100-message batches per side
    python -m bench.tables --smoke
"""

from __future__ import annotations

import asyncio
import glob
import statistics
import sys
import time
from dataclasses import dataclass

from ssb import client

from ._common import (
    BenchFailure,
    Catalog,
    CommandLine,
    broker,
    option,
    run,
)

CATALOG = Catalog("Tables")
RATIO_TARGET = 1.3
INSERT_ONE = "INSERT INTO Received (queuing_order, body) VALUES (@p1, @p2)"
INSERT_MANY = "INSERT INTO Received (queuing_order, body) VALUES "


@dataclass
class Options:
    batch: int = option(100)
    rounds: int = option(20)
    durability: str = option("fsync")


def _cpu_ns(pid: int) -> int | None:
    """The CPU time process `pid`'s threads have run, in nanoseconds (None where Linux's
    scheduler statistics cannot say)."""
    total = 0
    tasks = glob.glob(f"/proc/{pid}/task/*/schedstat")
    for path in tasks:
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # (a thread that ended meanwhile)
    return total if tasks else None


async def _fill(conn: client.Connection, handle: object, count: int) -> None:
    for first in range(0, count, 500):
        bodies = [b"%08d" % i for i in range(first, min(count, first + 500))]
        await conn.send_many(handle, CATALOG.message_type, bodies)  # type: ignore[arg-type]


async def _batch(conn: client.Connection, batch: int, side: str) -> float:
    """Seconds for one transaction: RECEIVE of `batch` messages, their rows inserted in
    `side`'s form (one of FORMS; "plain": none), COMMIT."""
    started = time.perf_counter()
    begin = asyncio.ensure_future(conn.begin_transaction())
    got = await conn.receive(CATALOG.target_queue, top=batch)
    await begin
    inserts: list[asyncio.Future[client.Result]] = []
    if side == "statements":
        rows = [(m.queuing_order, m.message_body) for m in got]
        inserts = [asyncio.ensure_future(conn.executemany(INSERT_ONE, rows))]
    elif side == "calls":
        inserts = [
            asyncio.ensure_future(conn.execute(INSERT_ONE, m.queuing_order, m.message_body))
            for m in got
        ]
    elif side == "rows":
        values = ", ".join(f"(@p{2 * i + 1}, @p{2 * i + 2})" for i in range(len(got)))
        parameters = [v for m in got for v in (m.queuing_order, m.message_body)]
        inserts = [asyncio.ensure_future(conn.execute(INSERT_MANY + values, *parameters))]
    commit = asyncio.ensure_future(conn.commit())
    for insert in inserts:
        await insert
    await commit
    if len(got) != batch:
        raise BenchFailure(f"received {len(got)} messages of {batch}")
    return time.perf_counter() - started


FORMS = ("statements", "rows", "calls")


async def measure(url: str, options: Options, pid: int = 0) -> dict[str, float]:
    """Each form's median time per batch ("plain" too) and its median ratio to plain
    ("<form>_ratio"); with the daemon's process id, its mean CPU per batch of each side
    ("<side>_cpu") and each form's ratio of it to plain's ("<form>_cpu_ratio")."""
    await CATALOG.create(url)
    async with await client.connect(url) as conn:
        await conn.execute(
            "CREATE TABLE Received (queuing_order BIGINT PRIMARY KEY, body VARBINARY(MAX))"
        )
        handle = await CATALOG.begin_dialog(conn)
        await _fill(conn, handle, (1 + len(FORMS)) * options.rounds * options.batch)
        times: dict[str, list[float]] = {side: [] for side in ("plain", *FORMS)}
        cpu: dict[str, list[int]] = {side: [] for side in times}
        for _ in range(options.rounds):
            for side in times:
                before = _cpu_ns(pid) if pid else None
                times[side].append(await _batch(conn, options.batch, side))
                after = _cpu_ns(pid) if pid else None
                if before is not None and after is not None:
                    cpu[side].append(after - before)
        stored = (await conn.execute("SELECT COUNT(*) FROM Received")).scalar()
        if stored != len(FORMS) * options.rounds * options.batch:
            raise BenchFailure(f"the table holds {stored} rows, not one per message")
        figures = {side: statistics.median(runs) for side, runs in times.items()}
        for form in FORMS:
            figures[f"{form}_ratio"] = statistics.median(
                t / p for t, p in zip(times[form], times["plain"], strict=True)
            )
        if all(len(runs) == options.rounds for runs in cpu.values()):
            for side, runs in cpu.items():
                figures[f"{side}_cpu"] = statistics.mean(runs) / 1e9
            for form in FORMS:
                figures[f"{form}_cpu_ratio"] = figures[f"{form}_cpu"] / figures["plain_cpu"]
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("tables", __doc__, Options)
    args, options = parser.read(argv, {"batch": 10, "rounds": 2})
    with broker(options.durability) as process:
        figures = run(measure(process.url, options, process.pid))
    ratio = figures["statements_ratio"]
    print(
        f"batches of {options.batch} ({options.durability}): RECEIVE + COMMIT"
        f" {figures['plain'] * 1e3:.2f} ms; RECEIVE + an INSERT statement per message"
        f" (executemany) + COMMIT {figures['statements'] * 1e3:.2f} ms, ratio {ratio:.2f}"
        f" (target at most {RATIO_TARGET:.1f}); one INSERT of all the rows"
        f" {figures['rows'] * 1e3:.2f} ms, ratio {figures['rows_ratio']:.2f}; an execute"
        f" request per message {figures['calls'] * 1e3:.2f} ms, ratio"
        f" {figures['calls_ratio']:.2f}"
    )
    if "plain_cpu" in figures:
        print(
            f"the daemon's CPU per batch: RECEIVE + COMMIT {figures['plain_cpu'] * 1e3:.2f} ms;"
            + ";".join(
                f" {form} {figures[f'{form}_cpu'] * 1e3:.2f} ms,"
                f" ratio {figures[f'{form}_cpu_ratio']:.2f}"
                for form in FORMS
            )
        )
    return parser.conclude(
        args,
        options,
        ratio <= RATIO_TARGET,
        **{
            name if name.endswith("_ratio") else f"{name}_ms": (
                value if name.endswith("_ratio") else value * 1e3
            )  # ("<side>_cpu" becomes "<side>_cpu_ms")
            for name, value in figures.items()
        },
    )


if __name__ == "__main__":
    sys.exit(main())
