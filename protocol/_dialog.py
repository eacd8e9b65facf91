"""Dialog protocol: exactly-once, in-order delivery of dialog directions between brokers.

Theory of operation
-------------------
A dialog has two directions (`Direction.FROM_INITIATOR`, `Direction.FROM_TARGET`). Each is
sequenced on its own: the sending broker numbers sequenced messages (user messages,
EndDialog, Error) 0, 1, 2, ... and hands them to a `DialogSender` (`_sender`:
fragmentation, the window, bundles); the receiving broker's `DialogReceiver` for the same
(conversation, direction) (`_receiver`: integrity, ordering, reassembly, the ack it owes)
delivers them exactly once, in that order. Acks and protocol errors are unsequenced and
never retried themselves: a lost ack is repaired because the sender retries and the
receiver acks the duplicate again.

`DialogPeer`, one per adjacent broker, holds every sender and receiver of the dialogs with
that broker, schedules their frames, times retransmissions and acks, and hands what
arrives to the direction it belongs to.

Scheduling: retransmissions that fall due go first, then fresh fragments one at a time,
round-robin across dialogs within the highest priority level, so small messages overtake
the fragments of a large one. Starvation is prevented: with a `starvation_bound`, a
dialog that has waited that many seconds goes next whatever its level; without one,
every `STARVATION_EVERY`-th pick goes to the longest-waiting dialog of any level. Each
frame is chosen when the writer asks for it, and a writer may bound what one call
returns by payload bytes (`max_bytes`): asking for what its socket takes now keeps
priorities and the bound where the bytes leave, not where they enter a buffer. Acks
ride on fragments of the reverse direction of the same conversation; an ack with no ride
goes alone `ack_delay` seconds after it became pending. Timers are heaps with lazy
deletion; nothing scans all dialogs.

Time is always an argument (`now`, seconds, any monotonic origin). Nothing here does I/O.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives.asymmetric import rsa

from ._dialog_events import (
    DialogEvent,
    FragmentReceived,
    HeldFragment,
    IntegrityFailure,
    MessageReceived,
    MessagesReceived,
    PendingMessage,
    SessionKeyReceived,
    UnknownDialog,
)
from ._dialog_frames import AckFrame, AckRecord, BundleFrame, Direction, Envelope, FragmentFrame
from ._errors import ErrorCode, IntegrityError, LocalProtocolError
from ._fields import MAX_FRAGMENT_SIZE
from ._integrity import wrap_session_key
from ._receiver import RECEIVE_WINDOW, DialogReceiver
from ._sender import (
    DEFAULT_FRAGMENT_SIZE,
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_FRAGMENT_SIZE,
    DialogSender,
    _OutMessage,
)

DEFAULT_ACK_DELAY: Final = 0.05
MAX_ACK_DELAY: Final = 1.0
DEFAULT_SEND_BATCH: Final = 256
STARVATION_EVERY: Final = 16


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retransmission backoff: `initial`, times `factor` per retry, capped at `maximum`."""

    initial: float = 4.0
    factor: float = 2.0
    maximum: float = 64.0

    def __post_init__(self) -> None:
        if not (self.initial > 0 and self.factor >= 1 and self.maximum >= self.initial):
            raise LocalProtocolError("invalid retry policy", ErrorCode.BAD_ARGUMENT)

    def delay(self, transmissions: int) -> float:
        """Seconds to wait for an ack after a fragment's `transmissions`-th send (1-based)."""
        delay = self.initial
        for _ in range(transmissions - 1):
            delay *= self.factor
            if delay >= self.maximum:
                return self.maximum
        return min(delay, self.maximum)


# --------------------------------------------------------------------------- peer


@dataclass(slots=True)
class PeerCounters:
    """Running totals of one DialogPeer, for the transmission queue and connections views."""

    fragments_sent: int = 0
    retransmissions: int = 0
    standalone_acks: int = 0
    piggybacked_acks: int = 0
    integrity_failures: int = 0
    unknown_acks: int = 0


class _BundleSent:
    """The messages of a bundle sent once, behind one retry entry: when it falls due,
    those still unacked go again one by one, as fragments. `first`: the members before it
    are acked (acks come mostly in order, so a check resumes there)."""

    __slots__ = ("first", "members")

    def __init__(self, members: list[_OutMessage]) -> None:
        self.members = members
        self.first = 0

    def outstanding(self, sender: DialogSender) -> bool:
        """Whether any member still waits for its ack."""
        members = self.members
        first = self.first
        while first < len(members) and not sender.is_outstanding(members[first], 0):
            first += 1
        self.first = first
        return first < len(members)


