"""A fault-injection TCP proxy for tests (tier 4): delay, cut, truncate, duplicate, corrupt.

`FaultProxy` listens on 127.0.0.1 (port 0) and forwards every accepted connection to
`127.0.0.1:target_port`, one pump per direction. It understands the framing both ssb
wires use (a 4-byte big-endian length, then a msgpack payload) and injects faults per
*frame*, so each fault means something precise to the receiver:

  delay      hold a frame back for up to `max_delay` seconds (order is kept: one pump
             per direction forwards frames one after another);
  cut        abort both sockets (RST) between two frames: the connection is gone;
  truncate   forward only the first part of a frame, then cut. This is how "drop"
             is simulated: TCP cannot lose bytes silently, so losing data in flight
             always means losing the connection too;
  duplicate  write a whole frame twice. Well framed, so after the handshake the
             receiver sees a duplicate fragment (it must ack and drop it) or a
             duplicate ack (harmless); a duplicated handshake frame would be a
             protocol error (the receiver closes the connection, i.e. a cut);
  corrupt    flip one byte of a frame, never the 4-byte length (which would only stall
             the stream until more bytes arrive). Two kinds:
             "payload": only frames of at least `payload_min_frame` bytes, at an offset
             in their middle half, i.e. inside a fragment's message bytes: the frame
             still decodes, so the fragment's MD5 signature check must fail (dropped,
             counted, repaired by retransmission);
             "header": one of the first 32 payload bytes (frame kind, conversation id,
             sequence numbers...): a malformed frame (protocol error, connection closed)
             or, when it still decodes, a failed signature.

Duplicates and corruptions spare the first `protect_frames` frames of each direction of
each connection (the handshake); cuts and delays may hit anything. Every fault is drawn
from a `random.Random(seed)` per direction and has a budget (`max_*`), so a run is
bounded; `set_clean()` stops all faults at once so a test can finish. `stats` counts what
was done per direction, and `stats.events` lists every fault injected (connection, frame,
its first bytes, what was done) for a failing test to print. If the first 4
bytes of a stream cannot be a frame length (say TLS), that connection falls back to
forwarding raw chunks with only delays and cuts.

`ThreadedFaultProxy` runs a `FaultProxy` on its own event loop in a daemon thread, so
that blocking calls in a test (starting or killing a daemon) never stall the traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Final

HOST: Final = "127.0.0.1"
LENGTH_SIZE: Final = 4
MAX_FRAME: Final = 128 * 1024 * 1024  # above this a "length" is not one: go raw
HEADER_ZONE: Final = 32
READ_SIZE: Final = 256 * 1024
MAX_EVENTS: Final = 2000

UP: Final = "up"  # client -> target
DOWN: Final = "down"  # target -> client


@dataclass(frozen=True)
class FaultPlan:
    """Per-direction fault probabilities (per frame) and budgets (per proxy)."""

    seed: int = 0
    delay_probability: float = 0.0
    max_delay: float = 0.02
    cut_probability: float = 0.0
    truncate_fraction: float = 0.5  # of the cuts, how many happen in the middle of a frame
    max_cuts: int = 0
    duplicate_probability: float = 0.0
    max_duplicates: int = 0
    payload_corrupt_probability: float = 0.0
    payload_min_frame: int = 16 * 1024
    max_payload_corruptions: int = 0
    header_corrupt_probability: float = 0.0
    max_header_corruptions: int = 0
    protect_frames: int = 3

    @classmethod
    def clean(cls) -> FaultPlan:
        return cls()

    @classmethod
    def cuts_both_ways(cls, seed: int, probability: float, most: int) -> dict[str, FaultPlan]:
        """The `up` and `down` plans of a proxy that cuts a client's connections: each
        direction cuts after a frame with `probability`, at most `most` times, never in a
        connection's first two frames (seeds `seed` and `seed + 1`)."""
        return {
            UP: cls(seed=seed, cut_probability=probability, max_cuts=most, protect_frames=2),
            DOWN: cls(seed=seed + 1, cut_probability=probability, max_cuts=most, protect_frames=2),
        }


@dataclass
class DirectionStats:
    """What one direction of the proxy forwarded and did (summed over connections)."""

    frames: int = 0
    bytes: int = 0
    delays: int = 0
    cuts: int = 0
    truncations: int = 0
    duplicates: int = 0
    payload_corruptions: int = 0
    header_corruptions: int = 0
    raw_connections: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _both_directions(name: str) -> property:
    """A count of ProxyStats: DirectionStats' `name`, up and down together."""
    return property(lambda stats: getattr(stats.up, name) + getattr(stats.down, name))


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0  # the target did not accept; the client's socket was closed
    up: DirectionStats = field(default_factory=DirectionStats)
    down: DirectionStats = field(default_factory=DirectionStats)
    # one line per injected fault (not delays), newest last: print it when a test fails
    events: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))

    cuts = _both_directions("cuts")
    duplicates = _both_directions("duplicates")
    payload_corruptions = _both_directions("payload_corruptions")
    header_corruptions = _both_directions("header_corruptions")

    def as_dict(self) -> dict[str, object]:
        return {
            "connections": self.connections,
            "refused": self.refused,
            "up": self.up.as_dict(),
            "down": self.down.as_dict(),
        }


