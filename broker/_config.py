"""Daemon settings: defaults, an optional TOML file, then command-line overrides.

With no file at all the broker runs on 127.0.0.1 (client port 4021, broker port
4022) with its data in ./ssb-data and `durability = "fsync"`. Unknown keys in the
file are an error naming the key, so a typo never silently changes nothing, and every
number is range-checked with a message that says what is allowed.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from ssb.protocol import DEFAULT_MAX_MESSAGE_SIZE, MAX_MESSAGE_SIZE_LIMIT

from ._core.backlog import DEFAULT_CACHE_BYTES

MIB: Final = 1024 * 1024
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_CHART_SECONDS: Final = 5.0  # the dashboard's depth samples, by default


class ConfigError(ValueError):
    """A setting is wrong; the message says which and how to fix it."""


@dataclass(frozen=True)
class ClientLimits:
    """The [limits] section: what one client connection may cost."""

    hello_frame_size: int = 64 * 1024  # bytes of the first frame, before login
    login_timeout: float = 10.0  # seconds from connecting to a successful login
    connections_per_address: int = 256  # open client connections from one address
    locks_per_transaction: int = 100_000  # conversation-group locks one transaction holds
    detached_per_login: int = 1_000  # open detached transactions of one login
    failed_login_window: float = 60.0  # seconds over which failed logins count
    failed_logins_per_address: int = (
        5  # per login and address, then refused until the window passes
    )
    failed_logins_per_login: int = 50  # per login from all addresses

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> ClientLimits:
        ranges: dict[str, tuple[float, float, bool] | None] = {
            "hello_frame_size": (1024, 1024 * 1024, True),
            "login_timeout": (0.1, 3600.0, False),
            "connections_per_address": (1, 1_000_000, True),
            "locks_per_transaction": (1, 100_000_000, True),
            "detached_per_login": (1, 1_000_000, True),
            "failed_login_window": (1.0, 86400.0, False),
            "failed_logins_per_address": (1, 1_000_000, True),
            "failed_logins_per_login": (1, 1_000_000, True),
        }
        return cls(**checked_section("limits", section, ranges))


def checked_section(
    name: str, section: dict[str, Any], ranges: Mapping[str, tuple[float, float, bool] | None]
) -> dict[str, Any]:
    """A config section's values, each known: numbers finite and within (low, high,
    whole), switches (a range of None) true or false."""
    unknown = set(section) - set(ranges)
    if unknown:
        raise ConfigError(
            f"unknown [{name}] setting(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(ranges))}"
        )
    for key, value in section.items():
        limits = ranges[key]
        if limits is None:
            if not isinstance(value, bool):
                raise ConfigError(f"[{name}] {key} must be true or false, not {value!r}")
            continue
        low, high, whole = limits
        if (
            isinstance(value, bool)
            or not isinstance(value, int if whole else (int, float))
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            kind = "a whole number" if whole else "a number of seconds"
            raise ConfigError(
                f"[{name}] {key} must be {kind} from {_shown(low)} to {_shown(high)}, not {value!r}"
            )
    return dict(section)


@dataclass
class Config:
    data_dir: Path = Path("ssb-data")
    host: str = "127.0.0.1"
    client_port: int = 4021
    broker_port: int = 4022
    durability: str = "fsync"
    lock_timeout: float = 30.0
    log_level: str = "INFO"
    log_format: str = "text"  # "text" for people, "json" (one object a line) for machines
    # the HTTP port of /metrics, /healthz and the dashboard; None: no HTTP
    http_port: int | None = None
    http_host: str = "127.0.0.1"  # the address it listens on (loopback unless set)
    # a bearer token that also opens /metrics (beyond loopback /metrics needs a login)
    http_token: str | None = None
    # seconds between the dashboard's samples of queue depths (its charts)
    chart_sample_seconds: float = DEFAULT_CHART_SECONDS
    # bodies of queued messages held in memory at most (the rest stays on disk)
    message_cache_bytes: int = DEFAULT_CACHE_BYTES
    # the largest message body accepted (always fits a frame with its headers)
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    # below this much free disk space, SEND and BEGIN DIALOG are refused
    min_free_disk: int = 1024 * MIB
    # committed transaction ids are kept this long and at most this many, so that a client
    # that lost a commit's answer can learn its outcome (see `transaction_outcome`)
    outcome_window_seconds: float = 3600.0
    outcome_window_count: int = 1_000_000
    # plain TCP on the client port beyond loopback (TLS is always offered; on loopback
    # plain TCP is always accepted)
    allow_plain: bool = False
    # the client port's TLS certificate and key (PEM files); none: made on first start
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # the functions activation and scheduler tasks may run (fnmatch over module:function)
    procedures: tuple[str, ...] = ()
    # what one client connection may cost ([limits])
    limits: ClientLimits = field(default_factory=lambda: ClientLimits())
    # sections other modules read (activation, transport, ...)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def check(self) -> None:
        if self.durability not in ("fsync", "os"):
            raise ConfigError(f"durability must be 'fsync' or 'os', not {self.durability!r}")
        for name in ("client_port", "broker_port"):
            port = getattr(self, name)
            if not isinstance(port, int) or not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be a port number 0..65535, not {port!r}")
        if self.http_port is not None and (
            isinstance(self.http_port, bool)
            or not isinstance(self.http_port, int)
            or not 0 <= self.http_port <= 65535
        ):
            raise ConfigError(f"http_port must be a port number 0..65535, not {self.http_port!r}")
        if not isinstance(self.log_level, str) or self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}"
            )
        if not isinstance(self.http_host, str) or not self.http_host:
            raise ConfigError(f"http_host must be an address, not {self.http_host!r}")
        if self.http_port is None and (
            self.http_token is not None or self.chart_sample_seconds != DEFAULT_CHART_SECONDS
        ):
            raise ConfigError(
                "http_token and chart_sample_seconds need the HTTP port: set http_port too"
            )
        if not isinstance(self.log_format, str) or self.log_format not in ("text", "json"):
            raise ConfigError(f"log_format must be 'text' or 'json', not {self.log_format!r}")
        if self.http_token is not None and (
            not isinstance(self.http_token, str) or len(self.http_token) < 16
        ):
            raise ConfigError("http_token must be a string of at least 16 characters")
        chart = self.chart_sample_seconds
        if not _seconds(chart) or not 0.05 <= chart <= 3600:
            raise ConfigError(
                f"chart_sample_seconds must be seconds from 0.05 to 3600, not {chart!r}"
            )
        if not _seconds(self.lock_timeout) or not 0 < self.lock_timeout <= 3600:
            raise ConfigError(
                f"lock_timeout must be seconds in (0, 3600], not {self.lock_timeout!r}"
            )
        _whole("message_cache_bytes", self.message_cache_bytes, MIB, 1 << 40)
        _whole("max_message_size", self.max_message_size, 1, MAX_MESSAGE_SIZE_LIMIT)
        _whole("min_free_disk", self.min_free_disk, 0, 1 << 50)
        window = self.outcome_window_seconds
        if not _seconds(window) or not 1 <= window <= 30 * 86400:
            raise ConfigError(
                f"outcome_window_seconds must be seconds from 1 to {30 * 86400}, not {window!r}"
            )
        _whole("outcome_window_count", self.outcome_window_count, 1, 100_000_000, "")
        if not isinstance(self.allow_plain, bool):
            raise ConfigError(f"allow_plain must be true or false, not {self.allow_plain!r}")


def _shown(limit: float) -> str:
    """A range's end as a person writes it (1048576, not 1.04858e+06)."""
    return str(int(limit)) if float(limit).is_integer() else f"{limit:g}"


