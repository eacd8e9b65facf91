"""What a producer keeps when its connection is cut every N commits.

One daemon (durability "fsync" by default), one producer in this process sending 1 KiB
messages in explicit transactions (begin, send_many, commit pipelined, a few in
flight; one known to be rolled back is sent again) through a small TCP proxy on
127.0.0.1. Two phases, the same proxy: first it
only forwards ("clean"), then it cuts the connection after every `--cut-every`
commit answers it forwarded ("cut"): each cut drops answers in flight, the client
reconnects and settles them by asking their outcomes. The figure is the cut phase's
rate as a fraction of the clean phase's; at the end the queue must hold every message
exactly once (the run fails loudly otherwise).

Run from the repository root:

    python -m bench.reconnect                 # 100,000 messages, 10 per transaction, a cut every 1,000 commits
    python -m bench.reconnect --messages 20000 --cut-every 200 --json out.json
    python -m bench.reconnect --smoke         # tiny sizes, seconds: does it still run?
"""

from __future__ import annotations

import asyncio
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

from ssb import client

from ._common import CommandLine, broker, option, pipelined, rate, run

TAG = struct.Struct(">BI")  # phase, index
LENGTH = struct.Struct(">I")
ANSWERS_PER_COMMIT = 3  # begin, send_many, commit
SMOKE = {"messages": 300, "cut_every": 5, "durability": "os"}


@dataclass
class Options:
    messages: int = option(100_000, at_least=1)
    batch: int = option(10, at_least=1)
    in_flight: int = option(4, at_least=1)
    body_size: int = option(1024, at_least=TAG.size)
    cut_every: int = option(1_000, "commits", at_least=1)
    durability: str = option("fsync")
    timeout: float = option(600.0)


class CuttingProxy:
    """127.0.0.1:port -> the broker; after `every` answer frames (when armed), cuts."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.every = 0  # answer frames between cuts; 0: never cut
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.sleep(0)  # let the pumps see their sockets go

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {writer, up_writer}
        up = asyncio.ensure_future(self._copy(reader, up_writer))
        try:
            await self._answers(up_reader, writer)
        except (asyncio.IncompleteReadError, OSError):
            pass  # one side closed
        finally:
            up.cancel()
            for w in (writer, up_writer):
                w.transport.abort()
                self._writers.discard(w)

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = 0
        while True:
            head = await reader.readexactly(LENGTH.size)
            body = await reader.readexactly(LENGTH.unpack(head)[0])
            frames += 1
            if self.every and frames > self.every:  # this answer is lost with the connection
                self.cuts += 1
                return
            writer.write(head + body)
            await writer.drain()


async def produce(url: str, phase: int, opts: Options) -> tuple[float, client.Connection]:
    conn = await client.connect(url)
    await conn.create_queue(f"Q{phase}")
    await conn.create_service(f"From{phase}", queue=f"Q{phase}")
    await conn.create_service(f"To{phase}", queue=f"Q{phase}", contracts=["DEFAULT"])
    handle = await conn.begin_dialog(f"From{phase}", f"To{phase}")
    pad = b"p" * max(0, opts.body_size - TAG.size)

    async def batch(first: int) -> None:
        """One transaction, its three requests pipelined; again while known rolled back."""
        last = min(opts.messages, first + opts.batch)
        bodies = [TAG.pack(phase, i) + pad for i in range(first, last)]
        for _ in range(100):
            answers = await asyncio.gather(
                conn.begin_transaction(),
                conn.send_many(handle, "DEFAULT", bodies),
                conn.commit(),
                return_exceptions=True,
            )
            errors = [a for a in answers if isinstance(a, BaseException)]
            if not errors:
                return
            if not all(isinstance(e, client.TransactionRolledBackError) for e in errors):
                raise errors[0]
        raise SystemExit("a transaction was rolled back 100 times")

    started = time.monotonic()
    batches = (batch(first) for first in range(0, opts.messages, opts.batch))
    await pipelined(batches, opts.in_flight, started + opts.timeout, f"phase {phase}")
    return time.monotonic() - started, conn


async def check(url: str, phase: int, opts: Options) -> None:
    """Every message of the phase is in its queue exactly once."""
    seen = bytearray(opts.messages)
    async with await client.connect(url) as conn:
        while True:
            got = await conn.receive(f"Q{phase}", top=1000)
            if not got:
                break
            for m in got:
                if m.message_type_name != "DEFAULT":
                    continue
                _, index = TAG.unpack_from(m.message_body)
                seen[index] += 1
    wrong = [i for i, n in enumerate(seen) if n != 1]
    if wrong:
        raise SystemExit(
            f"phase {phase}: {len(wrong)} messages not there exactly once: {wrong[:10]}"
        )


async def measure(opts: Options) -> dict[str, Any]:
    with broker(opts.durability) as daemon:
        proxy = CuttingProxy(daemon.client_port)
        await proxy.start()
        url = daemon.url.replace(f":{daemon.client_port}", f":{proxy.port}")
        try:
            clean, conn = await asyncio.wait_for(produce(url, 1, opts), opts.timeout)
            await conn.close()
            proxy.every = opts.cut_every * ANSWERS_PER_COMMIT
            cut, conn = await asyncio.wait_for(produce(url, 2, opts), opts.timeout)
            settled, reconnects = conn.settled, conn.reconnects
            await conn.close()
        finally:
            await proxy.close()
        await check(daemon.url, 1, opts)
        await check(daemon.url, 2, opts)
    return {
        "clean_msgs_s": rate(opts.messages, clean),
        "cut_msgs_s": rate(opts.messages, cut),
        "kept": clean / cut if cut else 0.0,
        "cuts": proxy.cuts,
        "reconnects": reconnects,
        "settled": settled,
    }


def main(argv: list[str] | None = None) -> int:
    parser = CommandLine("reconnect", __doc__, Options)
    args, opts = parser.read(argv, SMOKE)
    result = run(measure(opts))
    print(
        f"[{opts.durability}] {opts.messages} messages, {opts.batch} per transaction,"
        f" {opts.in_flight} in flight, a cut every {opts.cut_every} commits"
    )
    print(f"  clean  {result['clean_msgs_s']:>9,.0f} msgs/s")
    print(
        f"  cut    {result['cut_msgs_s']:>9,.0f} msgs/s  ({result['kept']:.2f} of clean;"
        f" {result['cuts']} cuts, {result['reconnects']} reconnects, settled {result['settled']})"
    )
    return parser.conclude(args, opts, True, **result)


if __name__ == "__main__":
    sys.exit(main())
