"""Shared helpers for the multi-broker tests: start N daemons, trust, route, poll, check EOIO.

`Federation` starts one `BrokerProcess` per name on 127.0.0.1 (each its own data dir and
free ports) with short transport timeouts, opens one client connection to each, and
makes every broker trust every other broker's certificate. Catalog helpers create the
same message types and contract on every broker (each broker has its own catalog),
initiator and target services, and routes in both directions. Waiting is always a poll
with a deadline (`wait_until`) or a RECEIVE with WAITFOR, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import operator
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from daemon import BrokerProcess
from faultproxy import FaultPlan, ThreadedFaultProxy
from setup_objects import numbered_batches

from ssb import client
from ssb.tools import wait_until

T = TypeVar("T")

# small timeouts so that reconnects, retransmissions and idle closes happen within a test
TRANSPORT: dict[str, Any] = {
    "idle_timeout": 1.0,
    "retry_initial": 0.2,
    "retry_max": 1.0,
    "fragment_size": 65536,
}
# the same in plain TCP (fault proxies and taps see frames; fragments stay signed)
PLAIN: dict[str, Any] = {**TRANSPORT, "tls": False}
# the override for a broker that relays other brokers' dialogs
FORWARDER: dict[str, Any] = {"forwarding": True}

REQUEST = "AsyncSent"
REPLY = "AsyncDone"
CONTRACT = "AsyncContract"
DIAGNOSTIC_VIEWS = ("transmission_queue", "broker_connections", "conversation_endpoints")


# ---- brokers -----------------------------------------------------------------------------


@dataclass
class Node:
    """One broker daemon of a federation and an admin connection to it."""

    name: str
    process: BrokerProcess
    conn: client.Connection
    instance: str = ""
    certificate: str = ""

    @property
    def broker_port(self) -> int:
        port = self.process.broker_port
        if not port:
            raise AssertionError(
                f"broker {self.name} printed no broker=HOST:PORT in its ready line: "
                "the broker-to-broker transport is not listening"
            )
        return port

    @property
    def address(self) -> str:
        """The route address of this broker's broker port."""
        return f"tcp://127.0.0.1:{self.broker_port}"

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    async def view(self, name: str) -> list[dict[str, Any]]:
        return await self.conn.view(name)

    async def connect(self, reconnect: bool = True) -> client.Connection:
        """A further session with this broker (the caller closes it)."""
        return await client.connect(self.process.url, reconnect=reconnect)


