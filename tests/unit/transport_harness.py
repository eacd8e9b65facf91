"""Brokers' transports without a daemon: an in-memory network and one fake clock.

Each `Broker` is a core (`core_harness.Core`: the real Store on an in-memory SQLite
database, durable only when flushed) with the real `Transport` and `Permissions` wired to
it as the daemon wires them (PUBLIC holds SEND on the broker unless a test says
otherwise, so other brokers may send to every service), but on a `FakeLoop` (the fake clock, with the timer calls the transport makes)
and a `Network` of in-memory connections instead of the event loop and TCP. Time moves
only by `World.advance()`; bytes move only in `World.settle()`, which also runs what
was scheduled, waits for connection attempts under way, and (unless told not to)
flushes every store each round, as the store thread would.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import os
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ssb.broker._core.ports import OutboundRelay
from ssb.broker._permissions import Permissions
from ssb.broker._transport import Transport, TransportSettings
from ssb.broker._transport.identity import CERT_FILE, KEY_FILE
from ssb.broker._transport.link import Link, Links, Peer
from ssb.protocol import generate_broker_identity

from .core_harness import Core, FakeClock

A_ID = "aaaaaaaa-0000-4000-8000-000000000001"
RATE_CHUNK = 4096  # bytes a throttled socket takes (and the other end gets) at a time
B_ID = "bbbbbbbb-0000-4000-8000-000000000002"
F_ID = "ffffffff-0000-4000-8000-000000000003"


class FakeLoop(FakeClock):
    """The fake clock as the transport uses it too: callback arguments, call_later."""

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Any:
        return super().call_at(when, functools.partial(callback, *args) if args else callback)

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Any:
        return self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        super().call_soon(functools.partial(callback, *args) if args else callback)

    def next_due(self) -> float | None:
        """When the next timer that is still armed falls due."""
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        return timers[0][0] if timers else None


class Pipe(asyncio.Transport):
    """One end of an in-memory connection: what it writes waits until the network moves it.

    Its socket takes every write at once, or (`rate`) that many bytes a second: a write
    then waits in the write buffer until its last byte went, and the protocol is paused
    and resumed at the buffer's limits as asyncio's transports do. While its reading is
    paused, nothing is delivered to it.
    """

    def __init__(self, protocol: asyncio.Protocol, peername: tuple[str, int], clock: FakeLoop):
        super().__init__()
        self.protocol = protocol
        self.peername = peername
        self.clock = clock
        self.other: Pipe = self
        self.sent: list[bytes] = []
        self.closing = False
        self.lost = False
        self.rate: float | None = None  # bytes a second the socket takes (None: all at once)
        self.buffer: deque[tuple[float, bytes]] = deque()  # (when its last byte goes, chunk)
        self.buffered = 0
        self.busy_until = 0.0
        self.high, self.low = 64 * 1024, 16 * 1024  # asyncio's defaults
        self.paused = False
        self.reading = True
        self.largest_buffer = 0  # the most bytes the write buffer ever held

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peername if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 4 * low if low is not None else 64 * 1024
        self.high, self.low = high, high // 4 if low is None else low

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.lost:
            return
        if self.rate is None:
            self.sent.append(bytes(data))
            return
        data = bytes(data)
        for start in range(0, len(data), RATE_CHUNK):  # bytes go in order, a chunk at a time
            chunk = data[start : start + RATE_CHUNK]
            self.busy_until = max(self.clock.now, self.busy_until) + len(chunk) / self.rate
            self.buffer.append((self.busy_until, chunk))
            self.clock.call_at(self.busy_until, self._taken)
        self.buffered += len(data)
        self.largest_buffer = max(self.largest_buffer, self.buffered)
        if not self.paused and self.buffered > self.high:
            self.paused = True
            self.protocol.pause_writing()

    def _taken(self) -> None:
        """Chunks whose last byte went leave the buffer for the other end."""
        while self.buffer and self.buffer[0][0] <= self.clock.now:
            data = self.buffer.popleft()[1]
            self.buffered -= len(data)
            if not self.lost:
                self.sent.append(data)
        if self.paused and self.buffered <= self.low and not self.lost:
            self.paused = False
            self.protocol.resume_writing()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


class Network:
    """Addresses that brokers listen on, and the connections between them."""

    def __init__(self, clock: FakeLoop) -> None:
        self.clock = clock
        self.listeners: dict[str, Links] = {}
        self.pipes: list[Pipe] = []
        self.attempts: list[tuple[str, float]] = []  # every address dialled, and when
        self.rates: dict[Links, float] = {}  # bytes a second the sockets of a broker take
        self._ports = itertools.count(40000)

    def throttle(self, links: Links, rate: float) -> None:
        """The sockets `links` writes to take `rate` bytes a second, from now on."""
        self.rates[links] = rate
        for pipe in self.pipes:
            if _links_of(pipe) is links:
                pipe.rate = rate

    async def create_connection(
        self,
        protocol_factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        *,
        ssl: Any = None,
    ) -> tuple[Pipe, asyncio.Protocol]:
        address = f"{host}:{port}"
        self.attempts.append((address, self.clock.now))
        links = self.listeners.get(address)
        if links is None:
            raise ConnectionRefusedError(f"nothing listens on {address}")
        caller = ("127.0.0.1", next(self._ports))
        assert links.admit(f"{caller[0]}:{caller[1]}")
        client, server = protocol_factory(), links.accepted()
        near, far = Pipe(client, (host, port), self.clock), Pipe(server, caller, self.clock)
        near.other, far.other = far, near
        for pipe in (near, far):
            owner = _links_of(pipe)
            pipe.rate = None if owner is None else self.rates.get(owner)
        self.pipes += [near, far]
        client.connection_made(near)
        server.connection_made(far)
        return near, client

    def transfer(self, limit: int | None = None) -> int:
        """Deliver what was written (at most `limit` writes); close what was closed."""
        moved = 0
        for pipe in list(self.pipes):
            while pipe.sent and pipe.other.reading and (limit is None or moved < limit):
                data = pipe.sent.pop(0)
                if not pipe.other.lost:
                    pipe.other.protocol.data_received(data)
                moved += 1
            if pipe.closing and not pipe.sent and not pipe.lost:
                self._lose(pipe)
                moved += 1
        return moved

    def pending(self, links: Links) -> int:
        """Writes of `links`' connections not yet delivered."""
        return sum(len(p.sent) for p in self.pipes if _links_of(p) is links)

    def cut(self, links: Links) -> None:
        """Every connection of `links` breaks, and what was on its way is lost."""
        for pipe in [p for p in self.pipes if _links_of(p) is links]:
            pipe.sent.clear()
            pipe.other.sent.clear()
            self._lose(pipe)

    def _lose(self, pipe: Pipe) -> None:
        for end in (pipe, pipe.other):
            if not end.lost:
                end.lost = end.closing = True
                self.pipes.remove(end)
                end.protocol.connection_lost(None)


