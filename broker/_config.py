"""Daemon settings: defaults, an optional TOML file, then command-line overrides.

With no file at all the broker runs on 127.0.0.1 (client port 4021, broker port
4022) with its data in ./ssb-data and `durability = "fsync"`. Unknown keys in the
file are an error naming the key, so a typo never silently changes nothing, and every
number is range-checked with a message that says what is allowed.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from ssb.protocol import DEFAULT_MAX_MESSAGE_SIZE, MAX_MESSAGE_SIZE_LIMIT

from ._core.backlog import DEFAULT_CACHE_BYTES

MIB: Final = 1024 * 1024


class ConfigError(ValueError):
    """A setting is wrong; the message says which and how to fix it."""


@dataclass
class Config:
    data_dir: Path = Path("ssb-data")
    host: str = "127.0.0.1"
    client_port: int = 4021
    broker_port: int = 4022
    durability: str = "fsync"
    lock_timeout: float = 30.0
    log_level: str = "INFO"
    # bodies of queued messages held in memory at most (the rest stays on disk)
    message_cache_bytes: int = DEFAULT_CACHE_BYTES
    # the largest message body accepted (always fits a frame with its headers)
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    # below this much free disk space, SEND and BEGIN DIALOG are refused
    min_free_disk: int = 1024 * MIB
    # login name -> password; empty means any login is accepted (loopback default)
    users: dict[str, str] = field(default_factory=dict)
    # sections other modules read (activation, transport, ...)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def check(self) -> None:
        if self.durability not in ("fsync", "os"):
            raise ConfigError(f"durability must be 'fsync' or 'os', not {self.durability!r}")
        for name in ("client_port", "broker_port"):
            port = getattr(self, name)
            if not isinstance(port, int) or not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be a port number 0..65535, not {port!r}")
        if (
            isinstance(self.lock_timeout, bool)
            or not isinstance(self.lock_timeout, (int, float))
            or not math.isfinite(self.lock_timeout)
            or not 0 < self.lock_timeout <= 3600
        ):
            raise ConfigError(f"lock_timeout must be seconds in (0, 3600], not {self.lock_timeout!r}")
        _bytes("message_cache_bytes", self.message_cache_bytes, MIB, 1 << 40)
        _bytes("max_message_size", self.max_message_size, 1, MAX_MESSAGE_SIZE_LIMIT)
        _bytes("min_free_disk", self.min_free_disk, 0, 1 << 50)


def _bytes(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name} must be a whole number of bytes from {low} to {high}, not {value!r}")


_SCALARS = {f.name for f in fields(Config)} - {"users", "sections"}
SECTIONS = ("activation", "transport")


def load(path: Path | None, overrides: dict[str, Any]) -> Config:
    """Defaults, then the TOML file at `path` (if any), then non-None overrides."""
    config = Config()
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        for key, value in data.items():
            if key in _SCALARS:
                setattr(config, key, Path(value) if key == "data_dir" else value)
            elif key == "users":
                if not isinstance(value, dict):
                    raise ConfigError("[users] must map login names to passwords")
                config.users = {str(k): str(v) for k, v in value.items()}
            elif key in SECTIONS and isinstance(value, dict):
                config.sections[key] = value
            else:
                raise ConfigError(
                    f"unknown setting {key!r} in {path}; known: "
                    f"{', '.join(sorted(_SCALARS | {'users', *SECTIONS}))}"
                )
    for key, value in overrides.items():
        if value is not None:
            setattr(config, key, Path(value) if key == "data_dir" else value)
    config.check()
    return config
