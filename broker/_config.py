"""Daemon settings: defaults, an optional TOML file, then command-line overrides.

With no file at all the broker runs on 127.0.0.1 (client port 4021, broker port
4022) with its data in ./ssb-data and `durability = "fsync"`. Unknown keys in the
file are an error naming the key, so a typo never silently changes nothing.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


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
        if self.lock_timeout <= 0:
            raise ConfigError("lock_timeout must be a positive number of seconds")


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