def _links_of(pipe: Pipe) -> Links | None:
    return pipe.protocol.links if isinstance(pipe.protocol, Link) else None


@functools.cache
def _identity(instance: str) -> tuple[bytes, bytes]:
    return generate_broker_identity(uuid.UUID(instance))


class Broker:
    """A core and its transport, on the world's network and clock."""

    def __init__(
        self, world: World, name: str, instance: str, address: str, public_send: bool = True
    ) -> None:
        self.world = world
        self.public_send = public_send
        self.name = name
        self.instance = instance
        self.address = address
        self.data_dir = world.tmp / name
        self.data_dir.mkdir()
        key_pem, cert_pem = _identity(instance)  # made once per test run
        fd = os.open(self.data_dir / KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        (self.data_dir / CERT_FILE).write_bytes(cert_pem)
        self.relay = OutboundRelay()
        self.core = Core(clock=world.clock, instance=instance, sink=self.relay)
        self.transport = self._start()

    def _start(self) -> Transport:
        engine = self.core.engine
        self.logins: set[str] = set()
        self.permissions = Permissions(  # wired as the daemon wires it
            self.core.store,
            engine.catalog,
            engine.endpoints,
            engine.transactions,
            self.logins,
            engine.routes.local_target,
            engine.delivery.service_created,
        )
        self.permissions.load()
        if self.public_send and ("public", "SEND", "", "") not in self.permissions.grants:
            self.op("grant", "SEND", "public")
        transport = Transport(
            instance=self.instance,
            delivery=engine.remote,
            endpoints=engine.endpoints,
            routes=engine.routes,
            catalog=engine.catalog,
            statements=engine.ddl,
            store=self.core.store,
            clock=self.world.clock,
            connector=self.world.network,
            wall_clock=self.world.clock.time,
            data_dir=self.data_dir,
            settings=self.world.settings,
            relay=self.relay,
            permission=self.permissions,
        )
        transport.restore()
        self.world.network.listeners[self.address] = transport.links
        transport.resume()
        return transport

    @property
    def certificate(self) -> str:
        return self.transport.trust.identity.certificate_pem.decode()

    def op(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """A client operation of the core, the permissions or the transport (as admin)."""
        ops = {**self.permissions.operations()}
        if hasattr(self, "transport"):
            ops |= self.transport.operations()
        if name in ops:
            return ops[name](self.core.new_session("admin"), *args, **kwargs)
        return self.core.op(name, *args, **kwargs)

    def peer(self, other: Broker) -> Peer:
        return self.transport.peers[uuid.UUID(other.instance)]

    def link_to(self, other: Broker) -> Link | None:
        peer = self.transport.peers.get(uuid.UUID(other.instance))
        return None if peer is None else peer.link

    def transmission_queue(self) -> int:
        """Entries of the transmission queue (committing what is pending first)."""
        self.core.flush()
        return sum(count for _, _, count, _ in self.core.store.transmission_summary())

    def queue(self, name: str) -> int:
        return self.core.engine.queues[name].ready

    async def crash(self) -> None:
        """Stop at once: connections break, what the store did not commit is lost."""
        network = self.world.network
        network.listeners.pop(self.address, None)
        network.cut(self.transport.links)
        self.core.engine.close()
        await self.transport.close()
        self.core.store.discard_pending()

    async def restart(self) -> None:
        """Crash, then start again from what is durable."""
        await self.crash()
        self.relay = OutboundRelay()
        self.core = Core(self.core.store, self.world.clock, self.instance, sink=self.relay)
        self.transport = self._start()


def dialog_services(a: Broker, b: Broker) -> None:
    """A's InitiatorService on queue Initiator; B's TargetService on queue Target (DEFAULT)."""
    a.op("create_queue", "Initiator")
    a.op("create_service", "InitiatorService", "Initiator")
    b.op("create_queue", "Target")
    b.op("create_service", "TargetService", "Target", ["DEFAULT"])


class World:
    """Brokers on one in-memory network and one fake clock."""

    def __init__(self, tmp: Path, **settings: Any) -> None:
        self.tmp = tmp
        self.clock = FakeLoop()
        self.network = Network(self.clock)
        # plain TCP (TLS needs real sockets); acks leave at once unless told otherwise
        self.settings = TransportSettings(**{"tls": False, "ack_delay": 0.0, **settings})
        self.brokers: list[Broker] = []

    def broker(self, name: str, instance: str, address: str, public_send: bool = True) -> Broker:
        broker = Broker(self, name, instance, address, public_send)
        self.brokers.append(broker)
        return broker

    def pair(self) -> tuple[Broker, Broker]:
        """Brokers A and B that trust each other; A routes TargetService to B."""
        a = self.broker("a", A_ID, "127.0.0.1:7001")
        b = self.broker("b", B_ID, "127.0.0.1:7002")
        a.op("create_certificate", "b", b.certificate)
        b.op("create_certificate", "a", a.certificate)
        dialog_services(a, b)
        a.op("create_route", "to_b", "TargetService", f"tcp://{b.address}", broker_instance=B_ID)
        b.op("create_route", "to_a", "InitiatorService", f"tcp://{a.address}", broker_instance=A_ID)
        return a, b

    def trio(
        self, name_brokers: bool = False, trust_b_on_a: bool = True
    ) -> tuple[Broker, Broker, Broker]:
        """A (InitiatorService) -> F -> B (TargetService), F forwarding (when the world's
        settings say so) and trusted by both; routes name an address only unless
        `name_brokers`; A trusts B's certificate unless not `trust_b_on_a`."""
        a = self.broker("a", A_ID, "127.0.0.1:7001")
        f = self.broker("f", F_ID, "127.0.0.1:7003")
        b = self.broker("b", B_ID, "127.0.0.1:7002")
        for x, y in ((a, f), (f, b), (a, b)):
            if x is not a or y is not b or trust_b_on_a:
                x.op("create_certificate", y.name, y.certificate)
            y.op("create_certificate", x.name, x.certificate)
        dialog_services(a, b)
        to_b = {"broker_instance": B_ID} if name_brokers else {}
        to_a = {"broker_instance": A_ID} if name_brokers else {}
        a.op("create_route", "to_b", "TargetService", f"tcp://{f.address}", **to_b)
        f.op("create_route", "to_b", "TargetService", f"tcp://{b.address}", **to_b)
        f.op("create_route", "to_a", "InitiatorService", f"tcp://{a.address}", **to_a)
        b.op("create_route", "to_a", "InitiatorService", f"tcp://{f.address}", **to_a)
        return a, f, b

    async def settle(self, flush: bool = True) -> None:
        """Run what is scheduled and move bytes until nothing moves."""
        clock = self.clock
        for _ in range(10_000):
            moved = clock.run_soon()
            if flush:
                for broker in self.brokers:
                    broker.core.store.flush()
                moved += clock.run_soon()
            attempts = [
                task for b in self.brokers for task in b.transport.links.attempts if not task.done()
            ]
            if attempts:
                await asyncio.gather(*attempts)
                moved += len(attempts)
            moved += self.network.transfer()
            if not moved:
                return
        raise AssertionError("the brokers did not settle")

    async def advance(self, seconds: float, flush: bool = True) -> None:
        """Settle, then move time forward timer by timer, settling after each."""
        target = self.clock.now + seconds
        await self.settle(flush)
        while True:
            due = self.clock.next_due()
            if due is None or due > target:
                self.clock.advance(target - self.clock.now)
                await self.settle(flush)
                return
            self.clock.advance(max(0.0, due - self.clock.now))
            await self.settle(flush)
