"""The transport's settings: the config's [transport] section, every value checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._config import ConfigError, checked_section


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
    # relay other brokers' dialogs along this broker's routes (see forwarding), holding
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
        if settings.forward_size != cls.forward_size and not settings.forwarding:
            raise ConfigError(
                "[transport] forward_size bounds what a forwarder holds, and this broker does"
                " not forward: set forwarding = true too, or remove forward_size"
            )
        return settings


def transmission_priority(level: int, honor_broker_priority: bool) -> int:
    """The level a dialog direction is transmitted at: its endpoint's, or 5 when the
    instance does not honor broker priorities. It never travels on the wire."""
    return level if honor_broker_priority else 5
