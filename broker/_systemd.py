"""Telling systemd how the daemon is doing (`Type=notify` units).

systemd passes a datagram socket's address in $NOTIFY_SOCKET; a unit of `Type=notify`
counts as started only when the daemon sends `READY=1` there, and `STOPPING=1` says a
clean stop has begun. Outside systemd the variable is unset and nothing is sent. A
failure to send is logged, never fatal: the broker serves either way.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("ssb.daemon")


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1\\nSTATUS=...") to systemd; whether it was sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket name
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("cannot notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False
    return True