_Key = tuple[uuid.UUID, Direction]
# (due, tick, sender, a fragment's message or a bundle's members, fragment index,
# transmissions so far)
_RetryEntry = tuple[float, int, DialogSender, "_OutMessage | _BundleSent", int, int]


def _outstanding(entry: _RetryEntry) -> bool:
    """Whether a retry entry still has something unacked."""
    sent = entry[3]
    if isinstance(sent, _BundleSent):
        return sent.outstanding(entry[2])
    return entry[2].is_outstanding(sent, entry[4])


_AckEntry = tuple[float, int, DialogReceiver, int]


class DialogPeer:
    """All dialog directions between this broker and one adjacent broker.

    It outlives TCP connections: frames it returns go on whichever connection is up;
    lost frames are repaired by retransmission.
    """

    def __init__(
        self,
        *,
        private_key: rsa.RSAPrivateKey | Sequence[rsa.RSAPrivateKey] | None = None,
        peer_public_key: rsa.RSAPublicKey | bytes | None = None,
        fragment_size: int = DEFAULT_FRAGMENT_SIZE,
        retry: RetryPolicy | None = None,
        ack_delay: float = DEFAULT_ACK_DELAY,
        window: int = RECEIVE_WINDOW,
        starvation_bound: float | None = None,
    ) -> None:
        """Args:
            starvation_bound: if set, a dialog whose fragments have waited this many
                seconds is served next whatever its priority; if None, every
                STARVATION_EVERY-th pick serves the longest-waiting dialog.
            private_key: this broker's key (unwraps session keys of inbound directions),
                or its keys, current first (see DialogReceiver).
            peer_public_key: the peer's public key or certificate PEM (wraps session keys
                of outbound directions opened without a wrapped key).
            fragment_size: largest fragment payload for outbound messages.
            retry: retransmission backoff; RetryPolicy() by default.
            ack_delay: how long an ack waits for return traffic before going alone.
            window: messages in flight / buffered beyond the cumulative ack, per direction.

        Raises: LocalProtocolError: an argument is out of range.
        """
        if not 0 <= ack_delay <= MAX_ACK_DELAY:
            raise LocalProtocolError(f"ack delay {ack_delay} out of range", ErrorCode.BAD_ARGUMENT)
        if not MIN_FRAGMENT_SIZE <= fragment_size <= MAX_FRAGMENT_SIZE:
            raise LocalProtocolError(
                f"fragment size {fragment_size} out of range", ErrorCode.BAD_ARGUMENT
            )
        self.counters = PeerCounters()
        self.private_key = private_key
        """Handed to receivers opened from now on; a broker that rotates its
        certificate sets its keys here, current first."""
        self._peer_public_key = peer_public_key
        self._fragment_size = fragment_size
        self._retry = retry if retry is not None else RetryPolicy()
        # retry.delay(n) at index n for the first few transmissions (a frozen policy)
        self._retry_delays = (0.0, *(self._retry.delay(n) for n in range(1, 9)))
        self._ack_delay = ack_delay
        self._window = window
        self._senders: dict[_Key, DialogSender] = {}
        self._receivers: dict[_Key, DialogReceiver] = {}
        self._tick = itertools.count()
        # Retry entries in (due, tick) order: a FIFO while they arrive in that order (the
        # common case: every first transmission waits the same delay and time only moves
        # forward), a heap for the rest. Entries of acked fragments are skipped lazily; in
        # the FIFO that costs O(1) each.
        self._retry_heap: list[_RetryEntry] = []
        self._retry_fifo: deque[_RetryEntry] = deque()
        self._retry_ready: deque[tuple[DialogSender, _OutMessage, int, int]] = deque()
        self._ack_heap: list[_AckEntry] = []
        self._ready: list[deque[DialogSender]] = [deque() for _ in range(MAX_PRIORITY + 1)]
        self._ready_count = 0
        self._picks = 0
        self._now = 0.0
        self._starvation_bound = starvation_bound
        self._starvation_checked = -1.0
        self.unacked_messages = 0
        """Messages queued on the senders and not yet fully acked (the broker's in-flight
        budget counts them)."""
        self.unacked_bytes = 0
        """Their bodies' bytes, as the senders hold them (encrypted, if so)."""
        self.bundling = False
        """Whether fresh messages may go in bundles (`BundleFrame`): the owner sets it
        while the connection in use reaches this peer directly and speaks protocol
        version 2."""

    # -- dialogs

    def open_sender(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        envelope: Envelope,
        *,
        session_key: bytes,
        wrapped_session_key: bytes | None = None,
        next_seq: int = 0,
        pending: Iterable[PendingMessage] = (),
        priority: int = DEFAULT_PRIORITY,
        now: float | None = None,
    ) -> DialogSender:
        """Start (or, with `pending`, resume after a restart) sending one dialog direction.

        `now`: the time, from which its pending messages wait (see `queue_message`).

        Raises: LocalProtocolError: already open, no way to wrap the session key, or a
            bad argument (see DialogSender).
        """
        key = (conversation_id, direction)
        if key in self._senders:
            raise LocalProtocolError(
                f"sender {conversation_id}/{direction.name} already open", ErrorCode.ALREADY_EXISTS
            )
        if wrapped_session_key is None:
            if self._peer_public_key is None:
                raise LocalProtocolError(
                    "no wrapped session key and no peer public key", ErrorCode.BAD_ARGUMENT
                )
            wrapped_session_key = wrap_session_key(session_key, self._peer_public_key)
        sender = DialogSender(
            conversation_id,
            direction,
            envelope,
            session_key=session_key,
            wrapped_session_key=wrapped_session_key,
            next_seq=next_seq,
            pending=pending,
            fragment_size=self._fragment_size,
            priority=priority,
            window=self._window,
        )
        self._senders[key] = sender
        self.unacked_messages += sender.unacked_count
        self.unacked_bytes += sender.unacked_bytes
        self._clock(now)
        self._make_ready(sender)
        return sender

    def open_receiver(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        *,
        session_key: bytes | None = None,
        encrypted: bool = False,
        next_expected_seq: int = 0,
        held_fragments: Iterable[HeldFragment] = (),
    ) -> list[DialogEvent]:
        """Start (or resume after a restart) receiving one dialog direction.

        Returns: MessageReceived events for messages the held fragments already complete.

        Raises: LocalProtocolError: already open.
        """
        key = (conversation_id, direction)
        if key in self._receivers:
            raise LocalProtocolError(
                f"receiver {conversation_id}/{direction.name} already open",
                ErrorCode.ALREADY_EXISTS,
            )
        receiver = DialogReceiver(
            conversation_id,
            direction,
            private_key=self.private_key,
            session_key=session_key,
            encrypted=encrypted,
            next_expected_seq=next_expected_seq,
            held_fragments=held_fragments,
            window=self._window,
        )
        self._receivers[key] = receiver
        return receiver.resume()

    def sender(self, conversation_id: uuid.UUID, direction: Direction) -> DialogSender | None:
        """The open sender of a direction, if any."""
        return self._senders.get((conversation_id, direction))

    def receiver(self, conversation_id: uuid.UUID, direction: Direction) -> DialogReceiver | None:
        """The open receiver of a direction, if any."""
        return self._receivers.get((conversation_id, direction))

    def receivers(self) -> list[DialogReceiver]:
        """Every open receiver."""
        return list(self._receivers.values())

    def close_sender(self, conversation_id: uuid.UUID, direction: Direction) -> None:
        """Forget a direction's sender (dialog ended and fully acked, or cleaned up)."""
        sender = self._senders.pop((conversation_id, direction), None)
        if sender is not None:
            sender.closed = True
            self.unacked_messages -= sender.unacked_count
            self.unacked_bytes -= sender.unacked_bytes

    def close_receiver(self, conversation_id: uuid.UUID, direction: Direction) -> None:
        """Forget a direction's receiver; later fragments produce UnknownDialog."""
        receiver = self._receivers.pop((conversation_id, direction), None)
        if receiver is not None:
            receiver.closed = True

    # -- sending

    def queue_message(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        seq: int,
        message_type: str,
        body: bytes,
        now: float | None = None,
    ) -> None:
        """Put the next sequenced message of an open sender on the transmission queue.

        `now`: the time; a dialog's wait for the starvation bound counts from the time of
        the call that made it ready (else from the last time this peer was told).

        Raises: LocalProtocolError: no such sender, wrong `seq`, or too large.
        """
        self.queue_messages(conversation_id, direction, seq, [(message_type, body)], now)

    def queue_messages(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        seq: int,
        messages: Iterable[tuple[str, bytes]],
        now: float | None = None,
    ) -> None:
        """`queue_message` for each of `messages` ((message type, body)), numbered from
        `seq` on: a direction's run of messages in one call.

        Raises: LocalProtocolError: as `queue_message`; the messages before the one
            refused stay queued.
        """
        sender = self._senders.get((conversation_id, direction))
        if sender is None:
            raise LocalProtocolError(
                f"no sender for {conversation_id}/{direction.name}", ErrorCode.UNKNOWN_CONVERSATION
            )
        held = sender.unacked_bytes
        count = sender.unacked_count
        try:
            for message_type, body in messages:
                sender.queue_message(seq, message_type, body)
                seq += 1
        finally:
            self.unacked_messages += sender.unacked_count - count
            self.unacked_bytes += sender.unacked_bytes - held
            self._clock(now)
            self._make_ready(sender)

    def _clock(self, now: float | None) -> None:
        if now is not None and now > self._now:
            self._now = now

    def _make_ready(self, sender: DialogSender) -> None:
        if not sender._in_ready and not sender.closed and sender.has_unsent():
            sender._in_ready = True
            sender._ready_stamp = self._picks
            sender._ready_since = self._now
            self._ready[sender.priority].append(sender)
            self._ready_count += 1

    def _pick_fresh(self, room: int | None = None) -> tuple[DialogSender, _OutMessage, int] | None:
        """The next fresh fragment by priority and starvation; None when none waits, or
        (with `room`) when the one that is next has more payload bytes than `room` (it
        stays next, and nothing is taken)."""
        while self._ready_count:
            self._picks += 1
            checked = self._starvation_checked
            queue = self._choose_ready_queue()
            if room is not None and queue[0].unsent_size() > room:
                self._picks -= 1
                self._starvation_checked = checked  # the check is still to be made
                return None
            sender = queue.popleft()
            self._ready_count -= 1
            picked = None if sender.closed else sender.next_unsent()
            if picked is not None and sender.has_unsent():
                sender._ready_stamp = self._picks
                sender._ready_since = self._now
                queue.append(sender)
                self._ready_count += 1
            else:
                sender._in_ready = False
            if picked is not None:
                return sender, picked[0], picked[1]
        return None

    def _choose_ready_queue(self) -> deque[DialogSender]:
        ready = self._ready
        if self._starvation_bound is not None:
            # at most once per point in time: the bound is far coarser than one pick
            if self._now != self._starvation_checked:
                self._starvation_checked = self._now
                oldest: deque[DialogSender] | None = None
                for queue in ready:
                    if queue and (oldest is None or queue[0]._ready_since < oldest[0]._ready_since):
                        oldest = queue
                if (
                    oldest is not None
                    and self._now - oldest[0]._ready_since >= self._starvation_bound
                ):
                    return oldest
        elif self._picks % STARVATION_EVERY == 0:
            return min((q for q in ready if q), key=lambda queue: queue[0]._ready_stamp)
        for queue in reversed(ready):
            if queue:
                return queue
        raise AssertionError("no ready dialog although the ready count is positive")

    def _take_ack(self, receiver: DialogReceiver, now: float) -> AckRecord:
        record = receiver.take_ack()
        receiver._ack_generation += 1
        receiver._ack_scheduled = False
        if receiver.ack_pending:  # ranges left over: send the rest at once
            self._schedule_ack(receiver, now, 0.0)
        return record

    def _schedule_ack(
        self, receiver: DialogReceiver, now: float, delay: float | None = None
    ) -> None:
        if receiver.ack_pending and not receiver._ack_scheduled and not receiver.closed:
            receiver._ack_scheduled = True
            deadline = now + (self._ack_delay if delay is None else delay)
            heapq.heappush(
                self._ack_heap, (deadline, next(self._tick), receiver, receiver._ack_generation)
            )

    @property
    def wants_to_send(self) -> bool:
        """Whether `frames_to_send(now)` has fragments ready without waiting for a timer."""
        return bool(self._retry_ready) or self._ready_count > 0

    def frames_to_send(
        self, now: float, limit: int = DEFAULT_SEND_BATCH, max_bytes: int | None = None
    ) -> list[FragmentFrame | BundleFrame | AckFrame]:
        """Frames to write now: due retransmissions, then up to `limit` fragments in all
        and (with `max_bytes`) at most that many bytes of their payloads, though always
        one, then standalone acks whose delay expired and found no ride.

        Every frame is chosen when it is asked for: a writer that asks for what its
        socket takes now (`max_bytes`) keeps priorities and the starvation bound where
        the bytes leave. Call again while `wants_to_send` (the writer's buffer
        permitting), and at `get_timer()`.
        """
        self._now = max(self._now, now)
        self.handle_timer(now)
        frames: list[FragmentFrame | BundleFrame | AckFrame] = []
        counters = self.counters
        receivers = self._receivers
        retry = self._retry
        delays = self._retry_delays
        room = max_bytes  # payload bytes left (None: no limit); the first frame goes anyway
        while len(frames) < limit:
            if self._retry_ready:
                sender, message, index, transmissions = self._retry_ready[0]
                if not sender.is_outstanding(message, index):
                    self._retry_ready.popleft()
                    continue
                if room is not None and frames and len(message.payload(index)) > room:
                    break
                self._retry_ready.popleft()
                counters.retransmissions += 1
            else:
                picked = self._pick_fresh(room if frames else None)
                if picked is None:
                    break
                sender, message, index = picked
                transmissions = 0
            ack = None
            receiver = receivers.get(sender._reverse_key)
            if receiver is not None and receiver.ack_pending:
                ack = self._take_ack(receiver, now)
                counters.piggybacked_acks += 1
            bundle = (
                sender.take_bundle(message, room)
                if transmissions == 0 and self.bundling and sender.confirmed
                else None
            )
            if bundle:
                # one retry entry for the bundle: a lost bundle is retransmitted message by
                # message, as fragments
                bundle.insert(0, message)
                frames.append(sender.build_bundle(bundle, ack))
                counters.fragments_sent += len(bundle)
                self._retry_later(
                    (now + delays[1], next(self._tick), sender, _BundleSent(bundle), 0, 1)
                )
                if room is not None:
                    room -= sum(len(member.body) for member in bundle)
                continue
            # a retransmission carries the routing header again (see `_sender`)
            fragment = sender.build_fragment(message, index, ack, transmissions > 0)
            frames.append(fragment)
            if room is not None:
                room -= len(fragment.payload)
            counters.fragments_sent += 1
            transmissions += 1
            delay = (
                delays[transmissions] if transmissions < len(delays) else retry.delay(transmissions)
            )
            self._retry_later(
                (now + delay, next(self._tick), sender, message, index, transmissions)
            )
        heap = self._ack_heap
        while heap and heap[0][0] <= now:
            _, _, receiver, generation = heapq.heappop(heap)
            if (
                receiver.closed
                or generation != receiver._ack_generation
                or not receiver.ack_pending
            ):
                continue
            frame = receiver.ack_frame(self._take_ack(receiver, now))
            if frame is not None:
                frames.append(frame)
                counters.standalone_acks += 1
        return frames

    def _retry_later(self, entry: _RetryEntry) -> None:
        """File a sent fragment's retry: on the FIFO while entries come in due order."""
        fifo = self._retry_fifo
        if not fifo or entry[0] >= fifo[-1][0]:
            fifo.append(entry)
        else:
            heapq.heappush(self._retry_heap, entry)

    # -- timers

    def get_timer(self) -> float | None:
        """When `handle_timer`/`frames_to_send` next has work (retry or ack due), or None."""
        heap = self._retry_heap
        while heap and not _outstanding(heap[0]):
            heapq.heappop(heap)
        fifo = self._retry_fifo
        while fifo and not _outstanding(fifo[0]):
            fifo.popleft()
        acks = self._ack_heap
        while acks and (acks[0][2].closed or acks[0][3] != acks[0][2]._ack_generation):
            heapq.heappop(acks)
        times = [entries[0][0] for entries in (heap, fifo, acks) if entries]
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        """Move retransmissions due by `now` to the front of the send order."""
        heap = self._retry_heap
        fifo = self._retry_fifo
        ready = self._retry_ready
        while True:
            # the earlier (due, tick) of both fronts, as one heap would have popped them
            if fifo and fifo[0][0] <= now and (not heap or fifo[0][:2] < heap[0][:2]):
                _, _, sender, message, index, transmissions = fifo.popleft()
            elif heap and heap[0][0] <= now:
                _, _, sender, message, index, transmissions = heapq.heappop(heap)
            else:
                return
            if isinstance(message, _BundleSent):
                ready += [
                    (sender, member, 0, transmissions)
                    for member in message.members[message.first :]
                    if sender.is_outstanding(member, 0)
                ]
            elif sender.is_outstanding(message, index):
                ready.append((sender, message, index, transmissions))

    def retransmit_all(self, now: float) -> None:
        """Make every unacked, already-sent fragment due at `now` (e.g. after a new
        connection replaced one that died), keeping each fragment's backoff step."""
        entries = [*self._retry_heap, *self._retry_fifo]
        self._retry_heap = []
        self._retry_fifo.clear()
        for entry in entries:
            if _outstanding(entry):
                due, tick, sender, message, index, transmissions = entry
                self._retry_heap.append(
                    (min(due, now), tick, sender, message, index, transmissions)
                )
        heapq.heapify(self._retry_heap)

    # -- receiving

    def receive_frame(
        self, frame: FragmentFrame | BundleFrame | AckFrame, now: float
    ) -> list[DialogEvent]:
        """Process one fragment or standalone ack from the peer.

        Returns: events for the broker, in the order it must apply them.

        Raises: RemoteProtocolError: the frame is inconsistent with the dialog state.
        """
        if isinstance(frame, AckFrame):
            sender = self._senders.get((frame.conversation_id, frame.direction))
            if sender is None:
                self.counters.unknown_acks += 1
                return []
            try:
                sender.verify_ack(frame)
            except IntegrityError as exc:
                self.counters.integrity_failures += 1
                return [
                    IntegrityFailure(frame.conversation_id, frame.direction, None, None, str(exc))
                ]
            return self._apply_ack(sender, frame.ack)
        receiver = self._receivers.get((frame.conversation_id, frame.direction))
        key_event: SessionKeyReceived | None = None
        # accept() and the piggybacked ack touch different objects: apply both, then
        # order the events as key, acks, accepted
        if isinstance(frame, BundleFrame):
            if receiver is None:
                # no envelope to open the direction with: its messages come again as
                # fragments that carry it (see `_sender`)
                return []
            try:
                receiver.verify_bundle(frame)
            except IntegrityError as exc:
                return self._integrity_failure(frame, 0, exc)
            events = receiver.accept_bundle(frame)
        else:
            if receiver is None:
                return [UnknownDialog(frame.conversation_id, frame.direction, frame)]
            try:
                key_event = receiver.verify(frame)
            except IntegrityError as exc:
                return self._integrity_failure(frame, frame.fragment_index, exc)
            events = receiver.accept(frame)
        if frame.ack is not None:
            sender = self._senders.get((frame.conversation_id, frame.direction.reverse))
            if sender is not None:
                events[:0] = self._apply_ack(sender, frame.ack)
        if key_event is not None:
            events.insert(0, key_event)
        self._schedule_ack(receiver, now)
        return events

    def _integrity_failure(
        self, frame: FragmentFrame | BundleFrame, index: int, exc: IntegrityError
    ) -> list[DialogEvent]:
        self.counters.integrity_failures += 1
        return [
            IntegrityFailure(frame.conversation_id, frame.direction, frame.seq, index, str(exc))
        ]

    def _apply_ack(self, sender: DialogSender, record: AckRecord) -> list[DialogEvent]:
        count = sender.unacked_count
        held = sender.unacked_bytes
        events: list[DialogEvent] = list(sender.handle_ack(record))
        self.unacked_messages -= count - sender.unacked_count
        self.unacked_bytes -= held - sender.unacked_bytes
        self._make_ready(sender)  # the window may have opened
        return events

    def mark_stored(
        self, events: Iterable[MessageReceived | MessagesReceived | FragmentReceived], now: float
    ) -> None:
        """The broker committed what these events reported; their acks may now go out."""
        for event in events:
            receiver = self._receivers.get((event.conversation_id, event.direction))
            if receiver is not None:
                receiver.mark_stored(event)
                self._schedule_ack(receiver, now)
