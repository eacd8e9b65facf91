"""Adjacent broker protocol: one TCP connection between two brokers, and its own frames.

Theory of operation
-------------------
One TCP connection joins a pair of adjacent brokers. Every frame is a `_framing` frame (a
4-byte length and one msgpack array) whose first element is a `FrameKind` (see `_fields`).
Frames are frozen dataclasses; each has `encode()` (to the wire array) and `decode()` (from
it) next to it, and `decode_link_frame` dispatches on the kind. The frames the connection
speaks itself (the handshake, an error, a close) are here; the dialog frames it carries
are in `_dialog_frames`.

Handshake (the transition table `_TRANSITIONS` is the documentation)::

    initiator                                   acceptor
    Hello(version, id, certificate, nonce_i) ->
                                             <- HelloAccept(version, id, certificate,
                                                            nonce_a, proof over nonce_i)
    Proof(proof over nonce_a)                ->
    ESTABLISHED                                 ESTABLISHED (after checking the proof)

A proof is the sender's RSA signature over both broker ids and the *receiver's* nonce; the
receiver accepts it only with a certificate from its trust store that names the announced
broker id. The connection produces and consumes handshake frames itself: the shell writes
`data_to_send()` after every `receive_data`/`next_event` round and never builds them.

After the handshake both sides exchange `FragmentFrame`s, `BundleFrame`s (several whole
messages of one dialog direction in one frame) and standalone `AckFrame`s (the dialog
layer gives them meaning) until either sends `CloseFrame` or `ProtocolErrorFrame`, or the
byte stream ends. Brokers of protocol version 3 also ask each other which broker hosts a
service (`_locate`); a version 2 peer is accepted and is never sent those frames. From
version 4 on a forwarder relays bundles, and a broker takes a bundle that a forwarder
relayed (see `RELAY_BUNDLES_VERSION`).

Versions: the initiator offers its version (or a lower one it is told to offer, see
below); the acceptor takes any offer from MIN_PROTOCOL_VERSION up and answers with the
lower of the offer and its own, which both then speak (`peer_version`). Version 2 and 3
acceptors refused any offer above their own, naming their version or range in the
refusal; `older_version_in_refusal` reads it, and the initiator offers that version in
its next connection. Any frame that the table does not allow in the current state, or any
malformed frame, raises `RemoteProtocolError`, moves the connection to CLOSED and queues a
`ProtocolErrorFrame` in `data_to_send()` so the peer learns why. Decoding never raises
anything but `ProtocolError` subclasses.

Invariants: no I/O, no clock; sizes are bounded by the `Final` limits of `_fields`;
counters on the connection feed the connections view.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, cast

from cryptography.hazmat.primitives.asymmetric import rsa

from ._dialog_frames import AckFrame, BundleFrame, FragmentFrame, UnbundleFrame
from ._errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from ._fields import (
    MAX_ERROR_TEXT,
    MAX_LINK_FRAME_SIZE,
    FrameKind,
    bytes_field,
    frame_fields,
    int_field,
    malformed,
    str_field,
    uuid_field,
)
from ._framing import NEED_DATA, FrameDecoder, _NeedData, encode_frame
from ._integrity import (
    MAX_CERTIFICATE_SIZE,
    MAX_PROOF_SIZE,
    NONCE_SIZE,
    RandomSource,
    TrustStore,
    new_nonce,
    sign_handshake_proof,
    trusted_certificate,
    verify_handshake_proof,
)
from ._locate import LOCATE_VERSION, LocatedFrame, LocateFrame

PROTOCOL_VERSION: Final = 4  # 2: bundles (several whole messages in one frame); 3: locate;
# 4: bundles relayed by forwarders, and the acceptor answers with the lower of both versions
MIN_PROTOCOL_VERSION: Final = 2  # the oldest a peer may speak (it is never sent what it lacks)
RELAY_BUNDLES_VERSION: Final = 4  # a peer of this version relays and takes relayed bundles


# --------------------------------------------------------------------------- the link's own frames


@dataclass(frozen=True, slots=True)
class Hello:
    """First frame of the initiator: who it is and a fresh nonce to sign."""

    version: int
    broker_id: uuid.UUID
    certificate_pem: bytes
    nonce: bytes

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.HELLO, self.version, self.broker_id, self.certificate_pem, self.nonce]

    @classmethod
    def decode(cls, obj: list[Any]) -> Hello:
        """Raises: RemoteProtocolError: malformed."""
        return cls(*_greeting(frame_fields(obj, FrameKind.HELLO, 4)))


@dataclass(frozen=True, slots=True)
class HelloAccept:
    """The acceptor's answer: who it is, its nonce, and its proof over the initiator's nonce."""

    version: int
    broker_id: uuid.UUID
    certificate_pem: bytes
    nonce: bytes
    proof: bytes

    def encode(self) -> list[object]:
        """Wire form."""
        return [
            FrameKind.HELLO_ACCEPT,
            self.version,
            self.broker_id,
            self.certificate_pem,
            self.nonce,
            self.proof,
        ]

    @classmethod
    def decode(cls, obj: list[Any]) -> HelloAccept:
        """Raises: RemoteProtocolError: malformed."""
        f = frame_fields(obj, FrameKind.HELLO_ACCEPT, 5)
        return cls(*_greeting(f), bytes_field(f[5], "proof", MAX_PROOF_SIZE))


def _greeting(f: list[Any]) -> tuple[int, uuid.UUID, bytes, bytes]:
    """The fields a Hello and a HelloAccept both begin with, checked: version, broker id,
    certificate, nonce."""
    return (
        int_field(f[1], "version", 0, 0xFFFF),
        uuid_field(f[2], "broker id"),
        bytes_field(f[3], "certificate", MAX_CERTIFICATE_SIZE),
        bytes_field(f[4], "nonce", NONCE_SIZE, NONCE_SIZE),
    )


@dataclass(frozen=True, slots=True)
class Proof:
    """The initiator's proof over the acceptor's nonce; completes the handshake."""

    proof: bytes

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.PROOF, self.proof]

    @classmethod
    def decode(cls, obj: list[Any]) -> Proof:
        """Raises: RemoteProtocolError: malformed."""
        f = frame_fields(obj, FrameKind.PROOF, 1)
        return cls(bytes_field(f[1], "proof", MAX_PROOF_SIZE))


@dataclass(frozen=True, slots=True)
class ProtocolErrorFrame:
    """The sender found a protocol violation and is closing the connection."""

    code: int
    text: str

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.ERROR, self.code, self.text]

    @classmethod
    def decode(cls, obj: list[Any]) -> ProtocolErrorFrame:
        """Raises: RemoteProtocolError: malformed."""
        f = frame_fields(obj, FrameKind.ERROR, 2)
        return cls(
            int_field(f[1], "error code", 0, 0xFFFFFFFF),
            str_field(f[2], "error text", MAX_ERROR_TEXT),
        )


@dataclass(frozen=True, slots=True)
class CloseFrame:
    """An orderly close (idle timeout, shutdown); nothing follows it."""

    reason: str = ""

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.CLOSE, self.reason]

    @classmethod
    def decode(cls, obj: list[Any]) -> CloseFrame:
        """Raises: RemoteProtocolError: malformed."""
        f = frame_fields(obj, FrameKind.CLOSE, 1)
        return cls(str_field(f[1], "close reason", MAX_ERROR_TEXT))


# what an open link carries once the handshake is done, either way
TrafficFrame = (
    FragmentFrame
    | BundleFrame
    | AckFrame
    | LocateFrame
    | LocatedFrame
    | UnbundleFrame
    | ProtocolErrorFrame
    | CloseFrame
)
LinkFrame = Hello | HelloAccept | Proof | TrafficFrame

_DECODERS: Final[dict[int, Any]] = {
    FrameKind.HELLO: Hello.decode,
    FrameKind.HELLO_ACCEPT: HelloAccept.decode,
    FrameKind.PROOF: Proof.decode,
    FrameKind.FRAGMENT: FragmentFrame.decode,
    FrameKind.BUNDLE: BundleFrame.decode,
    FrameKind.ACK: AckFrame.decode,
    FrameKind.ERROR: ProtocolErrorFrame.decode,
    FrameKind.CLOSE: CloseFrame.decode,
    FrameKind.LOCATE: LocateFrame.decode,
    FrameKind.LOCATED: LocatedFrame.decode,
    FrameKind.UNBUNDLE: UnbundleFrame.decode,
}


# a version 3 broker's refusal names its range ("we speak 2..3"), a version 2 one its
# version ("we speak 2")
_REFUSED_VERSION: Final = re.compile(
    r"peer speaks protocol version \d+, we speak (\d+)(?:\.\.(\d+))?"
)


def older_version_in_refusal(refusal: ProtocolErrorFrame, offered: int) -> int | None:
    """The version to offer next to a peer that refused the handshake with `refusal`
    because it speaks only versions older than `offered` (as version 2 and 3 acceptors
    refuse a higher offer); None when the refusal is for anything else."""
    if refusal.code != ErrorCode.HANDSHAKE_FAILED:
        return None
    found = _REFUSED_VERSION.fullmatch(refusal.text)
    if found is None:
        return None
    lowest = int(found[1])
    highest = lowest if found[2] is None else int(found[2])
    if lowest > highest or not MIN_PROTOCOL_VERSION <= highest < offered:
        return None
    return highest


def encode_link_frame(frame: LinkFrame) -> bytes:
    """One length-prefixed frame on the wire."""
    return encode_frame(frame.encode())


def decode_link_frame(obj: object) -> LinkFrame:
    """Turn one decoded msgpack object into a frame.

    Raises: RemoteProtocolError (MALFORMED_FRAME): anything but a well-formed frame.
    """
    if type(obj) is not list or not obj:
        raise malformed("a frame must be a non-empty array")
    kind = obj[0]
    decoder = _DECODERS.get(kind) if type(kind) is int else None
    if decoder is None:
        shown = repr(kind) if type(kind) is int else f"of type {type(kind).__name__}"
        raise malformed(f"unknown frame kind {shown}")
    frame: LinkFrame = decoder(obj)
    return frame


# --------------------------------------------------------------------------- connection


class Role(Enum):
    """Which side opened the TCP connection."""

    INITIATOR = "initiator"
    ACCEPTOR = "acceptor"


class LinkState(Enum):
    """Handshake and lifetime of one connection."""

    AWAITING_HELLO = "awaiting hello"  # acceptor, before the initiator's Hello
    AWAITING_ACCEPT = "awaiting accept"  # initiator, Hello sent
    AWAITING_PROOF = "awaiting proof"  # acceptor, HelloAccept sent
    ESTABLISHED = "established"
    CLOSED = "closed"


class LinkInput(Enum):
    """Everything that can move a connection's state."""

    RECV_HELLO = "recv hello"
    RECV_HELLO_ACCEPT = "recv hello accept"
    RECV_PROOF = "recv proof"
    RECV_FRAGMENT = "recv fragment"
    RECV_ACK = "recv ack"
    RECV_LOCATE = "recv locate"  # a question or an answer
    RECV_UNBUNDLE = "recv unbundle"
    RECV_ERROR = "recv error"
    RECV_CLOSE = "recv close"
    RECV_EOF = "recv eof"
    SEND_FRAGMENT = "send fragment"
    SEND_ACK = "send ack"
    SEND_LOCATE = "send locate"
    SEND_UNBUNDLE = "send unbundle"
    SEND_ERROR = "send error"
    SEND_CLOSE = "send close"


