"""Daemon settings: defaults, an optional TOML file, then command-line overrides.

With no file at all the broker runs on 127.0.0.1 (client port 4021, broker port
4022) with its data in ./ssb-data and `durability = "fsync"`. Unknown keys in the
file are an error naming the key, so a typo never silently changes nothing, and every
number is range-checked with a message that says what is allowed.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final, TypeVar

from ssb.protocol import MAX_MESSAGE_SIZE_LIMIT, check_poll_window

from ._core.engine import CoreLimits
from ._store import is_database_url

T = TypeVar("T")
MIB: Final = 1024 * 1024
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_CHART_SECONDS: Final = 5.0  # the dashboard's depth samples, by default
DEFAULT_HTTP_HOST: Final = "127.0.0.1"
CORE: Final = CoreLimits()  # the core's bounds, whose defaults are the config's
DEFAULT_FAILOVER: Final = 10.0
MIN_FAILOVER: Final = 1.0  # seconds: a shorter lease would be lost to a slow round trip
DEFAULT_DISK_RESERVE: Final = 16 * MIB
DEFAULT_BUSY_POLL: Final = 100e-6


class ConfigError(ValueError):
    """A setting is wrong; the message says which and how to fix it."""


def setting(default: T, low: float, high: float) -> T:
    """A number of a config section's settings: its default, and the range a value must
    be in (a whole number when the field is an int)."""
    return field(default=default, metadata={"range": (low, high)})


@dataclass(frozen=True)
class ClientLimits:
    """The [limits] section: what one client connection may cost.

    Each setting's docstring is its description in the configuration reference."""

    hello_frame_size: int = setting(64 * 1024, 1024, 1024 * 1024)
    """bytes a client may send in its first frame, before it has logged in"""
    login_timeout: float = setting(10.0, 0.1, 3600.0)
    """seconds from connecting to a successful login"""
    connections_per_address: int = setting(256, 1, 1_000_000)
    """open client connections from one address"""
    locks_per_transaction: int = setting(100_000, 1, 100_000_000)
    """conversation-group locks one transaction may hold"""
    detached_per_login: int = setting(1_000, 1, 1_000_000)
    """open detached transactions of one login"""
    failed_login_window: float = setting(60.0, 1.0, 86400.0)
    """seconds over which failed logins count"""
    failed_logins_per_address: int = setting(5, 1, 1_000_000)
    """failed logins of one login from one address, then it is refused there until the
    window passes"""
    failed_logins_per_login: int = setting(50, 1, 1_000_000)
    """failed logins of one login from all addresses, then it is refused everywhere
    until the window passes"""

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> ClientLimits:
        return cls(**checked_section("limits", section, cls))


