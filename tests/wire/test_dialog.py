"""Dialog layer: pair tests over an in-memory link with explicit time and injected faults."""

from __future__ import annotations

import dataclasses
import itertools
import random
import uuid
from collections.abc import Callable, Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from identities import A_CERT, A_ID, A_KEY, A_KEY_PEM, B_CERT, B_ID, B_KEY, B_KEY_PEM, established

from ssb.protocol import (
    NEED_DATA,
    AckFrame,
    BundleFrame,
    DialogEvent,
    DialogPeer,
    Direction,
    Envelope,
    FragmentFrame,
    FragmentReceived,
    HeldFragment,
    IntegrityFailure,
    LocalProtocolError,
    MessageAcked,
    MessageReceived,
    MessagesReceived,
    PartialMessageDiscarded,
    PendingMessage,
    RemoteProtocolError,
    RetryPolicy,
    SessionKeyReceived,
    UnknownDialog,
)
from ssb.protocol._dialog_frames import AckRecord
from ssb.protocol._fields import MAX_ACK_RANGES
from ssb.protocol._integrity import (
    SessionSeal,
    generate_broker_identity,
    load_private_key,
    new_session_key,
)
from ssb.protocol._receiver import DialogReceiver
from ssb.protocol._sender import MAX_PRIORITY, fragment_layout

FAST_RETRY = RetryPolicy(initial=0.5, factor=2.0, maximum=2.0)
INIT = Direction.FROM_INITIATOR
TARG = Direction.FROM_TARGET

Key = tuple[uuid.UUID, Direction]


def envelope_for(direction: Direction, encrypted: bool = False) -> Envelope:
    if direction is INIT:
        return Envelope("InitiatorService", "TargetService", "Contract", A_ID, B_ID, encrypted)
    return Envelope("TargetService", "InitiatorService", "Contract", B_ID, A_ID, encrypted)


class Broker:
    """A minimal broker: applies dialog events to 'durable' dicts, like the real one will.

    With `auto_store` every batch of events is committed at once and reported through
    `mark_stored`; otherwise events wait in `uncommitted` until `commit()` (a crash loses
    them, as a crash loses an open transaction).
    """

    def __init__(
        self,
        broker_id: uuid.UUID,
        private_key_pem: bytes,
        peer_certificate: bytes,
        *,
        fragment_size: int = 64,
        retry: RetryPolicy = FAST_RETRY,
        ack_delay: float = 0.05,
        window: int = 64,
        auto_store: bool = True,
        rng: random.Random | None = None,
        bundling: bool = False,
    ) -> None:
        self.broker_id = broker_id
        self.bundling = bundling
        self.private_key_pem = private_key_pem
        self.peer_certificate = peer_certificate
        self.config = dict(
            fragment_size=fragment_size, retry=retry, ack_delay=ack_delay, window=window
        )
        self.auto_store = auto_store
        self.rng = rng or random.Random(0)
        # durable state
        self.transmission_queue: dict[Key, dict[int, PendingMessage]] = {}
        self.send_state: dict[Key, tuple[bytes, Envelope, int]] = {}  # key, envelope, next seq
        self.receive_keys: dict[Key, tuple[bytes, bool]] = {}  # key, encrypted
        self.next_expected: dict[Key, int] = {}
        self.held: dict[Key, dict[tuple[int, int, int], HeldFragment]] = {}
        self.delivered: dict[Key, list[tuple[int, str, bytes]]] = {}
        # volatile
        self.uncommitted: list[DialogEvent] = []
        self.integrity_failures: list[IntegrityFailure] = []
        self.acked: list[MessageAcked] = []
        self.peer = self._new_peer()

    def _new_peer(self) -> DialogPeer:
        peer = DialogPeer(
            private_key=load_private_key(self.private_key_pem),
            peer_public_key=self.peer_certificate,
            **self.config,  # type: ignore[arg-type]
        )
        peer.bundling = self.bundling
        return peer

    # -- application side

    def begin(
        self, conversation_id: uuid.UUID, direction: Direction, encrypted: bool = False
    ) -> None:
        session_key = new_session_key(self.rng.randbytes)
        envelope = envelope_for(direction, encrypted)
        self.send_state[(conversation_id, direction)] = (session_key, envelope, 0)
        self.transmission_queue[(conversation_id, direction)] = {}
        self.peer.open_sender(conversation_id, direction, envelope, session_key=session_key)

    def send(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        body: bytes,
        message_type: str = "Msg",
    ) -> int:
        key = (conversation_id, direction)
        session_key, envelope, seq = self.send_state[key]
        self.peer.queue_message(conversation_id, direction, seq, message_type, body)
        self.transmission_queue[key][seq] = PendingMessage(seq, message_type, body)
        self.send_state[key] = (session_key, envelope, seq + 1)
        return seq

    def listen(self, conversation_id: uuid.UUID, direction: Direction) -> None:
        """Open the return direction's receiver (what the initiator does at BEGIN DIALOG)."""
        self.next_expected[(conversation_id, direction)] = 0
        self.peer.open_receiver(conversation_id, direction)

    # -- events

    def receive(self, frames: Iterable[Frame], now: float) -> None:
        """Frames from the peer, each received by the dialog layer and its events handled."""
        for frame in frames:
            self.handle(self.peer.receive_frame(frame, now), now)

    def handle(self, events: Iterable[DialogEvent], now: float) -> None:
        for event in events:
            if isinstance(event, UnknownDialog):
                assert event.frame.envelope is not None, "first contact must carry the envelope"
                assert event.frame.envelope.to_broker_id == self.broker_id
                self.next_expected[(event.conversation_id, event.direction)] = 0
                self.handle(self.peer.open_receiver(event.conversation_id, event.direction), now)
                self.receive([event.frame], now)
            elif isinstance(event, IntegrityFailure):
                self.integrity_failures.append(event)
            elif isinstance(event, MessageAcked):
                self.acked.append(event)
                queue = self.transmission_queue[(event.conversation_id, event.direction)]
                for seq in range(event.seq, event.last + 1):
                    queue.pop(seq, None)  # a run may cover numbers acked before
            else:
                self.uncommitted.append(event)
        if self.auto_store:
            self.commit(now)

    def commit(self, now: float) -> None:
        """Apply uncommitted events durably, then tell the dialog layer."""
        events, self.uncommitted = self.uncommitted, []
        storable: list[MessageReceived | MessagesReceived | FragmentReceived] = []
        for event in events:
            key = (event.conversation_id, event.direction)
            if isinstance(event, SessionKeyReceived):
                self.receive_keys[key] = (event.session_key, event.encrypted)
            elif isinstance(event, FragmentReceived):
                self.held.setdefault(key, {})[
                    (event.seq, event.fragment_count, event.fragment_index)
                ] = HeldFragment(
                    event.seq,
                    event.fragment_index,
                    event.fragment_count,
                    event.message_type,
                    event.payload,
                )
                storable.append(event)
            elif isinstance(event, PartialMessageDiscarded):
                held = self.held.get(key, {})
                for entry in [entry for entry in held if entry[0] == event.seq]:
                    del held[entry]
            elif isinstance(event, MessageReceived | MessagesReceived):
                bodies = [event.body] if isinstance(event, MessageReceived) else event.bodies
                for seq, body in enumerate(bodies, event.seq):
                    assert self.next_expected[key] == seq, "delivered out of order"
                    self.delivered.setdefault(key, []).append((seq, event.message_type, body))
                    self.next_expected[key] = seq + 1
                    held = self.held.get(key, {})
                    for entry in [entry for entry in held if entry[0] == seq]:
                        del held[entry]
                storable.append(event)
            else:  # pragma: no cover - every event kind is handled above
                raise AssertionError(event)
        self.peer.mark_stored(storable, now)

    # -- crash and restart

    def restart(self, now: float) -> None:
        """Lose all volatile state and rebuild the dialog layer from durable state."""
        self.uncommitted = []
        self.peer = self._new_peer()
        for key, (session_key, envelope, next_seq) in self.send_state.items():
            self.peer.open_sender(
                key[0],
                key[1],
                envelope,
                session_key=session_key,
                next_seq=next_seq,
                pending=self.transmission_queue[key].values(),
            )
        for key, next_expected in self.next_expected.items():
            session_key, encrypted = self.receive_keys.get(key, (None, False))
            events = self.peer.open_receiver(
                key[0],
                key[1],
                session_key=session_key,
                encrypted=encrypted,
                next_expected_seq=next_expected,
                held_fragments=self.held.get(key, {}).values(),
            )
            self.handle(events, now)