_S = LinkState
_I = LinkInput
_TRANSITIONS: Final[dict[tuple[LinkState, LinkInput], LinkState]] = {
    (_S.AWAITING_HELLO, _I.RECV_HELLO): _S.AWAITING_PROOF,
    (_S.AWAITING_ACCEPT, _I.RECV_HELLO_ACCEPT): _S.ESTABLISHED,
    (_S.AWAITING_PROOF, _I.RECV_PROOF): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.RECV_FRAGMENT): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.RECV_ACK): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.SEND_FRAGMENT): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.SEND_ACK): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.RECV_LOCATE): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.SEND_LOCATE): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.RECV_UNBUNDLE): _S.ESTABLISHED,
    (_S.ESTABLISHED, _I.SEND_UNBUNDLE): _S.ESTABLISHED,
}
for _state in (_S.AWAITING_HELLO, _S.AWAITING_ACCEPT, _S.AWAITING_PROOF, _S.ESTABLISHED):
    for _input in (_I.RECV_ERROR, _I.RECV_CLOSE, _I.RECV_EOF, _I.SEND_ERROR, _I.SEND_CLOSE):
        _TRANSITIONS[(_state, _input)] = _S.CLOSED
_TRANSITIONS[(_S.CLOSED, _I.RECV_EOF)] = _S.CLOSED