def checked_section(
    name: str, section: dict[str, Any], settings: type[Any], elsewhere: Collection[str] = ()
) -> dict[str, Any]:
    """Section [name]'s values for the settings dataclass `settings`, each one of its
    settings: numbers (fields made with `setting`) finite and within their range, switches
    (bool fields) true or false; those named in `elsewhere` are the caller's to check."""
    known = {f.name: f for f in fields(settings)}
    for f in known.values():  # (a mistake of ours: said at any start)
        if "range" not in f.metadata and f.type not in ("bool", bool) and f.name not in elsewhere:
            raise TypeError(f"[{name}] {f.name} is neither a setting() nor a bool")
    unknown = set(section) - set(known)
    if unknown:
        raise ConfigError(
            f"unknown [{name}] setting(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    for key, value in section.items():
        if key in elsewhere:
            continue
        limits = known[key].metadata.get("range")
        if limits is None:
            if not isinstance(value, bool):
                raise ConfigError(f"[{name}] {key} must be true or false, not {value!r}")
            continue
        low, high = limits
        whole = known[key].type in ("int", int)
        if (
            isinstance(value, bool)
            or not isinstance(value, int if whole else (int, float))
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            kind = "a whole number" if whole else "a number"  # (seconds, or a rate)
            raise ConfigError(
                f"[{name}] {key} must be {kind} from {_shown(low)} to {_shown(high)}, not {value!r}"
            )
    return dict(section)


@dataclass
class Config:
    """The daemon's settings. Each setting's docstring is its description in the
    configuration reference."""

    data_dir: Path = Path("ssb-data")
    """where the store, the broker's keys, admin.password and broker.json live"""
    store: str | None = None
    """the PostgreSQL database that keeps the broker's state, a postgresql:// URL (unset:
    the SQLite file in data_dir; see PostgreSQL in the documentation). Daemons given the
    same database are one broker: one serves, the others wait as standbys"""
    failover_timeout: float = DEFAULT_FAILOVER
    """with a PostgreSQL store: seconds within which a standby takes over when the active
    daemon dies or loses the database (its lease lasts half of this; the broker's state
    must be recovered in less than the rest)"""
    host: str = "127.0.0.1"
    """the address the client port and the broker port listen on (0.0.0.0: every IPv4
    address of this machine)"""
    client_port: int = 4021
    """the port of client sessions (0: any free port)"""
    broker_port: int = 4022
    """the port of broker-to-broker traffic (0: any free port)"""
    durability: str = "fsync"
    """what an answer waits for: "fsync", the disk; "os", the operating system (what was
    acknowledged then survives a daemon crash, not a power cut). With a PostgreSQL store:
    "fsync", a commit as the server's synchronous_commit says; "os", synchronous_commit
    off"""
    busy_poll: float = DEFAULT_BUSY_POLL
    """seconds the daemon keeps polling for the next request after it has answered,
    rather than sleeping in the kernel (0: never): on an idle machine the wake-up costs
    tens of microseconds of a client's round trip. Polls that find nothing make the next
    ones rarer (see Waiting for answers in the Python client's page)"""
    lock_timeout: float = CORE.lock_timeout
    """seconds a statement waits for a conversation group another transaction locks"""
    statement_timeout: float = CORE.statement_timeout
    """seconds a table statement may wait for a table another transaction locks, and
    then run"""
    log_level: str = "INFO"
    """DEBUG adds one line per statement"""
    log_format: str = "text"
    """how the log is written: "text", lines for people; "json", one JSON object a line"""
    http_port: int | None = None
    """the HTTP port of /metrics, /healthz and the dashboard (unset: no HTTP port)"""
    http_host: str = DEFAULT_HTTP_HOST
    """the address the HTTP port listens on (loopback unless set, whatever host says)"""
    http_token: str | None = None
    """a bearer token that also opens /metrics (beyond loopback /metrics needs a login);
    needs http_port"""
    chart_sample_seconds: float = DEFAULT_CHART_SECONDS
    """seconds between the dashboard's samples of queue depths (its charts); needs
    http_port"""
    message_cache_bytes: int = CORE.message_cache_bytes
    """bytes of queued message bodies held in memory at most (the rest stays on disk)"""
    max_message_size: int = CORE.max_message_size
    """bytes of the largest message body accepted (it always fits a frame with its
    headers)"""
    min_free_disk: int = CORE.min_free_disk
    """bytes of free disk space below which SEND and BEGIN DIALOG are refused (the SQLite
    store's disk; with a PostgreSQL store the server's disk is the server's to watch)"""
    disk_reserve: int = DEFAULT_DISK_RESERVE
    """bytes of disk space the daemon holds in a file of its data directory
    (disk-reserve) and gives up when the disk is full, so that the store still opens and
    RECEIVE and END CONVERSATION still commit; made again once there is room for it twice
    over, and meanwhile SEND and BEGIN DIALOG are refused (0: no reserve; the SQLite
    store's disk only)"""
    disk_full_timeout: float = 5.0
    """seconds a commit that cannot be written (a full disk, failing I/O) is tried again
    before it is rolled back: its clients are answered DiskFullError, nothing of it is
    applied, and the broker starts again from what is durable (see A full disk). A
    commit that failed for a lock held elsewhere or a lost connection to the PostgreSQL
    server (its outcome unknown, the server perhaps restarting) is never rolled back so:
    it waits"""
    outcome_window_seconds: float = CORE.outcome_window_seconds
    """seconds committed transaction ids are kept, so that a client that lost a commit's
    answer can learn its outcome (`transaction_outcome`)"""
    outcome_window_count: int = CORE.outcome_window_count
    """committed transaction ids kept at most, over the whole broker"""
    allow_plain: bool = False
    """plain TCP on the client port beyond loopback (TLS is always offered; on loopback
    plain TCP is always accepted)"""
    tls_cert_file: Path | None = None
    """the client port's TLS certificate, a PEM file (unset: one made on first start)"""
    tls_key_file: Path | None = None
    """the client port's TLS key, a PEM file (unset: one made on first start)"""
    procedures: tuple[str, ...] = ()
    """the functions activation and scheduler tasks may run (fnmatch patterns over
    module:function, or over the module)"""
    # what one client connection may cost ([limits])
    limits: ClientLimits = field(default_factory=lambda: ClientLimits())
    # sections other modules read (activation, transport, ...)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def check(self) -> None:
        if self.durability not in ("fsync", "os"):
            raise ConfigError(f"durability must be 'fsync' or 'os', not {self.durability!r}")
        timeout = self.failover_timeout
        if not _seconds(timeout) or not MIN_FAILOVER <= timeout <= 3600:
            raise ConfigError(
                f"failover_timeout must be seconds from {MIN_FAILOVER:g} to 3600, not {timeout!r}"
            )
        if self.store is not None:
            if not isinstance(self.store, str) or not is_database_url(self.store):
                raise ConfigError(
                    "store must be a PostgreSQL URL (postgresql://USER@HOST:PORT/DATABASE);"
                    " leave it unset for the SQLite store in data_dir"
                )
            for name, default in (
                ("min_free_disk", CORE.min_free_disk),
                ("disk_reserve", DEFAULT_DISK_RESERVE),
            ):
                if getattr(self, name) not in (0, default):
                    raise ConfigError(
                        f"{name} does not apply to a PostgreSQL store (its disk is the"
                        " database server's, which the broker cannot see): remove it, and"
                        " watch the server's disk there"
                    )
        elif self.failover_timeout != DEFAULT_FAILOVER:
            raise ConfigError(
                "failover_timeout applies to daemons sharing a PostgreSQL store (one serves,"
                " the others stand by): set store too, or remove failover_timeout"
            )
        if not isinstance(self.host, str) or not self.host:
            # (an empty host would listen on every address)
            raise ConfigError(
                f"host must be an address (0.0.0.0 for every address), not {self.host!r}"
            )
        for name in ("client_port", "broker_port"):
            port = getattr(self, name)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
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
        if self.http_port is None:
            given = [
                name
                for name, value, default in (
                    ("http_host", self.http_host, DEFAULT_HTTP_HOST),
                    ("http_token", self.http_token, None),
                    ("chart_sample_seconds", self.chart_sample_seconds, DEFAULT_CHART_SECONDS),
                )
                if value != default
            ]
            if given:
                one = len(given) == 1
                raise ConfigError(
                    f"{' and '.join(given)} {'needs' if one else 'need'} the HTTP port, which"
                    f" is off: set http_port too, or remove {'it' if one else 'them'}"
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
        try:
            check_poll_window(self.busy_poll)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not _seconds(self.lock_timeout) or not 0 < self.lock_timeout <= 3600:
            raise ConfigError(
                f"lock_timeout must be seconds in (0, 3600], not {self.lock_timeout!r}"
            )
        if not _seconds(self.statement_timeout) or not 0 < self.statement_timeout <= 3600:
            raise ConfigError(
                f"statement_timeout must be seconds in (0, 3600], not {self.statement_timeout!r}"
            )
        _whole("message_cache_bytes", self.message_cache_bytes, MIB, 1 << 40)
        _whole("max_message_size", self.max_message_size, 1, MAX_MESSAGE_SIZE_LIMIT)
        _whole("min_free_disk", self.min_free_disk, 0, 1 << 50)
        _whole("disk_reserve", self.disk_reserve, 0, 1 << 40)
        timeout = self.disk_full_timeout
        if not _seconds(timeout) or not 0.5 <= timeout <= 3600:
            raise ConfigError(
                f"disk_full_timeout must be seconds from 0.5 to 3600, not {timeout!r}"
            )
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
# What the settings of those sections mean. Their classes (ActivationSettings,
# TransportSettings) live with the parts that read them; the configuration reference
# shows these beside their defaults and ranges, and its build fails on a setting that
# has no description here.
SECTION_DOCS: Final[Mapping[str, Mapping[str, str]]] = {
    "activation": {
        "check_interval": "seconds between checks of every queue monitor",
        "empty_rowset_window": "seconds without an empty RECEIVE before messages that wait"
        " get another reader",
        "notification_timeout": "external activation: seconds to wait for a RECEIVE"
        " before notifying again",
        "idle_workers": "warm worker processes kept for reuse",
        "prestart_workers": "warm worker processes started with the daemon",
        "worker_start_timeout": "seconds a new worker process may take to start",
        "python_path": "directories workers import procedures from, besides the daemon's"
        " working directory",
        "execution_log_rows": "rows of the scheduler's execution log kept",
    },
    "transport": {
        "idle_timeout": "seconds of quiet after which a connection to another broker closes",
        "retry_initial": "seconds before a message's first retransmission (then doubling)",
        "retry_max": "seconds between retransmissions at most (at least retry_initial)",
        "fragment_size": "bytes of a fragment: larger messages travel in several",
        "ack_delay": "seconds an acknowledgement waits for return traffic before it goes alone",
        "connect_timeout": "seconds to connect to another broker, and for a connecting"
        " broker to say who it is",
        "honor_broker_priority": "transmit by conversation priority (false: all at 5)",
        "starvation_bound": "seconds after which a dialog waiting to transmit goes next,"
        " whatever its priority",
        "closed_dialog_linger": "seconds an ended dialog's receiving side keeps"
        " acknowledging late retransmissions",
        "accept_rate": "incoming broker connections given a handshake per second (also as"
        " a burst); more are closed at once",
        "tls": "mutual TLS between brokers with their broker certificates (false: plain"
        " TCP; the handshake still authenticates both sides)",
        "forwarding": "relay messages for services that other brokers host, along this"
        " broker's routes",
        "forward_size": "megabytes of frames a forwarder holds for next hops that cannot"
        " take them yet",
    },
}
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
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text: {exc}") from None
        except OSError as exc:  # a directory, no permission, an I/O error
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
        for key, value in data.items():
            if key in _SCALARS:
                setattr(config, key, _path(key, value) if key in _PATHS else value)
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
            elif key in ("limits", *SECTIONS) and not isinstance(value, dict):
                raise ConfigError(f"{key} must be a section ([{key}]), not {value!r}")
            elif key == "limits":
                config.limits = ClientLimits.from_section(value)
            elif key in SECTIONS:
                config.sections[key] = value
            else:
                raise ConfigError(
                    f"unknown setting {key!r} in {path}; known: "
                    f"{', '.join(sorted(_SCALARS | {'limits', 'procedures', *SECTIONS}))}"
                )
    for key, value in overrides.items():
        if value is not None:
            setattr(config, key, _path(key, value) if key in _PATHS else value)
    config.check()
    return config


def _path(key: str, value: object) -> Path:
    """A path setting's value (an empty one would be the working directory)."""
    if not isinstance(value, (str, Path)):
        raise ConfigError(f"{key} must be a path in quotes, not {value!r}")
    if not str(value):
        raise ConfigError(f'{key} = "" names no path; give one, or leave {key} out for the default')
    return Path(value)
