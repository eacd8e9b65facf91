"""Links: the connections to adjacent brokers, and the brokers at their far ends.

Theory of operation. A `Link` is one TCP connection (mutual TLS between brokers unless
[transport] tls = false) driven by protocol's sans-IO `LinkConnection`: bytes in, events
out. It hands its owner (`LinkEvents`: the transport) the frames of each read together,
in order with the handshake and closing events around them, a slice of READ_SLICE
messages per turn of the event loop (the socket's reading paused while frames already
read wait for their turn), and tells it when its
socket takes writes again: it pauses as soon as the socket does not take a write
whole (`WRITE_BUFFER_HIGH`), so that what waits in its buffer is at most one write of the
pump's (see `pump`). A `Peer` is a broker this broker holds dialogs with; it
outlives connections (its `DialogPeer` is sans-IO) and is the peer of at most one
established link.

`Links` owns every link. It dials an address on demand, one attempt at a time per
address, after the backoff its last failure earned (retry_initial, doubling up to
retry_max); an address whose route has a mirror address (MIRROR_ADDRESS: another
address of the same broker, whose daemons share a database and only one of which
listens) is one attempt at both, the one that answered last first, and the link is
known by the route's address whichever answered; it accepts incoming connections at most `accept_rate` a second (a token
bucket: each may cost an RSA signature before its sender has proved anything), and it
closes a link that was quiet for `idle_timeout` while nothing waits to go on it. Time
comes from the `Clock` port and connections from the `Connector` port, so that tests
run links on an in-memory network with a fake clock.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from collections.abc import Callable
from typing import Final, Protocol, cast

from ssb.protocol import (
    NEED_DATA,
    PROTOCOL_VERSION,
    AckFrame,
    BundleFrame,
    CloseFrame,
    ConnectionClosed,
    DialogPeer,
    FragmentFrame,
    HandshakeCompleted,
    LinkState,
    LocatedFrame,
    LocateFrame,
    ProtocolError,
    ProtocolErrorFrame,
    Role,
    UnbundleFrame,
    older_version_in_refusal,
)

from .._config import ClientLimits
from .._core.ports import Cancellable
from .._core.transmission import DialogOutbox, DirectionKey
from .._tls import Door
from .ports import Clock, Connector
from .refusals import REFUSAL_LOG_EVERY
from .settings import TransportSettings
from .trust import Trust

log = logging.getLogger("ssb.transport")

Frames = list[FragmentFrame | BundleFrame | AckFrame]

# bytes the connection's write buffer may hold before the link pauses (`Link.paused`):
# one write's worth at most waits there, every later frame is chosen when it can go
WRITE_BUFFER_HIGH: Final = 1
# messages one turn of the event loop takes from a link's reads (a bundle counts its
# messages, any other frame one): the rest waits for the next turn, with the socket's
# reading paused, so that clients' requests and the store's commits wait behind at most
# this much of another broker's traffic, not a whole read of it
READ_SLICE: Final = 64


class Peer:
    """One broker this broker holds dialogs with: its dialogs, its own connection if it is
    adjacent, where to reach it, and what is in flight to it. Each part of the transport
    keeps its share here: links the connection and address, outbound the outboxes and
    the in-flight budget, the pump its timer, inbound the counters of refused frames."""

    __slots__ = (
        "address",
        "boxes",
        "certificate_pem",
        "corrupt_fragments",
        "dialog",
        "instance",
        "link",
        "pump_scheduled",
        "refused_fragments",
        "relayed_bundles",
        "services",
        "timer",
        "timer_at",
        "via",
    )

    def __init__(self, instance: uuid.UUID, dialog: DialogPeer, certificate_pem: bytes) -> None:
        self.instance = instance
        self.dialog = dialog
        self.certificate_pem = certificate_pem
        self.link: Link | None = None
        self.address: str | None = None
        self.timer: Cancellable | None = None
        self.timer_at: float | None = None
        self.corrupt_fragments = 0
        self.refused_fragments = 0
        self.services: set[str] = set()  # services it hosts that we send to
        # the adjacent broker its frames arrive through, when that is not itself
        # (a forwarder); frames to it go back the same way unless a route says otherwise
        self.via: uuid.UUID | None = None
        # bundles may go to it through a forwarder (until one says they cannot go on)
        self.relayed_bundles = True
        self.pump_scheduled = False
        # outboxes with entries still to pull (what is pulled and not yet acked, the
        # dialog layer counts: `dialog.unacked_messages`)
        self.boxes: dict[DirectionKey, DialogOutbox] = {}

    def has_work(self) -> bool:
        """Frames to send now, or a retransmission or ack due later."""
        dialog = self.dialog
        return dialog.wants_to_send or dialog.get_timer() is not None


class LinkEvents(Protocol):
    """What links tell their owner."""

    def frames(self, link: Link, frames: Frames) -> None:
        """The dialog frames of one read (only once the link has a peer)."""

    def established(self, link: Link, event: HandshakeCompleted) -> None: ...

    def lost(self, link: Link) -> None:
        """The connection is gone (after `Links` forgot it)."""

    def locate(self, link: Link, frame: LocateFrame | LocatedFrame) -> None:
        """A question about where a service is, or an answer (see `locator`)."""

    def unbundle(self, link: Link, frame: UnbundleFrame) -> None:
        """A forwarder says a dialog direction's bundles cannot go on (see `forwarding`)."""

    def writable(self, peer: Peer) -> None:
        """The link of `peer` takes writes again."""

    def retry(self, address: str) -> None:
        """The backoff after a failed attempt to reach `address` is over."""

    def housekeeping(self, now: float) -> None:
        """Called at every idle check (every half idle_timeout)."""