def _seconds(value: object) -> bool:
    """Whether `value` is a finite number (of seconds); the caller checks its range."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _whole(name: str, value: object, low: int, high: int, unit: str = " of bytes") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"{name} must be a whole number{unit} from {low} to {high}, not {value!r}"
        )


_SCALARS = {f.name for f in fields(Config)} - {"limits", "sections", "procedures"}
SECTIONS = ("activation", "transport")
_PATHS = ("data_dir", "tls_cert_file", "tls_key_file")
PLAINTEXT_USERS = (
    "[users] with passwords in the config is no longer supported: logins live in the store"
    " as salted hashes. Remove [users] and add each login to the running broker with"
    " `ssb login add NAME` (the first start creates 'admin'; its password is in the data"
    " directory's admin.password)"
)


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
                setattr(config, key, Path(value) if key in _PATHS else value)
            elif key == "users":
                raise ConfigError(PLAINTEXT_USERS)
            elif key == "procedures":
                if not isinstance(value, list) or not all(
                    isinstance(v, str) and v.strip() for v in value
                ):
                    raise ConfigError(
                        'procedures must be a list of patterns, e.g. ["myapp.tasks.*"]'
                    )
                config.procedures = tuple(value)
            elif key == "limits" and isinstance(value, dict):
                config.limits = ClientLimits.from_section(value)
            elif key in SECTIONS and isinstance(value, dict):
                config.sections[key] = value
            else:
                raise ConfigError(
                    f"unknown setting {key!r} in {path}; known: "
                    f"{', '.join(sorted(_SCALARS | {'limits', 'procedures', *SECTIONS}))}"
                )
    for key, value in overrides.items():
        if value is not None:
            setattr(config, key, Path(value) if key in _PATHS else value)
    config.check()
    return config
