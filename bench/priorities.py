"""RECEIVE throughput with many conversation groups over 10 priority levels vs one level.

The issue: "RECEIVE throughput with 10,000 conversation groups spread over 10 levels
must stay within 80% of the single-level figure: choosing the next group is
O(log n), not a scan".

Setup, on a fresh daemon per run: one target queue with 10 target services, each
with its own broker priority (local_service = that service). In the multi-level run
service k gets level k (1..10); in the single-level run every priority is level 5,
so both runs do the same work apart from the levels. Then --groups dialogs (spread
evenly over the services, begun in interleaved order) each send --per-group messages;
the lowest levels are sent first, so arrival order is the opposite of priority
order. Each target endpoint is its own conversation group.

Measured: one consumer drains the queue with RECEIVE TOP(--top) (one group per
RECEIVE), keeping --in-flight receives pipelined: autocommitted receives by default,
or begin/receive/commit triples with --mode txn. Checked: every message arrives
exactly once, each RECEIVE returns one group, and in the multi-level run levels come
out highest first (never a higher level after a lower one) with each message's
priority equal to its service's level. Reported: messages and receives per second,
the ratio multi/single (exit status 1 below 0.8), the daemon's CPU time per RECEIVE
(steadier than wall time on a shared machine) and, for scale, one multi-level run
with a tenth of the groups.

Run from the repository root:

    python -m bench.priorities                    # 10,000 groups x 5 messages
    python -m bench.priorities --groups 2000 --json prio.json
    python -m bench.priorities --smoke            # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import asyncio
import os
import statistics
import struct
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace

from ssb import client

from ._common import (
    BenchFailure,
    Catalog,
    CommandLine,
    broker,
    cpu_meter,
    in_one_round_trip,
    option,
    pipelined,
    print_header,
    rate,
    run,
)

CATALOG = Catalog("Prio")  # its target service is one a level: target_service(k)
LEVELS = 10
SINGLE_LEVEL = 5
REQUIRED_RATIO = 0.8
SMOKE = {"groups": 100, "per_group": 2}

TAG = struct.Struct(">II")  # (dialog index, message index)


def target_service(k: int) -> str:
    return f"{CATALOG.target_service}{k:02d}"


@dataclass
class Options:
    groups: int = option(10_000, at_least=1)
    per_group: int = option(5, at_least=1)
    body_size: int = option(256, at_least=TAG.size)
    top: int = option(100, at_least=1)
    in_flight: int = option(8, at_least=1)
    mode: str = option("autocommit", choices=("autocommit", "txn"))
    durability: str = option("os")
    setup_in_flight: int = 256
    timeout: float = option(600.0)


@dataclass
class Run:
    name: str
    levels: list[int]
    groups: int = 0
    messages: int = 0
    receives: int = 0
    setup_seconds: float = 0.0
    drain_seconds: float = 0.0
    msgs_s: float = 0.0
    receives_s: float = 0.0
    daemon_cpu_us_per_receive: float | None = None
    per_level: dict[int, int] = field(default_factory=dict)


async def setup(url: str, levels: list[int], opts: Options) -> int:
    """Catalog, priorities, dialogs and messages; returns the number of messages sent."""
    deadline = time.monotonic() + opts.timeout
    async with await client.connect(url) as conn:
        await conn.create_message_type(CATALOG.message_type)
        await conn.create_contract(CATALOG.contract, {CATALOG.message_type: "INITIATOR"})
        await conn.create_queue(CATALOG.initiator_queue)
        await conn.create_queue(CATALOG.target_queue)
        await conn.create_service(CATALOG.initiator_service, queue=CATALOG.initiator_queue)
        for k in range(1, LEVELS + 1):
            await conn.create_service(
                target_service(k), queue=CATALOG.target_queue, contracts=[CATALOG.contract]
            )
            await conn.create_broker_priority(
                f"PrioLevel{k:02d}",
                contract=CATALOG.contract,
                local_service=target_service(k),
                level=levels[k - 1],
            )
        # dialog i goes to service (i % 10) + 1: services interleave in creation order
        services = [(i % LEVELS) + 1 for i in range(opts.groups)]
        handles = await pipelined(
            [
                conn.begin_dialog(
                    CATALOG.initiator_service, target_service(k), contract=CATALOG.contract
                )
                for k in services
            ],
            opts.setup_in_flight,
            deadline,
            "setup: BEGIN DIALOG",
        )
        pad = b"b" * max(0, opts.body_size - TAG.size)
        # lowest service number (= lowest level in the multi-level run) sends first
        order = sorted(range(opts.groups), key=lambda i: (services[i], i))
        sends = []
        for i in order:
            bodies = [TAG.pack(i, j) + pad for j in range(opts.per_group)]
            sends.append(conn.send_many(handles[i], CATALOG.message_type, bodies))
        await pipelined(sends, opts.setup_in_flight, deadline, "setup: SEND")
    return opts.groups * opts.per_group


async def _one_receive(conn: client.Connection, opts: Options) -> list[client.Message]:
    receive = conn.receive(CATALOG.target_queue, top=opts.top, timeout=0)
    if opts.mode == "txn":
        return await in_one_round_trip(conn, receive)
    return await receive


async def drain(url: str, expected: int, levels: list[int], opts: Options, result: Run) -> None:
    """Receive everything with `in_flight` receives outstanding; check what arrives."""
    level_of = {target_service(k): levels[k - 1] for k in range(1, LEVELS + 1)}
    multi = len(set(levels)) > 1
    seen = bytearray(opts.groups * opts.per_group)
    count = 0
    receives = 0
    last_level = LEVELS + 1
    per_level: dict[int, int] = {}
    async with await client.connect(url) as conn:
        await conn.ping()
        deadline = time.monotonic() + opts.timeout
        pending: deque[asyncio.Future[list[client.Message]]] = deque()
        empty_answers = 0
        started = time.monotonic()
        while count < expected:
            while len(pending) < opts.in_flight:
                pending.append(asyncio.ensure_future(_one_receive(conn, opts)))
            messages = await asyncio.wait_for(pending.popleft(), deadline - time.monotonic())
            if not messages:
                empty_answers += 1
                if empty_answers > opts.in_flight * 2:
                    raise BenchFailure(f"queue ran dry after {count} of {expected} messages")
                continue
            receives += 1
            group = messages[0].conversation_group_id
            for m in messages:
                if m.conversation_group_id != group:
                    raise BenchFailure("one RECEIVE returned messages of two groups")
                dialog, index = TAG.unpack_from(m.message_body)
                slot = dialog * opts.per_group + index
                if seen[slot]:
                    raise BenchFailure(f"message {dialog}/{index} received twice")
                seen[slot] = 1
                level = level_of[m.service_name]
                if m.priority != level:
                    raise BenchFailure(
                        f"{m.service_name} message has priority {m.priority}, expected {level}"
                    )
                if multi and m.priority > last_level:
                    raise BenchFailure(
                        f"level {m.priority} received after level {last_level}: "
                        "RECEIVE did not take the highest priority group"
                    )
                last_level = m.priority
                per_level[level] = per_level.get(level, 0) + 1
                count += 1
        finished = time.monotonic()
        for future in pending:  # receives issued past the end must come back empty
            if await asyncio.wait_for(future, 30.0):
                raise BenchFailure("messages beyond the expected count")
        if await conn.receive(CATALOG.target_queue, top=1, timeout=0):
            raise BenchFailure("queue not empty at the end")
    wanted: dict[int, int] = {}
    for i in range(opts.groups):
        level = levels[i % LEVELS]
        wanted[level] = wanted.get(level, 0) + opts.per_group
    if per_level != wanted:
        raise BenchFailure(f"messages per level {per_level}, expected {wanted}")
    result.messages = count
    result.receives = receives
    result.drain_seconds = finished - started
    result.msgs_s = rate(count, result.drain_seconds)
    result.receives_s = rate(receives, result.drain_seconds)
    result.per_level = dict(sorted(per_level.items()))


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def one_run(name: str, levels: list[int], opts: Options) -> Run:
    result = Run(name=name, levels=levels, groups=opts.groups)
    with broker(opts.durability) as daemon:
        print(f"[{name}] setup: {opts.groups} groups x {opts.per_group} messages ...", flush=True)
        t0 = time.monotonic()
        expected = run(setup(daemon.url, levels, opts))
        result.setup_seconds = time.monotonic() - t0
        print(f"[{name}] draining {expected} messages ...", flush=True)
        cpu = cpu_meter(daemon.pid)
        run(drain(daemon.url, expected, levels, opts, result))
        result.daemon_cpu_us_per_receive = cpu(result.receives)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("priorities", __doc__, Options)
    parser.add_argument("--repeat", type=int, default=1, help="run both levels N times")
    parser.add_argument(
        "--no-scaling",
        dest="scaling",
        action="store_false",
        help="skip the extra multi-level run at a tenth of the groups",
    )
    args, opts = parser.read(argv, SMOKE, "repeat")
    single_levels = [SINGLE_LEVEL] * LEVELS
    multi_levels = list(range(1, LEVELS + 1))
    singles: list[Run] = []
    multis: list[Run] = []
    for _ in range(args.repeat):  # alternate, so drifting load hits both alike
        singles.append(one_run("single-level", single_levels, opts))
        multis.append(one_run("multi-level", multi_levels, opts))
    runs = [r for pair in zip(singles, multis, strict=True) for r in pair]
    small: Run | None = None
    if args.scaling and opts.groups >= 10 * LEVELS:
        small = one_run("multi-level", multi_levels, replace(opts, groups=opts.groups // 10))
        runs.append(small)
    single_rate = statistics.median(r.msgs_s for r in singles)
    multi_rate = statistics.median(r.msgs_s for r in multis)
    ratio = multi_rate / single_rate if single_rate else 0.0
    met = ratio >= REQUIRED_RATIO

    print()
    print(
        f"{opts.per_group} messages of {opts.body_size} B per group, "
        f"RECEIVE TOP {opts.top}, {opts.in_flight} in flight, mode={opts.mode}, "
        f"durability={opts.durability}, {os.cpu_count()} CPUs"
    )
    header = (
        f"{'run':<13} {'groups':>7} {'levels':>6} {'msgs/s':>9} {'receives/s':>11} "
        f"{'drain s':>8} {'setup s':>8} {'daemon cpu us/receive':>22}"
    )
    print_header(header)
    for r in runs:
        print(
            f"{r.name:<13} {r.groups:>7} {len(set(r.levels)):>6} {r.msgs_s:>9,.0f} "
            f"{r.receives_s:>11,.0f} {r.drain_seconds:>8.2f} {r.setup_seconds:>8.2f} "
            f"{_us(r.daemon_cpu_us_per_receive):>22}"
        )
    print(
        f"ratio multi/single at {opts.groups} groups = {ratio:.2f} "
        f"(median of {args.repeat}; required >= {REQUIRED_RATIO}): "
        f"{'met' if met else 'NOT MET'}; multi-level order checked (highest level first)"
    )
    scaling = None
    if small is not None:
        scaling = multi_rate / small.msgs_s if small.msgs_s else 0.0
        print(
            f"scaling: multi-level msgs/s at {opts.groups} groups / at {small.groups} groups"
            f" = {scaling:.2f} (a scan per RECEIVE would fall far below 1)"
        )
    return parser.conclude(
        args,
        opts,
        met,
        results=[asdict(r) for r in runs],
        ratio=ratio,
        required_ratio=REQUIRED_RATIO,
        met=met,
        scaling=scaling,
    )


if __name__ == "__main__":
    sys.exit(main())
