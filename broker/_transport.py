"""Broker-to-broker transport: the asyncio shell around protocol's link and dialog layers.

Theory of operation. Each broker this one holds dialogs with is a `Peer` with one
`DialogPeer` (all dialog directions to it, sans-IO) that outlives TCP connections. An
adjacent peer has at most one established `Link` (a TCP connection driven by a
`LinkConnection`); a peer reached through a forwarding broker has none of its own, and
its frames travel on the forwarder's link (`_link_of`: the broker its frames arrive
through, `Peer.via`, or the one its route's address turned out to be). Incoming frames
go to the peer whose dialog they belong to (`far` maps conversations held with a
non-adjacent peer), and frames of other brokers' dialogs to the `Forwarder` when
forwarding is on (see `_forwarding`). Connections are opened on demand to the address a
route gives, authenticated by the handshake (certificates trusted with
`create_certificate`), closed after `idle_timeout` of quiet, and reopened when there is
traffic again. If both brokers connect at once, both keep the connection opened by the
broker with the smaller instance id. A dialog direction that reaches this broker
through a forwarder is opened only with its origin's signature over the envelope and
wrapped session key (`_origin`).

Sending: the core keeps messages for other brokers in its durable transmission queue,
one outbox per dialog direction (see `_core.delivery`), and tells the transport
(`outbound`). Once the entries are durable and the peer's identity is known, `_feed`
pulls them into the direction's `DialogSender` (opened with a fresh session key,
wrapped with the peer's public key and persisted), in order, while the peer's in-flight
budget (IN_FLIGHT_MESSAGES, IN_FLIGHT_BYTES) allows: memory holds what is in flight, not
the backlog. A direction the budget leaves out gets its first entry from a small reserve,
so that priorities and the starvation bound of the dialog layer apply to it too. `pump` writes due fragments (retries first, then fresh fragments
round-robin by priority, acks piggybacked) while the socket accepts them; on a peer's
own connection (not through a forwarder) runs of small messages go as bundles. A
`MessageAcked` deletes the message from the transmission queue, frees its budget and
feeds more; an acknowledged EndDialog or Error lets the ending endpoint close.

Receiving: before the dialog layer sees a fragment, the core says whether a message for
that direction could be stored now; a fragment for a full queue, or while the disk is
full, is dropped unacknowledged and the sender retries with its usual backoff. Fragments
go to the dialog layer; `MessageReceived` is handed to the core (which creates the
target endpoint with the first message, or holds the message while the target queue is
OFF), fragments of incomplete messages are held in the store, and the receiver's next
sequence number is persisted, all in the store's open batch. Only when that batch is
durable does the dialog layer learn the events were stored, so no ack ever leaves for
something a crash could lose.

Restart: receivers come back from their persisted next sequence number and held
fragments; a sender resumes at its direction's first unacknowledged message (numbers in
between that were acknowledged out of order are skipped, see `DialogSender.skip_to`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import ssl
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from ssb.protocol import (
    NEED_DATA,
    AckFrame,
    BundleFrame,
    CloseFrame,
    ConnectionClosed,
    DialogEvent,
    DialogPeer,
    Direction,
    Envelope,
    ErrorCode,
    FragmentFrame,
    FragmentReceived,
    HandshakeCompleted,
    HeldFragment,
    IntegrityError,
    IntegrityFailure,
    LinkConnection,
    LinkState,
    MessageAcked,
    MessageReceived,
    PartialMessageDiscarded,
    ProtocolError,
    ProtocolErrorFrame,
    RetryPolicy,
    Role,
    SessionKeyReceived,
    TrustStore,
    UnknownDialog,
    certificate_broker_id,
    new_session_key,
    pack,
    sign_origin,
    unpack,
    verify_origin,
    wrap_session_key,
)

from ._config import ClientLimits, ConfigError, checked_section
from ._core import catalog as cat
from ._core.conversations import Endpoint
from ._core.delivery import SYSTEM_TYPES, DialogOutbox, DirectionKey, Outbound
from ._core.engine import Engine
from ._core.transactions import Session
from ._errors import BrokerError, bad_argument
from ._forwarding import Forwarder, Frame, Hop
from ._identity import Identity, IdentityFiles
from ._store import Store
from ._tls import Door, fingerprint
from ._views import HeldPartial

log = logging.getLogger("ssb.transport")

SEND_BATCH: Final = 256
IN_FLIGHT_MESSAGES: Final = 8192  # messages pulled into a peer's senders and not yet acked
IN_FLIGHT_BYTES: Final = 64 * 1024 * 1024  # their bodies
# beyond them, for the first entry of directions the budget left out (see _feed_first)
RESERVE_MESSAGES: Final = 1024
RESERVE_BYTES: Final = 16 * 1024 * 1024
FEED_CHUNK: Final = 256  # messages pulled from one direction per turn
REFUSAL_LOG_EVERY: Final = 60.0  # seconds between log lines about one refused direction


@dataclass(frozen=True)
class TransportSettings:
    idle_timeout: float = 60.0
    retry_initial: float = 4.0
    retry_max: float = 64.0
    fragment_size: int = 64 * 1024
    ack_delay: float = 0.05
    connect_timeout: float = 5.0
    honor_broker_priority: bool = True
    # a dialog waiting this long to transmit goes next, whatever its priority
    starvation_bound: float = 2.0
    # how long the receiving side of an ended dialog stays to ack late retransmissions
    closed_dialog_linger: float = 300.0
    # incoming broker connections accepted per second (each may cost an RSA signature
    # before its sender has proved anything); more are closed at once
    accept_rate: float = 20.0
    # mutual TLS between brokers, with their broker identities (off: plain TCP; the
    # handshake still authenticates both sides and fragments are still signed)
    tls: bool = True
    # relay other brokers' dialogs along this broker's routes (see _forwarding), holding
    # at most forward_size megabytes of their frames
    forwarding: bool = False
    forward_size: int = 10

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> TransportSettings:
        """The config's [transport] section, every value checked."""
        ranges: dict[str, tuple[float, float, bool] | None] = {
            "idle_timeout": (0.01, 86400.0, False),
            "retry_initial": (0.01, 3600.0, False),
            "retry_max": (0.01, 86400.0, False),
            "fragment_size": (1024, 1024 * 1024, True),
            "ack_delay": (0.0, 1.0, False),
            "connect_timeout": (0.01, 600.0, False),
            "starvation_bound": (0.001, 3600.0, False),
            "closed_dialog_linger": (0.0, 86400.0, False),
            "accept_rate": (0.1, 10000.0, False),
            "forward_size": (1, 1024 * 1024, True),
            "honor_broker_priority": None,
            "tls": None,
            "forwarding": None,
        }
        settings = cls(**checked_section("transport", section, ranges))
        if settings.retry_max < settings.retry_initial:
            raise ConfigError("[transport] retry_max must be at least retry_initial")
        return settings


def transmission_priority(level: int, honor_broker_priority: bool) -> int:
    """The level a dialog direction is transmitted at: its endpoint's, or 5 when the
    instance does not honor broker priorities. It never travels on the wire."""
    return level if honor_broker_priority else 5


@functools.lru_cache(maxsize=1024)
def _instance_id(text: str) -> uuid.UUID:
    return uuid.UUID(text)


@functools.lru_cache(maxsize=1024)
def _instance_text(instance: uuid.UUID) -> str:
    return str(instance)


def _direction(from_initiator: bool) -> Direction:
    return Direction.FROM_INITIATOR if from_initiator else Direction.FROM_TARGET


class _Arrivals:
    """Consecutive messages of one dialog direction and type, delivered together."""

    __slots__ = ("bodies", "envelope", "message_type", "seq")

    def __init__(self, message_type: str, seq: int, body: bytes, envelope: Envelope) -> None:
        self.message_type = message_type
        self.seq = seq
        self.bodies = [body]
        self.envelope = envelope


class _Applying:
    """What applying one read's frames leaves for its end: the messages to deliver (per
    direction, one enqueue each), the events to acknowledge once durable, and each
    direction's next sequence number to persist."""

    __slots__ = ("arrivals", "next_seqs", "stored")

    def __init__(self) -> None:
        self.stored: list[MessageReceived | FragmentReceived] = []
        self.next_seqs: dict[tuple[uuid.UUID, Direction], int] = {}
        self.arrivals: dict[tuple[uuid.UUID, Direction], _Arrivals] = {}


