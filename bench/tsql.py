"""T-SQL's costs: parsing a 10 KB script, and a T-SQL loop that SENDs and RECEIVEs
beside the same work through the async client, in the same run on the same broker.

  parse   a 10 KB script of Service Broker batches (GO, DECLARE, WAITFOR (RECEIVE),
          IF, SEND, END CONVERSATION, COMMIT), split and parsed; best of --rounds.
          Target: under 50 ms.
  loop    N messages, one at a time, on one conversation: SEND, then RECEIVE TOP (1)
          of it, each statement committing on its own; in T-SQL one batch
          `WHILE @i < N BEGIN SEND ...; RECEIVE TOP (1) ...; SET @i += 1 END` (parsed
          once), and in Python the same two awaited client calls per message. The
          rounds alternate between the two; each side's time per message is its best
          round. Target: T-SQL at most 2x the client's time per message.

Exit status 1 when a target is missed (not with --smoke, which only checks that the
benchmark runs: a few messages, one round). All traffic stays on 127.0.0.1.

    python -m bench.tsql                 # 2,000 messages, 3 rounds
    python -m bench.tsql --smoke
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from ssb import client
from ssb.tsql import Collect, Session, parse_batch, split_batches

from ._common import Catalog, CommandLine, broker, option, run

CATALOG = Catalog("TSql")
PARSE_TARGET_MS = 50.0
RATIO_TARGET = 2.0
UNIT = (
    "DECLARE @h UNIQUEIDENTIFIER, @m NVARCHAR(100), @t sysname;\n"
    "BEGIN TRANSACTION;\n"
    "WAITFOR (RECEIVE TOP(1) @h = conversation_handle, @m = message_body,"
    " @t = message_type_name FROM [//Bench/Queue]), TIMEOUT 1000;\n"
    "IF @t = N'//Bench/Request'\nBEGIN\n"
    "  SEND ON CONVERSATION @h MESSAGE TYPE [//Bench/Reply] (@m);\n"
    "  END CONVERSATION @h;\nEND\n"
    "COMMIT TRANSACTION;\nGO\n"
)


@dataclass
class Options:
    messages: int = option(2_000)
    rounds: int = option(3)


def parse_script() -> str:
    return UNIT * (10_240 // len(UNIT) + 1)


def parse_ms(text: str, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for batch in split_batches(text):
            parse_batch(batch.text, batch.first_line)
        best = min(best, time.perf_counter() - started)
    return best * 1000


async def client_round(conn: client.Connection, handle: object, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        await conn.send(handle, CATALOG.message_type, b"<m/>")  # type: ignore[arg-type]
        got = await conn.receive(CATALOG.target_queue, top=1)
        assert len(got) == 1
    return (time.perf_counter() - started) / count


async def tsql_round(session: Session, out: Collect, handle: object, count: int) -> float:
    text = (
        f"DECLARE @h UNIQUEIDENTIFIER = '{handle}', @i INT = 0, @b VARBINARY(MAX)\n"
        f"WHILE @i < {count}\nBEGIN\n"
        f"  SEND ON CONVERSATION @h MESSAGE TYPE [{CATALOG.message_type}] (0x3C6D2F3E)\n"
        f"  RECEIVE TOP (1) @b = message_body FROM [{CATALOG.target_queue}]\n"
        "  IF @@ROWCOUNT <> 1 THROW 50000, N'a message was not received', 1\n"
        "  SET @i += 1\nEND\n"
    )
    (batch,) = split_batches(text)
    started = time.perf_counter()
    ok = await session.run_batch(batch)
    elapsed = time.perf_counter() - started
    if not ok:
        raise RuntimeError(f"the T-SQL loop failed: {out.errors[-1].format()}")
    return elapsed / count


async def loop(url: str, options: Options) -> tuple[float, float]:
    await CATALOG.create(url)
    async with await client.connect(url) as conn:
        handle = await CATALOG.begin_dialog(conn)
        out = Collect()
        session = Session(conn, out)
        python_best = tsql_best = float("inf")
        for _ in range(options.rounds):
            python_best = min(python_best, await client_round(conn, handle, options.messages))
            tsql_best = min(tsql_best, await tsql_round(session, out, handle, options.messages))
        return python_best, tsql_best


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("tsql", __doc__, Options)
    args, options = parser.read(argv, {"messages": 20, "rounds": 1})
    parse = parse_ms(parse_script(), max(options.rounds, 3))
    print(f"parse   10 KB script: {parse:.1f} ms (target under {PARSE_TARGET_MS:.0f} ms)")
    with broker("os") as process:
        python_s, tsql_s = run(loop(process.url, options))
    ratio = tsql_s / python_s
    print(
        f"loop    {options.messages} messages: client {python_s * 1e6:.0f} us/message,"
        f" T-SQL {tsql_s * 1e6:.0f} us/message, ratio {ratio:.2f} (target at most {RATIO_TARGET:.1f})"
    )
    met = parse < PARSE_TARGET_MS and ratio <= RATIO_TARGET
    return parser.conclude(
        args,
        options,
        met,
        parse_ms=parse,
        client_us=python_s * 1e6,
        tsql_us=tsql_s * 1e6,
        ratio=ratio,
    )


if __name__ == "__main__":
    sys.exit(main())
