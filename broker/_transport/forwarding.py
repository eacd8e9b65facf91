"""Message forwarding: relaying other brokers' dialog frames along this broker's routes.

Theory of operation. With `[transport] forwarding = true` a broker relays the frames of
dialogs it is not party to: a fragment whose envelope names another broker as its target,
and every later frame of the same conversation, bundles (several whole messages in one
frame) as they came. It never opens, acknowledges or stores them: the dialog layer runs
end to end between the two brokers that own the dialog (sequence numbers, acks,
retransmission, the session key wrapped for the target, the origin's signature over the
envelope, the session key's seal over every fragment and bundle), so a forwarder that
dies loses nothing (the origin retransmits) and one that alters a frame is caught by the
target's integrity check.

Each relayed conversation is a `Relay` keyed by conversation id: the two brokers, their
services, and for each direction of travel the adjacent broker its frames last arrived
from. A frame travels towards the target (a fragment from the initiator, or an ack of the
target's direction) or towards the initiator (the reverse). Its next hop is what this
broker's routes say for the far service and broker, else the hop the far side's frames
arrive from. A frame without an envelope for an unknown conversation is not relayed: the
origin's next retransmission carries the envelope again (see `_sender`), which is how a
restarted forwarder, or one that forgot an idle conversation, learns the route anew.

The frames of one read (a slice of it, see `link`) go on together: those for the same
next hop in one write. A bundle goes on only to a next hop that takes relayed bundles (protocol version 4 on; an
origin bundles through a forwarder of version 4 only). One for an older next hop is
dropped and counted, and the broker it came from is told (an `UnbundleFrame`, passed
back hop by hop to the origin, at most once a second per conversation; the origin then
sends that far broker's messages as fragments); the dropped bundle's messages come
again as fragments when the origin retransmits them.

Frames the next hop cannot take now (no connection yet, a busy socket) are held here in
memory, a fragment once however often it is retransmitted, the latest ack of a direction
only, up to `forward_size` in all; past it new frames are refused (the origin keeps them
in its transmission queue and retries with its usual backoff), never what is held. Held
frames go in arrival order when the hop can take them: forwarded messages travel at the
default priority 5, whatever their dialogs' priorities at the ends.

Loops are detected, reported and broken: a frame whose next hop is the broker it came
from, or the same fragment (its seal) coming back from another hop within
`loop_window` seconds, is dropped. Nothing here does I/O or reads a clock: the transport
supplies the next-hop lookup, the writer and `now`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, cast

from ssb.protocol import AckFrame, BundleFrame, Direction, FragmentFrame, UnbundleFrame

log = logging.getLogger("ssb.transport")

Hop = uuid.UUID | str
"""An adjacent broker: its instance id, or its address before the first connection."""
Frame = FragmentFrame | BundleFrame | AckFrame

FRAME_OVERHEAD: Final = 128  # bytes a held frame costs beyond its payload (counted)
MAX_RELAYS: Final = 1_000_000  # conversations relayed at once
RECENT_SEALS: Final = 65_536  # fragments remembered for loop detection
LOG_EVERY: Final = 60.0
TOWARDS_TARGET: Final = 0
TOWARDS_INITIATOR: Final = 1


@dataclass(slots=True)
class Relay:
    """One conversation this broker forwards."""

    conversation_id: uuid.UUID
    initiator: uuid.UUID
    target: uuid.UUID
    initiator_service: str
    target_service: str
    # the adjacent broker frames travelling towards the target / the initiator came from
    came_from: list[uuid.UUID | None] = field(default_factory=lambda: [None, None])
    relayed: int = 0
    refused: int = 0
    unbundled_at: float | None = None  # when the last notice went back (at most 1/s)
    held_frames: int = 0
    held_bytes: int = 0
    last_seen: float = 0.0
    status: str = ""


def _travel(frame: Frame) -> int:
    """Which way a frame goes: fragments with their direction, acks against it."""
    towards_target = frame.direction is Direction.FROM_INITIATOR
    if isinstance(frame, AckFrame):
        towards_target = not towards_target
    return TOWARDS_TARGET if towards_target else TOWARDS_INITIATOR


def _size(frame: Frame) -> int:
    if isinstance(frame, FragmentFrame):
        return FRAME_OVERHEAD + len(frame.payload)
    if isinstance(frame, BundleFrame):
        return FRAME_OVERHEAD + sum(map(len, frame.payloads))
    return FRAME_OVERHEAD


def _held_key(frame: Frame) -> tuple[Any, ...]:
    if isinstance(frame, FragmentFrame):
        return (frame.conversation_id, frame.direction, frame.seq, frame.fragment_index)
    if isinstance(frame, BundleFrame):  # -1: never a fragment's index
        return (frame.conversation_id, frame.direction, frame.seq, -1, len(frame.payloads))
    return (frame.conversation_id, frame.direction)


@dataclass(eq=False)
class Forwarder:
    """The relayed conversations of one broker and the frames it holds for them.

    Attributes (given):
        instance: this broker's id.
        forward_size: bytes of held frames at most.
        loop_window: seconds within which the same fragment coming back from another hop
            means the routes form a loop.
        route: the next hop for (service, broker), or why there is none (a str that is
            not an address: the transport returns addresses only as "host:port").
        send: writes frames to a hop and returns True, or returns False when the hop
            cannot take them now (the transport then connects and calls `flush` later).
        takes_bundles: whether a hop takes relayed bundles (True while it is not
            connected: asked again when what is held for it goes).
        notify: writes a notice to an adjacent broker if its connection is up.
    """

    instance: uuid.UUID
    forward_size: int
    loop_window: float
    route: Callable[[str, uuid.UUID], Hop | None]
    send: Callable[[Hop, list[Frame]], bool]
    takes_bundles: Callable[[Hop], bool] = lambda hop: True
    notify: Callable[[uuid.UUID, UnbundleFrame], None] = lambda hop, frame: None
    relays: dict[uuid.UUID, Relay] = field(init=False, default_factory=dict)
    # by hop, in arrival order: (frame, its relay, when it was first held)
    held: dict[Hop, dict[tuple[Any, ...], tuple[Frame, Relay, float]]] = field(
        init=False, default_factory=dict
    )
    held_bytes: int = field(init=False, default=0)
    relayed: int = field(init=False, default=0)
    refused: int = field(init=False, default=0)
    loops: int = field(init=False, default=0)
    unbundled: int = field(init=False, default=0)  # bundles dropped: next hop takes none
    _seals: dict[bytes, tuple[uuid.UUID, float]] = field(init=False, default_factory=dict)
    _logged: dict[str, float] = field(init=False, default_factory=dict)
    _now: float = field(init=False, default=0.0)

    # ---- deciding -----------------------------------------------------------------------

    def wants(self, frame: Frame) -> bool:
        """Whether `frame` is another broker's to relay (not this broker's own)."""
        if frame.conversation_id in self.relays:
            return True
        envelope = frame.envelope if isinstance(frame, FragmentFrame) else None
        return envelope is not None and envelope.to_broker_id != self.instance

    def relay(self, frame: Frame, came_from: uuid.UUID, now: float) -> None:
        """Pass one frame on towards its next hop (or hold, refuse or drop it)."""
        self.relay_all([frame], came_from, now)

    def relay_all(self, frames: list[Frame], came_from: uuid.UUID, now: float) -> None:
        """Pass the frames of one read on, in order, those for one next hop together."""
        self._now = now
        going: dict[Hop, list[tuple[Frame, Relay]]] = {}
        for frame in frames:
            relay = self._relay_for(frame, came_from, now)
            if relay is None:
                continue
            hop = self._hop_for(relay, frame, came_from, now)
            if hop is not None:
                going.setdefault(hop, []).append((frame, relay))
        for hop, passing in going.items():
            self._pass_on(hop, passing)

    def _hop_for(self, relay: Relay, frame: Frame, came_from: uuid.UUID, now: float) -> Hop | None:
        """Where `frame` goes next, or None when it goes nowhere (said why)."""
        relay.last_seen = now
        travel = _travel(frame)
        relay.came_from[travel] = came_from
        hop = self._next_hop(relay, travel)
        if hop is None:
            far = relay.target if travel == TOWARDS_TARGET else relay.initiator
            service = relay.target_service if travel == TOWARDS_TARGET else relay.initiator_service
            relay.status = f"no route to service '{service}' at broker {far}"
            self._warn(
                "route:" + service,
                "cannot forward conversation %s: %s",
                relay.conversation_id,
                relay.status,
            )
            return None
        if hop == came_from or self._came_back(frame, came_from, now):
            self._loop(relay, frame, came_from, hop)
            return None
        if isinstance(frame, BundleFrame) and not self.takes_bundles(hop):
            self._unbundled(relay, hop, frame)
            return None
        return hop

    def _pass_on(self, hop: Hop, passing: list[tuple[Frame, Relay]]) -> None:
        if self.held.get(hop):
            self.flush(hop)  # the hop may take them now: they go first, in order
        if not self.held.get(hop) and self.send(hop, [frame for frame, _ in passing]):
            for _, relay in passing:
                relay.relayed += 1
                relay.status = ""
            self.relayed += len(passing)
            return
        for frame, relay in passing:
            self._hold(relay, hop, frame)

    def _unbundled(self, relay: Relay, hop: Hop, frame: BundleFrame) -> None:
        self.unbundled += 1
        self._notice(relay, UnbundleFrame(frame.conversation_id, frame.direction))
        relay.status = (
            f"broker {hop} speaks a protocol version older than 4 and takes no relayed"
            " bundles: they are dropped, and their messages go as fragments when retransmitted"
        )
        self._warn(
            f"bundles:{hop}",
            "not forwarding bundles of conversation %s: %s",
            relay.conversation_id,
            relay.status,
        )

    def unbundle(self, notice: UnbundleFrame, now: float) -> bool:
        """A next hop says bundles of a relayed direction cannot go on: pass the notice
        back the way they came. False: not a conversation relayed here."""
        self._now = now
        relay = self.relays.get(notice.conversation_id)
        if relay is None:
            return False
        self._notice(relay, notice)
        return True

    def _notice(self, relay: Relay, notice: UnbundleFrame) -> None:
        towards_target = notice.direction is Direction.FROM_INITIATOR
        back = relay.came_from[TOWARDS_TARGET if towards_target else TOWARDS_INITIATOR]
        now = self._now
        if back is None or (relay.unbundled_at is not None and now - relay.unbundled_at < 1.0):
            return
        relay.unbundled_at = now
        self.notify(back, notice)

    def _relay_for(self, frame: Frame, came_from: uuid.UUID, now: float) -> Relay | None:
        relay = self.relays.get(frame.conversation_id)
        if relay is not None:
            return relay
        envelope = frame.envelope if isinstance(frame, FragmentFrame) else None
        if envelope is None:
            return None  # cannot route it; the origin's retransmission carries the envelope
        if envelope.from_broker_id == self.instance:
            self.loops += 1
            self._warn(
                f"own:{frame.conversation_id}",
                "routes form a loop: a message of conversation %s that this broker sent came"
                " back from broker %s; check the routes on the way",
                frame.conversation_id,
                came_from,
            )
            return None
        if len(self.relays) >= MAX_RELAYS:
            self.refused += 1
            self._warn("full", "not forwarding more conversations: %d are relayed", MAX_RELAYS)
            return None
        if frame.direction is Direction.FROM_INITIATOR:
            ends = (envelope.from_broker_id, envelope.to_broker_id)
            services = (envelope.from_service, envelope.to_service)
        else:
            ends = (envelope.to_broker_id, envelope.from_broker_id)
            services = (envelope.to_service, envelope.from_service)
        relay = Relay(frame.conversation_id, ends[0], ends[1], services[0], services[1])
        self.relays[frame.conversation_id] = relay
        log.debug(
            "forwarding conversation %s between broker %s and broker %s",
            frame.conversation_id,
            relay.initiator,
            relay.target,
        )
        return relay

    def _next_hop(self, relay: Relay, travel: int) -> Hop | None:
        if travel == TOWARDS_TARGET:
            hop = self.route(relay.target_service, relay.target)
        else:
            hop = self.route(relay.initiator_service, relay.initiator)
        # no route: back the way the far side's frames come from
        return hop if hop is not None else relay.came_from[1 - travel]

    def _came_back(self, frame: Frame, came_from: uuid.UUID, now: float) -> bool:
        """The same fragment passed here from another hop moments ago: a loop."""
        if isinstance(frame, AckFrame):
            return False
        seals = self._seals
        seen = seals.get(frame.signature)
        if seen is not None and seen[0] != came_from and now - seen[1] < self.loop_window:
            return True
        if seen is None and len(seals) >= RECENT_SEALS:
            del seals[next(iter(seals))]
        seals[frame.signature] = (came_from, now)
        return False

    def _loop(self, relay: Relay, frame: Frame, came_from: uuid.UUID, hop: Hop) -> None:
        self.loops += 1
        far = relay.target if _travel(frame) == TOWARDS_TARGET else relay.initiator
        relay.status = (
            f"routes form a loop: a frame for broker {far} came from broker {came_from}"
            f" and would go on to {hop}; dropped"
        )
        self._warn(
            f"loop:{relay.conversation_id}",
            "not forwarding conversation %s: %s",
            relay.conversation_id,
            relay.status,
        )

    # ---- holding ------------------------------------------------------------------------

    def _hold(self, relay: Relay, hop: Hop, frame: Frame) -> None:
        held = self.held.setdefault(hop, {})
        key = _held_key(frame)
        size = _size(frame)
        previous = held.get(key)
        if previous is not None:  # held already: the newer copy (of an ack, the latest)
            held[key] = (frame, relay, previous[2])
            return
        if self.held_bytes + size > self.forward_size:
            relay.refused += 1
            self.refused += 1
            relay.status = (
                f"holding {self.held_bytes} bytes, the forward_size limit: refusing more"
                " (the sender keeps them and retries)"
            )
            self._warn(
                "size",
                "forwarding holds %d bytes, [transport] forward_size is %d: refusing frames"
                " until %s takes what is held",
                self.held_bytes,
                self.forward_size,
                hop,
            )
            return
        held[key] = (frame, relay, self._now)
        relay.held_frames += 1
        relay.held_bytes += size
        self.held_bytes += size
        relay.status = relay.status or f"waiting for broker {hop}"

    def _release(self, frame: Frame, relay: Relay) -> None:
        size = _size(frame)
        relay.held_frames -= 1
        relay.held_bytes -= size
        self.held_bytes -= size

    def flush(self, hop: Hop) -> None:
        """`hop` can take frames: send what is held for it, in arrival order."""
        held = self.held.pop(hop, None)
        if not held:
            return
        if not self.takes_bundles(hop):
            for key in [k for k, (f, _, _) in held.items() if isinstance(f, BundleFrame)]:
                frame, relay, _ = held.pop(key)
                self._release(frame, relay)
                self._unbundled(relay, hop, cast(BundleFrame, frame))
            if not held:
                return
        frames = [frame for frame, _, _ in held.values()]
        if not self.send(hop, frames):
            self.held[hop] = held
            return
        for frame, relay, _ in held.values():
            self._release(frame, relay)
            relay.relayed += 1
            relay.status = ""
        self.relayed += len(frames)

    def rename(self, address: str, instance: uuid.UUID) -> None:
        """The broker at `address` turned out to be `instance`: what waits for the address
        waits for the broker."""
        held = self.held.pop(address, None)
        if held:
            self.held.setdefault(instance, {}).update(held)

    def expire(self, now: float, idle: float, hold_for: float) -> None:
        """Drop frames held for `hold_for` seconds (their hop stayed unreachable; the
        origin retransmits them anyway), and forget conversations quiet for `idle`
        seconds that hold nothing (a later frame of one is routed again from its
        retransmission's envelope)."""
        self._now = now
        for hop, held in list(self.held.items()):
            stale = [k for k, (_, _, since) in held.items() if since < now - hold_for]
            for key in stale:
                frame, relay, _ = held.pop(key)
                self._release(frame, relay)
            if not held:
                del self.held[hop]
        horizon = now - idle
        quiet = [c for c, r in self.relays.items() if r.last_seen < horizon and not r.held_frames]
        for cid in quiet:
            del self.relays[cid]
        seals = self._seals
        for seal in [s for s, (_, at) in seals.items() if at < now - self.loop_window]:
            del seals[seal]

    # ---- reporting ----------------------------------------------------------------------

    def _warn(self, topic: str, text: str, *args: object) -> None:
        """A line per topic at most every LOG_EVERY seconds: a forwarder fed a stream of
        bad frames must not flood its log."""
        now = self._now
        if now - self._logged.get(topic, -LOG_EVERY) < LOG_EVERY:
            return
        if len(self._logged) > 10_000:
            self._logged.clear()
        self._logged[topic] = now
        log.warning(text, *args)

    def view(self) -> list[dict[str, Any]]:
        """One row per relayed conversation: who it is between, where its frames go, what
        is held for it and why."""
        rows = []
        for relay in self.relays.values():
            to_target = self._next_hop(relay, TOWARDS_TARGET)
            to_initiator = self._next_hop(relay, TOWARDS_INITIATOR)
            rows.append(
                {
                    "conversation_id": str(relay.conversation_id),
                    "initiator_broker": str(relay.initiator),
                    "target_broker": str(relay.target),
                    "initiator_service": relay.initiator_service,
                    "target_service": relay.target_service,
                    "next_hop_to_target": None if to_target is None else str(to_target),
                    "next_hop_to_initiator": None if to_initiator is None else str(to_initiator),
                    "priority": 5,
                    "held_fragments": relay.held_frames,
                    "held_bytes": relay.held_bytes,
                    "relayed_frames": relay.relayed,
                    "refused_frames": relay.refused,
                    "status": relay.status,
                }
            )
        return rows

    def totals(self) -> dict[str, int]:
        return {
            "relayed_conversations": len(self.relays),
            "held_bytes": self.held_bytes,
            "forward_size": self.forward_size,
            "relayed_frames": self.relayed,
            "refused_frames": self.refused,
            "loops": self.loops,
            "unbundled": self.unbundled,
        }