_RECV_INPUT: Final[dict[type, LinkInput]] = {
    Hello: _I.RECV_HELLO,
    HelloAccept: _I.RECV_HELLO_ACCEPT,
    Proof: _I.RECV_PROOF,
    FragmentFrame: _I.RECV_FRAGMENT,
    BundleFrame: _I.RECV_FRAGMENT,
    AckFrame: _I.RECV_ACK,
    LocateFrame: _I.RECV_LOCATE,
    LocatedFrame: _I.RECV_LOCATE,
    UnbundleFrame: _I.RECV_UNBUNDLE,
    ProtocolErrorFrame: _I.RECV_ERROR,
    CloseFrame: _I.RECV_CLOSE,
}
_SEND_INPUT: Final[dict[type, LinkInput]] = {
    FragmentFrame: _I.SEND_FRAGMENT,
    BundleFrame: _I.SEND_FRAGMENT,
    AckFrame: _I.SEND_ACK,
    LocateFrame: _I.SEND_LOCATE,
    LocatedFrame: _I.SEND_LOCATE,
    UnbundleFrame: _I.SEND_UNBUNDLE,
    ProtocolErrorFrame: _I.SEND_ERROR,
    CloseFrame: _I.SEND_CLOSE,
}
# Frame types whose input leaves ESTABLISHED as it is, derived from the table: the
# steady-state traffic skips the (state, input) lookup and its enum hashing.
_RECV_KEEPS_ESTABLISHED: Final = frozenset(
    kind
    for kind, event in _RECV_INPUT.items()
    if _TRANSITIONS.get((_S.ESTABLISHED, event)) is _S.ESTABLISHED
)
_SEND_KEEPS_ESTABLISHED: Final = frozenset(
    kind
    for kind, event in _SEND_INPUT.items()
    if _TRANSITIONS.get((_S.ESTABLISHED, event)) is _S.ESTABLISHED
)


