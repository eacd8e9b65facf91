"""The ssb broker daemon (run it with `ssb serve`)."""

from __future__ import annotations

from ._config import Config, ConfigError, load
from ._daemon import Broker, run, serve

__all__ = ["Broker", "Config", "ConfigError", "load", "run", "serve"]