Frame = FragmentFrame | BundleFrame | AckFrame
Fault = Callable[[list[Frame]], list[Frame]]


def flip_bit(frame: Frame, rng: random.Random) -> Frame:
    if isinstance(frame, BundleFrame):
        payloads = list(frame.payloads)
        which = rng.randrange(len(payloads))
        if payloads[which]:
            data = bytearray(payloads[which])
            position = rng.randrange(len(data) * 8)
            data[position // 8] ^= 1 << (position % 8)
            payloads[which] = bytes(data)
            return dataclasses.replace(frame, payloads=tuple(payloads))
        return dataclasses.replace(frame, seq=frame.seq + 1)
    if isinstance(frame, FragmentFrame) and frame.payload:
        data = bytearray(frame.payload)
        position = rng.randrange(len(data) * 8)
        data[position // 8] ^= 1 << (position % 8)
        return dataclasses.replace(frame, payload=bytes(data))
    data = bytearray(frame.signature)
    data[rng.randrange(len(data))] ^= 0x40
    return dataclasses.replace(frame, signature=bytes(data))


class Network:
    """Two brokers joined by a pair of established LinkConnections, with fault injection.

    Frames are faulted at frame level (drop, duplicate, delay/reorder, corrupt) and then
    really encoded by one LinkConnection and decoded by the other.
    """

    def __init__(
        self,
        a: Broker,
        b: Broker,
        *,
        seed: int = 0,
        drop: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        corrupt: float = 0.0,
        batch: int = 32,
    ) -> None:
        self.a, self.b = a, b
        self.rng = random.Random(seed)
        self.drop, self.duplicate, self.reorder, self.corrupt = drop, duplicate, reorder, corrupt
        self.batch = batch
        self.delayed: dict[str, list[Frame]] = {"ab": [], "ba": []}
        self.log: list[tuple[float, str, Frame]] = []
        self.corrupted = 0
        self.connect()

    def connect(self) -> None:
        """A new TCP connection: handshake two fresh LinkConnections."""
        a_link, b_link = established()
        self.links = {"ab": (a_link, b_link), "ba": (b_link, a_link)}

    def _faulty(self, path: str, frames: list[Frame]) -> list[Frame]:
        rng = self.rng
        out: list[Frame] = []
        for frame in frames:
            if rng.random() < self.drop:
                continue
            if rng.random() < self.corrupt:
                frame = flip_bit(frame, rng)
                self.corrupted += 1
            if rng.random() < self.reorder:
                self.delayed[path].append(frame)
                continue
            out.append(frame)
            if rng.random() < self.duplicate:
                out.append(frame)
        if self.delayed[path] and rng.random() < 0.5:
            late, self.delayed[path] = self.delayed[path], []
            for frame in late:
                out.insert(rng.randrange(len(out) + 1), frame)
        return out

    def _carry(self, path: str, src: Broker, dst: Broker, now: float) -> int:
        frames = src.peer.frames_to_send(now, self.batch)
        for frame in frames:
            self.log.append((now, path, frame))
        send_link, receive_link = self.links[path]
        for frame in self._faulty(path, frames):
            receive_link.receive_data(send_link.send(frame))
            while (event := receive_link.next_event()) is not NEED_DATA:
                assert isinstance(event, (FragmentFrame, BundleFrame, AckFrame))
                dst.receive([event], now)
        return len(frames)

    def transfer(self, now: float) -> int:
        """Move whatever both sides want to send at `now`; returns frames sent."""
        return self._carry("ab", self.a, self.b, now) + self._carry("ba", self.b, self.a, now)

    def next_time(self, now: float) -> float | None:
        if self.a.peer.wants_to_send or self.b.peer.wants_to_send:
            return now
        timers = [t for t in (self.a.peer.get_timer(), self.b.peer.get_timer()) if t is not None]
        return max(now, min(timers)) if timers else None

    def run(self, now: float, until: Callable[[], bool], deadline: float = 10_000.0) -> float:
        """Advance time from timer to timer until `until()` holds or nothing is left to do."""
        while not until():
            self.transfer(now)
            upcoming = self.next_time(now)
            if upcoming is None:
                break
            if upcoming > deadline:
                raise AssertionError(f"not done by t={deadline}")
            now = upcoming
        return now


def make_pair(**options: object) -> tuple[Broker, Broker]:
    broker_options = {
        k: v
        for k, v in options.items()
        if k in ("fragment_size", "retry", "ack_delay", "window", "bundling")
    }
    a = Broker(A_ID, A_KEY_PEM, B_CERT, rng=random.Random(1), **broker_options)  # type: ignore[arg-type]
    b = Broker(B_ID, B_KEY_PEM, A_CERT, rng=random.Random(2), **broker_options)  # type: ignore[arg-type]
    return a, b


def begun_dialog(**options: object) -> tuple[Broker, Broker, uuid.UUID]:
    """A pair of brokers (`make_pair(**options)`) and a conversation A has begun."""
    a, b = make_pair(**options)
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    return a, b, conv


def bodies(rng: random.Random, count: int, max_size: int) -> list[bytes]:
    return [rng.randbytes(rng.randrange(max_size + 1)) for _ in range(count)]


def received(events: Iterable[DialogEvent]) -> list[tuple[int, bytes]]:
    """(seq, body) of every message the events deliver, a bundle's one by one."""
    out: list[tuple[int, bytes]] = []
    for event in events:
        if isinstance(event, MessageReceived):
            out.append((event.seq, event.body))
        elif isinstance(event, MessagesReceived):
            out += enumerate(event.bodies, event.seq)
    return out


def all_acked(*brokers: Broker) -> Callable[[], bool]:
    return lambda: all(
        not queue for broker in brokers for queue in broker.transmission_queue.values()
    )


# =========================================================================== pair tests


def test_clean_link_delivers_everything_in_order() -> None:
    a, b = make_pair()
    net = Network(a, b)
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    a.listen(conv, TARG)
    expected = bodies(random.Random(5), 50, 300)
    for body in expected:
        a.send(conv, INIT, body)
    net.run(0.0, all_acked(a))
    assert [body for _, _, body in b.delivered[(conv, INIT)]] == expected
    assert [seq for seq, _, _ in b.delivered[(conv, INIT)]] == list(range(50))
    assert a.peer.counters.retransmissions == 0
    assert b.integrity_failures == []


def _lossy_exchange(
    seed: int, fragment_sizes: list[int], run_length: int, bundling: bool = False
) -> tuple[Broker, Broker, Network]:
    """Four dialogs both ways over a link that drops, duplicates, reorders and corrupts:
    steps of 1..`run_length` messages, then everything must arrive once and in order."""
    rng = random.Random(seed)
    a, b = make_pair(fragment_size=rng.choice(fragment_sizes), bundling=bundling)
    net = Network(a, b, seed=seed, drop=0.2, duplicate=0.2, reorder=0.2, corrupt=0.1, batch=64)
    conversations = [uuid.uuid4() for _ in range(4)]
    sent: dict[Key, list[bytes]] = {}
    for conv in conversations:
        a.begin(conv, INIT)
        a.listen(conv, TARG)
        sent[(conv, INIT)] = [b"first"]
        a.send(conv, INIT, b"first")
    now = 0.0
    # The target answers only once its endpoint exists, as a real target would.
    now = net.run(now, lambda: all((c, INIT) in b.next_expected for c in conversations))
    for conv in conversations:
        b.begin(conv, TARG)
        sent[(conv, TARG)] = []
    for step in range(40):
        for _ in range(rng.randrange(1, run_length + 1)):
            conv = rng.choice(conversations)
            broker, direction = (a, INIT) if rng.random() < 0.5 else (b, TARG)
            body = rng.randbytes(rng.choice([0, 1, 10, 100, 1000]))
            broker.send(conv, direction, body)
            sent[(conv, direction)].append(body)
        net.transfer(now)
        now += 0.01 * step
    net.run(now, all_acked(a, b))
    for (conv, direction), expected in sent.items():
        receiver = b if direction is INIT else a
        got = receiver.delivered.get((conv, direction), [])
        assert [seq for seq, _, _ in got] == list(range(len(expected)))
        assert [body for _, _, body in got] == expected
    assert net.corrupted > 0
    reported = len(a.integrity_failures) + len(b.integrity_failures)
    assert reported > 0, "corrupted frames must be reported"
    assert a.peer.counters.retransmissions + b.peer.counters.retransmissions > 0
    return a, b, net


@pytest.mark.parametrize("seed", range(6))
def test_lossy_link_delivers_exactly_once_in_order_both_directions(seed: int) -> None:
    _lossy_exchange(seed, [16, 64, 200], run_length=1)


@pytest.mark.parametrize("seed", range(6))
def test_bundles_on_a_lossy_link_deliver_exactly_once_in_order(seed: int) -> None:
    """Bundles dropped, duplicated, reordered and corrupted: a lost bundle is repaired
    message by message, a corrupted one is reported and never acked."""
    _, _, net = _lossy_exchange(seed, [200, 1024, 4096], run_length=20, bundling=True)
    assert _bundles(net), "no bundle was sent"


def _bundles(net: Network) -> list[BundleFrame]:
    return [frame for _, _, frame in net.log if isinstance(frame, BundleFrame)]


def _confirmed_dialog(**options: object) -> tuple[Broker, Broker, Network, uuid.UUID, float]:
    """A pair with one dialog whose first message is acknowledged (its direction is
    confirmed: later fragments carry no envelope), and the time then."""
    a, b = make_pair(**options)
    net = Network(a, b, batch=256)
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    a.listen(conv, TARG)
    a.send(conv, INIT, b"first")
    now = net.run(0.0, all_acked(a))
    return a, b, net, conv, now


def test_bundles_carry_runs_of_small_messages_once_the_direction_is_confirmed() -> None:
    a, b, net, conv, now = _confirmed_dialog(fragment_size=1024, bundling=True)
    assert _bundles(net) == []  # the first message carries the envelope: a fragment
    bodies = [bytes([i]) * 100 for i in range(50)] + [b"x" * 3000] + [b"after"] * 5
    for body in bodies:
        a.send(conv, INIT, body)
    a.send(conv, INIT, b"other type", message_type="Other")
    net.run(now, all_acked(a))
    delivered = b.delivered[(conv, INIT)]
    assert [seq for seq, _, _ in delivered] == list(range(len(bodies) + 2))
    assert [body for _, _, body in delivered] == [b"first", *bodies, b"other type"]
    assert delivered[-1][1] == "Other"
    bundles = _bundles(net)
    # 50 bodies of 100 bytes in bundles of at most one fragment's worth (1024 bytes);
    # the 3 KiB message goes in fragments, the last five in one bundle, the other type alone
    assert [len(bundle.payloads) for bundle in bundles] == [10, 10, 10, 10, 10, 5]
    assert all(sum(map(len, bundle.payloads)) <= 1024 for bundle in bundles)
    assert a.peer.counters.retransmissions == 0
    assert b.integrity_failures == []


def test_a_peer_without_bundling_sends_fragments_only() -> None:
    a, b, net, conv, now = _confirmed_dialog(bundling=False)
    for i in range(20):
        a.send(conv, INIT, bytes([i]))
    net.run(now, all_acked(a))
    assert len(b.delivered[(conv, INIT)]) == 21
    assert _bundles(net) == []


def test_a_bundle_for_an_unknown_direction_is_dropped_without_an_event() -> None:
    """A bundle has no envelope to open a direction with: a receiver that does not know
    the direction drops it (the sender's retransmissions are fragments carrying it)."""
    a, b, _, conv, now = _confirmed_dialog(bundling=True)
    for i in range(5):
        a.send(conv, INIT, bytes([i]))
    (bundle,) = a.peer.frames_to_send(now)
    assert isinstance(bundle, BundleFrame)
    stranger = Broker(B_ID, B_KEY_PEM, A_CERT)
    assert stranger.peer.receive_frame(bundle, now) == []
    # the broker that knows the direction takes all five from the same bundle
    events = b.peer.receive_frame(bundle, now)
    assert [seq for seq, _ in received(events)] == [1, 2, 3, 4, 5]


def test_a_bundle_in_order_is_delivered_whole_and_one_behind_a_gap_message_by_message() -> None:
    a, b, _, conv, now = _confirmed_dialog(bundling=True)
    for i in range(3):
        a.send(conv, INIT, bytes([i]))
    (first,) = a.peer.frames_to_send(now)
    for i in range(3, 5):
        a.send(conv, INIT, bytes([i]))
    (second,) = a.peer.frames_to_send(now)
    assert isinstance(first, BundleFrame) and isinstance(second, BundleFrame)
    # the second bundle first: its messages wait (held) behind the gap, one by one
    later = b.peer.receive_frame(second, now)
    assert {type(e) for e in later} == {FragmentReceived} and received(later) == []
    # the gap filled: the first bundle's messages, then the held ones, each its own event
    events = b.peer.receive_frame(first, now)
    assert {type(e) for e in events} == {MessageReceived}
    assert [seq for seq, _ in received(events)] == [1, 2, 3, 4, 5]
    # in order with nothing held: the next bundle is one event for all its messages
    for i in range(5, 9):
        a.send(conv, INIT, bytes([i]))
    (third,) = a.peer.frames_to_send(now)
    (event,) = b.peer.receive_frame(third, now)
    assert isinstance(event, MessagesReceived)
    assert (event.seq, event.last, event.bodies) == (6, 9, (b"\x05", b"\x06", b"\x07", b"\x08"))


def test_a_lost_bundle_goes_again_as_fragments_of_its_unacked_messages_when_due() -> None:
    a, _, _, conv, now = _confirmed_dialog(bundling=True)
    for i in range(5):
        a.send(conv, INIT, bytes([i]))
    (bundle,) = a.peer.frames_to_send(now)  # lost on the way
    assert isinstance(bundle, BundleFrame) and bundle.seq == 1
    sender = a.peer.sender(conv, INIT)
    assert sender is not None
    sender.handle_ack(AckRecord(3, ()))  # meanwhile 1 and 2 are acked (an earlier copy)
    due = a.peer.get_timer()
    assert due is not None and due > now
    assert a.peer.frames_to_send(due - 1e-6) == []
    again = a.peer.frames_to_send(due)
    assert [(type(f), f.seq) for f in again] == [(FragmentFrame, seq) for seq in (3, 4, 5)]
    assert a.peer.counters.retransmissions == 3
    sender.handle_ack(AckRecord(6, ()))
    assert a.peer.get_timer() is None  # nothing left to retry
    for i in range(5, 8):
        a.send(conv, INIT, bytes([i]))
    (bundle,) = a.peer.frames_to_send(due)
    assert isinstance(bundle, BundleFrame) and a.peer.get_timer() is not None  # its retry
    sender.handle_ack(AckRecord(9, ()))
    assert a.peer.get_timer() is None  # acked before it fell due: nothing to retry


def test_a_bundle_altered_in_a_payload_or_its_boundaries_is_refused() -> None:
    a, b, _, conv, now = _confirmed_dialog(bundling=True)
    a.send(conv, INIT, b"abc")
    a.send(conv, INIT, b"def")
    (bundle,) = a.peer.frames_to_send(now)
    assert isinstance(bundle, BundleFrame) and bundle.payloads == (b"abc", b"def")
    for altered in (
        dataclasses.replace(bundle, payloads=(b"abc", b"deF")),
        dataclasses.replace(bundle, payloads=(b"abcd", b"ef")),  # same bytes, moved boundary
        dataclasses.replace(bundle, payloads=(b"abc",)),
        dataclasses.replace(bundle, seq=bundle.seq + 1),
        dataclasses.replace(bundle, message_type="Other"),
    ):
        events = b.peer.receive_frame(altered, now)
        assert [type(e) for e in events] == [IntegrityFailure]
    assert len(b.delivered[(conv, INIT)]) == 1
    events = b.peer.receive_frame(bundle, now)
    assert [body for _, body in received(events)] == [b"abc", b"def"]


def test_corrupted_fragment_is_dropped_reported_not_acked_and_repaired() -> None:
    a, b = make_pair(ack_delay=0.0)
    net = Network(a, b)
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    a.send(conv, INIT, b"hello")
    frames = a.peer.frames_to_send(0.0)
    assert len(frames) == 1
    bad = flip_bit(frames[0], random.Random(3))
    b.receive([bad], 0.0)  # UnknownDialog -> receiver opened -> check fails
    assert len(b.integrity_failures) == 1
    failure = b.integrity_failures[0]
    assert (failure.conversation_id, failure.seq, failure.fragment_index) == (conv, 0, 0)
    assert "integrity" in failure.reason or "unwrap" in failure.reason or "key" in failure.reason
    assert b.delivered == {}
    assert b.peer.frames_to_send(10.0) == []  # nothing to ack
    # the retransmission repairs it
    assert a.peer.get_timer() == pytest.approx(0.5)
    net.run(0.5, all_acked(a))
    assert b.delivered[(conv, INIT)] == [(0, "Msg", b"hello")]


def test_corrupted_standalone_ack_is_reported_and_ignored() -> None:
    a, b, conv = begun_dialog(ack_delay=0.0)
    a.send(conv, INIT, b"x")
    b.receive(a.peer.frames_to_send(0.0), 0.0)
    (ack,) = b.peer.frames_to_send(0.0)
    assert isinstance(ack, AckFrame)
    a.receive([flip_bit(ack, random.Random(1))], 0.0)
    assert len(a.integrity_failures) == 1 and a.integrity_failures[0].seq is None
    assert a.transmission_queue[(conv, INIT)]
    a.receive([ack], 0.0)
    assert not a.transmission_queue[(conv, INIT)]


# =========================================================================== backoff


def test_retransmission_backoff_schedule_without_acks() -> None:
    a, _, conv = begun_dialog(retry=RetryPolicy(initial=4.0, factor=2.0, maximum=64.0))
    a.send(conv, INIT, b"unanswered")
    now = 100.0
    sends: list[float] = []
    for _ in range(9):
        frames = a.peer.frames_to_send(now)
        assert len(frames) == 1 and isinstance(frames[0], FragmentFrame) and frames[0].seq == 0
        sends.append(now)
        # nothing before the timer
        timer = a.peer.get_timer()
        assert timer is not None
        assert a.peer.frames_to_send(timer - 1e-6) == []
        now = timer
    assert [t - 100.0 for t in sends] == [0, 4, 12, 28, 60, 124, 188, 252, 316]
    intervals = [later - earlier for earlier, later in itertools.pairwise(sends)]
    assert intervals == [4, 8, 16, 32, 64, 64, 64, 64]
    assert a.peer.counters.retransmissions == 8


def test_retry_policy_delays() -> None:
    policy = RetryPolicy()
    assert [policy.delay(n) for n in range(1, 9)] == [4, 8, 16, 32, 64, 64, 64, 64]
    shrunk = RetryPolicy(initial=0.1, factor=3, maximum=1.0)
    assert shrunk.delay(3) == pytest.approx(0.9) and shrunk.delay(4) == 1.0
    with pytest.raises(LocalProtocolError):
        RetryPolicy(initial=0)
    with pytest.raises(LocalProtocolError):
        RetryPolicy(initial=4, maximum=1)


def test_each_fragment_has_its_own_backoff_and_ack_stops_it() -> None:
    a, b = make_pair(
        fragment_size=4, retry=RetryPolicy(initial=4.0, factor=2.0, maximum=64.0), ack_delay=0.0
    )
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    a.send(conv, INIT, b"abcdefgh")  # two fragments
    first, second = a.peer.frames_to_send(0.0)
    assert isinstance(first, FragmentFrame) and isinstance(second, FragmentFrame)
    b.receive([second], 0.0)  # only fragment 1 arrives
    acks = b.peer.frames_to_send(0.0)
    a.receive(acks, 0.0)
    retried = a.peer.frames_to_send(4.0)
    assert [(f.seq, f.fragment_index) for f in retried if isinstance(f, FragmentFrame)] == [(0, 0)]
    assert a.peer.get_timer() == 12.0


# =========================================================================== acks


def test_ack_piggybacks_on_return_traffic_without_standalone_ack() -> None:
    a, b = make_pair(ack_delay=0.2)
    net = Network(a, b)
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    a.listen(conv, TARG)
    a.send(conv, INIT, b"request")
    net.transfer(0.0)
    assert b.delivered[(conv, INIT)] == [(0, "Msg", b"request")]
    # the target answers within the ack delay: the ack rides on the answer
    b.begin(conv, TARG)
    b.send(conv, TARG, b"response")
    net.transfer(0.1)
    b_frames = [frame for t, path, frame in net.log if path == "ba"]
    assert len(b_frames) == 1
    (response,) = b_frames
    assert isinstance(response, FragmentFrame) and response.ack == AckRecord(1, ())
    assert a.acked == [MessageAcked(conv, INIT, 0, 0, "Msg")]
    # and a's ack for the response has no ride: it goes alone after the delay
    net.transfer(0.1 + 0.2 - 1e-6)
    assert not [f for _, path, f in net.log if path == "ab" and isinstance(f, AckFrame)]
    net.transfer(0.1 + 0.2)
    standalone = [f for _, path, f in net.log if path == "ab" and isinstance(f, AckFrame)]
    assert len(standalone) == 1 and standalone[0].direction is TARG
    assert not [f for _, path, f in net.log if path == "ba" and isinstance(f, AckFrame)]
    assert b.acked == [MessageAcked(conv, TARG, 0, 0, "Msg")]
    assert b.peer.counters.standalone_acks == 0 and b.peer.counters.piggybacked_acks == 1


def test_standalone_ack_after_delay_when_no_return_traffic() -> None:
    a, b, conv = begun_dialog(ack_delay=0.25)
    a.send(conv, INIT, b"one-way")
    b.receive(a.peer.frames_to_send(1.0), 1.0)
    assert b.peer.get_timer() == pytest.approx(1.25)
    assert b.peer.frames_to_send(1.2) == []
    (ack,) = b.peer.frames_to_send(1.25)
    assert isinstance(ack, AckFrame) and ack.ack == AckRecord(1, ())
    assert b.peer.get_timer() is None


def test_no_ack_before_the_broker_stores() -> None:
    a, b = make_pair(ack_delay=0.05)
    b.auto_store = False
    net = Network(a, b)
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    a.send(conv, INIT, b"durable?")
    a.send(conv, INIT, b"x" * 200)  # several fragments
    now = 0.0
    for _ in range(10):  # retransmissions, duplicates, time well past the ack delay
        net.transfer(now)
        now += 1.0
    assert not [f for _, path, f in net.log if path == "ba"], "acked before stored"
    assert a.acked == []
    assert b.delivered == {}
    delivered = [e for e in b.uncommitted if isinstance(e, MessageReceived)]
    assert [e.seq for e in delivered] == [0, 1], "duplicates must not be delivered twice"
    b.commit(now)
    assert b.peer.frames_to_send(now) == []  # still within the ack delay
    net.run(now, all_acked(a))
    assert [seq for seq, _, _ in b.delivered[(conv, INIT)]] == [0, 1]
    assert [(e.seq, e.last) for e in a.acked] == [(0, 1)]  # one run: one cumulative ack


def test_an_ack_reports_each_run_of_one_type_and_the_peer_counts_what_is_unacked() -> None:
    a, b, conv = begun_dialog(ack_delay=0.0)
    b.auto_store = False
    net = Network(a, b)
    for body, message_type in [(b"a" * 10, "Job"), (b"b" * 20, "Job"), (b"c" * 30, "Done")]:
        a.send(conv, INIT, body, message_type)
    a.send(conv, INIT, b"d" * 40, "Job")
    assert (a.peer.unacked_messages, a.peer.unacked_bytes) == (4, 100)
    net.transfer(0.0)
    assert a.acked == [] and a.peer.unacked_messages == 4  # not stored yet
    b.commit(0.0)  # all four stored: one cumulative ack covers them
    net.run(0.0, all_acked(a))
    assert [(e.seq, e.last, e.message_type) for e in a.acked] == [
        (0, 1, "Job"),
        (2, 2, "Done"),
        (3, 3, "Job"),
    ]
    assert (a.peer.unacked_messages, a.peer.unacked_bytes) == (0, 0)
    # a restart counts the restored transmission queue; closing a sender gives it back
    a.send(conv, INIT, b"e" * 50)
    a.restart(1.0)
    assert (a.peer.unacked_messages, a.peer.unacked_bytes) == (1, 50)
    other = uuid.uuid4()
    a.begin(other, INIT, encrypted=True)
    a.send(other, INIT, b"f" * 50)
    sender = a.peer.sender(other, INIT)
    assert sender is not None and sender.unacked_bytes > 50  # held encrypted, with its tag
    assert (a.peer.unacked_messages, a.peer.unacked_bytes) == (2, 50 + sender.unacked_bytes)
    a.peer.close_sender(conv, INIT)
    assert (a.peer.unacked_messages, a.peer.unacked_bytes) == (1, sender.unacked_bytes)


def test_stored_fragments_are_acked_before_the_message_completes() -> None:
    a, b, conv = begun_dialog(fragment_size=10, ack_delay=0.0)
    a.send(conv, INIT, bytes(range(30)))  # fragments 0, 1, 2
    frames = a.peer.frames_to_send(0.0)
    for frame in frames[1:]:  # fragment 0 lost
        b.receive([frame], 0.0)
    held = b.held[(conv, INIT)]
    assert sorted(held) == [(0, 3, 1), (0, 3, 2)]
    (ack,) = b.peer.frames_to_send(0.0)
    assert isinstance(ack, AckFrame) and ack.ack == AckRecord(0, ((0, 3, 1, 3),))
    a.receive([ack], 0.0)
    assert a.acked == []  # not the whole message yet
    retried = a.peer.frames_to_send(0.5)
    assert [(f.seq, f.fragment_index) for f in retried if isinstance(f, FragmentFrame)] == [(0, 0)]


def test_duplicate_of_delivered_message_is_acked_again_not_redelivered() -> None:
    a, b, conv = begun_dialog(ack_delay=0.0)
    a.send(conv, INIT, b"once")
    (frame,) = a.peer.frames_to_send(0.0)
    b.receive([frame], 0.0)
    (lost_ack,) = b.peer.frames_to_send(0.0)
    assert isinstance(lost_ack, AckFrame)
    (retry,) = a.peer.frames_to_send(0.5)
    b.receive([retry], 0.5)
    assert b.delivered[(conv, INIT)] == [(0, "Msg", b"once")]
    (again,) = b.peer.frames_to_send(0.5)
    assert isinstance(again, AckFrame) and again.ack.below == 1
    a.receive([again], 0.5)
    assert a.acked == [MessageAcked(conv, INIT, 0, 0, "Msg")]
    assert a.peer.get_timer() is None


# =========================================================================== fragmentation


def test_reassembly_of_1000_fragments_fed_one_byte_at_a_time() -> None:
    a, b, conv = begun_dialog(fragment_size=8, window=8)
    body = random.Random(9).randbytes(8 * 1000 - 3)
    a.send(conv, INIT, body)
    frames = a.peer.frames_to_send(0.0, limit=2000)
    assert len(frames) == 1000
    assert {f.fragment_count for f in frames if isinstance(f, FragmentFrame)} == {1000}
    random.Random(4).shuffle(frames)  # arrive out of order too
    net = Network(a, b)
    a_link, b_link = net.links["ab"]
    stream = b"".join(a_link.send(frame) for frame in frames)
    received: list[FragmentFrame] = []
    for i in range(len(stream)):
        b_link.receive_data(stream[i : i + 1])
        while (event := b_link.next_event()) is not NEED_DATA:
            assert isinstance(event, FragmentFrame)
            received.append(event)
            b.receive([event], 0.0)
            if len(received) < 1000:
                assert (conv, INIT) not in b.delivered, "partial message delivered"
    assert len(received) == 1000
    assert b.delivered[(conv, INIT)] == [(0, "Msg", body)]
    assert b.held[(conv, INIT)] == {}
    net.run(0.0, all_acked(a))
    assert a.acked == [MessageAcked(conv, INIT, 0, 0, "Msg")]


def test_fragment_layout() -> None:
    assert fragment_layout(0, 10) == (1, 0)
    assert fragment_layout(10, 10) == (1, 10)
    assert fragment_layout(11, 10) == (2, 6)
    assert fragment_layout(100, 60) == (2, 50)
    with pytest.raises(LocalProtocolError):
        fragment_layout(1 << 30, 1)


def test_small_message_overtakes_fragments_of_a_large_one() -> None:
    a, b = make_pair(fragment_size=100)
    net = Network(a, b, batch=1)
    big, small = uuid.uuid4(), uuid.uuid4()
    a.begin(big, INIT)
    a.begin(small, INIT)
    large = bytes(100 * 100)
    a.send(big, INIT, large)
    now = 0.0
    for _ in range(10):
        net.transfer(now)
        now += 0.001
    a.send(small, INIT, b"urgent")
    for _ in range(3):
        net.transfer(now)
        now += 0.001
    assert b.delivered[(small, INIT)] == [(0, "Msg", b"urgent")]
    assert (big, INIT) not in b.delivered
    net.run(now, all_acked(a))
    assert b.delivered[(big, INIT)] == [(0, "Msg", large)]


def test_round_robin_across_conversations_and_priority() -> None:
    a, _ = make_pair(fragment_size=10)
    convs = [uuid.uuid4() for _ in range(3)]
    for conv in convs:
        a.begin(conv, INIT)
        a.send(conv, INIT, bytes(50))
    frames = a.peer.frames_to_send(0.0, limit=6)
    assert [f.conversation_id for f in frames] == convs * 2
    # a higher priority dialog goes first
    hot = uuid.uuid4()
    a.peer.open_sender(hot, INIT, envelope_for(INIT), session_key=bytes(16), priority=MAX_PRIORITY)
    a.peer.queue_message(hot, INIT, 0, "Msg", bytes(30))
    frames = a.peer.frames_to_send(0.0, limit=3)
    assert [f.conversation_id for f in frames] == [hot] * 3


def test_low_priority_is_not_starved() -> None:
    a, _ = make_pair(fragment_size=1, window=4096)
    low, high = uuid.uuid4(), uuid.uuid4()
    a.peer.open_sender(low, INIT, envelope_for(INIT), session_key=bytes(16), priority=1)
    a.peer.open_sender(high, INIT, envelope_for(INIT), session_key=bytes(16), priority=9)
    a.peer.queue_message(low, INIT, 0, "Msg", b"l")
    a.peer.queue_message(high, INIT, 0, "Msg", bytes(1000))
    frames = a.peer.frames_to_send(0.0, limit=40)
    assert low in [f.conversation_id for f in frames]


def test_window_limits_messages_in_flight() -> None:
    a, b, conv = begun_dialog(window=4, ack_delay=0.0)
    for i in range(10):
        a.send(conv, INIT, bytes([i]))
    frames = a.peer.frames_to_send(0.0)
    assert [f.seq for f in frames if isinstance(f, FragmentFrame)] == [0, 1, 2, 3]
    assert not a.peer.wants_to_send
    b.receive(frames, 0.0)
    a.receive(b.peer.frames_to_send(0.0), 0.0)
    assert a.peer.wants_to_send
    assert [f.seq for f in a.peer.frames_to_send(0.0) if isinstance(f, FragmentFrame)] == [
        4,
        5,
        6,
        7,
    ]


def test_receiver_drops_beyond_window_unacked() -> None:
    receiver = DialogReceiver(uuid.uuid4(), INIT, private_key=None, session_key=bytes(16), window=2)
    frame = FragmentFrame(receiver.conversation_id, INIT, 5, 0, 1, "Msg", b"far", bytes(16))
    assert receiver.accept(frame) == []
    assert receiver.dropped == 1 and not receiver.ack_pending


# =========================================================================== envelope and key


def test_first_fragments_carry_envelope_and_key_until_first_ack() -> None:
    a, b, conv = begun_dialog(ack_delay=0.0)
    a.send(conv, INIT, b"1")
    a.send(conv, INIT, b"2")
    first = a.peer.frames_to_send(0.0)
    assert all(isinstance(f, FragmentFrame) and f.envelope == envelope_for(INIT) for f in first)
    assert all(isinstance(f, FragmentFrame) and f.wrapped_session_key for f in first)
    b.receive(first, 0.0)
    assert b.receive_keys[(conv, INIT)] == (a.send_state[(conv, INIT)][0], False)
    a.receive(b.peer.frames_to_send(0.0), 0.0)
    a.send(conv, INIT, b"3")
    (later,) = a.peer.frames_to_send(0.0)
    assert (
        isinstance(later, FragmentFrame)
        and later.envelope is None
        and later.wrapped_session_key is None
    )
    b.receive([later], 0.0)
    assert [body for _, _, body in b.delivered[(conv, INIT)]] == [b"1", b"2", b"3"]


def test_fragment_without_key_is_an_integrity_failure() -> None:
    receiver = DialogReceiver(uuid.uuid4(), INIT, private_key=B_KEY)
    frame = FragmentFrame(receiver.conversation_id, INIT, 0, 0, 1, "Msg", b"x", bytes(16))
    (event,) = receiver.receive_fragment(frame)
    assert isinstance(event, IntegrityFailure) and "no session key" in event.reason


def test_sender_rejects_out_of_sequence_and_unknown() -> None:
    a, _, conv = begun_dialog()
    with pytest.raises(LocalProtocolError):
        a.peer.queue_message(conv, INIT, 3, "Msg", b"")
    with pytest.raises(LocalProtocolError):
        a.peer.queue_message(uuid.uuid4(), INIT, 0, "Msg", b"")
    with pytest.raises(LocalProtocolError):
        a.peer.open_sender(conv, INIT, envelope_for(INIT), session_key=bytes(16))
    bare = DialogPeer()
    with pytest.raises(LocalProtocolError):
        bare.open_sender(conv, INIT, envelope_for(INIT), session_key=bytes(16))


def test_ack_for_unknown_sender_is_counted_and_ignored() -> None:
    a, _ = make_pair()
    frame = AckFrame(uuid.uuid4(), INIT, AckRecord(3), bytes(16))
    assert a.peer.receive_frame(frame, 0.0) == []
    assert a.peer.counters.unknown_acks == 1


def test_closed_receiver_reports_unknown_dialog() -> None:
    a, b, conv = begun_dialog()
    a.send(conv, INIT, b"x")
    (frame,) = a.peer.frames_to_send(0.0)
    b.receive([frame], 0.0)
    b.peer.close_receiver(conv, INIT)
    (event,) = b.peer.receive_frame(frame, 0.0)
    assert isinstance(event, UnknownDialog) and event.frame is frame


# =========================================================================== restart


@pytest.mark.parametrize("seed", range(4))
def test_restart_of_both_brokers_loses_and_duplicates_nothing(seed: int) -> None:
    rng = random.Random(seed)
    a, b = make_pair(fragment_size=50)
    net = Network(a, b, seed=seed, drop=0.15, duplicate=0.15, reorder=0.15)
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    expected = bodies(rng, 30, 400)
    now = 0.0
    for i, body in enumerate(expected):
        a.send(conv, INIT, body)
        if i % 3 == 0:
            net.transfer(now)
            now += 0.05
        if i == 12:
            b.auto_store = False  # an open transaction is lost in the crash
            net.transfer(now)
            b.auto_store = True
            b.restart(now)
            net.connect()
        if i == 20:
            a.restart(now)
            net.connect()
            net.delayed = {"ab": [], "ba": []}
    net.run(now, all_acked(a))
    got = b.delivered[(conv, INIT)]
    assert [seq for seq, _, _ in got] == list(range(len(expected)))
    assert [body for _, _, body in got] == expected


def test_restart_with_a_different_fragment_size_discards_stale_partial() -> None:
    a, b, conv = begun_dialog(fragment_size=10, ack_delay=0.0)
    body = bytes(range(100))
    a.send(conv, INIT, body)
    frames = a.peer.frames_to_send(0.0)
    b.receive(frames[1:5], 0.0)
    assert len(b.held[(conv, INIT)]) == 4
    stale_ack = b.peer.frames_to_send(0.0)
    # the sender restarts with a larger fragment size; the stale ack must not count
    a.config["fragment_size"] = 30
    a.restart(0.0)
    a.receive(stale_ack, 0.0)
    assert a.acked == []
    net = Network(a, b)
    net.run(0.0, all_acked(a))
    assert b.delivered[(conv, INIT)] == [(0, "Msg", body)]
    assert b.held[(conv, INIT)] == {}


def test_receiver_resumes_complete_message_from_held_fragments() -> None:
    _a, b = make_pair()
    conv = uuid.uuid4()
    held = [HeldFragment(3, i, 2, "Msg", part) for i, part in enumerate([b"ab", b"cd"])]
    b.next_expected[(conv, INIT)] = 3
    b.held[(conv, INIT)] = {(h.seq, h.fragment_count, h.fragment_index): h for h in held}
    b.receive_keys[(conv, INIT)] = (bytes(16), False)
    b.restart(0.0)
    assert b.delivered[(conv, INIT)] == [(3, "Msg", b"abcd")]
    assert b.next_expected[(conv, INIT)] == 4


def test_sender_restores_pending_messages() -> None:
    a, _ = make_pair()
    conv = uuid.uuid4()
    sender = a.peer.open_sender(
        conv,
        INIT,
        envelope_for(INIT),
        session_key=bytes(16),
        next_seq=10,
        pending=[PendingMessage(8, "Msg", b"8"), PendingMessage(9, "Msg", b"9")],
    )
    assert sender.next_seq == 10 and sender.unacked_count == 2
    assert [f.seq for f in a.peer.frames_to_send(0.0) if isinstance(f, FragmentFrame)] == [8, 9]
    assert [m.seq for m in sender.unacked()] == [8, 9]
    with pytest.raises(LocalProtocolError):
        a.peer.open_sender(
            uuid.uuid4(),
            INIT,
            envelope_for(INIT),
            session_key=bytes(16),
            pending=[PendingMessage(0, "M", b"")],
        )


# =========================================================================== property


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    drop=st.floats(0.0, 0.4),
    duplicate=st.floats(0.0, 0.4),
    reorder=st.floats(0.0, 0.4),
    corrupt=st.floats(0.0, 0.2),
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    fragment_size=st.sampled_from([7, 32, 128]),
    batch=st.integers(1, 8),
)
def test_property_exactly_once_in_order_under_any_fault_schedule(
    seed: int,
    drop: float,
    duplicate: float,
    reorder: float,
    corrupt: float,
    sizes: list[int],
    fragment_size: int,
    batch: int,
) -> None:
    rng = random.Random(seed)
    a, b = make_pair(fragment_size=fragment_size, window=4)
    net = Network(
        a,
        b,
        seed=seed,
        drop=drop,
        duplicate=duplicate,
        reorder=reorder,
        corrupt=corrupt,
        batch=batch,
    )
    conv = uuid.uuid4()
    a.begin(conv, INIT)
    expected = [rng.randbytes(size) for size in sizes]
    now = 0.0
    for body in expected:
        a.send(conv, INIT, body)
        net.transfer(now)
        now += rng.random()
    net.run(now, all_acked(a), deadline=now + 3000)
    got = b.delivered[(conv, INIT)]
    assert [body for _, _, body in got] == expected
    assert [seq for seq, _, _ in got] == list(range(len(expected)))


# =========================================================================== odds and ends


def test_ack_ranges_beyond_the_limit_go_in_several_acks() -> None:
    conv = uuid.uuid4()
    receiver = DialogReceiver(conv, INIT, private_key=None, session_key=bytes(16), window=4096)
    stored: list[MessageReceived | FragmentReceived] = []
    for seq in range(1, 2 * (MAX_ACK_RANGES + 76), 2):  # every other message: one range each
        frame = FragmentFrame(conv, INIT, seq, 0, 1, "Msg", b"m", bytes(16))
        (event,) = receiver.accept(frame)
        assert isinstance(event, FragmentReceived)
        stored.append(event)
    assert not receiver.ack_pending
    for event in stored:
        receiver.mark_stored(event)
    first = receiver.take_ack()
    assert len(first.ranges) == MAX_ACK_RANGES and receiver.ack_pending
    second = receiver.take_ack()
    assert len(second.ranges) == 76 and not receiver.ack_pending
    assert {r[0] for r in first.ranges + second.ranges} == {e.seq for e in stored}


def test_retransmit_all_after_reconnect_and_close_sender_stops_retries() -> None:
    a, _, conv = begun_dialog(retry=RetryPolicy(initial=4.0, factor=2.0, maximum=64.0))
    a.send(conv, INIT, b"a")
    a.send(conv, INIT, b"b")
    assert len(a.peer.frames_to_send(0.0)) == 2
    assert a.peer.frames_to_send(1.0) == []
    a.peer.retransmit_all(1.0)
    assert len(a.peer.frames_to_send(1.0)) == 2
    assert a.peer.get_timer() == 9.0  # the backoff went on: second retry waits 8 s
    a.peer.close_sender(conv, INIT)
    assert a.peer.get_timer() is None
    assert a.peer.frames_to_send(100.0) == []


def test_peer_argument_checks() -> None:
    with pytest.raises(LocalProtocolError):
        DialogPeer(ack_delay=5.0)
    with pytest.raises(LocalProtocolError):
        DialogPeer(fragment_size=0)
    a, _ = make_pair()
    with pytest.raises(LocalProtocolError):
        a.peer.open_sender(
            uuid.uuid4(), INIT, envelope_for(INIT), session_key=bytes(16), priority=11
        )


def test_retries_fall_due_in_deadline_order_even_when_time_goes_back() -> None:
    """Retry entries sit in a FIFO while deadlines arrive in order and in a heap
    otherwise; together they must release retries exactly as one heap would."""
    a, _, conv = begun_dialog(retry=RetryPolicy(initial=4.0, factor=2.0, maximum=64.0))
    sent_at = [3.0, 3.5, 1.0, 3.2, 1.0, 3.9]  # deadlines 7, 7.5, 5, 7.2, 5, 7.9
    for seq, now in enumerate(sent_at):
        a.send(conv, INIT, bytes([seq]))
        frames = a.peer.frames_to_send(now)
        assert [f.seq for f in frames if isinstance(f, FragmentFrame)] == [seq]
    assert a.peer.get_timer() == 5.0
    retried = a.peer.frames_to_send(20.0)
    assert [f.seq for f in retried if isinstance(f, FragmentFrame)] == [2, 4, 0, 3, 1, 5]
    assert a.peer.counters.retransmissions == 6
    assert a.peer.get_timer() == 28.0  # the second wait of the ones just retried (20 + 8)


def test_stale_retry_entries_do_not_hold_the_timer() -> None:
    a, b, conv = begun_dialog(ack_delay=0.0)
    for index in range(50):
        a.send(conv, INIT, bytes([index]))
    network = Network(a, b)
    network.transfer(0.0)
    network.transfer(0.0)
    assert not a.transmission_queue[(conv, INIT)]
    assert a.peer.get_timer() is None


def test_fragment_with_a_foreign_conversation_id_is_still_refused() -> None:
    """The receiver's precomputed header part is only used for its own direction; a
    validly signed fragment of another dialog still fails as before."""
    a, _ = make_pair()
    conv, other = uuid.uuid4(), uuid.uuid4()
    a.begin(conv, INIT)
    a.send(conv, INIT, b"x")
    (frame,) = a.peer.frames_to_send(0.0)
    assert isinstance(frame, FragmentFrame)
    session_key = a.send_state[(conv, INIT)][0]
    receiver = DialogReceiver(other, INIT, private_key=B_KEY, session_key=session_key)
    with pytest.raises(RemoteProtocolError):
        receiver.receive_fragment(frame)
    wrong_direction = DialogReceiver(conv, TARG, private_key=B_KEY, session_key=session_key)
    with pytest.raises(RemoteProtocolError):
        wrong_direction.receive_fragment(frame)
    own = DialogReceiver(conv, INIT, private_key=B_KEY, session_key=session_key)
    assert [type(e) for e in own.receive_fragment(frame)] == [MessageReceived]


# =========================================================================== encryption


def test_encrypted_dialog_sends_no_body_in_clear_and_survives_faults_and_restarts() -> None:
    rng = random.Random(11)
    a, b = make_pair(fragment_size=48)
    net = Network(a, b, seed=11, drop=0.2, duplicate=0.2, reorder=0.2, corrupt=0.1)
    conv = uuid.uuid4()
    a.begin(conv, INIT, encrypted=True)
    a.listen(conv, TARG)
    marker = b"MARKER-" * 20
    sent = [marker + bytes([i]) + rng.randbytes(rng.choice([0, 5, 200])) for i in range(12)]
    for body in sent[:6]:
        a.send(conv, INIT, body)
    now = net.run(0.0, lambda: len(b.delivered.get((conv, INIT), [])) >= 3)
    b.restart(now)
    a.config["fragment_size"] = 100  # the rest goes again, cut into other fragments
    a.restart(now)
    for body in sent[6:]:
        a.send(conv, INIT, body)
    b.begin(conv, TARG, encrypted=True)
    b.send(conv, TARG, marker + b"reply")
    net.run(now, all_acked(a, b))
    assert [body for _, _, body in b.delivered[(conv, INIT)]] == sent
    assert a.delivered[(conv, TARG)] == [(0, "Msg", marker + b"reply")]
    payloads = [f.payload for _, _, f in net.log if isinstance(f, FragmentFrame)]
    assert len(payloads) > 12
    assert not any(b"MARKER" in payload for payload in payloads)
    assert b.receive_keys[(conv, INIT)][1] and a.receive_keys[(conv, TARG)][1]


def test_unencrypted_payloads_are_the_body_so_the_check_above_can_fail() -> None:
    a, _, conv = begun_dialog()
    a.send(conv, INIT, b"MARKER in clear")
    (frame,) = a.peer.frames_to_send(0.0)
    assert isinstance(frame, FragmentFrame) and frame.payload == b"MARKER in clear"


def test_a_body_that_does_not_decrypt_is_delivered_rejected_never_in_clear() -> None:
    """The sender holds the session key, so its signatures verify; its ciphertext is
    still checked, and what fails is reported instead of delivered."""
    a, b = make_pair(ack_delay=0.0)
    conv = uuid.uuid4()
    a.begin(conv, INIT, encrypted=True)
    a.send(conv, INIT, b"first, genuine")
    a.send(conv, INIT, b"second, altered by its own sender")
    first, second = a.peer.frames_to_send(0.0)
    assert isinstance(first, FragmentFrame) and isinstance(second, FragmentFrame)
    session_key = a.send_state[(conv, INIT)][0]
    seal = SessionSeal(session_key)
    altered = bytearray(second.payload)
    altered[3] ^= 0x40
    forged = dataclasses.replace(second, payload=bytes(altered))
    forged = dataclasses.replace(
        forged, signature=seal.sign(forged.signed_header(), forged.payload)
    )
    b.receive([first], 0.0)
    b.receive([forged], 0.0)
    assert b.integrity_failures == []
    assert b.delivered[(conv, INIT)][0] == (0, "Msg", b"first, genuine")
    assert b.delivered[(conv, INIT)][1] == (1, "Msg", b"")
    # the same flip without the key is caught by the signature and never delivered
    c, d = make_pair()
    c.begin(conv, INIT, encrypted=True)
    c.send(conv, INIT, b"x" * 40)
    (frame,) = c.peer.frames_to_send(0.0)
    d.receive([flip_bit(frame, random.Random(1))], 0.0)
    assert len(d.integrity_failures) == 1 and d.delivered == {}


def test_rejected_message_names_the_reason() -> None:
    receiver = DialogReceiver(
        uuid.uuid4(), INIT, private_key=B_KEY, session_key=bytes(16), encrypted=True
    )
    sender_envelope = envelope_for(INIT, encrypted=True)
    frame_sender = DialogPeer(private_key=A_KEY, peer_public_key=B_CERT)
    conv = receiver.conversation_id
    frame_sender.open_sender(conv, INIT, sender_envelope, session_key=bytes(16))
    frame_sender.queue_message(conv, INIT, 0, "Msg", b"body")
    (frame,) = frame_sender.frames_to_send(0.0)
    assert isinstance(frame, FragmentFrame)
    moved = dataclasses.replace(frame, message_type="Other")  # same ciphertext, other type
    moved = dataclasses.replace(
        moved, signature=SessionSeal(bytes(16)).sign(moved.signed_header(), moved.payload)
    )
    (event,) = receiver.receive_fragment(moved)
    assert isinstance(event, MessageReceived)
    assert event.body == b"" and "does not decrypt" in event.rejected


def test_a_receiver_unwraps_with_a_previous_key_after_a_certificate_rotation() -> None:
    new_key_pem, new_cert = generate_broker_identity(B_ID)
    new_key = load_private_key(new_key_pem)
    a = DialogPeer(private_key=A_KEY, peer_public_key=B_CERT)  # still knows the old one
    b = DialogPeer(private_key=[new_key, B_KEY], peer_public_key=A_CERT)
    conv = uuid.uuid4()
    a.open_sender(conv, INIT, envelope_for(INIT), session_key=new_session_key())
    a.queue_message(conv, INIT, 0, "Msg", b"wrapped for the old certificate")
    (frame,) = a.frames_to_send(0.0)
    (unknown,) = b.receive_frame(frame, 0.0)
    assert isinstance(unknown, UnknownDialog)
    b.open_receiver(conv, INIT)
    events = b.receive_frame(frame, 0.0)
    assert [type(e) for e in events] == [SessionKeyReceived, MessageReceived]
    # a broker that holds only the new key cannot
    c = DialogPeer(private_key=new_key, peer_public_key=A_CERT)
    c.open_receiver(conv, INIT)
    (failure,) = c.receive_frame(frame, 0.0)
    assert isinstance(failure, IntegrityFailure)
    del new_cert


def test_envelope_wire_form_keeps_five_elements_unless_encrypted() -> None:
    plain, sealed = envelope_for(INIT), envelope_for(INIT, encrypted=True)
    assert len(plain.encode()) == 5 and len(sealed.encode()) == 6
    assert Envelope.decode(plain.encode()) == plain
    assert Envelope.decode(sealed.encode()) == sealed
    for bad in ([*plain.encode(), False], [*plain.encode(), 1], plain.encode()[:4]):
        with pytest.raises(RemoteProtocolError):
            Envelope.decode(bad)


def test_a_receiver_reports_the_messages_it_holds_in_part() -> None:
    a, b, conv = begun_dialog(fragment_size=10)
    a.send(conv, INIT, b"x" * 25)  # three fragments
    first, second, third = a.peer.frames_to_send(0.0)
    b.receive((first, third), 0.0)
    receiver = b.peer.receiver(conv, INIT)
    assert receiver is not None and b.peer.receivers() == [receiver]
    (held,) = receiver.partials()
    assert (held.seq, held.message_type, held.fragments_received, held.fragment_count) == (
        0,
        "Msg",
        2,
        3,
    )
    assert held.bytes_received == len(first.payload) + len(third.payload)  # type: ignore[union-attr]
    b.receive([second], 0.0)
    assert receiver.partials() == []
    assert b.delivered[(conv, INIT)] == [(0, "Msg", b"x" * 25)]
