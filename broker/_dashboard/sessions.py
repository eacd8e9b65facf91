"""Who is asking: the dashboard's web sessions (cookie tokens, kept as digests), and
whether a request comes from the dashboard's own pages (its Origin or Referer)."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from aiohttp import web

SESSION_IDLE: Final = 30 * 60.0
SESSION_LIFETIME: Final = 8 * 3600.0
MAX_SESSIONS: Final = 1000  # beyond it the least recently used web session ends
SESSIONS_PER_LOGIN: Final = 20  # beyond it that login's least recently used one ends
FLASH_LIMIT: Final = 10  # notices a web session keeps for its next page


@dataclass(slots=True)
class WebSession:
    user: str
    csrf: str
    created: float
    seen: float
    # (kind, text) to show once; the newest few, however many posts came in between
    flash: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=FLASH_LIMIT))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class WebSessions:
    """Logged-in browsers, by a digest of their cookie's token."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._by_digest: dict[bytes, WebSession] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def open(self, user: str) -> tuple[str, WebSession]:
        """A new web session for `user`: (the cookie's token, the session)."""
        now = self.clock()
        for key in [k for k, s in self._by_digest.items() if self._expired(s, now)]:
            del self._by_digest[key]
        # one login logging in again and again ends its own sessions, not everyone's
        own = [k for k, s in self._by_digest.items() if s.user == user]
        while len(own) >= SESSIONS_PER_LOGIN:
            oldest = min(own, key=lambda k: self._by_digest[k].seen)
            own.remove(oldest)
            del self._by_digest[oldest]
        while len(self._by_digest) >= MAX_SESSIONS:
            oldest = min(self._by_digest, key=lambda k: self._by_digest[k].seen)
            del self._by_digest[oldest]
        token = secrets.token_urlsafe(32)
        session = WebSession(user, secrets.token_urlsafe(32), now, now)
        self._by_digest[_digest(token)] = session
        return token, session

    def find(self, token: str | None) -> WebSession | None:
        """The live web session of `token` (its idle time starts again), else None."""
        if not token:
            return None
        key = _digest(token)
        session = self._by_digest.get(key)
        if session is None:
            return None
        now = self.clock()
        if self._expired(session, now):
            del self._by_digest[key]
            return None
        session.seen = now
        return session

    def close(self, token: str | None) -> None:
        if token:
            self._by_digest.pop(_digest(token), None)

    def forget_login(self, user: str) -> int:
        """End every web session of `user`; returns how many there were."""
        keys = [k for k, s in self._by_digest.items() if s.user == user]
        for key in keys:
            del self._by_digest[key]
        return len(keys)

    @staticmethod
    def _expired(session: WebSession, now: float) -> bool:
        return now - session.seen > SESSION_IDLE or now - session.created > SESSION_LIFETIME


def peer_of(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return request.remote or "?"


def same_origin(request: web.Request) -> bool:
    """Whether the request's Origin (else its Referer) names this very host and scheme."""
    source = request.headers.get("Origin") or request.headers.get("Referer")
    if not source or source == "null":
        return False
    parts = urlsplit(source)
    return parts.scheme == request.scheme and parts.netloc.lower() == request.host.lower()
