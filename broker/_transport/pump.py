"""The pump: each peer's due frames onto the link they travel on.

Theory of operation. The dialog layer decides what goes next (due retransmissions, then
fresh fragments round robin by priority with the starvation bound, acks riding along;
see protocol's `DialogPeer`). `pump` asks it for frames while the link's socket takes
every write whole (`Link.paused`: something is left in the connection's write buffer)
and writes each batch, up to SEND_BATCH frames and one fragment's worth of payload
(`write_bytes`), as one write; `writable` pumps again once the buffer is empty. So the
buffer holds at most one write, and every other frame is chosen when the socket can take
it: a low-priority message whose wait reaches the starvation bound goes within one
fragment's transfer time, whatever was queued before it. A socket that takes every
write still gets several frames per write. This is the one place frames are chosen and
written. A peer whose
link is down gets a connection on demand (see `link`). Each peer has one timer, at the
dialog layer's next retry or ack deadline. `soon` pumps once at the end of the loop's
iteration, so that many messages queued in one go leave in one write.

Runs of small messages go as bundles on a peer's own connection, and through a
forwarder that relays them (protocol version 4 on, see `forwarding`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ssb.protocol import RELAY_BUNDLES_VERSION

from .forwarding import Forwarder
from .link import Links, Peer
from .peers import Peers
from .ports import Clock

SEND_BATCH: Final = 256  # frames asked of the dialog layer per write


@dataclass(eq=False)
class Pump:
    """Writes peers' frames, now, soon, or when their timer fires.

    `write_bytes`: payload bytes one write carries at most (one frame always)."""

    peers: Peers
    links: Links
    clock: Clock
    forwarder: Forwarder | None
    write_bytes: int

    def soon(self, peer: Peer) -> None:
        """Pump once at the end of this loop iteration (many messages, one write)."""
        if not peer.pump_scheduled:
            peer.pump_scheduled = True
            self.clock.call_soon(self._scheduled, peer)

    def _scheduled(self, peer: Peer) -> None:
        peer.pump_scheduled = False
        if not self.links.closing:
            self.pump(peer)

    def pump(self, peer: Peer) -> None:
        """Write what `peer`'s dialogs have to send while its link takes it."""
        link = self.peers.link_of(peer)
        now = self.clock.time()
        if link is None or not link.established:
            if link is None and peer.has_work() and not self.links.closing:
                address = self.peers.address_of(peer)
                if address is not None:
                    peer.address = address
                    self.links.connect(address)
            self._arm(peer)
            return
        dialog = peer.dialog
        # bundles go on a connection of the peer's own, or to a forwarder that relays them
        dialog.bundling = link.peer is peer or (
            peer.relayed_bundles and link.connection.peer_version >= RELAY_BUNDLES_VERSION
        )
        write_bytes = self.write_bytes
        while not link.paused:
            frames = dialog.frames_to_send(now, SEND_BATCH, write_bytes)
            if not frames:
                break
            send = link.connection.send
            link.write(b"".join([send(frame) for frame in frames]))
            if not dialog.wants_to_send:
                break
        self._arm(peer)

    def writable(self, adjacent: Peer) -> None:
        """`adjacent`'s connection takes writes again: everything that goes on it."""
        self.pump(adjacent)
        for peer in self.peers.routed_via(adjacent):
            self.pump(peer)
        if self.forwarder is not None:
            self.forwarder.flush(adjacent.instance)

    def _arm(self, peer: Peer) -> None:
        when = peer.dialog.get_timer()
        if when is None:
            return
        if peer.timer is not None and peer.timer_at is not None and peer.timer_at <= when:
            return
        if peer.timer is not None:
            peer.timer.cancel()
        peer.timer_at = when
        peer.timer = self.clock.call_at(when, self._fire, peer)

    def _fire(self, peer: Peer) -> None:
        peer.timer = None
        peer.timer_at = None
        if not self.links.closing:
            self.pump(peer)

    def stop(self) -> None:
        for peer in self.peers.all.values():
            if peer.timer is not None:
                peer.timer.cancel()