class Federation:
    """N brokers on 127.0.0.1 that trust each other; an async context manager.

    Args:
        root: a directory for the data dirs, configs and logs (tmp_path).
        names: one broker per name.
        durability: "os" (survives kill -9 of a daemon, faster) or "fsync".
        transport: the `[transport]` settings; defaults to `TRANSPORT`.
        trust: exchange certificates between every pair of brokers.
        overrides: more `[transport]` settings for some brokers, by name.
    """

    def __init__(
        self,
        root: Path,
        names: Sequence[str],
        durability: str = "os",
        transport: dict[str, Any] | None = None,
        trust: bool = True,
        overrides: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.root = root
        self.overrides = overrides or {}
        self.names = list(names)
        self.durability = durability
        self.transport = dict(TRANSPORT if transport is None else transport)
        self.trust = trust
        self.nodes: dict[str, Node] = {}
        self._extra: list[client.Connection] = []

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    async def __aenter__(self) -> Federation:
        try:
            for name in self.names:
                process = BrokerProcess(
                    self.root / name,
                    durability=self.durability,
                    config={
                        "http_port": 0,  # (/metrics)
                        "transport": {**self.transport, **self.overrides.get(name, {})},
                    },
                )
                process.start()
                conn = await client.connect(process.url)
                node = Node(name, process, conn)
                self.nodes[name] = node
                node.instance = await conn.broker_instance()
                assert node.instance == process.instance, "instance id differs from ready line"
                node.certificate = await conn.broker_certificate()
                assert "BEGIN CERTIFICATE" in node.certificate, node.certificate[:80]
                node.broker_port  # noqa: B018 - fail early and clearly without a broker port
            if self.trust:
                for node in self.nodes.values():
                    for peer in self.nodes.values():
                        if peer is not node:
                            await trust(node, peer)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            await self.report()
        for conn in [*self._extra, *(n.conn for n in self.nodes.values())]:
            with contextlib.suppress(Exception):
                await conn.close()
        for node in self.nodes.values():
            node.process.kill()

    async def report(self, rows: int = 10) -> None:
        """Print each broker's transport views and log tail (pytest shows them on failure)."""
        for node in self.nodes.values():
            print(f"---- broker {node.name} {node.instance} ----")
            try:
                async with asyncio.timeout(5):
                    conn = await client.connect(node.process.url)
                    try:
                        for view in DIAGNOSTIC_VIEWS:
                            found = await conn.view(view)
                            print(f"{view}: {len(found)} rows")
                            for row in found[:rows]:
                                print(f"  {row}")
                    finally:
                        await conn.close()
            except Exception as exc:
                print(f"views unavailable: {exc!r}")
            with contextlib.suppress(OSError):
                print(f"log tail:\n{node.process.log_text()[-3000:]}")

    async def session(self, name: str, reconnect: bool = True) -> client.Connection:
        """Another connection to broker `name`, closed with the federation."""
        conn = await self.nodes[name].connect(reconnect)
        self._extra.append(conn)
        return conn

    async def restart(self, name: str, kill: bool = True) -> Node:
        """kill -9 (or SIGTERM) broker `name` and start it again on the same dir and ports."""
        node = self.nodes[name]
        with contextlib.suppress(Exception):
            await node.conn.close()
        if kill:
            node.process.kill()
        else:
            node.process.stop()
        node.process.start()
        node.conn = await client.connect(node.process.url)
        return node


class Trio(NamedTuple):
    """What `forwarding_trio` yields: the federation, its brokers A, F and B, and the
    queues of A's service Initiator and B's TargetB."""

    fed: Federation
    a: Node
    f: Node
    b: Node
    init_q: str
    target_q: str


@contextlib.asynccontextmanager
async def forwarding_trio(
    root: Path, chain: bool = False, named: bool = True
) -> AsyncIterator[Trio]:
    """Brokers A, F and B on plain links, F a forwarder (it hosts no service of the
    dialogs it relays), with Initiator on A and TargetB on B (`dialog_services`); with
    `chain`, routes along A -> F -> B and back (`route_chain`, naming the far broker
    unless `named` is false)."""
    async with Federation(
        root, ["A", "F", "B"], transport=PLAIN, overrides={"F": FORWARDER}
    ) as fed:
        a, f, b = fed["A"], fed["F"], fed["B"]
        init_q, target_q = await dialog_services(a, b)
        if chain:
            await route_chain(a, [f], b, named=named)
        yield Trio(fed, a, f, b, init_q, target_q)


async def trust(node: Node, peer: Node) -> None:
    """`node` trusts `peer` (CREATE CERTIFICATE from the peer's public certificate)."""
    await node.conn.create_certificate(f"cert_{peer.name}", peer.certificate)


# ---- catalog -------------------------------------------------------------------------------


async def create_contract(*nodes: Node) -> None:
    """The message types and contract every broker of a test needs (same names everywhere),
    on each of `nodes`."""
    for node in nodes:
        await node.conn.create_message_type(REQUEST, validation="NONE")
        await node.conn.create_message_type(REPLY, validation="NONE")
        await node.conn.create_contract(CONTRACT, {REQUEST: "INITIATOR", REPLY: "TARGET"})


async def create_initiator(node: Node, service: str, queue: str | None = None) -> str:
    """A service that begins dialogs; other brokers may answer it (SEND to PUBLIC, whom
    their certificates map to)."""
    queue = queue or f"{service}Queue"
    await node.conn.create_queue(queue)
    await node.conn.create_service(service, queue=queue)
    await node.conn.grant("SEND", "public", "service", service)
    return queue


async def create_target(
    node: Node, service: str, queue: str | None = None, status: str = "ON"
) -> str:
    """A service on CONTRACT that other brokers may send to (SEND to PUBLIC)."""
    queue = queue or f"{service}Queue"
    await node.conn.create_queue(queue, status=status)
    await node.conn.create_service(service, queue=queue, contracts=[CONTRACT])
    await node.conn.grant("SEND", "public", "service", service)
    return queue


async def dialog_services(a: Node, b: Node, target_status: str = "ON") -> tuple[str, str]:
    """The contract on both brokers, service Initiator on `a`, TargetB on `b` (no routes);
    returns their queues."""
    await create_contract(a, b)
    init_q = await create_initiator(a, "Initiator")
    return init_q, await create_target(b, "TargetB", status=target_status)


async def begin_dialogs(node: Node, count: int) -> list[uuid.UUID]:
    """`count` dialogs from Initiator on `node` to TargetB (the services `dialog_services`
    makes), on the contract: their handles, in the order they were begun."""
    return [
        await node.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        for _ in range(count)
    ]


async def two_brokers_with_a_dialog_pair(
    fed: Federation, target_status: str = "ON"
) -> tuple[Node, Node, str, str]:
    """Initiator service on A, TargetB on B, contract on both, routes both ways."""
    a, b = fed["A"], fed["B"]
    init_q, target_q = await dialog_services(a, b, target_status)
    await link(a, "Initiator", b, "TargetB")
    return a, b, init_q, target_q


async def route(
    node: Node,
    service: str,
    to: Node | str,
    broker_instance: str | None = None,
    lifetime: float | None = None,
    name: str | None = None,
) -> str:
    """On `node`, a route for `service` to broker `to` (or to an address such as a proxy's)."""
    address = to.address if isinstance(to, Node) else to
    name = name or f"route_{service}_{uuid.uuid4().hex[:8]}"
    await node.conn.create_route(
        name, service, address, broker_instance=broker_instance, lifetime=lifetime
    )
    return name


async def link(
    initiator: Node,
    initiator_service: str,
    target: Node,
    target_service: str,
    forward: str | None = None,
    back: str | None = None,
) -> None:
    """Routes both ways between a service on `initiator` and one on `target`.

    `forward` / `back` override the addresses (e.g. a fault proxy in between).
    """
    await route(initiator, target_service, forward or target)
    await route(target, initiator_service, back or initiator)


async def route_chain(a: Node, hops: Sequence[Node], b: Node, named: bool = True) -> None:
    """Routes for Initiator (on `a`) and TargetB (on `b`) along a -> hops... -> b and back,
    each naming the far broker unless `named` is false (as Service Broker allows: the
    origin then asks along the route which broker hosts the service)."""
    chain = [a, *hops, b]
    for i, node in enumerate(chain):
        if i + 1 < len(chain):
            far = b.instance if named else None
            await route(node, "TargetB", chain[i + 1].address, broker_instance=far)
        if i > 0:
            far = a.instance if named else None
            await route(node, "Initiator", chain[i - 1].address, broker_instance=far)


# ---- waiting -------------------------------------------------------------------------------


async def run_together(*coroutines: Awaitable[Any], timeout: float) -> list[Any]:
    """Run coroutines concurrently; the first failure cancels the others and is raised as is
    (not as an ExceptionGroup), and so is running out of `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout), asyncio.TaskGroup() as group:
            tasks = [group.create_task(_as_coroutine(c)) for c in coroutines]
    except BaseExceptionGroup as failures:
        first = failures.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [t.result() for t in tasks]


def holds(predicate: Callable[[], object]) -> Callable[[], Awaitable[bool]]:
    """A plain condition, `predicate`, as a probe that `wait_until` polls."""

    async def probe() -> bool:
        return bool(predicate())

    return probe


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def pipelined(calls: Iterable[Callable[[], Awaitable[Any]]], in_flight: int) -> None:
    """Start calls in order with at most `in_flight` unanswered; on failure cancel the rest."""
    pending: deque[asyncio.Future[Any]] = deque()
    try:
        for call in calls:
            pending.append(asyncio.ensure_future(call()))
            if len(pending) >= in_flight:
                await pending.popleft()
        while pending:
            await pending.popleft()
    finally:
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def produce(
    conn: client.Connection, batches: Iterable[tuple[uuid.UUID, list[bytes]]], in_flight: int = 6
) -> None:
    """Send requests, each of `batches` (handle, bodies) to a send_many, `in_flight` calls
    in flight."""
    await pipelined(
        (functools.partial(conn.send_many, h, REQUEST, bodies) for h, bodies in batches),
        in_flight,
    )


async def serve(
    conn: client.Connection,
    queue: str,
    got: list[client.Message],
    total: int,
    reply: Callable[[bytes], bytes],
    top: int = 50,
) -> None:
    """Receive `total` requests in transactions (RECEIVE TOP (`top`)), replying to each
    (`reply(body)`) in the same transaction; `got` collects them."""
    while len(got) < total:
        async with conn.transaction():
            messages = await conn.receive(queue, top=top, timeout=1.0)
            for h, group in by_conversation(messages).items():
                await conn.send_many(h, REPLY, [reply(m.message_body) for m in group])
        got += messages


async def collect(
    conn: client.Connection, queue: str, got: list[client.Message], total: int
) -> None:
    """Receive until `got` holds `total` messages."""
    while len(got) < total:
        got += await conn.receive(queue, top=500, timeout=1.0)


@dataclass
class Exchange:
    """Requests from A on every dialog of `handles`, `per_dialog` on each, `body(dialog,
    number)` each (its first field the dialog's number, as in b"3:17:..."), and B's reply
    to each, `reply(request)`; `served` and `replies` hold what B and A received so far."""

    handles: list[uuid.UUID]
    per_dialog: int
    body: Callable[[int, int], bytes]
    reply: Callable[[bytes], bytes]
    served: list[client.Message] = field(default_factory=list)
    replies: list[client.Message] = field(default_factory=list)

    async def run(self, fed: Federation, init_q: str, target_q: str, batch: int) -> None:
        """A sends (`batch` to a send_many), B serves its queue `target_q` replying in the
        same transactions, A collects the replies from its queue `init_q`: all at once, on
        sessions of their own. Raises TimeoutError after 60 seconds."""
        total = len(self.handles) * self.per_dialog
        await run_together(
            produce(
                await fed.session("A"),
                numbered_batches(self.handles, self.per_dialog, batch, self.body),
            ),
            serve(await fed.session("B"), target_q, self.served, total, self.reply),
            collect(await fed.session("A"), init_q, self.replies, total),
            timeout=60,
        )

    def check(self) -> None:
        """B got every request exactly once, in order, with its exact body, and A got every
        reply likewise, on the dialog it was sent on."""
        streams = assert_eoio(self.served)
        assert len(streams) == len(self.handles)
        for bodies in streams.values():
            dialog = int(bodies[0].split(b":", 1)[0])
            assert bodies == [self.body(dialog, n) for n in range(self.per_dialog)]
        replied = assert_eoio(self.replies)
        assert set(replied) == set(self.handles)
        for dialog, h in enumerate(self.handles):
            expected = [self.reply(self.body(dialog, n)) for n in range(self.per_dialog)]
            assert replied[h] == expected


async def receive_count(
    conn: client.Connection,
    queue: str,
    count: int,
    timeout: float = 30.0,
    top: int = 500,
    **where: Any,
) -> list[client.Message]:
    """RECEIVE (autocommit) until `count` messages came, or fail after `timeout` seconds."""
    got: list[client.Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(
                f"only {len(got)} of {count} messages from {queue} in {timeout:g} s"
            )
        got += await conn.receive(
            queue, top=min(top, count - len(got)), timeout=min(1.0, left), **where
        )
    return got


async def request_and_reply(
    a: Node, b: Node, init_q: str, target_q: str, request: bytes, reply: bytes
) -> None:
    """The one message that reaches B's `target_q` is `request`, and B's `reply` on its
    conversation reaches A's `init_q`."""
    (got,) = await receive_count(b.conn, target_q, 1)
    assert got.message_body == request
    await b.conn.send(got.conversation_handle, REPLY, reply)
    (answer,) = await receive_count(a.conn, init_q, 1)
    assert answer.message_body == reply


async def end_dialogs(
    a: Node, b: Node, handles: list[uuid.UUID], target_q: str, sent: int, timeout: float = 30.0
) -> None:
    """A ends its dialogs `handles`, B sees each END_DIALOG after `sent` messages on its
    queue `target_q` and ends its side; then neither broker has anything left to send nor
    an endpoint."""
    await asyncio.gather(*(a.conn.end_conversation(h) for h in handles))
    ends = await receive_count(b.conn, target_q, len(handles), timeout=timeout)
    assert {(m.message_type_name, m.message_sequence_number) for m in ends} == {
        (client.END_DIALOG, sent)
    }
    for m in ends:
        await b.conn.end_conversation(m.conversation_handle)
    await wait_quiet([a, b])


async def transmission_queue(node: Node) -> list[dict[str, Any]]:
    return await node.view("transmission_queue")


async def connections(node: Node) -> list[dict[str, Any]]:
    return await node.view("broker_connections")


async def endpoints(node: Node) -> list[dict[str, Any]]:
    return await node.view("conversation_endpoints")


async def wait_quiet(nodes: Iterable[Node], timeout: float = 30.0) -> None:
    """Wait until no broker has a message in its transmission queue or a conversation endpoint."""
    for node in nodes:
        for view in ("transmission_queue", "conversation_endpoints"):
            await _emptied(node, view, timeout)


async def acknowledged(node: Node, timeout: float = 30.0) -> None:
    """Wait until every message `node` sent was acknowledged (its transmission queue is
    empty)."""
    await _emptied(node, "transmission_queue", timeout)


async def _emptied(node: Node, view: str, timeout: float) -> None:
    await wait_until(
        functools.partial(node.view, view),
        f"an empty {view} on {node.name}",
        timeout,
        until=operator.not_,
    )


# ---- checks ----------------------------------------------------------------------------------


def by_conversation(messages: Iterable[client.Message]) -> dict[uuid.UUID, list[client.Message]]:
    groups: dict[uuid.UUID, list[client.Message]] = defaultdict(list)
    for m in messages:
        groups[m.conversation_handle].append(m)
    return dict(groups)


def assert_eoio(messages: Iterable[client.Message], first: int = 0) -> dict[uuid.UUID, list[bytes]]:
    """Each conversation's sequenced messages arrived once each, numbered first, first+1, ...

    Returns each conversation's bodies in arrival order.
    """
    bodies: dict[uuid.UUID, list[bytes]] = {}
    for handle, group in by_conversation(messages).items():
        numbers = [m.message_sequence_number for m in group]
        expected = list(range(first, first + len(group)))
        if numbers != expected:
            dup = len(numbers) - len(set(numbers))
            raise AssertionError(
                f"conversation {handle}: sequence numbers are not {first}..{first + len(group) - 1}"
                f" in order ({dup} duplicates; first difference at "
                f"{next(i for i, (a, b) in enumerate(zip(numbers, expected, strict=True)) if a != b)}"
                f": {numbers[:5]}...)"
            )
        bodies[handle] = [m.message_body for m in group]
    return bodies


class Hop:
    """The two fault proxies between brokers X and Y: `to_y` carries the connection X opens
    (up = X -> Y), `to_x` the one Y opens (up = Y -> X). Which of the two the brokers keep
    depends on their instance ids, so both inject faults both ways: `plan(seed, towards_y)`
    is the plan of each direction, its seed one of seed .. seed + 3."""

    def __init__(
        self, name: str, x: Node, y: Node, seed: int, plan: Callable[[int, bool], FaultPlan]
    ) -> None:
        self.name = name
        self.to_y = ThreadedFaultProxy(
            y.broker_port, up=plan(seed, True), down=plan(seed + 1, False)
        )
        self.to_x = ThreadedFaultProxy(
            x.broker_port, up=plan(seed + 2, False), down=plan(seed + 3, True)
        )

    def start(self) -> Hop:
        self.to_y.start()
        try:
            self.to_x.start()
        except BaseException:
            self.to_y.stop()
            raise
        return self

    def stop(self) -> None:
        self.to_y.stop()
        self.to_x.stop()

    def __enter__(self) -> Hop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_clean(self) -> None:
        self.to_y.set_clean()
        self.to_x.set_clean()

    @property
    def cuts(self) -> int:
        return self.to_y.stats.cuts + self.to_x.stats.cuts

    @property
    def duplicates(self) -> int:
        return self.to_y.stats.duplicates + self.to_x.stats.duplicates

    @property
    def corrupted_towards_y(self) -> int:
        return self.to_y.stats.up.payload_corruptions + self.to_x.stats.down.payload_corruptions

    @property
    def corrupted_towards_x(self) -> int:
        return self.to_y.stats.down.payload_corruptions + self.to_x.stats.up.payload_corruptions

    def describe(self) -> str:
        return f"{self.name}: ->y {self.to_y.stats.as_dict()}, ->x {self.to_x.stats.as_dict()}"

    def events(self) -> list[str]:
        return [*self.to_y.stats.events, *self.to_x.stats.events]


@dataclass
class ConnectionSampler:
    """Polls broker_connections of some brokers in the background and keeps every row.

    Connections close when idle, so counters are sampled while traffic flows.
    """

    nodes: list[Node]
    interval: float = 0.2
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    max_established: dict[tuple[str, str | None], int] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _sessions: list[client.Connection] = field(default_factory=list)

    async def start(self) -> ConnectionSampler:
        self._sessions = [await node.connect() for node in self.nodes]
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval)

    async def sample(self) -> None:
        for node, conn in zip(self.nodes, self._sessions, strict=True):
            try:
                rows = await conn.view("broker_connections")
            except client.BrokerError:
                continue  # a broker being killed by the test
            self.rows[node.name] += rows
            established: dict[str | None, int] = defaultdict(int)
            for row in rows:
                if row.get("state") == "ESTABLISHED":
                    established[row.get("peer")] += 1
            for peer, count in established.items():
                key = (node.name, peer)
                self.max_established[key] = max(self.max_established.get(key, 0), count)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.sample()
        for conn in self._sessions:
            with contextlib.suppress(Exception):
                await conn.close()

    def peer_rows(self, node: Node, peer: Node) -> list[dict[str, Any]]:
        return [r for r in self.rows[node.name] if r.get("peer") == peer.instance]

    def peak(self, node: Node, peer: Node, column: str) -> int:
        """The largest value of a counter seen on `node` for connections with `peer`."""
        return max((int(r.get(column) or 0) for r in self.peer_rows(node, peer)), default=0)
