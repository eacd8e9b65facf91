"""The transport's views: the broker connections, and what this broker forwards."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ssb.protocol import Role

from .forwarding import Forwarder
from .link import Links
from .peers import Peers
from .ports import Clock


@dataclass(eq=False)
class TransportViews:
    links: Links
    peers: Peers
    forwarder: Forwarder | None
    clock: Clock
    wall_clock: Callable[[], float]

    def forwarded(self) -> list[dict[str, Any]]:
        """Conversations this broker relays for others (empty unless forwarding is on)."""
        return [] if self.forwarder is None else self.forwarder.view()

    def connections(self) -> list[dict[str, Any]]:
        """Every link, and every peer without a link of its own (how it is reached)."""
        rows = []
        # links keep monotonic times; the view shows wall-clock ones
        offset = self.wall_clock() - self.clock.time()
        for link in sorted(self.links.all, key=lambda lk: lk.address):
            counters = link.connection.counters
            peer = link.peer
            rows.append(
                {
                    "peer": None if peer is None else str(peer.instance),
                    "address": link.address,
                    "direction": "outbound" if link.role is Role.INITIATOR else "inbound",
                    "state": link.connection.state.name,
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
                    "in_flight": peer.dialog.unacked_messages if peer else 0,
                    "retransmissions": peer.dialog.counters.retransmissions if peer else 0,
                    "last_activity": time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(link.last_activity + offset)
                    ),
                    "via": None,
                }
            )
        linked = {link.peer.instance for link in self.links.all if link.peer is not None}
        for peer in self.peers.all.values():
            if peer.instance in linked:
                continue
            error = self.links.connect_errors.get(peer.address or "", "")
            # a peer reached through a forwarder: that connection's state, and who it is
            carrier = self.peers.link_of(peer)
            via = None if carrier is None or carrier.peer is None else carrier.peer.instance
            rows.append(
                {
                    "peer": str(peer.instance),
                    "address": peer.address,
                    "direction": "outbound",
                    "state": "CLOSED" if carrier is None else carrier.connection.state.name,
                    "login_state": error or "NONE",
                    "bytes_sent": 0,
                    "bytes_received": 0,
                    "fragments_sent": peer.dialog.counters.fragments_sent,
                    "fragments_received": 0,
                    "frames_sent": 0,
                    "frames_received": 0,
                    "corrupt_fragments": peer.corrupt_fragments,
                    "refused_fragments": peer.refused_fragments,
                    "in_flight": peer.dialog.unacked_messages,
                    "retransmissions": peer.dialog.counters.retransmissions,
                    "last_activity": None,
                    "via": None if via is None else str(via),
                }
            )
        return rows