@dataclass(frozen=True, slots=True)
class HandshakeCompleted:
    """The peer proved its identity; fragments and acks may flow."""

    peer_broker_id: uuid.UUID
    peer_certificate_pem: bytes


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The byte stream ended (`receive_data(b"")`) before a Close or an error frame."""

    mid_frame: bool = False


LinkEvent = HandshakeCompleted | TrafficFrame | ConnectionClosed


@dataclass(slots=True)
class LinkCounters:
    """Running totals for the connections view."""

    bytes_in: int = 0
    bytes_out: int = 0
    frames_in: int = 0
    frames_out: int = 0
    fragments_in: int = 0
    fragments_out: int = 0
    acks_in: int = 0
    acks_out: int = 0
    corrupt_fragments: int = 0


@dataclass(slots=True)
class _PeerInfo:
    broker_id: uuid.UUID
    certificate_pem: bytes
    nonce: bytes = field(repr=False)


class LinkConnection:
    """Sans-IO facade for one broker-to-broker TCP connection.

    Drive it with::

        link = LinkConnection(Role.INITIATOR, ...)      # or Role.ACCEPTOR
        writer.write(link.data_to_send())               # the initiator's Hello
        # on every read:
        link.receive_data(data)                         # b"" means EOF
        while (event := link.next_event()) is not NEED_DATA: ...
        writer.write(link.data_to_send())               # handshake answers, error frame
        # to transmit dialog traffic once ESTABLISHED:
        writer.write(link.send(frame))
    """

    def __init__(
        self,
        role: Role,
        *,
        broker_id: uuid.UUID,
        private_key: rsa.RSAPrivateKey,
        certificate_pem: bytes,
        trusted: TrustStore,
        expected_peer_id: uuid.UUID | None = None,
        random: RandomSource = os.urandom,
        max_frame_size: int = MAX_LINK_FRAME_SIZE,
        version: int = PROTOCOL_VERSION,
    ) -> None:
        """Args:
        role: INITIATOR for the side that connected, ACCEPTOR for the listener.
        broker_id: this broker's instance id.
        private_key: this broker's key, used to sign handshake proofs.
        certificate_pem: this broker's certificate, sent to the peer.
        trusted: certificates of peers this broker accepts.
        expected_peer_id: if set, a peer announcing another id is refused.
        random: source of the handshake nonce.
        max_frame_size: largest frame accepted, at most MAX_LINK_FRAME_SIZE.
        version: the version an initiator offers (MIN_PROTOCOL_VERSION..PROTOCOL_VERSION):
            lower than ours only for a peer that refused ours (`older_version_in_refusal`).
        """
        if not MIN_PROTOCOL_VERSION <= version <= PROTOCOL_VERSION:
            raise ValueError(
                f"version must be {MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}, not {version}"
            )
        self.version = version
        self.role = role
        self.counters = LinkCounters()
        self._broker_id = broker_id
        self._private_key = private_key
        self._certificate_pem = certificate_pem
        self._trusted = trusted
        self._expected_peer_id = expected_peer_id
        self._nonce = new_nonce(random)
        # no nesting walk: every decoder checks the type of each field it reads, so a
        # list or map where it expects none is malformed at once, and nothing recurses
        # into what a peer sent (msgpack itself stops at about a thousand levels)
        self._decoder = FrameDecoder(min(max_frame_size, MAX_LINK_FRAME_SIZE), nesting=False)
        self._outgoing = bytearray()
        self._eof = False
        self._peer: _PeerInfo | None = None
        self.peer_version = PROTOCOL_VERSION
        """The protocol version the peer speaks (known once its Hello or HelloAccept came)."""
        self.error: ProtocolError | None = None
        if role is Role.INITIATOR:
            self._state = LinkState.AWAITING_ACCEPT
            self._queue(Hello(version, broker_id, certificate_pem, self._nonce))
        else:
            self._state = LinkState.AWAITING_HELLO

    # -- state

    @property
    def state(self) -> LinkState:
        """Current handshake/lifetime state."""
        return self._state

    @property
    def peer_broker_id(self) -> uuid.UUID | None:
        """The peer's instance id once its hello arrived (verified once ESTABLISHED)."""
        return None if self._peer is None else self._peer.broker_id

    def _transition(self, event: LinkInput) -> None:
        try:
            self._state = _TRANSITIONS[(self._state, event)]
        except KeyError:
            state = self._state
            self._state = LinkState.CLOSED
            if event.name.startswith("RECV"):
                raise RemoteProtocolError(
                    f"peer sent {event.value} in state {state.value}", ErrorCode.UNEXPECTED_FRAME
                ) from None
            raise LocalProtocolError(
                f"cannot {event.value} in state {state.value}", ErrorCode.UNEXPECTED_FRAME
            ) from None

    # -- input

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the socket; `b""` signals end of stream."""
        if not data:
            self._eof = True
            return
        self.counters.bytes_in += len(data)
        if self._state is not LinkState.CLOSED:
            self._decoder.receive_data(data)

    def next_event(self) -> LinkEvent | _NeedData:
        """The next event, or NEED_DATA when no complete frame is buffered.

        Handshake frames are answered internally (see `data_to_send`); the caller sees
        `HandshakeCompleted` once the peer is authenticated.

        Raises: RemoteProtocolError: the peer sent a malformed or unexpected frame, or
            failed the handshake. The connection is then CLOSED and `data_to_send()`
            holds a ProtocolErrorFrame to write before closing the socket.
        """
        while self._state is not LinkState.CLOSED:
            try:
                obj: object = self._decoder.next_frame()
                if isinstance(obj, _NeedData):
                    if not self._eof:
                        return obj
                    self._transition(LinkInput.RECV_EOF)
                    return ConnectionClosed(mid_frame=self._decoder.buffered > 0)
                frame = decode_link_frame(obj)
                self.counters.frames_in += 1
                if not (
                    self._state is LinkState.ESTABLISHED and type(frame) in _RECV_KEEPS_ESTABLISHED
                ):
                    self._transition(_RECV_INPUT[type(frame)])
                event = self._handle(frame)
            except RemoteProtocolError as exc:
                self._fail(exc)
                raise
            if event is not None:
                return event
        return NEED_DATA

    def _handle(self, frame: LinkFrame) -> LinkEvent | None:
        if isinstance(frame, FragmentFrame):
            self.counters.fragments_in += 1
            return frame
        if isinstance(frame, BundleFrame):
            self.counters.fragments_in += len(frame.payloads)
            return frame
        if isinstance(frame, AckFrame):
            self.counters.acks_in += 1
            return frame
        if isinstance(frame, (ProtocolErrorFrame, CloseFrame)):
            return frame
        if isinstance(frame, (LocateFrame, LocatedFrame)):
            if self.peer_version < LOCATE_VERSION:
                raise RemoteProtocolError(
                    f"a peer of protocol version {self.peer_version} sent a locate frame",
                    ErrorCode.UNEXPECTED_FRAME,
                )
            return frame
        if isinstance(frame, UnbundleFrame):
            if self.peer_version < RELAY_BUNDLES_VERSION:
                raise RemoteProtocolError(
                    f"a peer of protocol version {self.peer_version} sent an unbundle frame",
                    ErrorCode.UNEXPECTED_FRAME,
                )
            return frame
        if isinstance(frame, Hello):
            self._on_hello(frame)
            return None
        if isinstance(frame, HelloAccept):
            return self._on_hello_accept(frame)
        assert isinstance(frame, Proof)
        return self._on_proof(frame)

    def _check_peer(self, version: int, broker_id: uuid.UUID, certificate_pem: bytes) -> None:
        """`version`: the acceptor's answer, or (on the acceptor) the initiator's offer,
        which may be higher than ours: then ours is spoken."""
        highest = PROTOCOL_VERSION if self.role is Role.ACCEPTOR else self.version
        if version < MIN_PROTOCOL_VERSION or (self.role is Role.INITIATOR and version > highest):
            raise RemoteProtocolError(
                f"peer speaks protocol version {version}, we speak"
                f" {MIN_PROTOCOL_VERSION}..{highest}",
                ErrorCode.HANDSHAKE_FAILED,
            )
        self.peer_version = min(version, highest)
        if broker_id == self._broker_id:
            raise RemoteProtocolError(
                "peer announced our own broker id", ErrorCode.HANDSHAKE_FAILED
            )
        if self._expected_peer_id is not None and broker_id != self._expected_peer_id:
            raise RemoteProtocolError(
                f"expected broker {self._expected_peer_id}, peer is {broker_id}",
                ErrorCode.HANDSHAKE_FAILED,
            )
        trusted_certificate(certificate_pem, broker_id, self._trusted)

    def _on_hello(self, frame: Hello) -> None:
        self._check_peer(frame.version, frame.broker_id, frame.certificate_pem)
        self._peer = _PeerInfo(frame.broker_id, frame.certificate_pem, frame.nonce)
        proof = sign_handshake_proof(
            self._private_key,
            signer_id=self._broker_id,
            peer_id=frame.broker_id,
            peer_nonce=frame.nonce,
        )
        self._queue(
            HelloAccept(
                self.peer_version, self._broker_id, self._certificate_pem, self._nonce, proof
            )
        )

    def _on_hello_accept(self, frame: HelloAccept) -> HandshakeCompleted:
        self._check_peer(frame.version, frame.broker_id, frame.certificate_pem)
        verify_handshake_proof(
            certificate_pem=frame.certificate_pem,
            proof=frame.proof,
            signer_id=frame.broker_id,
            peer_id=self._broker_id,
            peer_nonce=self._nonce,
            trusted=self._trusted,
        )
        self._peer = _PeerInfo(frame.broker_id, frame.certificate_pem, frame.nonce)
        self._queue(
            Proof(
                sign_handshake_proof(
                    self._private_key,
                    signer_id=self._broker_id,
                    peer_id=frame.broker_id,
                    peer_nonce=frame.nonce,
                )
            )
        )
        return HandshakeCompleted(frame.broker_id, frame.certificate_pem)

    def _on_proof(self, frame: Proof) -> HandshakeCompleted:
        peer = self._peer
        assert peer is not None  # AWAITING_PROOF is only reached through a Hello
        verify_handshake_proof(
            certificate_pem=peer.certificate_pem,
            proof=frame.proof,
            signer_id=peer.broker_id,
            peer_id=self._broker_id,
            peer_nonce=self._nonce,
            trusted=self._trusted,
        )
        return HandshakeCompleted(peer.broker_id, peer.certificate_pem)

    def _fail(self, exc: RemoteProtocolError) -> None:
        self._state = LinkState.CLOSED
        if self.error is None:
            self.error = exc
            self._queue(ProtocolErrorFrame(int(exc.code), str(exc)[:MAX_ERROR_TEXT]))

    # -- output

    def _queue(self, frame: LinkFrame) -> None:
        self._outgoing += encode_link_frame(frame)
        self.counters.frames_out += 1

    def data_to_send(self) -> bytes:
        """Bytes the connection produced by itself (handshake, error report); may be empty."""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        self.counters.bytes_out += len(data)
        return data

    def send(self, frame: TrafficFrame) -> bytes:
        """Encode one frame for the wire.

        Fragments, acks, locate and unbundle frames are allowed only when ESTABLISHED
        (locate frames only to a peer of LOCATE_VERSION, unbundle frames only to one of
        RELAY_BUNDLES_VERSION); an error or close frame from any open state, after which
        the connection is CLOSED.

        Raises: LocalProtocolError: the frame is not allowed in the current state.
        """
        kind = type(frame)
        if kind in (LocateFrame, LocatedFrame) and self.peer_version < LOCATE_VERSION:
            raise LocalProtocolError(
                f"the peer speaks protocol version {self.peer_version}: no locate frames",
                ErrorCode.UNEXPECTED_FRAME,
            )
        if kind is UnbundleFrame and self.peer_version < RELAY_BUNDLES_VERSION:
            raise LocalProtocolError(
                f"the peer speaks protocol version {self.peer_version}: no unbundle frames",
                ErrorCode.UNEXPECTED_FRAME,
            )
        if not (self._state is LinkState.ESTABLISHED and kind in _SEND_KEEPS_ESTABLISHED):
            event = _SEND_INPUT.get(kind)
            if event is None:
                raise LocalProtocolError(
                    f"{kind.__name__} frames are produced by the connection itself",
                    ErrorCode.UNEXPECTED_FRAME,
                )
            self._transition(event)
        data = encode_frame(frame.encode())
        counters = self.counters
        counters.bytes_out += len(data)
        counters.frames_out += 1
        if kind is FragmentFrame:
            counters.fragments_out += 1
        elif kind is BundleFrame:
            counters.fragments_out += len(cast(BundleFrame, frame).payloads)
        elif kind is AckFrame:
            counters.acks_out += 1
        return data

    def record_corrupt_fragment(self) -> None:
        """Count a fragment the dialog layer dropped for a failed integrity check."""
        self.counters.corrupt_fragments += 1
