"""`ssb://user:password@host:port` connection URLs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

DEFAULT_PORT: Final = 4021


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    user: str
    password: str


def parse_url(url: str) -> Target:
    """Split a broker URL; raise ValueError saying what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme != "ssb":
        raise ValueError(f"broker URL must start with ssb://, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"broker URL {url!r} names no host")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"broker URL {url!r} has a bad port") from None
    return Target(
        parts.hostname,
        port,
        unquote(parts.username or ""),
        unquote(parts.password or ""),
    )
