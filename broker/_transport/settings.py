"""The transport's settings: the config's [transport] section, every value checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._config import ConfigError, checked_section, setting


@dataclass(frozen=True)
class TransportSettings:
    idle_timeout: float = setting(60.0, 0.01, 86400.0)
    retry_initial: float = setting(4.0, 0.01, 3600.0)
    retry_max: float = setting(64.0, 0.01, 86400.0)
    fragment_size: int = setting(64 * 1024, 1024, 1024 * 1024)
    ack_delay: float = setting(0.05, 0.0, 1.0)
    connect_timeout: float = setting(5.0, 0.01, 600.0)
    honor_broker_priority: bool = True
    # a dialog waiting this long to transmit goes next, whatever its priority
    starvation_bound: float = setting(2.0, 0.001, 3600.0)
    # how long the receiving side of an ended dialog stays to ack late retransmissions
    closed_dialog_linger: float = setting(300.0, 0.0, 86400.0)
    # incoming broker connections accepted per second (each may cost an RSA signature
    # before its sender has proved anything); more are closed at once
    accept_rate: float = setting(20.0, 0.1, 10000.0)
    # mutual TLS between brokers, with their broker identities (off: plain TCP; the
    # handshake still authenticates both sides and fragments are still signed)
    tls: bool = True
    # relay other brokers' dialogs along this broker's routes (see forwarding), holding
    # at most forward_size megabytes of their frames
    forwarding: bool = False
    forward_size: int = setting(10, 1, 1024 * 1024)

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> TransportSettings:
        """The config's [transport] section, every value checked."""
        settings = cls(**checked_section("transport", section, cls))
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