class Link(asyncio.Protocol):
    """One TCP connection to an adjacent broker."""

    def __init__(self, links: Links, role: Role, address: str) -> None:
        self.links = links
        self.events = links.events
        self.clock = links.clock
        self.role = role
        self.address = address
        self.connection = links.trust.new_connection(
            role, links.offers.get(address, PROTOCOL_VERSION)
        )
        self.transport: asyncio.Transport | None = None
        self.peer: Peer | None = None
        self.paused = False
        self.slicing = False  # frames already read wait for the loop's next turn
        self.closed = False
        self.login_state = "HANDSHAKE"
        self.reason = ""  # why this side closed it (empty: the peer or the network did)
        self.last_activity = self.clock.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        # pause as soon as the socket does not take a write whole, resume once it took
        # all: frames are chosen when the socket takes bytes (see pump), not queued here
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=0)
        peer = self.transport.get_extra_info("peername")
        if self.role is Role.ACCEPTOR and isinstance(peer, tuple):
            self.address = f"{peer[0]}:{peer[1]}"
        self.links.all.add(self)
        self.last_activity = self.clock.time()
        self._flush()

    @property
    def established(self) -> bool:
        """Open, and past the handshake: frames may be written."""
        return not self.closed and self.connection.state is LinkState.ESTABLISHED

    def _flush(self) -> None:
        data = self.connection.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self.last_activity = self.clock.time()

    def data_received(self, data: bytes) -> None:
        self.last_activity = self.clock.time()
        self.connection.receive_data(data)
        if not self.slicing:
            self._read()

    def _next_slice(self) -> None:
        self.slicing = False
        if self.closed:
            return
        self._read()
        if not self.slicing and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _read(self) -> None:
        """Handle what was read, READ_SLICE messages at most; the rest in the loop's next
        turn (`_next_slice`), reading paused until it is done."""
        connection = self.connection
        batch: Frames = []
        room = READ_SLICE
        try:
            while True:
                if room <= 0:
                    self.slicing = True
                    break
                event = connection.next_event()
                if event is NEED_DATA:
                    break
                if isinstance(event, (FragmentFrame, BundleFrame, AckFrame)):
                    if self.peer is not None:
                        batch.append(event)
                        room -= len(event.payloads) if isinstance(event, BundleFrame) else 1
                    continue
                if batch:  # keep the order of frames and other events
                    self.events.frames(self, batch)
                    batch = []
                if isinstance(event, HandshakeCompleted):
                    self.login_state = "AUTHENTICATED"
                    self._flush()  # our proof goes before any fragment
                    self.events.established(self, event)
                elif isinstance(event, (LocateFrame, LocatedFrame)):
                    if self.peer is not None:
                        self.events.locate(self, event)
                elif isinstance(event, UnbundleFrame):
                    if self.peer is not None:
                        self.events.unbundle(self, event)
                elif isinstance(event, ProtocolErrorFrame):
                    if self.peer is None and self.links.older_version(self, event):
                        self.close(f"the peer speaks an older protocol version: {event.text}")
                        return
                    log.warning("peer %s reported a protocol error: %s", self.address, event)
                    if self.peer is None:
                        self.login_state = f"FAILED: refused by peer: {event.text}"
                        self.links.handshake_failed(self, f"refused by the peer: {event.text}")
                    self.close(f"the peer reported a protocol error: {event.text}")
                    return
                elif isinstance(event, CloseFrame):
                    self.close(f"closed by the peer ({event.reason or 'no reason given'})")
                    return
                elif isinstance(event, ConnectionClosed):
                    self.close("the peer's connection ended")
                    return
        except ProtocolError as exc:
            if batch:
                self.events.frames(self, batch)
            if self.peer is None:
                self.login_state = f"FAILED: {exc}"
                self.links.handshake_failed(self, str(exc))
            log.warning("closing broker connection %s: %s", self.address, exc)
            self._flush()
            self.close(f"protocol error: {exc}")
            return
        if batch:
            self.events.frames(self, batch)
        self._flush()
        if self.slicing:
            if self.transport is not None and not self.transport.is_closing():
                self.transport.pause_reading()
            self.clock.call_soon(self._next_slice)

    def close(self, reason: str = "") -> None:
        self.reason = self.reason or reason
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def shut(self, said: str, reason: str = "") -> None:
        """Close, telling the peer `said` first if the link is up."""
        if self.connection.state is LinkState.ESTABLISHED:
            self.write(self.connection.send(CloseFrame(said)))
        self.close(reason)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.peer is not None and self.connection.version < PROTOCOL_VERSION:
            # the next connection offers ours again: the peer may have been upgraded
            self.links.offers.pop(self.address, None)
        if not self.reason:
            self.reason = f"connection lost: {exc}" if exc is not None else "closed by the peer"
        self.links.all.discard(self)
        self.events.lost(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.peer is not None:
            self.events.writable(self.peer)


class TokenBucket:
    """`rate` events a second on average, `burst` at once."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, 0.0

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class Links:
    """Every connection to an adjacent broker: dialled, accepted, closed when idle."""

    def __init__(
        self,
        events: LinkEvents,
        trust: Trust,
        clock: Clock,
        connector: Connector,
        settings: TransportSettings,
        mirror: Callable[[str], str | None] = lambda address: None,
    ) -> None:
        """`mirror`: the mirror address (host:port) of a route's address, if it has one."""
        self.events = events
        self.mirror = mirror
        self.answered: dict[str, str] = {}  # a mirrored address -> which of the two answered
        self.trust = trust
        self.clock = clock
        self.connector = connector
        self.settings = settings
        self.all: set[Link] = set()
        self.door: Door | None = None
        self.closing = False
        self.connecting: set[str] = set()
        self.connect_errors: dict[str, str] = {}
        self.retry_at: dict[str, float] = {}
        self.retry_delay: dict[str, float] = {}
        # address -> the older protocol version its broker asked for (see `older_version`)
        self.offers: dict[str, int] = {}
        self.accepts = TokenBucket(settings.accept_rate, burst=max(1.0, settings.accept_rate))
        self._accept_refusals = 0
        self._accept_logged = -REFUSAL_LOG_EVERY
        self._idle_timer: Cancellable | None = None
        self.attempts: set[asyncio.Task[None]] = set()  # connections being opened

    # ---- accepting ---------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        """Accept brokers' connections on `host`:`port` (0: any free port)."""
        self.door = Door(
            self.accepted,
            self.trust.tls_server,
            not self.settings.tls,
            ClientLimits(login_timeout=self.settings.connect_timeout),
            lambda host: sum(1 for lk in self.all if lk.address.rpartition(":")[0] == host),
            self.admit,
        )
        return await self.door.start(host, port)

    def accepted(self) -> Link:
        """The link of a connection accepted from another broker."""
        return Link(self, Role.ACCEPTOR, "")

    def admit(self, address: str) -> bool:
        """Whether an incoming connection from `address` is within `accept_rate`; one
        beyond it is closed before any handshake work."""
        now = self.clock.time()
        if self.accepts.take(now):
            return True
        self._accept_refusals += 1
        if now - self._accept_logged >= REFUSAL_LOG_EVERY:
            log.warning(
                "closed %d incoming broker connection(s) beyond [transport] accept_rate = %g/s"
                " (latest from %s)",
                self._accept_refusals,
                self.settings.accept_rate,
                address,
            )
            self._accept_logged, self._accept_refusals = now, 0
        return False

    def tls_changed(self) -> None:
        if self.door is not None:
            self.door.context = self.trust.tls_server

    # ---- dialling ----------------------------------------------------------------------

    def connect(self, address: str) -> None:
        """Open a connection to `address` unless one is open or opening (after the
        backoff of the last failure)."""
        if address in self.connecting or self.closing:
            return
        if any(
            lk.address == address and not lk.closed for lk in self.all if lk.role is Role.INITIATOR
        ):
            return
        self.connecting.add(address)
        delay = self.retry_at.get(address, 0.0) - self.clock.time()
        if delay > 0:
            self.clock.call_later(delay, self._dial, address)
        else:
            self._dial(address)

    def _dial(self, address: str) -> None:
        if self.closing:
            self.connecting.discard(address)
            return
        task = asyncio.get_running_loop().create_task(self._open(address))
        self.attempts.add(task)
        task.add_done_callback(self.attempts.discard)

    async def _open(self, address: str) -> None:
        try:
            mirror = self.mirror(address)
            endpoints = [address] if mirror is None else [address, mirror]
            if self.answered.get(address) == mirror:
                endpoints.reverse()
            failures = []
            for endpoint in endpoints:
                text = await self._dial_one(address, endpoint)
                if text is None:
                    if mirror is not None:
                        if self.answered.get(address, address) != endpoint:
                            log.info("broker of route address %s answers at %s", address, endpoint)
                        self.answered[address] = endpoint
                    return
                failures.append(text)
            text = "; ".join(failures)
            if self.connect_errors.get(address) != text:
                log.warning("cannot reach broker at %s: %s", address, text)
            self.connect_errors[address] = text
            self.clock.call_later(self.backoff(address), self.events.retry, address)
        finally:
            self.connecting.discard(address)

    async def _dial_one(self, address: str, endpoint: str) -> str | None:
        """Connect to `endpoint` for the route address `address` (the link's name); None
        when connected, else why not."""
        host, _, port = endpoint.rpartition(":")
        try:
            await asyncio.wait_for(
                self.connector.create_connection(
                    lambda: Link(self, Role.INITIATOR, address),
                    host,
                    int(port),
                    ssl=self.trust.tls_client,
                ),
                self.settings.connect_timeout,
            )
        except (TimeoutError, OSError, ValueError) as exc:
            if isinstance(exc, ssl.SSLError):
                return f"TLS with {endpoint} failed: {exc.reason or exc}; both brokers must trust each other's certificate"
            if isinstance(exc, ConnectionRefusedError):
                return f"connection refused by {endpoint}"
            if isinstance(exc, asyncio.TimeoutError):
                return f"connection to {endpoint} timed out"
            return f"cannot connect to {endpoint}: {exc}"
        return None

    def backoff(self, address: str) -> float:
        """The next attempt at `address` waits this long, and the one after twice that."""
        step = self.retry_delay.get(address, self.settings.retry_initial)
        self.retry_at[address] = self.clock.time() + step
        self.retry_delay[address] = min(step * 2, self.settings.retry_max)
        return step

    def retry_later(self, address: str) -> None:
        """Try `address` again once its backoff is over."""
        delay = max(0.0, self.retry_at.get(address, 0.0) - self.clock.time())
        self.clock.call_later(delay, self.events.retry, address)

    def handshake_failed(self, link: Link, reason: str) -> None:
        if link.role is Role.INITIATOR:
            self.connect_errors[link.address] = (
                f"handshake with {link.address} failed: {reason}; both brokers must trust"
                " each other's certificate (create_certificate with the peer's"
                " broker_certificate())"
            )
            self.backoff(link.address)

    def older_version(self, link: Link, refusal: ProtocolErrorFrame) -> bool:
        """Whether the broker `link` dialled refused our version for an older one of its
        own; then the next connection (retried at once) offers that one."""
        if link.role is not Role.INITIATOR:
            return False
        version = older_version_in_refusal(refusal, link.connection.version)
        if version is None:
            return False
        log.info(
            "broker at %s speaks protocol version %d: connecting again with it",
            link.address,
            version,
        )
        self.offers[link.address] = version
        return True

    def reached(self, address: str) -> None:
        """A connection to `address` is up: its backoff starts over."""
        self.connect_errors.pop(address, None)
        self.retry_delay.pop(address, None)
        self.retry_at.pop(address, None)

    # ---- idle links and closing --------------------------------------------------------

    def start(self) -> None:
        """Start checking for idle links."""
        self._arm_idle_check()

    def _arm_idle_check(self) -> None:
        interval = max(0.05, self.settings.idle_timeout / 2)
        self._idle_timer = self.clock.call_later(interval, self._idle_check)

    def _idle_check(self) -> None:
        now = self.clock.time()
        timeout = self.settings.idle_timeout
        for link in list(self.all):
            peer = link.peer
            if now - link.last_activity >= timeout and (peer is None or not peer.has_work()):
                link.shut("idle", f"idle for {timeout:g} s")
        self.events.housekeeping(now)
        if not self.closing:
            self._arm_idle_check()

    def close_all(self, said: str) -> None:
        """Close every link, telling each peer why (they reconnect when they need to)."""
        for link in list(self.all):
            link.shut(said)

    async def close(self) -> None:
        self.closing = True
        if self.door is not None:
            self.door.close()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self.close_all("broker shutting down")
        for task in list(self.attempts):
            task.cancel()
        if self.attempts:
            await asyncio.gather(*self.attempts, return_exceptions=True)