class _Cut(Exception):
    """Raised inside a pump to abort the whole proxied connection."""


class _Faults:
    """One direction's seeded random source and remaining budgets."""

    def __init__(
        self, plan: FaultPlan, stats: DirectionStats, events: deque[str], name: str
    ) -> None:
        self.plan = plan
        self.stats = stats
        self.events = events
        self.name = name
        self.random = random.Random(plan.seed)
        self.clean = False

    def _draw(self, probability: float, used: int, budget: int) -> bool:
        if self.clean or probability <= 0 or used >= budget:
            return False
        return self.random.random() < probability

    def delay(self) -> float:
        p = self.plan
        if self.clean or p.delay_probability <= 0:
            return 0.0
        if self.random.random() >= p.delay_probability:
            return 0.0
        self.stats.delays += 1
        return self.random.uniform(0.0, p.max_delay)

    def cut(self) -> bool:
        return self._draw(self.plan.cut_probability, self.stats.cuts, self.plan.max_cuts)

    def truncate(self) -> bool:
        return self.random.random() < self.plan.truncate_fraction

    def duplicate(self, index: int) -> bool:
        if index < self.plan.protect_frames:
            return False
        return self._draw(
            self.plan.duplicate_probability, self.stats.duplicates, self.plan.max_duplicates
        )

    def note(self, connection: int, index: int, frame: bytes | bytearray, what: str) -> None:
        head = bytes(frame[LENGTH_SIZE : LENGTH_SIZE + 2]).hex()
        self.events.append(
            f"{self.name} connection {connection} frame {index} ({len(frame)} bytes, "
            f"starts {head}): {what}"
        )

    def corrupt(self, frame: bytearray, index: int) -> str:
        """Maybe flip one byte of `frame` (length prefix included) in place; say what."""
        p = self.plan
        if index < p.protect_frames:
            return ""
        length = len(frame) - LENGTH_SIZE
        if length >= p.payload_min_frame and self._draw(
            p.payload_corrupt_probability, self.stats.payload_corruptions, p.max_payload_corruptions
        ):
            offset = LENGTH_SIZE + self.random.randrange(length // 4, 3 * length // 4)
            frame[offset] ^= self.random.randrange(1, 256)
            self.stats.payload_corruptions += 1
            return f"payload byte {offset} flipped"
        if length > 0 and self._draw(
            p.header_corrupt_probability, self.stats.header_corruptions, p.max_header_corruptions
        ):
            offset = LENGTH_SIZE + self.random.randrange(min(length, HEADER_ZONE))
            frame[offset] ^= self.random.randrange(1, 256)
            self.stats.header_corruptions += 1
            return f"header byte {offset} flipped"
        return ""


class FaultProxy:
    """An asyncio TCP proxy 127.0.0.1:port -> 127.0.0.1:target_port that injects faults.

    Args:
        target_port: where to forward to.
        up: faults on bytes going to the target (None: none).
        down: faults on bytes coming back from the target (None: none).
    """

    def __init__(
        self, target_port: int, up: FaultPlan | None = None, down: FaultPlan | None = None
    ) -> None:
        self.target_port = target_port
        self.stats = ProxyStats()
        self._faults = {
            UP: _Faults(up or FaultPlan.clean(), self.stats.up, self.stats.events, UP),
            DOWN: _Faults(down or FaultPlan.clean(), self.stats.down, self.stats.events, DOWN),
        }
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._passing = asyncio.Event()  # cleared: new connections wait before going through
        self._passing.set()
        self.port = 0

    @property
    def address(self) -> str:
        """The route address that leads through this proxy."""
        return f"tcp://{HOST}:{self.port}"

    @property
    def clean(self) -> bool:
        return self._faults[UP].clean and self._faults[DOWN].clean

    def set_clean(self) -> None:
        """No more faults from now on (connections stay as they are)."""
        for faults in self._faults.values():
            faults.clean = True

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            _abort(writer)
        while self._tasks:  # a connection accepted just before the close may start meanwhile
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)
        if self._server is not None:
            await self._server.wait_closed()

    def hold(self, held: bool) -> None:
        """While held, new connections are accepted but wait before reaching the target."""
        if held:
            self._passing.clear()
        else:
            self._passing.set()

    async def cut_all(self) -> None:
        """Abort every connection now (counted as a cut of the up direction)."""
        for writer in list(self._writers):
            _abort(writer)
        self.stats.up.cuts += 1

    # ---- one proxied connection -------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            _abort(writer)
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.stats.connections += 1
        connection = self.stats.connections
        self._writers.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        clean_end = False
        try:
            await self._passing.wait()
            try:
                up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
            except OSError:
                self.stats.refused += 1
                return
            self._writers.add(up_writer)
            pumps = [
                asyncio.ensure_future(self._pump(reader, up_writer, UP, connection)),
                asyncio.ensure_future(self._pump(up_reader, writer, DOWN, connection)),
            ]
            try:
                # an EOF half-closes one direction; a cut or an error in either ends both
                clean_end = True
                for finished in asyncio.as_completed(pumps):
                    if not await finished:
                        clean_end = False
                        break
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            for end in (writer, up_writer):
                if end is None:
                    continue
                if clean_end:
                    end.close()  # flushes what is buffered, then closes
                else:
                    _abort(end)
                self._writers.discard(end)
            self._tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: str,
        connection: int,
    ) -> bool:
        """Forward one direction; True after a clean EOF, False after a cut or an error."""
        faults = self._faults[direction]
        stats = faults.stats
        buffer = bytearray()
        index = 0
        raw = False
        try:
            while True:
                data = await reader.read(READ_SIZE)
                if not data:
                    if buffer:  # a partial frame at EOF: pass it on as it is
                        writer.write(bytes(buffer))
                    await writer.drain()
                    if writer.can_write_eof():
                        writer.write_eof()
                    return True
                buffer += data
                if raw:
                    await self._forward_raw(buffer, writer, faults)
                    buffer.clear()
                    continue
                while len(buffer) >= LENGTH_SIZE:
                    length = int.from_bytes(buffer[:LENGTH_SIZE], "big")
                    if length > MAX_FRAME:
                        raw = True
                        stats.raw_connections += 1
                        await self._forward_raw(buffer, writer, faults)
                        buffer.clear()
                        break
                    end = LENGTH_SIZE + length
                    if len(buffer) < end:
                        break
                    frame = buffer[:end]
                    del buffer[:end]
                    await self._forward_frame(frame, index, writer, faults, connection)
                    index += 1
        except (_Cut, ConnectionError, OSError):
            return False

    async def _forward_frame(
        self,
        frame: bytearray,
        index: int,
        writer: asyncio.StreamWriter,
        faults: _Faults,
        connection: int,
    ) -> None:
        stats = faults.stats
        pause = faults.delay()
        if pause:
            await asyncio.sleep(pause)  # injected latency, not synchronisation
        if faults.cut():
            stats.cuts += 1
            if faults.truncate() and len(frame) > 1:
                stats.truncations += 1
                part = faults.random.randrange(1, len(frame))
                faults.note(connection, index, frame, f"cut after {part} bytes of it")
                writer.write(bytes(frame[:part]))
                with contextlib.suppress(OSError):
                    await writer.drain()
            else:
                faults.note(connection, index, frame, "cut before it")
            raise _Cut
        corrupted = faults.corrupt(frame, index)
        if corrupted:
            faults.note(connection, index, frame, corrupted)
        payload = bytes(frame)
        writer.write(payload)
        stats.frames += 1
        stats.bytes += len(payload)
        if faults.duplicate(index):
            stats.duplicates += 1
            faults.note(connection, index, frame, "duplicated")
            writer.write(payload)
            stats.bytes += len(payload)
        await writer.drain()

    async def _forward_raw(
        self, data: bytearray, writer: asyncio.StreamWriter, faults: _Faults
    ) -> None:
        pause = faults.delay()
        if pause:
            await asyncio.sleep(pause)
        if faults.cut():
            faults.stats.cuts += 1
            raise _Cut
        writer.write(bytes(data))
        faults.stats.bytes += len(data)
        await writer.drain()


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    if not transport.is_closing():
        transport.abort()


class ThreadedFaultProxy:
    """A `FaultProxy` on its own event loop in a daemon thread; usable from sync or async code.

    proxy = ThreadedFaultProxy(target_port, up=FaultPlan(...)).start()
    ... route to proxy.address ...
    proxy.set_clean(); proxy.stop()
    """

    def __init__(
        self, target_port: int, up: FaultPlan | None = None, down: FaultPlan | None = None
    ) -> None:
        self.proxy = FaultProxy(target_port, up, down)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def start(self) -> ThreadedFaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def set_clean(self) -> None:
        self._loop.call_soon_threadsafe(self.proxy.set_clean)

    def cut_all(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.cut_all(), self._loop).result(timeout=10)

    def hold(self, held: bool) -> None:
        self._loop.call_soon_threadsafe(self.proxy.hold, held)

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def address(self) -> str:
        return self.proxy.address

    @property
    def stats(self) -> ProxyStats:
        return self.proxy.stats

    def url(self, url: str) -> str:
        """A client URL of the broker at the proxy's target port (`url`), leading through
        the proxy instead."""
        return url.replace(f":{self.proxy.target_port}", f":{self.port}")

    def __enter__(self) -> ThreadedFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
