"""Free TCP ports of 127.0.0.1 that a daemon may keep while it is not listening."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Final

EPHEMERAL_PORTS: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT: Final = 10_000  # free_port's ports are from here to the ephemeral range


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now, for a daemon that must keep its port
    while it is not listening (a standby, a restart).

    It is taken below the system's ephemeral range: a port from that range can be given
    to any outgoing connection meanwhile (the kernel picks those), and the daemon then
    cannot listen on it again; below the range only an explicit bind can take it.
    """
    try:
        low = int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default
    for _ in range(200):
        port = random.randrange(LOWEST_PORT, max(LOWEST_PORT + 1, low))
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port of 127.0.0.1 between {LOWEST_PORT} and {low}")
