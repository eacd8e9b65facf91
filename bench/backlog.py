"""Deep backlog: millions of queued messages with no reader, memory, restart and drain.

The issue's figures: 2,000,000 messages of 1 KiB on 10,000 conversations queued with no
reader. Daemon RSS growth <= 150 MB; restart to ready at most 1 s slower than an empty
daemon's restart, same run; RSS after the drain within 50 MB of the empty daemon's;
drain rate from the deep queue >= 0.8 of the rate from a short queue, same run.

Procedure, on one fresh daemon (durability "os" unless --durability; the default
`message_cache_bytes` unless --cache-bytes):

  empty      restart the empty daemon (kill -9, start, until its "ssb ready" line)
             --restarts times: median restart time; then its idle RSS ("empty RSS");
  setup      one queue/service pair and --conversations dialogs, begun in explicit
             transactions of 1,000 (pipelined); a restart (reported) for a cold start;
  short      the reference: a short backlog (--short-messages, default 20,000, at most
             a tenth of --messages) with the SAME number of messages per conversation as
             the deep one (so on fewer conversations: each RECEIVE returns as many
             messages in both), filled and then drained, --short-repeats times here and
             --short-repeats times again after the deep drain (so the reference brackets
             the deep drain in time on a noisy machine); the reference rate is the median
             of all of them. It fits the message cache, so it is served from memory;
  fill       a restart (so the peak RSS, VmHWM, covers the fill only), the idle RSS
             before the fill, then --messages bodies with `send_many` (--batch bodies per
             call on one conversation, calls going round the conversations, --in-flight
             calls pipelined on one connection). RSS sampled every second; the peak is
             the larger of the samples and VmHWM. Store size (broker.db + -wal) after;
  restart    kill -9 and start with the backlog, --restarts times: median restart time
             (and time until the first answer), RSS right after; the queue must show
             every message after each restart;
  drain      one consumer: pipelined BEGIN / RECEIVE TOP (--receive-top) / COMMIT until
             every message arrived; msgs/s over the whole drain and over its first and
             last 10%, and the daemon's CPU time per message;
  after      --settle seconds idle (the daemon truncates the WAL after 10 s idle): RSS
             and the store size then (informative: the daemon is returning free pages
             to the file system a slice a second, and holds the pages of the slice it
             is moving); then, once the store file has stopped shrinking (at most
             --tidy-timeout s), RSS again: the figure held against the target; then the
             second half of the short reference.

Every body starts with (phase, conversation, index): the consumer checks that every
message arrives exactly once, on the right conversation, in order within it, and that
the queue is empty at the end; the run fails loudly otherwise. Gated (exit status 1 when
missed): RSS growth during the fill, the restart time difference, RSS after the drain vs
the empty daemon's, and the deep/short drain ratio. Every loop is bounded in count and
time; everything stays on 127.0.0.1.

Run from the repository root (the defaults are the full-size run: minutes, ~3 GB of
disk in a temp dir):

    python -m bench.backlog
    python -m bench.backlog --messages 50000 --conversations 1000 --json out.json
    python -m bench.backlog --smoke       # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import os
import statistics
import struct
import sys
import time
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from ssb import client

from ._common import (
    BenchFailure,
    Catalog,
    CommandLine,
    Watchdog,
    broker,
    cpu_meter,
    figure_table,
    in_one_round_trip,
    option,
    pipelined,
    rate,
    run,
)
from ._memory import (
    MB,
    BrokerProcess,
    RssSampler,
    cache_config,
    daemon_peak,
    daemon_rss,
    mb,
    now_line,
    peak_since,
    queue_state,
    store_sizes,
    timed_restart,
)

CATALOG = Catalog("Backlog")
TAG = struct.Struct(">BII")  # (phase, conversation, index in the conversation)
PHASE_SHORT = 1
PHASE_DEEP = 2
DIALOGS_PER_TRANSACTION = 1000

# the targets
TARGET_GROWTH = 150 * MB
TARGET_RESTART_DELTA = 1.0  # seconds
TARGET_AFTER_DRAIN = 50 * MB
TARGET_DRAIN_RATIO = 0.8
SMOKE = {
    "messages": 2_000,
    "conversations": 20,
    "short_messages": 200,
    "short_repeats": 1,
    "restarts": 1,
    "settle": 0.0,
    "tidy_timeout": 5.0,
}


@dataclass
class Options:
    messages: int = option(2_000_000, at_least=1)
    conversations: int = option(10_000, at_least=1)
    body_size: int = option(1024, at_least=TAG.size)
    durability: str = option("os")
    cache_bytes: int | None = option(None, "message_cache_bytes (default: the daemon's)", parse=int)
    batch: int = option(100, "bodies per send_many", at_least=1)
    in_flight: int = option(8, at_least=1)
    receive_top: int = option(100, at_least=1)
    short_messages: int = option(20_000, at_least=1)
    short_repeats: int = option(3, at_least=1)
    restarts: int = option(3, at_least=1)
    settle: float = option(12.0)
    tidy_timeout: float = option(
        300.0, "seconds to wait, after --settle, for the idle store to stop shrinking"
    )
    phase_timeout: float = option(3600.0)
    idle_timeout: float = 60.0


@dataclass
class Drain:
    messages: int = 0
    receives: int = 0
    seconds: float = 0.0
    msgs_s: float = 0.0
    first_10pct_msgs_s: float = 0.0
    last_10pct_msgs_s: float = 0.0
    daemon_cpu_us: float | None = None  # daemon CPU (user+system) per message


@dataclass
class Result:
    messages: int = 0
    conversations: int = 0
    messages_per_conversation: float = 0.0
    # empty daemon
    empty_restart_s: list[float] = field(default_factory=list)
    empty_restart_median_s: float = 0.0
    rss_empty: int = 0
    # setup
    dialogs_s: float = 0.0
    idle_conversations_restart_s: float = 0.0
    # short reference
    short_messages: int = 0
    short_conversations: int = 0
    short_drains: list[Drain] = field(default_factory=list)
    short_msgs_s: float = 0.0  # median of every short drain (before the fill and after)
    short_before_msgs_s: float = 0.0
    short_after_msgs_s: float = 0.0
    # fill
    rss_before_fill: int = 0
    fill_s: float = 0.0
    fill_msgs_s: float = 0.0
    rss_after_fill: int = 0
    rss_peak_fill: int = 0
    rss_growth: int = 0
    store_after_fill: dict[str, int] = field(default_factory=dict)
    resources_after_fill: dict[str, Any] = field(default_factory=dict)
    # restart with the backlog
    deep_restart_s: list[float] = field(default_factory=list)
    deep_restart_median_s: float = 0.0
    deep_first_answer_s: list[float] = field(default_factory=list)
    rss_after_deep_restart: list[int] = field(default_factory=list)
    restart_delta_s: float = 0.0
    # drain
    deep: Drain = field(default_factory=Drain)
    rss_peak_drain: int = 0
    drain_ratio: float = 0.0
    drain_cpu_ratio: float | None = None  # short / deep daemon CPU per message (informative)
    # after
    rss_after_drain: int = 0
    rss_at_settle: int = 0  # RSS --settle s after the drain, while the store tidies
    tidy_seconds: float | None = None  # drain end to the store file no longer shrinking
    rss_after_drain_vs_empty: int = 0
    store_after_drain: dict[str, int] = field(default_factory=dict)
    store_after_settle: dict[str, int] = field(default_factory=dict)
    store_after_tidy: dict[str, int] = field(default_factory=dict)
    resources_after_drain: dict[str, Any] = field(default_factory=dict)
    # gates
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    all_met: bool = False


# ---- plumbing ----------------------------------------------------------------------------


def spread(total: int, conversations: int) -> list[int]:
    """`total` messages over `conversations`, as evenly as possible."""
    base, extra = divmod(total, conversations)
    return [base + (1 if c < extra else 0) for c in range(conversations)]


def plan(counts: list[int], batch: int) -> Iterator[tuple[int, int, int]]:
    """(conversation, first index, count) per send_many call: rounds over the
    conversations, `batch` bodies of one conversation per call."""
    rounds = (max(counts, default=0) + batch - 1) // batch
    for r in range(rounds):
        first = r * batch
        for c, count in enumerate(counts):
            if first < count:
                yield c, first, min(batch, count - first)


async def begin_dialogs(url: str, count: int, timeout: float) -> list[uuid.UUID]:
    handles: list[uuid.UUID] = []
    async with await client.connect(url) as conn:
        async for begun in CATALOG.begin_dialogs(conn, count, DIALOGS_PER_TRANSACTION, timeout):
            handles += begun
    return handles


async def fill(
    url: str,
    handles: list[uuid.UUID],
    counts: list[int],
    phase: int,
    opts: Options,
    label: str,
    progress: Any = None,
) -> float:
    """Send every planned message; seconds taken. `progress(fraction)` prints a line."""
    pad = b"b" * max(0, opts.body_size - TAG.size)
    total_calls = sum((n + opts.batch - 1) // opts.batch for n in counts)
    step = max(1, total_calls // 10)
    async with await client.connect(url) as conn:
        started = time.monotonic()

        def sends() -> Iterator[Awaitable[None]]:
            for number, (c, first, n) in enumerate(plan(counts, opts.batch), 1):
                bodies = [TAG.pack(phase, c, i) + pad for i in range(first, first + n)]
                yield conn.send_many(handles[c], CATALOG.message_type, bodies)
                if progress is not None and number % step == 0 and number < total_calls:
                    progress(number / total_calls, time.monotonic() - started)

        await pipelined(sends(), opts.in_flight, started + opts.phase_timeout, f"{label}: fill")
        return time.monotonic() - started


async def drain(
    url: str,
    counts: list[int],
    phase: int,
    opts: Options,
    label: str,
    pid: int,
    verbose: bool = False,
) -> Drain:
    """Receive every planned message, checking exactly once, conversation and order."""
    total = sum(counts)
    expected = [0] * len(counts)  # next index per conversation
    conversation_of: dict[uuid.UUID, int] = {}  # target handle -> conversation
    handle_of: dict[int, uuid.UUID] = {}
    tenth = max(1, total // 10)
    mark_10 = mark_90 = 0.0
    count = receives = 0
    cpu = cpu_meter(pid)
    async with await client.connect(url) as conn:
        await conn.ping()
        started = time.monotonic()
        watchdog = Watchdog(label, total, started, opts.phase_timeout, opts.idle_timeout)
        next_report = tenth
        while count < total:
            watchdog.check(count)
            messages = await in_one_round_trip(
                conn, conn.receive(CATALOG.target_queue, top=opts.receive_top, timeout=1.0)
            )
            if not messages:
                continue
            last_message = watchdog.heard()
            receives += 1
            for m in messages:
                if m.message_type_name != CATALOG.message_type:
                    raise BenchFailure(f"{label}: unexpected message type {m.message_type_name}")
                got_phase, c, index = TAG.unpack_from(m.message_body)
                if got_phase != phase or c >= len(counts):
                    raise BenchFailure(
                        f"{label}: foreign message phase={got_phase} conversation={c}"
                    )
                known = conversation_of.setdefault(m.conversation_handle, c)
                if (
                    known != c
                    or handle_of.setdefault(c, m.conversation_handle) != m.conversation_handle
                ):
                    raise BenchFailure(
                        f"{label}: message ({c}, {index}) arrived on the wrong conversation"
                    )
                if index != expected[c]:
                    what = "twice" if index < expected[c] else "early (a message is missing)"
                    raise BenchFailure(
                        f"{label}: conversation {c}: message {index} arrived {what}; "
                        f"expected {expected[c]}"
                    )
                expected[c] += 1
            before = count
            count += len(messages)
            if before < tenth <= count:
                mark_10 = last_message
            if before < total - tenth <= count:
                mark_90 = last_message
            if verbose and count >= next_report and count < total:
                elapsed = last_message - started
                print(
                    f"  [{label}] drained {count:,}/{total:,} ({100 * count / total:.0f}%) "
                    f"{rate(count, elapsed):,.0f} msgs/s",
                    flush=True,
                )
                next_report += tenth
        finished = watchdog.last_message
        leftover = await conn.receive(CATALOG.target_queue, top=1, timeout=0)
        if leftover:
            raise BenchFailure(f"{label}: the queue is not empty after {count} messages")
    short = [c for c, n in enumerate(counts) if expected[c] != n]
    if short:
        raise BenchFailure(f"{label}: {len(short)} conversations incomplete, e.g. {short[0]}")
    seconds = finished - started
    return Drain(
        messages=count,
        receives=receives,
        seconds=seconds,
        msgs_s=rate(count, seconds),
        first_10pct_msgs_s=rate(tenth, mark_10 - started),
        last_10pct_msgs_s=rate(tenth, finished - mark_90),
        daemon_cpu_us=cpu(count),
    )


async def first_answer(url: str) -> float:
    """Seconds to connect and get a ping answered."""
    started = time.perf_counter()
    async with await client.connect(url) as conn:
        await conn.ping()
    return time.perf_counter() - started


def _settle(seconds: float) -> None:
    time.sleep(seconds)  # pacing, bounded: let the daemon go idle before a memory reading


TIDY_STABLE: Final = 3  # one-second readings of the same db size, and no WAL, in a row


def _wait_tidied(process: BrokerProcess, timeout: float) -> float | None:
    """Seconds until the idle daemon's store file stopped shrinking and its WAL is empty
    (it returns free pages a slice a second while idle), or None after `timeout`."""
    started = time.monotonic()
    last, same = -1, 0
    while time.monotonic() - started < timeout:
        size = store_sizes(process)
        same = same + 1 if size["db"] == last and size["wal"] == 0 else 0
        if same >= TIDY_STABLE:
            return time.monotonic() - started
        last = size["db"]
        time.sleep(1.0)  # polling a file size, bounded by `timeout`
    return None


# ---- the run -------------------------------------------------------------------------------


def bench(opts: Options) -> Result:
    r = Result(messages=opts.messages, conversations=opts.conversations)
    r.messages_per_conversation = opts.messages / opts.conversations
    deep_counts = spread(opts.messages, opts.conversations)
    per_conversation = max(1, opts.messages // opts.conversations)
    short_total = max(1, min(opts.short_messages, opts.messages // 10))
    short_conversations = max(1, min(opts.conversations, short_total // per_conversation))
    short_counts = spread(short_total, short_conversations)
    r.short_messages = short_total
    r.short_conversations = short_conversations
    with broker(opts.durability, cache_config(opts.cache_bytes), stop_timeout=60.0) as d:
        url = d.url
        print(f"[empty] {opts.restarts} restarts of the empty daemon ...", flush=True)
        r.empty_restart_s = [timed_restart(d) for _ in range(opts.restarts)]
        r.empty_restart_median_s = statistics.median(r.empty_restart_s)
        _settle(2.0)
        r.rss_empty = daemon_rss(d)

        print(f"[setup] objects and {opts.conversations:,} dialogs ...", flush=True)
        run(CATALOG.create(url))
        started = time.monotonic()
        handles = run(begin_dialogs(url, opts.conversations, opts.phase_timeout))
        r.dialogs_s = time.monotonic() - started
        r.idle_conversations_restart_s = timed_restart(d)

        def short_phase(when: str) -> None:
            print(
                f"[short, {when}] {short_total:,} messages on {short_conversations:,} "
                f"conversations ({per_conversation} each), {opts.short_repeats} times ...",
                flush=True,
            )
            for i in range(opts.short_repeats):
                run(fill(url, handles, short_counts, PHASE_SHORT, opts, "short"))
                got = run(drain(url, short_counts, PHASE_SHORT, opts, "short", d.pid))
                r.short_drains.append(got)
                print(f"  short drain {i + 1}: {got.msgs_s:,.0f} msgs/s", flush=True)

        short_phase("before the fill")

        print(
            f"[fill] {opts.messages:,} messages on {opts.conversations:,} conversations ...",
            flush=True,
        )
        timed_restart(d)  # a fresh process: VmHWM covers the fill only
        _settle(2.0)
        r.rss_before_fill = daemon_rss(d)
        hwm_before = daemon_peak(d)

        def progress(fraction: float, elapsed: float) -> None:
            print(
                f"  [fill] {100 * fraction:.0f}% {rate(int(fraction * opts.messages), elapsed):,.0f}"
                f" msgs/s, {now_line(d)}",
                flush=True,
            )

        with RssSampler(lambda: d.pid) as sampler:
            r.fill_s = run(fill(url, handles, deep_counts, PHASE_DEEP, opts, "fill", progress))
        r.fill_msgs_s = rate(opts.messages, r.fill_s)
        r.rss_after_fill = daemon_rss(d)
        r.rss_peak_fill = peak_since(d, hwm_before, sampler.peak, r.rss_after_fill)
        r.rss_growth = r.rss_peak_fill - r.rss_before_fill
        r.store_after_fill = store_sizes(d)
        row, r.resources_after_fill = run(queue_state(url, CATALOG.target_queue))
        print(
            f"  filled in {r.fill_s:.1f} s ({r.fill_msgs_s:,.0f} msgs/s); RSS {mb(r.rss_after_fill)}"
            f" MB, peak {mb(r.rss_peak_fill)} MB; queue: {row['messages_ready']:,} ready,"
            f" {row['bytes_stored'] / MB:,.1f} MB",
            flush=True,
        )

        print(f"[restart] {opts.restarts} restarts with the backlog ...", flush=True)
        for _ in range(opts.restarts):
            r.deep_restart_s.append(timed_restart(d))
            r.rss_after_deep_restart.append(daemon_rss(d))
            r.deep_first_answer_s.append(r.deep_restart_s[-1] + run(first_answer(url)))
            row, _ = run(queue_state(url, CATALOG.target_queue))
            stored = row["messages_ready"]
            if stored != opts.messages:
                raise BenchFailure(
                    f"after a restart the queue shows {stored} messages, not {opts.messages}: {row}"
                )
        r.deep_restart_median_s = statistics.median(r.deep_restart_s)
        r.restart_delta_s = r.deep_restart_median_s - r.empty_restart_median_s

        print(f"[drain] {opts.messages:,} messages ...", flush=True)
        with RssSampler(lambda: d.pid) as sampler:
            r.deep = run(drain(url, deep_counts, PHASE_DEEP, opts, "deep", d.pid, True))
        r.rss_peak_drain = sampler.peak
        r.store_after_drain = store_sizes(d)

        print(f"[after] {opts.settle:g} s idle ...", flush=True)
        _settle(opts.settle)
        r.rss_at_settle = daemon_rss(d)
        r.store_after_settle = store_sizes(d)
        print(
            f"[after] until the store stops shrinking (at most {opts.tidy_timeout:g} s) ...",
            flush=True,
        )
        tidied = _wait_tidied(d, opts.tidy_timeout)
        r.tidy_seconds = None if tidied is None else opts.settle + tidied
        r.rss_after_drain = daemon_rss(d)
        r.rss_after_drain_vs_empty = r.rss_after_drain - r.rss_empty
        r.store_after_tidy = store_sizes(d)
        _, r.resources_after_drain = run(queue_state(url, CATALOG.target_queue))

        # the reference again, on the same daemon: both bracket the deep drain in time
        short_phase("after the drain")
        half = len(r.short_drains) // 2
        r.short_before_msgs_s = statistics.median(x.msgs_s for x in r.short_drains[:half])
        r.short_after_msgs_s = statistics.median(x.msgs_s for x in r.short_drains[half:])
        r.short_msgs_s = statistics.median(x.msgs_s for x in r.short_drains)
        r.drain_ratio = r.deep.msgs_s / r.short_msgs_s if r.short_msgs_s else 0.0
        short_cpu = [x.daemon_cpu_us for x in r.short_drains if x.daemon_cpu_us is not None]
        if short_cpu and r.deep.daemon_cpu_us:
            r.drain_cpu_ratio = statistics.median(short_cpu) / r.deep.daemon_cpu_us

    r.targets = {
        "rss_growth_during_fill": {
            "value": r.rss_growth,
            "target": f"<= {TARGET_GROWTH // MB} MB",
            "met": r.rss_growth <= TARGET_GROWTH,
        },
        "restart_slower_by_s": {
            "value": r.restart_delta_s,
            "target": f"<= {TARGET_RESTART_DELTA}",
            "met": r.restart_delta_s <= TARGET_RESTART_DELTA,
        },
        "rss_after_drain_vs_empty": {
            "value": r.rss_after_drain_vs_empty,
            "target": f"|x| <= {TARGET_AFTER_DRAIN // MB} MB",
            "met": abs(r.rss_after_drain_vs_empty) <= TARGET_AFTER_DRAIN,
        },
        "drain_ratio_deep_vs_short": {
            "value": r.drain_ratio,
            "target": f">= {TARGET_DRAIN_RATIO}",
            "met": r.drain_ratio >= TARGET_DRAIN_RATIO,
        },
    }
    r.all_met = all(t["met"] for t in r.targets.values())
    return r


# ---- report ---------------------------------------------------------------------------------


def print_table(r: Result, opts: Options) -> None:
    cache = "default" if opts.cache_bytes is None else f"{opts.cache_bytes:,} B"
    print()
    print(
        f"{opts.messages:,} messages of {opts.body_size} B on {opts.conversations:,} conversations"
        f" ({r.messages_per_conversation:g} each), durability={opts.durability}, "
        f"message_cache_bytes={cache}, {os.cpu_count()} CPUs; MB = 10^6 bytes"
    )

    def sizes(s: dict[str, int]) -> str:
        return f"{mb(s.get('db'))} + {mb(s.get('wal'))}"

    line = figure_table(48, 10)
    t = r.targets
    line("RSS, empty daemon (MB)", mb(r.rss_empty))
    line("RSS before the fill (MB)", mb(r.rss_before_fill))
    line("RSS after the fill (MB)", mb(r.rss_after_fill))
    line("RSS peak during the fill (MB)", mb(r.rss_peak_fill))
    g = t["rss_growth_during_fill"]
    line("RSS growth during the fill (MB)", mb(r.rss_growth), "<= 150", g["met"])
    line("fill rate (msgs/s)", f"{r.fill_msgs_s:,.0f}")
    line("store after the fill: db + wal (MB)", sizes(r.store_after_fill))
    line(
        "restart, empty (median, s)",
        f"{r.empty_restart_median_s:.2f}",
    )
    line(
        f"restart, {opts.conversations:,} idle conversations (s)",
        f"{r.idle_conversations_restart_s:.2f}",
    )
    line("restart, deep backlog (median, s)", f"{r.deep_restart_median_s:.2f}")
    line(
        "restart to first answer, deep (median, s)",
        f"{statistics.median(r.deep_first_answer_s):.2f}" if r.deep_first_answer_s else "n/a",
    )
    d = t["restart_slower_by_s"]
    line("restart slower than empty by (s)", f"{r.restart_delta_s:+.2f}", "<= 1.0", d["met"])
    line(
        "RSS right after a deep restart (MB)",
        mb(statistics.median(r.rss_after_deep_restart)) if r.rss_after_deep_restart else "n/a",
    )
    line(f"drain rate, short ({r.short_messages:,}; median, msgs/s)", f"{r.short_msgs_s:,.0f}")
    line(
        "  before the fill / after the drain (msgs/s)",
        f"{r.short_before_msgs_s:,.0f} / {r.short_after_msgs_s:,.0f}",
    )
    line("drain rate, deep (msgs/s)", f"{r.deep.msgs_s:,.0f}")
    line(
        "  first 10% / last 10% (msgs/s)",
        f"{r.deep.first_10pct_msgs_s:,.0f} / {r.deep.last_10pct_msgs_s:,.0f}",
    )
    short_cpu = [x.daemon_cpu_us for x in r.short_drains if x.daemon_cpu_us is not None]
    line(
        "daemon CPU/msg, short / deep (us)",
        f"{statistics.median(short_cpu):.1f} / {r.deep.daemon_cpu_us:.1f}"
        if short_cpu and r.deep.daemon_cpu_us is not None
        else "n/a",
    )
    q = t["drain_ratio_deep_vs_short"]
    line("drain rate ratio deep / short", f"{r.drain_ratio:.2f}", ">= 0.8", q["met"])
    line(
        "  same by daemon CPU/msg (informative)",
        "n/a" if r.drain_cpu_ratio is None else f"{r.drain_cpu_ratio:.2f}",
    )
    line("RSS peak during the drain (MB)", mb(r.rss_peak_drain))
    line(f"RSS {opts.settle:g} s after the drain (MB, informative)", mb(r.rss_at_settle))
    line(
        "store tidied (s after the drain)",
        "timed out" if r.tidy_seconds is None else f"{r.tidy_seconds:.0f}",
    )
    line("RSS after the drain, store tidied (MB)", mb(r.rss_after_drain))
    a = t["rss_after_drain_vs_empty"]
    line(
        "RSS after the drain - empty (MB)",
        f"{r.rss_after_drain_vs_empty / MB:+,.1f}",
        "<= 50",
        a["met"],
    )
    line("store right after the drain: db + wal (MB)", sizes(r.store_after_drain))
    line(f"store {opts.settle:g} s later: db + wal (MB)", sizes(r.store_after_settle))
    line("store tidied: db + wal (MB)", sizes(r.store_after_tidy))
    res = r.resources_after_drain
    line(
        "after: cached_bytes / endpoints_in_memory",
        f"{res.get('cached_bytes', 'n/a')} / {res.get('endpoints_in_memory', 'n/a')}",
    )
    print()
    print("all targets met" if r.all_met else "TARGET MISSED")


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("backlog", __doc__, Options)
    args, opts = parser.read(argv, SMOKE)
    if args.conversations > args.messages:
        parser.error("--conversations must be <= --messages")
    if not 0 <= args.settle <= 600 or not 0 < args.phase_timeout <= 86400:
        parser.error("--settle must be 0..600 s, --phase-timeout 0..86400 s")
    if not 0 < args.tidy_timeout <= 3600:
        parser.error("--tidy-timeout must be 0..3600 s")
    result = bench(opts)
    print_table(result, opts)
    return parser.conclude(args, opts, result.all_met, result=asdict(result))


if __name__ == "__main__":
    sys.exit(main())
