"""The broker-to-broker transport (see `transport` for how its parts fit together)."""

from __future__ import annotations

from .receivers import HeldPartial
from .settings import TransportSettings, transmission_priority
from .transport import Transport

__all__ = ["HeldPartial", "Transport", "TransportSettings", "transmission_priority"]