class Peer:
    """One adjacent broker: its dialogs, its connection, where to reach it."""

    def __init__(self, instance: uuid.UUID, dialog: DialogPeer, certificate_pem: bytes) -> None:
        self.instance = instance
        self.dialog = dialog
        self.certificate_pem = certificate_pem
        self.link: Link | None = None
        self.address: str | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at: float | None = None
        self.corrupt_fragments = 0
        self.refused_fragments = 0
        self.last_error = ""
        self.services: set[str] = set()  # services it hosts that we send to
        # the adjacent broker its frames arrive through, when that is not itself
        # (a forwarder); frames to it go back the same way unless a route says otherwise
        self.via: uuid.UUID | None = None
        self.pump_scheduled = False
        # outboxes with entries still to pull, and what is pulled and not yet acked
        self.boxes: dict[DirectionKey, DialogOutbox] = {}
        self.in_flight: dict[tuple[uuid.UUID, Direction, int], tuple[int, str]] = {}
        self.in_flight_bytes = 0


class Link(asyncio.Protocol):
    """One TCP connection to an adjacent broker."""

    def __init__(self, owner: Transport, role: Role, address: str) -> None:
        self.owner = owner
        self.role = role
        self.address = address
        self.link = owner.new_link_connection(role)
        self.transport: asyncio.Transport | None = None
        self.peer: Peer | None = None
        self.paused = False
        self.closed = False
        self.login_state = "HANDSHAKE"
        self.reason = ""  # why this side closed it (empty: the peer or the network did)
        self.last_activity = time.time()
        self.last_activity_mono = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = self.transport.get_extra_info("peername")
        if self.role is Role.ACCEPTOR and isinstance(peer, tuple):
            self.address = f"{peer[0]}:{peer[1]}"
        self.owner.links.add(self)
        self._touch()
        self._flush()

    @property
    def established(self) -> bool:
        """Open, and past the handshake: frames may be written."""
        return not self.closed and self.link.state is LinkState.ESTABLISHED

    def _touch(self) -> None:
        self.last_activity = time.time()
        self.last_activity_mono = self.owner.loop.time()

    def _flush(self) -> None:
        data = self.link.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self._touch()

    def data_received(self, data: bytes) -> None:
        self._touch()
        self.link.receive_data(data)
        batch: list[FragmentFrame | BundleFrame | AckFrame] = []
        try:
            while True:
                event = self.link.next_event()
                if event is NEED_DATA:
                    break
                if isinstance(event, (FragmentFrame, BundleFrame, AckFrame)):
                    if self.peer is not None:
                        batch.append(event)
                    continue
                if batch:  # keep the order of frames and other events
                    self.owner.frames(self, batch)
                    batch = []
                if isinstance(event, HandshakeCompleted):
                    self.login_state = "AUTHENTICATED"
                    self._flush()  # our proof goes before any fragment
                    self.owner.established(self, event)
                elif isinstance(event, ProtocolErrorFrame):
                    log.warning("peer %s reported a protocol error: %s", self.address, event)
                    if self.peer is None:
                        self.login_state = f"FAILED: refused by peer: {event.text}"
                        self.owner.handshake_failed(self, f"refused by the peer: {event.text}")
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
                self.owner.frames(self, batch)
            if self.peer is None:
                self.login_state = f"FAILED: {exc}"
                self.owner.handshake_failed(self, str(exc))
            log.warning("closing broker connection %s: %s", self.address, exc)
            self._flush()
            self.close(f"protocol error: {exc}")
            return
        if batch:
            self.owner.frames(self, batch)
        self._flush()

    def close(self, reason: str = "") -> None:
        self.reason = self.reason or reason
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.reason:
            self.reason = f"connection lost: {exc}" if exc is not None else "closed by the peer"
        self.owner.lost(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.peer is not None:
            self.owner.writable(self.peer)


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


class Transport:
    """All adjacent brokers of this broker; the core's OutboundSink."""

    def __init__(
        self, engine: Engine, store: Store, data_dir: Path, settings: TransportSettings
    ) -> None:
        self.engine = engine
        self.store = store
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.instance = uuid.UUID(engine.instance_id)
        self.identity_files = IdentityFiles(data_dir, engine.instance_id)
        self.identity: Identity = self.identity_files.load()
        self.trust = self._trust_store()
        self.tls_server, self.tls_client = self._tls_contexts()
        self.door: Door | None = None
        self.peers: dict[uuid.UUID, Peer] = {}
        self.links: set[Link] = set()
        self.accepts = TokenBucket(settings.accept_rate, burst=max(1.0, settings.accept_rate))
        self._accept_refusals = 0
        self._accept_logged = -REFUSAL_LOG_EVERY
        self.address_peer: dict[str, uuid.UUID] = {}
        # outboxes waiting to learn which broker an address is
        self.waiting: dict[str, dict[DirectionKey, DialogOutbox]] = {}
        self.unrouted: dict[DirectionKey, DialogOutbox] = {}  # no route (yet)
        self.connecting: set[str] = set()
        self.connect_errors: dict[str, str] = {}
        self.retry_at: dict[str, float] = {}
        self.retry_delay: dict[str, float] = {}
        self.envelopes: dict[tuple[uuid.UUID, Direction], Envelope] = {}
        self.discarding: set[tuple[uuid.UUID, Direction]] = set()
        self.held_seqs: set[tuple[uuid.UUID, Direction, int]] = set()
        self.closed_conversations: set[uuid.UUID] = set()  # ended here recently
        self._closed_order: deque[tuple[float, uuid.UUID]] = deque()
        # told of, to place once durable: by the store batch their entries are in, in the
        # order they were told of (a dict as an ordered set)
        self._fresh: dict[int, dict[DialogOutbox, None]] = {}
        self._refusal_logged: dict[DirectionKey, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self.closing = False
        # conversations whose dialogs are with a broker other than the adjacent one their
        # frames arrive from (found on the first such frame; see _partner)
        self.far: dict[uuid.UUID, Peer] = {}
        self.forwarder = (
            Forwarder(
                self.instance,
                settings.forward_size * 1024 * 1024,
                min(1.0, settings.retry_initial / 2),
                self._relay_hop,
                self._relay_send,
            )
            if settings.forwarding
            else None
        )

    # ---- identity and trust ----------------------------------------------------

    def _trust_store(self) -> TrustStore:
        return TrustStore([c.pem.encode() for c in self.engine.catalog.certificates.values()])

    def _tls_contexts(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
        """Mutual TLS with the broker identities: each side presents its broker
        certificate and accepts only the certificates this broker trusts (self-signed:
        each is its own trust anchor)."""
        if not self.settings.tls:
            return None, None
        trusted = "".join(c.pem for c in self.engine.catalog.certificates.values())
        contexts = []
        for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
            context = ssl.SSLContext(purpose)
            context.load_cert_chain(self.identity_files.cert_path, self.identity_files.key_path)
            context.check_hostname = False  # the broker id, not a host name, is checked
            context.verify_mode = ssl.CERT_REQUIRED
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            if trusted:
                context.load_verify_locations(cadata=trusted)
            contexts.append(context)
        return contexts[0], contexts[1]

    def _trust_changed(self) -> None:
        self.trust = self._trust_store()
        self.tls_server, self.tls_client = self._tls_contexts()
        if self.door is not None:
            self.door.context = self.tls_server

    @staticmethod
    def _tls_matches(link: Link, certificate_pem: bytes) -> bool:
        """The TLS peer is the broker of the link handshake (no relay in between)."""
        ssl_object = None if link.transport is None else link.transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return False
        der = ssl_object.getpeercert(binary_form=True)
        try:
            return bool(der) and der == ssl.PEM_cert_to_DER_cert(certificate_pem.decode())
        except ValueError:
            return False

    def _admit(self, address: str) -> bool:
        if self.accepts.take(self.loop.time()):
            return True
        self.refused_accept(address)
        return False

    def trusted_certificate(self, instance: uuid.UUID) -> bytes | None:
        for cert in self.engine.catalog.certificates.values():
            if cert.broker_instance == str(instance):
                return cert.pem.encode()
        return None

    def new_link_connection(self, role: Role) -> LinkConnection:
        return LinkConnection(
            role,
            broker_id=self.instance,
            private_key=self.identity.private_key,
            certificate_pem=self.identity.certificate_pem,
            trusted=self.trust,
        )

    def _peer(self, instance: uuid.UUID, certificate_pem: bytes | None = None) -> Peer | None:
        peer = self.peers.get(instance)
        if peer is not None:
            return peer
        pem = certificate_pem or self.trusted_certificate(instance)
        if pem is None:
            return None
        s = self.settings
        dialog = DialogPeer(
            private_key=self.identity.private_keys,
            peer_public_key=pem,
            fragment_size=s.fragment_size,
            retry=RetryPolicy(initial=s.retry_initial, factor=2.0, maximum=s.retry_max),
            ack_delay=s.ack_delay,
            starvation_bound=s.starvation_bound,
        )
        peer = self.peers[instance] = Peer(instance, dialog, pem)
        return peer

    # ---- operations and views for clients --------------------------------------------

    def operations(self) -> dict[str, Callable[..., Any]]:
        return {
            "broker_certificate": self.op_broker_certificate,
            "create_certificate": self.op_create_certificate,
            "drop_certificate": self.op_drop_certificate,
            "next_broker_certificate": self.op_next_broker_certificate,
            "rotate_broker_certificate": self.op_rotate_broker_certificate,
            "create_remote_service_binding": self.op_create_remote_service_binding,
            "drop_remote_service_binding": self.op_drop_remote_service_binding,
        }

    def views(self) -> dict[str, Callable[[], list[dict[str, Any]]]]:
        return {
            "broker_connections": self.connections_view,
            "certificates": self.certificates_view,
            "forwarded_conversations": self.forwarded_view,
            "remote_service_bindings": self.bindings_view,
        }

    def forwarded_view(self) -> list[dict[str, Any]]:
        """Conversations this broker relays for others (empty unless forwarding is on)."""
        return [] if self.forwarder is None else self.forwarder.view()

    def certificates_view(self) -> list[dict[str, Any]]:
        """The peer brokers' certificates this broker trusts (CREATE CERTIFICATE)."""
        return [
            {
                "name": c.name,
                "broker_instance": c.broker_instance,
                "fingerprint": fingerprint(c.pem),
            }
            for c in sorted(self.engine.catalog.certificates.values(), key=lambda c: c.name)
        ]

    def partials(self) -> list[HeldPartial]:
        """Messages from other brokers that are still arriving, with where they go."""
        found = []
        for peer in self.peers.values():
            for receiver in peer.dialog.receivers():
                held = receiver.partials()
                key = (receiver.conversation_id, receiver.direction)
                if not held or key in self.discarding:
                    continue
                envelope = self.envelopes.get(key)
                ep = self.engine.endpoints.by_conversation(key[0], key[1] is Direction.FROM_TARGET)
                service = ep.service if ep else envelope.to_service if envelope else ""
                defined = self.engine.catalog.services.get(service)
                queue = ep.queue if ep else defined.queue if defined else None
                for message in held:
                    found.append(
                        HeldPartial(
                            queue,
                            ep.handle if ep else None,
                            ep.group_id if ep else None,
                            ep.priority if ep else 5,
                            service,
                            ep.contract if ep else envelope.contract if envelope else "",
                            ep.far_service if ep else envelope.from_service if envelope else "",
                            str(peer.instance),
                            key[0],
                            message,
                        )
                    )
        return found

    def op_broker_certificate(self, session: Session) -> str:
        return self.identity.certificate_pem.decode()

    def _peer_certificate(self, kind: str, name: object, pem: object) -> tuple[str, str]:
        """(name, broker instance) of a new catalog object holding another broker's
        certificate; raises if the name is taken or `pem` is not such a certificate."""
        name = cat.check_name(kind.replace("_", " "), name)
        if not isinstance(pem, str):
            raise bad_argument("pem must be the peer's certificate in PEM text")
        if name in self.engine.catalog.table(kind):
            raise BrokerError(
                ErrorCode.ALREADY_EXISTS, f"{kind.replace('_', ' ')} '{name}' already exists"
            )
        try:
            instance = certificate_broker_id(pem.encode())
            TrustStore([pem.encode()])
        except ProtocolError as exc:
            raise bad_argument(f"not a broker certificate: {exc}") from None
        if instance == self.instance:
            raise bad_argument("that is this broker's own certificate")
        return name, str(instance)

    def op_create_certificate(self, session: Session, name: object, pem: object) -> None:
        name, instance = self._peer_certificate("certificate", name, pem)
        assert isinstance(pem, str)
        self.engine.ddl.persist("certificate", cat.Certificate(name, pem, instance))
        self._trust_changed()
        self._replace_all()

    def op_create_remote_service_binding(
        self, session: Session, name: object, service: object, pem: object
    ) -> None:
        name, instance = self._peer_certificate("remote_service_binding", name, pem)
        if not isinstance(service, str) or not service:
            raise bad_argument("service must be the name of the remote service")
        assert isinstance(pem, str)
        binding = cat.RemoteServiceBinding(name, service, pem, instance)
        self.engine.ddl.persist("remote_service_binding", binding)
        self._replace_all()

    def op_drop_remote_service_binding(self, session: Session, name: object) -> None:
        if not isinstance(name, str):
            raise bad_argument("drop_remote_service_binding needs a binding name")
        self.engine.ddl.drop(session, "remote_service_binding", name)

    def bindings_view(self) -> list[dict[str, Any]]:
        return [
            {"name": b.name, "remote_service_name": b.service, "broker_instance": b.broker_instance}
            for b in sorted(self.engine.catalog.bindings.values(), key=lambda b: b.name)
        ]

    def op_next_broker_certificate(self, session: Session) -> str:
        pem = self.identity_files.stage_next()
        log.info("next broker certificate staged; trust it on every peer, then rotate")
        return pem.decode()

    def op_rotate_broker_certificate(self, session: Session) -> str:
        if not self.identity_files.has_next():
            raise bad_argument(
                "no next certificate is staged: call next_broker_certificate() first and"
                " trust what it returns on every peer (create_certificate)"
            )
        self.identity = self.identity_files.rotate()
        for peer in self.peers.values():
            peer.dialog.private_key = self.identity.private_keys
        self._trust_changed()
        for link in list(self.links):  # peers reconnect and meet the new certificate
            if link.link.state is LinkState.ESTABLISHED:
                link.write(link.link.send(CloseFrame("broker certificate rotated")))
            link.close()
        log.info(
            "broker certificate rotated; %d previous key(s) kept", len(self.identity.previous_keys)
        )
        return self.identity.certificate_pem.decode()

    def op_drop_certificate(self, session: Session, name: object) -> None:
        if not isinstance(name, str):
            raise bad_argument("drop_certificate needs a certificate name")
        self.engine.ddl.drop(session, "certificate", name)
        self._trust_changed()

    # ---- start and stop ------------------------------------------------------------

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._restore()
        limits = ClientLimits(login_timeout=self.settings.connect_timeout)
        self.door = Door(
            lambda: Link(self, Role.ACCEPTOR, ""),
            self.tls_server,
            not self.settings.tls,
            limits,
            lambda host: sum(1 for lk in self.links if lk.address.rpartition(":")[0] == host),
            self._admit,
        )
        sock = await self.door.start(host, port)
        self._arm_idle_check()
        for box in self.engine.delivery.remote_outboxes():
            self._place(box)
        for peer in self.peers.values():
            self.pump(peer)
        return sock[0], sock[1]

    async def close(self) -> None:
        self.closing = True
        if self.door is not None:
            self.door.close()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        for peer in self.peers.values():
            if peer.timer is not None:
                peer.timer.cancel()
        for link in list(self.links):
            if link.link.state is LinkState.ESTABLISHED:
                link.write(link.link.send(CloseFrame("broker shutting down")))
            link.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _restore(self) -> None:
        remote_dialogs, held_fragments = self.store.load_remote()
        held: dict[tuple[uuid.UUID, Direction], list[HeldFragment]] = {}
        for conv, direction, seq, index, count, mtype, payload in held_fragments:
            key = (uuid.UUID(bytes=conv), Direction(direction))
            held.setdefault(key, []).append(HeldFragment(seq, index, count, mtype, payload))
            self.held_seqs.add((key[0], key[1], seq))
        outboxes = self.engine.delivery.outboxes
        for conv_raw, direction, side, peer_id, key, wrapped, next_seq, env in remote_dialogs:
            conv, d = uuid.UUID(bytes=conv_raw), Direction(direction)
            peer = self._peer(uuid.UUID(peer_id))
            if peer is None:
                log.warning("no trusted certificate for broker %s; dialog %s waits", peer_id, conv)
                continue
            envelope = Envelope.decode(unpack(env)) if env else None
            if side == "recv":
                if envelope is not None:
                    self.envelopes[(conv, d)] = envelope
                events = peer.dialog.open_receiver(
                    conv,
                    d,
                    session_key=key,
                    next_expected_seq=next_seq,
                    encrypted=envelope is not None and envelope.encrypted,
                    held_fragments=held.get((conv, d), ()),
                )
                self._apply(peer, events)
                continue
            from_initiator = d is Direction.FROM_INITIATOR
            box = outboxes.get((conv, from_initiator))
            ep = self.engine.endpoints.by_conversation(conv, from_initiator)
            if (box is None or box.local) and ep is None:
                self.store.delete_remote_dialog(conv, int(d), "send")
                continue
            first = box.first_key() if box is not None and not box.local else None
            resume = first if first is not None else (ep.send_seq if ep else 0)
            assert envelope is not None
            peer.dialog.open_sender(
                conv,
                d,
                envelope,
                session_key=key,
                wrapped_session_key=wrapped,
                next_seq=resume,
                priority=self._priority(box.priority if box is not None else 5),
            )
            peer.services.add(envelope.to_service)

    def _priority(self, level: int) -> int:
        return transmission_priority(level, self.settings.honor_broker_priority)

    # ---- outbound: the core's OutboundSink -------------------------------------------------

    def outbound(self, box: DialogOutbox) -> None:
        """The core put entries for another broker in `box`; they go once durable (a message
        sent before its sender's commit could reach the peer, be lost here in a crash, and its
        sequence number be used again for another message)."""
        batch = self.store.watermark()
        fresh = self._fresh.get(batch)
        if fresh is None:
            fresh = self._fresh[batch] = {}
            self.store.when_durable(batch, lambda: self._place_soon(batch))
        fresh[box] = None

    def _place_soon(self, durable: int) -> None:
        # in the loop's next turn: the senders' answers, waiting for the same batch, go first
        self.loop.call_soon(self._place_fresh, durable)

    def _place_fresh(self, durable: int) -> None:
        """Batch `durable` is durable: place the boxes told of up to it (those of a later
        batch wait for theirs; placed now they would find nothing to pull, and nothing
        would feed them again while their link is idle)."""
        for batch in [b for b in self._fresh if b <= durable]:
            for box in self._fresh.pop(batch):
                self._place(box)

    def _place(self, box: DialogOutbox) -> None:
        """Find the peer of a direction's entries and feed it, or record why they wait."""
        if self.closing or self.engine.delivery.outboxes.get(box.direction) is not box:
            return
        key = box.direction
        route = self.engine.routes.find(box.to_service, box.to_broker_instance)
        address = None if route is None else self._route_address(route.address, box.to_service)
        if route is None or address is None:
            box.status = f"no route to service '{box.to_service}'"
            self.unrouted[key] = box
            return
        self.unrouted.pop(key, None)
        box.status = ""
        named = box.to_broker_instance or route.broker_instance
        instance = _instance_id(named) if named else self.address_peer.get(address)
        peer = self._peer(instance) if instance else None
        if peer is None and named:
            box.status = (
                f"no certificate of broker {named} is trusted here: create_certificate with"
                " its broker_certificate()"
            )
        if peer is None:
            self.waiting.setdefault(address, {})[key] = box
            self._connect(address)
            return
        opened = peer.dialog.sender(key[0], _direction(key[1])) is not None
        refusal = None if opened else self._encryption_refusal(box, peer)
        if refusal is not None:
            box.status = refusal
            self.unrouted[key] = box
            self._log_refusal(
                (key[0], _direction(key[1])), "conversation %s waits: %s", key[0], refusal
            )
            return
        peer.address = address
        peer.boxes[key] = box
        self._feed(peer)
        self._feed_first(peer, key, box)

    def _feed_first(self, peer: Peer, key: DirectionKey, box: DialogOutbox) -> None:
        """A direction the in-flight budget left out, with nothing in flight, gets its first
        entry from a small reserve, so that the dialog layer's priorities and starvation
        bound see it: fed in turn, a low-priority direction placed behind a large
        backlog would wait for all of it, whatever the bound."""
        if peer.boxes.get(key) is not box:
            return  # fed whole already
        sender = peer.dialog.sender(key[0], _direction(key[1]))
        if sender is not None and sender.unacked_count:
            return
        if (
            len(peer.in_flight) >= IN_FLIGHT_MESSAGES + RESERVE_MESSAGES
            or peer.in_flight_bytes >= IN_FLIGHT_BYTES + RESERVE_BYTES
        ):
            return
        delivery = self.engine.delivery
        for out in delivery.pull(box, 1, RESERVE_BYTES):
            self._queue(peer, out)
        if delivery.outboxes.get(key) is not box:
            del peer.boxes[key]
        self.pump_soon(peer)

    def _encryption_refusal(self, box: DialogOutbox, peer: Peer) -> str | None:
        """Why an encrypted dialog's messages may not go to `peer` (None: they may)."""
        conversation_id, from_initiator = box.direction
        if not from_initiator:
            return None  # the target answers with the initiator broker's certificate
        ep = self.engine.endpoints.by_conversation(conversation_id, True)
        if ep is None or not ep.encrypted:
            return None
        try:
            binding = self.engine.catalog.binding_for(box.to_service)
        except BrokerError as exc:
            return str(exc)
        if binding.broker_instance != str(peer.instance):
            return (
                f"ENCRYPTION = ON: the remote service binding '{binding.name}' names broker"
                f" {binding.broker_instance} for service '{box.to_service}', but the route"
                f" leads to broker {peer.instance}"
            )
        return None

    def _recipient(self, peer: Peer, out: Outbound, direction: Direction) -> tuple[bool, bytes]:
        """Whether a new dialog direction is encrypted, and whose certificate its session
        key is wrapped for: the far service's binding for an encrypted initiator, else
        the peer's. Placing the direction checked that the binding names the peer, so a
        binding dropped since leaves the peer's certificate: the same broker, never clear
        text (and never an exception in the middle of feeding the peer)."""
        if out.is_initiator:
            ep = self.engine.endpoints.by_conversation(out.conversation_id, True)
            if ep is not None and ep.encrypted:
                binding = self.engine.catalog.find_binding(out.to_service)
                return True, peer.certificate_pem if binding is None else binding.pem.encode()
            return False, peer.certificate_pem
        incoming = self.envelopes.get((out.conversation_id, direction.reverse))
        return incoming is not None and incoming.encrypted, peer.certificate_pem

    def _replace_all(self) -> None:
        """Routes or trust changed: place again every direction that waits."""
        boxes = list(self.unrouted.values())
        for waiting in self.waiting.values():
            boxes += waiting.values()
        self.unrouted.clear()
        self.waiting.clear()
        for box in boxes:
            self._place(box)

    def _feed(self, peer: Peer) -> None:
        """Pull durable entries into the peer's senders while its budget allows."""
        delivery = self.engine.delivery
        for key, box in list(peer.boxes.items()):
            room = IN_FLIGHT_MESSAGES - len(peer.in_flight)
            room_bytes = IN_FLIGHT_BYTES - peer.in_flight_bytes
            if room <= 0 or room_bytes <= 0:
                break
            if delivery.outboxes.get(key) is not box:
                del peer.boxes[key]
                continue
            entries = delivery.pull(box, min(room, FEED_CHUNK), room_bytes)
            for out in entries:
                self._queue(peer, out)
            if delivery.outboxes.get(key) is not box:
                del peer.boxes[key]  # all pulled: a later entry makes a new outbox
            elif entries:
                del peer.boxes[key]
                peer.boxes[key] = box  # round robin among directions
        self.pump_soon(peer)

    def _queue(self, peer: Peer, out: Outbound) -> None:
        direction = _direction(out.is_initiator)
        dialog = peer.dialog
        peer.services.add(out.to_service)
        sender = dialog.sender(out.conversation_id, direction)
        if sender is None:
            encrypted, recipient = self._recipient(peer, out, direction)
            envelope = Envelope(
                out.from_service,
                out.to_service,
                out.contract,
                self.instance,
                peer.instance,
                encrypted,
            )
            key = new_session_key()
            wrapped = wrap_session_key(key, recipient)
            # the origin's signature, so that the target can tell, when the dialog reaches
            # it through a forwarder, that no one on the way put in a key of its own
            transcript = envelope.origin_transcript(out.conversation_id, direction, wrapped)
            envelope = dataclasses.replace(
                envelope, origin_proof=sign_origin(self.identity.private_key, transcript)
            )
            sender = dialog.open_sender(
                out.conversation_id,
                direction,
                envelope,
                session_key=key,
                wrapped_session_key=wrapped,
                next_seq=out.seq,
                priority=self._priority(out.priority),
            )
            self.store.put_remote_dialog(
                (
                    out.conversation_id,
                    int(direction),
                    "send",
                    str(peer.instance),
                    key,
                    wrapped,
                    out.seq,
                    pack(envelope.encode()),
                )
            )
            ep = self.engine.endpoints.by_conversation(out.conversation_id, out.is_initiator)
            if ep is not None and ep.far_broker_instance is None:
                ep.far_broker_instance = str(peer.instance)
                self.engine.endpoints.update(ep)
        if out.seq < sender.next_seq:
            return  # already on its way (a duplicate pull cannot happen; kept safe)
        if out.seq > sender.next_seq:
            sender.skip_to(out.seq)  # acknowledged out of order before a restart
        dialog.queue_message(out.conversation_id, direction, out.seq, out.message_type, out.body)
        peer.in_flight[(out.conversation_id, direction, out.seq)] = (out.size, out.message_type)
        peer.in_flight_bytes += out.size

    def endpoint_removed(self, ep: Endpoint) -> None:
        """A local endpoint closed: forget its dialog directions to other brokers."""
        if ep.far_broker_instance in (None, self.engine.instance_id):
            return
        try:
            instance = uuid.UUID(ep.far_broker_instance)
        except ValueError:
            return
        peer = self.peers.get(instance)
        out_d = _direction(ep.is_initiator)
        in_d = out_d.reverse
        store = self.store
        if peer is not None:
            sender = peer.dialog.sender(ep.conversation_id, out_d)
            if sender is not None and sender.unacked_count == 0:
                peer.dialog.close_sender(ep.conversation_id, out_d)
                store.delete_remote_dialog(ep.conversation_id, int(out_d), "send")
            if peer.dialog.receiver(ep.conversation_id, in_d) is not None:
                # keep acking late retransmissions for a while, delivering nothing
                key = (ep.conversation_id, in_d)
                self.discarding.add(key)
                self.loop.call_later(
                    self.settings.closed_dialog_linger, self._close_receiver, peer, key
                )
        self._remember_closed(ep.conversation_id)
        self.far.pop(ep.conversation_id, None)
        store.delete_remote_dialog(ep.conversation_id, int(in_d), "recv")
        store.delete_held_direction(ep.conversation_id, int(in_d))
        self.envelopes.pop((ep.conversation_id, in_d), None)

    def routes_changed(self) -> None:
        """A route was created or dropped: messages may now have somewhere to go."""
        self._replace_all()
        for peer in self.peers.values():
            if peer.link is None and self._has_work(peer):
                self.pump(peer)

    def describe(self, out: Outbound) -> str:
        waiting = self.unrouted.get((out.conversation_id, out.is_initiator))
        if waiting is not None and waiting.status:
            return waiting.status
        route = self.engine.routes.find(out.to_service, out.to_broker_instance)
        if route is None:
            return f"no route to service '{out.to_service}'"
        address = self._route_address(route.address, out.to_service)
        if address is None:
            return f"route '{route.name}' has no usable address"
        return self.connect_errors.get(address, "")

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def _route_address(address: str, service: str) -> str | None:
        if address == "TRANSPORT":
            address = service
        if not address.startswith("tcp://"):
            return None
        return address[len("tcp://") :].split("/", 1)[0]

    # ---- connections -----------------------------------------------------------------

    def _connect(self, address: str) -> None:
        if address in self.connecting or self.closing:
            return
        if any(
            lk.address == address and not lk.closed
            for lk in self.links
            if lk.role is Role.INITIATOR
        ):
            return
        delay = max(0.0, self.retry_at.get(address, 0.0) - self.loop.time())
        self.connecting.add(address)
        task = self.loop.create_task(self._open(address, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, address: str, delay: float) -> None:
        try:
            if delay:
                await asyncio.sleep(delay)
            host, _, port = address.rpartition(":")
            try:
                await asyncio.wait_for(
                    self.loop.create_connection(
                        lambda: Link(self, Role.INITIATOR, address),
                        host,
                        int(port),
                        ssl=self.tls_client,
                    ),
                    self.settings.connect_timeout,
                )
            except (TimeoutError, OSError, ValueError) as exc:
                if isinstance(exc, ssl.SSLError):
                    text = f"TLS with {address} failed: {exc.reason or exc}; both brokers must trust each other's certificate"
                elif isinstance(exc, ConnectionRefusedError):
                    text = f"connection refused by {address}"
                elif isinstance(exc, asyncio.TimeoutError):
                    text = f"connection to {address} timed out"
                else:
                    text = f"cannot connect to {address}: {exc}"
                if self.connect_errors.get(address) != text:
                    log.warning("cannot reach broker at %s: %s", address, text)
                self.connect_errors[address] = text
                self.loop.call_later(self._backoff(address), self._retry_address, address)
        finally:
            self.connecting.discard(address)

    def _retry_address(self, address: str) -> None:
        """Try again: routes may have changed (expired, dropped, added) meanwhile."""
        if self.closing:
            return
        for box in self.waiting.pop(address, {}).values():
            self._place(box)
        for peer in self.peers.values():
            if peer.link is None and peer.address == address and self._has_work(peer):
                self.pump(peer)

    def _peer_address(self, peer: Peer) -> str | None:
        """Where routes say this peer is now (they may have changed or expired), else
        where it was, else where the forwarder its frames arrive through is."""
        for service in peer.services:
            route = self.engine.routes.find(service, str(peer.instance))
            if route is not None and route.address != "LOCAL":
                address = self._route_address(route.address, service)
                if address is not None:
                    return address
        if peer.address is None and peer.via is not None:
            forwarder = self.peers.get(peer.via)
            return None if forwarder is None else forwarder.address
        return peer.address

    def _has_work(self, peer: Peer) -> bool:
        dialog = peer.dialog
        return dialog.wants_to_send or dialog.get_timer() is not None

    # ---- connections -----------------------------------------------------------------

    def established(self, link: Link, event: HandshakeCompleted) -> None:
        instance = event.peer_broker_id
        if self.settings.tls and not self._tls_matches(link, event.peer_certificate_pem):
            log.warning(
                "closing broker connection %s: its TLS certificate is not the one broker %s"
                " proved in the handshake",
                link.address,
                instance,
            )
            link.close()
            return
        peer = self._peer(instance, event.peer_certificate_pem)
        assert peer is not None
        if link.role is Role.INITIATOR:
            # known before a duplicate is closed: peers routed to this address use the
            # connection that stays, whichever it is
            self.address_peer[link.address] = instance
            if self.forwarder is not None:
                self.forwarder.rename(link.address, instance)
        if peer.certificate_pem != event.peer_certificate_pem:
            log.info("broker %s presents a new certificate; new dialogs use it", instance)
            peer.certificate_pem = event.peer_certificate_pem
        current = peer.link
        if current is not None and current is not link and not current.closed:
            keep_ours = self.instance < instance
            current_is_ours = current.role is Role.INITIATOR
            if current_is_ours == keep_ours:
                link.peer = None
                link.write(link.link.send(CloseFrame("duplicate connection")))
                link.close("a duplicate of the link already up")
                if self.forwarder is not None:
                    self.forwarder.flush(instance)  # what waited for the address goes
                return
            current.peer = None
            current.close("replaced by a newer connection")
        link.peer = peer
        peer.link = link
        log.info(
            "link to broker %s up (%s, %s)",
            instance,
            link.address,
            "outbound" if link.role is Role.INITIATOR else "inbound",
        )
        if link.role is Role.INITIATOR:
            peer.address = peer.address or link.address
            self.connect_errors.pop(link.address, None)
            self.retry_delay.pop(link.address, None)
            self.retry_at.pop(link.address, None)
            for box in self.waiting.pop(link.address, {}).values():
                self._place(box)
        now = self.loop.time()
        for routed in [peer, *self._routed_via(peer)]:
            routed.dialog.retransmit_all(now)
        self.writable(peer)

    def refused_accept(self, address: str) -> None:
        """An incoming connection beyond `accept_rate`: closed before any handshake work."""
        self._accept_refusals += 1
        now = self.loop.time()
        if now - self._accept_logged >= REFUSAL_LOG_EVERY:
            log.warning(
                "closed %d incoming broker connection(s) beyond [transport] accept_rate = %g/s"
                " (latest from %s)",
                self._accept_refusals,
                self.settings.accept_rate,
                address,
            )
            self._accept_logged, self._accept_refusals = now, 0

    def handshake_failed(self, link: Link, reason: str) -> None:
        if link.role is Role.INITIATOR:
            self.connect_errors[link.address] = (
                f"handshake with {link.address} failed: {reason}; both brokers must trust"
                " each other's certificate (create_certificate with the peer's"
                " broker_certificate())"
            )
            self._backoff(link.address)

    def _backoff(self, address: str) -> float:
        step = self.retry_delay.get(address, self.settings.retry_initial)
        self.retry_at[address] = self.loop.time() + step
        self.retry_delay[address] = min(step * 2, self.settings.retry_max)
        return step

    def lost(self, link: Link) -> None:
        self.links.discard(link)
        peer = link.peer
        if self.closing:
            return
        if peer is not None and peer.link is link:
            peer.link = None
            log.info("link to broker %s down (%s): %s", peer.instance, link.address, link.reason)
            for routed in [peer, *self._routed_via(peer)]:
                if self._has_work(routed):
                    self.pump(routed)
        elif peer is None and link.role is Role.INITIATOR:
            address = link.address
            if self.waiting.get(address) or any(
                p.address == address and p.link is None and self._has_work(p)
                for p in self.peers.values()
            ):
                delay = max(0.0, self.retry_at.get(address, 0.0) - self.loop.time())
                self.loop.call_later(delay, self._retry_address, address)

    def _arm_idle_check(self) -> None:
        interval = max(0.05, self.settings.idle_timeout / 2)
        self._idle_timer = self.loop.call_later(interval, self._idle_check)

    def _idle_check(self) -> None:
        now = self.loop.time()
        for link in list(self.links):
            peer = link.peer
            quiet = now - link.last_activity_mono >= self.settings.idle_timeout
            if quiet and (peer is None or not self._has_work(peer)):
                if link.link.state is LinkState.ESTABLISHED:
                    link.write(link.link.send(CloseFrame("idle")))
                link.close(f"idle for {self.settings.idle_timeout:g} s")
        if self.forwarder is not None:
            settings = self.settings
            self.forwarder.expire(
                now, max(settings.closed_dialog_linger, 2 * settings.retry_max), settings.retry_max
            )
        if not self.closing:
            self._arm_idle_check()

    # ---- the send loop ---------------------------------------------------------------

    def pump_soon(self, peer: Peer) -> None:
        """Pump once at the end of this loop iteration (many messages, one write)."""
        if not peer.pump_scheduled:
            peer.pump_scheduled = True
            self.loop.call_soon(self._pump_scheduled, peer)

    def _pump_scheduled(self, peer: Peer) -> None:
        peer.pump_scheduled = False
        if not self.closing:
            self.pump(peer)

    def _link_of(self, peer: Peer) -> Link | None:
        """The connection a peer's frames go on: its own, or the one to the forwarder its
        frames arrive through or its route's address leads to."""
        link = peer.link
        if link is not None and not link.closed:
            return link
        hops = (peer.via, None if peer.address is None else self.address_peer.get(peer.address))
        for hop in hops:
            if hop is not None and hop != peer.instance:
                forwarder = self.peers.get(hop)
                if forwarder is not None and forwarder.link is not None:
                    return forwarder.link
        return None

    def _routed_via(self, adjacent: Peer) -> list[Peer]:
        """Peers whose frames travel on `adjacent`'s connection (it forwards them)."""
        return [
            p
            for p in self.peers.values()
            if p is not adjacent
            and p.link is None
            and (
                p.via == adjacent.instance
                or (p.address is not None and self.address_peer.get(p.address) == adjacent.instance)
            )
        ]

    def writable(self, adjacent: Peer) -> None:
        """`adjacent`'s connection takes writes again: everything that goes on it."""
        self.pump(adjacent)
        for peer in self._routed_via(adjacent):
            self.pump(peer)
        if self.forwarder is not None:
            self.forwarder.flush(adjacent.instance)

    def _relay_hop(self, service: str, broker: uuid.UUID) -> Hop | None:
        """The forwarder's next hop for a far service: the adjacent broker (or, not yet
        connected, the address) this broker's routes give."""
        route = self.engine.routes.find(service, str(broker))
        if route is None or route.address == "LOCAL":
            return None
        address = self._route_address(route.address, service)
        if address is None:
            return None
        known = self.address_peer.get(address)
        if known is not None:
            return known
        peer = self.peers.get(broker)
        if peer is not None and peer.link is not None and not peer.link.closed:
            return broker  # connected already (it connected to us): no need to dial
        return address

    def _relay_send(self, hop: Hop, frames: list[Frame]) -> bool:
        """Write relayed frames to `hop`, or say it cannot take them now (and connect)."""
        if isinstance(hop, str):
            address: str | None = hop
            peer = None
        else:
            peer = self.peers.get(hop)
            address = None if peer is None else self._peer_address(peer)
        link = None if peer is None else peer.link
        if link is None or not link.established:
            if address is not None and not self.closing:
                self._connect(address)
            return False
        if link.paused:
            return False
        send = link.link.send
        link.write(b"".join([send(frame) for frame in frames]))
        return True

    def pump(self, peer: Peer) -> None:
        link = self._link_of(peer)
        now = self.loop.time()
        if link is None or not link.established:
            if link is None and self._has_work(peer) and not self.closing:
                address = self._peer_address(peer)
                if address is not None:
                    peer.address = address
                    self._connect(address)
            self._arm(peer)
            return
        dialog = peer.dialog
        # bundles go only on a connection of the peer's own (a forwarder relays fragments)
        dialog.bundling = link.peer is peer
        while not link.paused:
            frames = dialog.frames_to_send(now, SEND_BATCH)
            if not frames:
                break
            send = link.link.send
            link.write(b"".join([send(frame) for frame in frames]))
            if not dialog.wants_to_send:
                break
        self._arm(peer)

    def _arm(self, peer: Peer) -> None:
        when = peer.dialog.get_timer()
        if when is None:
            return
        if peer.timer is not None and peer.timer_at is not None and peer.timer_at <= when:
            return
        if peer.timer is not None:
            peer.timer.cancel()
        peer.timer_at = when
        peer.timer = self.loop.call_at(when, self._fire, peer)

    def _fire(self, peer: Peer) -> None:
        peer.timer = None
        peer.timer_at = None
        if not self.closing:
            self.pump(peer)

    # ---- receiving ---------------------------------------------------------------------

    def frames(self, link: Link, frames: list[FragmentFrame | BundleFrame | AckFrame]) -> None:
        """Frames from one read: their events are applied (and stored) together, per
        broker the dialogs are with; other brokers' frames go to the forwarder."""
        adjacent = link.peer
        if adjacent is None:
            return
        now = self.loop.time()
        forwarder = self.forwarder
        far = self.far
        applying: dict[Peer, _Applying] = {}

        def pending() -> tuple[int, int]:
            """The read's messages not yet delivered, and their bytes."""
            bodies = [b for w in applying.values() for g in w.arrivals.values() for b in g.bodies]
            return len(bodies), sum(map(len, bodies))

        for frame in frames:
            peer: Peer | None
            if isinstance(frame, BundleFrame):
                peer = adjacent  # a bundle comes from the broker that sealed it, never relayed
            elif forwarder is not None and forwarder.wants(frame):
                forwarder.relay(frame, adjacent.instance, now)
                continue
            else:
                peer = far.get(frame.conversation_id)
                if peer is None:
                    peer = self._partner(adjacent, frame)
                    if peer is None:
                        continue
            # one frame at a time: a queue a message just filled refuses the next one (the
            # read's messages not yet delivered count as if they were in their queues)
            if not isinstance(frame, AckFrame) and self._refused(peer, frame, pending):
                continue
            try:
                events = peer.dialog.receive_frame(frame, now)
            except ProtocolError as exc:
                log.warning("dropping a bad frame from broker %s: %s", peer.instance, exc)
                continue
            if peer is not adjacent and not any(isinstance(e, IntegrityFailure) for e in events):
                # a frame the far broker sealed came this way: its frames go back so too
                far[frame.conversation_id] = peer
                peer.via = adjacent.instance
            work = applying.get(peer)
            if work is None:
                work = applying[peer] = _Applying()
            self._apply(peer, events, link, work)
        for peer, work in applying.items():
            self._applied(peer, work)
            if peer.boxes:
                self._feed(peer)
            else:
                self.pump_soon(peer)

    def _partner(self, adjacent: Peer, frame: Frame) -> Peer | None:
        """The broker a frame's dialog is with, when the far map does not say: the adjacent
        one, or (the first frame of a restored dialog through a forwarder) the peer that
        has the dialog. None: the frame is not for this broker and is dropped."""
        conv, direction = frame.conversation_id, frame.direction
        dialog = adjacent.dialog
        if isinstance(frame, AckFrame):
            if dialog.sender(conv, direction) is not None:
                return adjacent
        elif dialog.receiver(conv, direction) is not None:
            return adjacent
        envelope = frame.envelope if isinstance(frame, FragmentFrame) else None
        if envelope is not None and envelope.from_broker_id == self.instance:
            self._log_refusal(
                (conv, direction),
                "routes form a loop: a message of conversation %s that this broker sent came"
                " back from broker %s; check the routes on the way",
                conv,
                adjacent.instance,
            )
            return None
        if envelope is not None and envelope.to_broker_id != self.instance:
            self._log_refusal(
                (conv, direction),
                "dropping conversation %s from broker %s: it is addressed to broker %s and"
                " this broker does not forward ([transport] forwarding = false)",
                conv,
                adjacent.instance,
                envelope.to_broker_id,
            )
            return None
        for peer in self.peers.values():
            if peer is adjacent:
                continue
            d = peer.dialog
            if any(
                d.sender(conv, way) is not None or d.receiver(conv, way) is not None
                for way in Direction
            ):
                if envelope is not None and envelope.from_broker_id != peer.instance:
                    self._log_refusal(
                        (conv, direction),
                        "refusing conversation %s from broker %s: the conversation is with"
                        " broker %s",
                        conv,
                        envelope.from_broker_id,
                        peer.instance,
                    )
                    return None
                return peer
        return adjacent

    def _refused(
        self,
        peer: Peer,
        frame: FragmentFrame | BundleFrame,
        pending: Callable[[], tuple[int, int]],
    ) -> bool:
        """Whether a message of this fragment's direction could not be stored now (a full
        queue or disk): then it is dropped unacknowledged, and the sender retries."""
        key = (frame.conversation_id, frame.direction)
        if key in self.discarding:
            return False
        envelope = frame.envelope or self.envelopes.get(key)
        from_initiator = frame.direction is Direction.FROM_INITIATOR
        reason = self.engine.delivery.accepts(
            frame.conversation_id,
            from_initiator,
            envelope.to_service if envelope else "",
            pending,
            len(frame.payloads) if isinstance(frame, BundleFrame) else 1,
        )
        if reason is None:
            return False
        peer.refused_fragments += 1
        self._log_refusal(
            key,
            "not acknowledging messages of conversation %s from broker %s: %s (it retries)",
            frame.conversation_id,
            peer.instance,
            reason,
            level=logging.INFO,
        )
        return True

    def _apply(
        self,
        peer: Peer,
        events: Iterable[DialogEvent],
        link: Link | None = None,
        applying: _Applying | None = None,
    ) -> None:
        """Hand the dialog layer's events to the core and the store; with `applying`, leave
        the writes that can wait for the end of the read to it (`_applied`)."""
        own = applying is None
        if applying is None:
            applying = _Applying()
        delivery = self.engine.delivery
        store = self.store
        stored = applying.stored
        next_seqs = applying.next_seqs
        arrivals = applying.arrivals
        # acknowledged user messages, as contiguous ranges per direction (one delete each)
        acked: dict[tuple[uuid.UUID, Direction], list[int]] = {}
        for event in events:
            if isinstance(event, MessageReceived):
                key = (event.conversation_id, event.direction)
                if key not in self.discarding:
                    envelope = self.envelopes.get(key)
                    if envelope is not None and not event.rejected:
                        group = arrivals.get(key)
                        if group is not None and (
                            group.message_type != event.message_type
                            or group.seq + len(group.bodies) != event.seq
                        ):
                            self._deliver(applying, key)
                            group = None
                        if group is None:
                            arrivals[key] = _Arrivals(
                                event.message_type, event.seq, event.body, envelope
                            )
                        else:
                            group.bodies.append(event.body)
                    elif envelope is not None:
                        self._deliver(applying, key)
                        delivery.deliver_remote(
                            event.conversation_id,
                            event.direction is Direction.FROM_INITIATOR,
                            event.seq,
                            event.message_type,
                            event.body,
                            envelope.from_service,
                            envelope.to_service,
                            envelope.contract,
                            str(envelope.from_broker_id),
                            event.rejected,
                        )
                        if envelope.encrypted:
                            self._mark_encrypted(event.conversation_id, event.direction)
                        if event.rejected:
                            log.warning(
                                "conversation %s from broker %s ended: %s",
                                event.conversation_id,
                                peer.instance,
                                event.rejected,
                            )
                    next_seqs[key] = event.seq + 1
                    held = (key[0], key[1], event.seq)
                    if held in self.held_seqs:
                        self.held_seqs.discard(held)
                        store.delete_held_message(key[0], int(key[1]), event.seq)
                stored.append(event)
                continue
            if arrivals and not isinstance(event, FragmentReceived):
                self._deliver(applying)  # what came before it, first
            if isinstance(event, MessageAcked):
                done = peer.in_flight.pop((event.conversation_id, event.direction, event.seq), None)
                mtype = ""
                if done is not None:
                    peer.in_flight_bytes -= done[0]
                    mtype = done[1]
                key = (event.conversation_id, event.direction)
                span = acked.get(key)
                if span is not None and span[1] + 1 == event.seq and mtype not in SYSTEM_TYPES:
                    span[1] = event.seq
                    continue
                if span is not None:
                    del acked[key]
                    self._acknowledged(key, span[0], span[1])
                if mtype in SYSTEM_TYPES:  # may close the sender: after the range before it
                    self._acknowledged(key, event.seq, event.seq, mtype)
                else:
                    acked[key] = [event.seq, event.seq]
            elif isinstance(event, FragmentReceived):
                key = (event.conversation_id, event.direction)
                if key not in self.discarding:
                    store.put_held_fragment(
                        (
                            key[0],
                            int(key[1]),
                            event.seq,
                            event.fragment_index,
                            event.fragment_count,
                            event.message_type,
                            event.payload,
                        )
                    )
                    self.held_seqs.add((key[0], key[1], event.seq))
                stored.append(event)
            elif isinstance(event, SessionKeyReceived):
                key = (event.conversation_id, event.direction)
                if key not in self.discarding:
                    envelope = self.envelopes.get(key)
                    store.put_remote_dialog(
                        (
                            key[0],
                            int(key[1]),
                            "recv",
                            str(peer.instance),
                            event.session_key,
                            None,
                            0,
                            None if envelope is None else pack(envelope.encode()),
                        )
                    )
            elif isinstance(event, PartialMessageDiscarded):
                store.delete_held_message(event.conversation_id, int(event.direction), event.seq)
            elif isinstance(event, IntegrityFailure):
                # counted against the broker it came from: through a forwarder, that one
                carrier = peer if link is None or link.peer is None else link.peer
                carrier.corrupt_fragments += 1
                if link is not None:
                    link.link.record_corrupt_fragment()
                through = "" if carrier is peer else f" through broker {carrier.instance}"
                log.warning(
                    "corrupted fragment from broker %s%s (conversation %s, seq %s): %s",
                    peer.instance,
                    through,
                    event.conversation_id,
                    event.seq,
                    event.reason,
                )
            elif isinstance(event, UnknownDialog):
                self._open_receiver(peer, event, link)
        for key, span in acked.items():
            self._acknowledged(key, span[0], span[1])
        if own:
            self._applied(peer, applying)

    def _mark_encrypted(self, conversation_id: uuid.UUID, direction: Direction) -> None:
        """The local endpoint of an encrypted dialog shows it (is_encrypted)."""
        ep = self.engine.endpoints.by_conversation(
            conversation_id, direction is Direction.FROM_TARGET
        )
        if ep is not None and not ep.encrypted:
            ep.encrypted = True
            self.engine.endpoints.update(ep)

    def _acknowledged(
        self, key: tuple[uuid.UUID, Direction], first: int, last: int, message_type: str = ""
    ) -> None:
        """The far broker stored messages `first`..`last` of direction `key`."""
        self.engine.delivery.remote_acknowledged(
            key[0], key[1] is Direction.FROM_INITIATOR, first, last, message_type
        )

    def _deliver(
        self, applying: _Applying, only: tuple[uuid.UUID, Direction] | None = None
    ) -> None:
        """Hand the messages gathered in `applying` (of direction `only`, or all) to the core."""
        arrivals = applying.arrivals
        keys = list(arrivals) if only is None else [only] if only in arrivals else []
        deliver = self.engine.delivery.deliver_remote_many
        for key in keys:
            group = arrivals.pop(key)
            envelope = group.envelope
            deliver(
                key[0],
                key[1] is Direction.FROM_INITIATOR,
                group.seq,
                group.message_type,
                group.bodies,
                envelope.from_service,
                envelope.to_service,
                envelope.contract,
                _instance_text(envelope.from_broker_id),
            )
            if envelope.encrypted:
                self._mark_encrypted(key[0], key[1])

    def _applied(self, peer: Peer, applying: _Applying) -> None:
        """A read's events were applied: deliver its messages, persist next sequence
        numbers, ack once durable."""
        if applying.arrivals:
            self._deliver(applying)
        for (conversation_id, direction), next_seq in applying.next_seqs.items():
            self.store.set_remote_next_seq(conversation_id, int(direction), "recv", next_seq)
        if applying.stored:
            self._when_stored(peer, applying.stored)

    def _when_stored(self, peer: Peer, stored: list[MessageReceived | FragmentReceived]) -> None:
        def durable() -> None:
            peer.dialog.mark_stored(stored, self.loop.time())
            self.pump_soon(peer)

        self.store.when_durable(self.store.watermark(), durable)

    def _open_receiver(self, peer: Peer, event: UnknownDialog, link: Link | None) -> None:
        """First frame of a dialog direction we have no receiver for.

        A new dialog's first frames may arrive in any order (a corrupted or lost
        fragment of message 0 is retried later), so a live dialog always starts at
        sequence 0. A direction that ended here (or whose initiator is gone) is
        received in discard mode: acknowledged and dropped, so its sender stops.
        Nothing is kept unless the frame passes the integrity check.
        """
        frame = event.frame
        key = (event.conversation_id, event.direction)
        envelope = frame.envelope
        adjacent = None if link is None else link.peer
        if (
            envelope is not None
            and adjacent is not None
            and envelope.from_broker_id != adjacent.instance
        ):
            # it came through a forwarder: the origin must prove it opened the direction
            origin = self._origin(adjacent, key, frame)
            if origin is None:
                return
            if origin is not adjacent:
                self.far[key[0]] = origin
                origin.via = adjacent.instance
            peer = origin
        if peer.dialog.receiver(*key) is not None:
            # opened by an earlier frame of the same read
            self._apply(peer, peer.dialog.receive_frame(frame, self.loop.time()), link)
            return
        from_initiator = event.direction is Direction.FROM_INITIATOR
        if from_initiator:
            alive = key[0] not in self.closed_conversations
        else:
            alive = self.engine.endpoints.by_conversation(key[0], True) is not None
        if alive and (envelope is None or envelope.to_broker_id != self.instance):
            return  # cannot create an endpoint without a routing header addressed to us
        refusal = self._not_party(peer, key, envelope) if alive else None
        if refusal is not None:  # dropped unacknowledged: nothing of it is kept
            self._log_refusal(
                key,
                "refusing conversation %s from broker %s: %s",
                key[0],
                peer.instance,
                refusal,
            )
            return
        first = 0 if alive else frame.seq
        events = peer.dialog.open_receiver(key[0], key[1], next_expected_seq=first)
        followed = peer.dialog.receive_frame(frame, self.loop.time())
        if any(isinstance(e, IntegrityFailure) for e in followed):
            peer.dialog.close_receiver(*key)  # an unverified frame creates nothing
            self._apply(peer, [e for e in followed if isinstance(e, IntegrityFailure)], link)
            return
        if alive:
            assert envelope is not None
            self.envelopes[key] = envelope
            self.discarding.discard(key)
        else:
            self.discarding.add(key)
        self._apply(peer, events, link)
        self._apply(peer, followed, link)

    def _origin(
        self, adjacent: Peer, key: tuple[uuid.UUID, Direction], frame: FragmentFrame
    ) -> Peer | None:
        """The broker a dialog direction that came through a forwarder (`adjacent`) comes
        from, if it proves itself: a certificate of it is trusted here and its signature
        over the envelope and wrapped session key verifies. None: refused (logged)."""
        envelope = frame.envelope
        assert envelope is not None
        origin = envelope.from_broker_id
        pem = self.trusted_certificate(origin)
        refusal = None
        if pem is None:
            refusal = (
                f"no certificate of broker {origin} is trusted here (create_certificate with"
                " its broker_certificate())"
            )
        elif envelope.origin_proof is None or frame.wrapped_session_key is None:
            refusal = "it carries no origin proof"
        else:
            transcript = envelope.origin_transcript(key[0], key[1], frame.wrapped_session_key)
            try:
                verify_origin(pem, transcript, envelope.origin_proof)
            except IntegrityError:
                adjacent.corrupt_fragments += 1
                refusal = "its origin proof does not verify (altered on the way)"
        if refusal is not None:
            self._log_refusal(
                key,
                "refusing conversation %s from broker %s through broker %s: %s",
                key[0],
                origin,
                adjacent.instance,
                refusal,
            )
            return None
        return self._peer(origin, pem)

    def _not_party(
        self, peer: Peer, key: tuple[uuid.UUID, Direction], envelope: Envelope | None
    ) -> str | None:
        """Why `peer` may not speak for this dialog direction (None: it may). Only the
        authenticated broker that is the other party of a conversation sends on it, and
        an envelope must name that broker as its sender (a forged one names another)."""
        if envelope is not None and envelope.from_broker_id != peer.instance:
            return f"its envelope names broker {envelope.from_broker_id} as the sender"
        known = self.envelopes.get(key)
        if known is not None and known.from_broker_id != peer.instance:
            return f"the conversation's messages come from broker {known.from_broker_id}"
        local = self.engine.endpoints.by_conversation(key[0], key[1] is Direction.FROM_TARGET)
        if local is not None and local.far_broker_instance not in (None, str(peer.instance)):
            return f"the conversation is with broker {local.far_broker_instance}"
        if (
            local is not None
            and local.encrypted
            and local.is_initiator
            and not (envelope is not None and envelope.encrypted)
        ):
            return "the conversation is encrypted and its answers come in clear"
        return None

    def _log_refusal(
        self,
        key: tuple[uuid.UUID, Direction],
        text: str,
        *args: object,
        level: int = logging.WARNING,
    ) -> None:
        """A line per dialog direction at most every REFUSAL_LOG_EVERY seconds."""
        now = self.loop.time()
        direction = (key[0], key[1] is Direction.FROM_INITIATOR)
        if now - self._refusal_logged.get(direction, -REFUSAL_LOG_EVERY) >= REFUSAL_LOG_EVERY:
            self._refusal_logged[direction] = now
            if len(self._refusal_logged) > 10_000:
                self._refusal_logged.clear()
            log.log(level, text, *args)

    def _remember_closed(self, conversation_id: uuid.UUID) -> None:
        """Late frames of a dialog that ended here are discarded, for a while."""
        now = self.loop.time()
        self.closed_conversations.add(conversation_id)
        self._closed_order.append((now, conversation_id))
        horizon = now - 2 * self.settings.closed_dialog_linger
        while self._closed_order and self._closed_order[0][0] < horizon:
            self.closed_conversations.discard(self._closed_order.popleft()[1])

    def _close_receiver(self, peer: Peer, key: tuple[uuid.UUID, Direction]) -> None:
        if key in self.discarding:
            peer.dialog.close_receiver(*key)
            self.discarding.discard(key)
            self.far.pop(key[0], None)

    # ---- views -------------------------------------------------------------------------

    def connections_view(self) -> list[dict[str, Any]]:
        rows = []
        for link in sorted(self.links, key=lambda lk: lk.address):
            counters = link.link.counters
            peer = link.peer
            rows.append(
                {
                    "peer": None if peer is None else str(peer.instance),
                    "address": link.address,
                    "direction": "outbound" if link.role is Role.INITIATOR else "inbound",
                    "state": link.link.state.name,
                    "login_state": link.login_state,
                    "bytes_sent": counters.bytes_out,
                    "bytes_received": counters.bytes_in,
                    "fragments_sent": counters.fragments_out,
                    "fragments_received": counters.fragments_in,
                    "frames_sent": counters.frames_out,
                    "frames_received": counters.frames_in,
                    "corrupt_fragments": peer.corrupt_fragments
                    if peer
                    else counters.corrupt_fragments,
                    "refused_fragments": peer.refused_fragments if peer else 0,
                    "in_flight": len(peer.in_flight) if peer else 0,
                    "retransmissions": peer.dialog.counters.retransmissions if peer else 0,
                    "last_activity": time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(link.last_activity)
                    ),
                    "via": None,
                }
            )
        linked = {link.peer.instance for link in self.links if link.peer is not None}
        for peer in self.peers.values():
            if peer.instance in linked:
                continue
            error = self.connect_errors.get(peer.address or "", "")
            # a peer reached through a forwarder: that connection's state, and who it is
            carrier = self._link_of(peer)
            via = None if carrier is None or carrier.peer is None else carrier.peer.instance
            rows.append(
                {
                    "peer": str(peer.instance),
                    "address": peer.address,
                    "direction": "outbound",
                    "state": "CLOSED" if carrier is None else carrier.link.state.name,
                    "login_state": error or "NONE",
                    "bytes_sent": 0,
                    "bytes_received": 0,
                    "fragments_sent": peer.dialog.counters.fragments_sent,
                    "fragments_received": 0,
                    "frames_sent": 0,
                    "frames_received": 0,
                    "corrupt_fragments": peer.corrupt_fragments,
                    "refused_fragments": peer.refused_fragments,
                    "in_flight": len(peer.in_flight),
                    "retransmissions": peer.dialog.counters.retransmissions,
                    "last_activity": None,
                    "via": None if via is None else str(via),
                }
            )
        return rows
