"""Logins: who may open a session, kept in the store as salted scrypt hashes.

Theory of operation. The `logins` table holds one row per login: its name and a
scrypt hash of its password with the salt and cost parameters beside it, so the cost
can rise later without invalidating old rows. No password is ever stored or logged.
On a store with no login at all (the first start) `bootstrap` creates `admin` with a
random password and writes that password, alone on one line, to `admin.password` in
the data directory; the file is created with mode 0600 and never widened.

Checking a password costs ~tens of milliseconds of CPU and 16 MiB on purpose, so it
runs on a worker thread, never on the event loop. A successful check is remembered
as a keyed digest (HMAC with a per-process random key) so a client that reconnects,
a Spark reader or a pooled worker does not pay it again; changing or dropping the
login forgets it. Failures are counted per (login, address) and per login: past a
small allowance within a window, further attempts under that key are refused at once
without checking anything, until the window passes. The key includes the address,
so a noisy client guessing one login does not lock out another login's workers on
the same loopback address; the per-login count, with a larger allowance, bounds a
guesser spread over many addresses.

A login that a trusted certificate maps another broker to (`create_certificate(...,
login=...)`) cannot be dropped while it does: the certificate would name no login, and
a login made later under that name would speak for that broker. So too a login a queue's
activation runs as (`execute_as`): a login made later under that name would run its
procedures. And a login that owns objects (as SQL Server will not drop a login that
owns a database): a login made later under that name would own them, and an activation
that runs as its queue's owner would run as it.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ssb.protocol import ErrorCode

from ._core.names import MAX_LOGIN_NAME, is_login_name
from ._core.transactions import Session
from ._errors import BrokerError
from ._store import Store

log = logging.getLogger("ssb.logins")

ADMIN: Final = "admin"
# `Logins.check` as others take it: (name, password, "host:port") -> None, or why not
LoginCheck = Callable[[str, str, str], Awaitable[str | None]]
PASSWORD_FILE: Final = "admin.password"
SCRYPT_N: Final = 1 << 14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
SALT_BYTES: Final = 16
MAX_NAME: Final = MAX_LOGIN_NAME
MAX_PASSWORD: Final = 1024
MIN_PASSWORD: Final = 8
_NAMED_AT_MOST: Final = 5  # objects a refused drop names


def hash_password(password: str) -> str:
    """A self-describing scrypt hash: `scrypt$N$r$p$salt$digest` (base64 fields)."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return "$".join(
        ("scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P), _b64(salt), _b64(digest))
    )


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        got = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=256 * n * r * p, dklen=32
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def check_name(name: object) -> str:
    if not is_login_name(name):
        raise BrokerError(
            ErrorCode.BAD_ARGUMENT,
            f"a login name is 1..{MAX_NAME} letters, digits, '_', '-' or '.', not {name!r}",
        )
    return name


def check_password(password: object) -> str:
    if not isinstance(password, str) or not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise BrokerError(
            ErrorCode.BAD_ARGUMENT,
            f"a password is a string of {MIN_PASSWORD}..{MAX_PASSWORD} characters",
        )
    return password


def write_secret_file(path: Path, text: str) -> None:
    """Create `path` with mode 0600 from the start (any old file is replaced)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


@dataclass(frozen=True)
class ThrottleSettings:
    """From the config's [limits] (failed_login_window, failed_logins_per_address,
    failed_logins_per_login), where the defaults are."""

    window: float  # seconds over which failures count
    per_login_address: int  # failures allowed per (login, address) in a window
    per_login: int  # failures allowed per login from all addresses in a window


@dataclass
class _Failures:
    times: deque[float] = field(default_factory=deque)

    def count(self, now: float, window: float) -> int:
        while self.times and self.times[0] <= now - window:
            self.times.popleft()
        return len(self.times)


class FailedLogins:
    """Recent failed logins per key; says how long a key must wait, if at all."""

    def __init__(self, settings: ThrottleSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.clock = clock
        self._keys: dict[tuple[str, str], _Failures] = {}

    def _limits(self, name: str, address: str) -> list[tuple[tuple[str, str], int]]:
        s = self.settings
        return [((name, address), s.per_login_address), ((name, ""), s.per_login)]

    def wait(self, name: str, address: str) -> float:
        """Seconds until an attempt for `name` from `address` is checked again (0: now)."""
        now, window = self.clock(), self.settings.window
        longest = 0.0
        for key, allowed in self._limits(name, address):
            failures = self._keys.get(key)
            if failures is None:
                continue
            if failures.count(now, window) >= allowed:
                longest = max(longest, failures.times[-allowed] + window - now)
            elif not failures.times:
                del self._keys[key]
        return longest

    def failed(self, name: str, address: str) -> None:
        now = self.clock()
        for key, allowed in self._limits(name, address):
            failures = self._keys.setdefault(key, _Failures())
            failures.times.append(now)
            while len(failures.times) > allowed:  # only the last `allowed` matter
                failures.times.popleft()
        if len(self._keys) > 100_000:  # a spray of names: forget what has expired
            for key in [k for k, f in self._keys.items() if not f.count(now, self.settings.window)]:
                del self._keys[key]


class Logins:
    """The broker's logins (owned here), their checks and their admin operations."""

    def __init__(
        self,
        store: Store,
        throttle: ThrottleSettings,
        on_change: Callable[[str], None] = lambda name: None,
        clock: Callable[[], float] = time.monotonic,
        mapped_by: Callable[[str], list[str]] = lambda name: [],
        activated_as: Callable[[str], list[str]] = lambda name: [],
        owned_by: Callable[[str], list[str]] = lambda name: [],
    ) -> None:
        """The logins stored in `store`, failed attempts limited by `throttle`;
        `on_change` hears the name of a login whose password changed or that was
        dropped; `mapped_by` names the certificates that map another broker to a login,
        `activated_as` the queues whose activation runs as it, `owned_by` the objects it
        owns (as "kind 'name'")."""
        self.store = store
        self._hashes: dict[str, str] = {}
        self._created: dict[str, float] = {}
        self._verified: dict[str, bytes] = {}  # name -> HMAC of a password that checked
        self._key = secrets.token_bytes(32)
        self.failures = FailedLogins(throttle, clock)
        self.on_change = on_change
        self.mapped_by = mapped_by
        self.activated_as = activated_as
        self.owned_by = owned_by

    def load(self) -> None:
        for name, stored, created in self.store.load_logins():
            self._hashes[name] = stored
            self._created[name] = created

    def __contains__(self, name: object) -> bool:
        return name in self._hashes

    def names(self) -> list[str]:
        return sorted(self._hashes)

    def bootstrap(self, data_dir: Path) -> Path | None:
        """First start: create `admin` with a random password, written to a 0600 file
        only once the login is durable (a crash in between leaves no login whose
        password nobody has: the next start makes a new one)."""
        if self._hashes:
            return None
        password = secrets.token_urlsafe(24)
        self._put(ADMIN, hash_password(password))
        self.store.write_now()
        path = data_dir / PASSWORD_FILE
        write_secret_file(path, password + "\n")
        return path

    # ---- checking ------------------------------------------------------------------

    async def check(self, name: str, password: str, address: str) -> str | None:
        """None when `password` is `name`'s; else why not (for the client, no secret)."""
        host = address.rsplit(":", 1)[0]
        wait = self.failures.wait(name, host)
        if wait > 0:
            log.warning(
                "login refused for %r from %s: too many failed logins, %.0f s to wait",
                name,
                address,
                wait,
            )
            return f"too many failed logins for '{name}' from {host}; try again in {wait:.0f} s"
        stored = self._hashes.get(name)
        mac = hmac.digest(self._key, password.encode("utf-8", "surrogatepass"), "sha256")
        known = self._verified.get(name)
        if stored is not None and known is not None and hmac.compare_digest(known, mac):
            return None
        loop = asyncio.get_running_loop()
        # an unknown name costs the same as a wrong password: no hint which names exist
        target = stored if stored is not None else _decoy()
        ok = await loop.run_in_executor(None, verify_password, password, target)
        if ok and stored is not None and self._hashes.get(name) == stored:
            self._verified[name] = mac
            return None
        self.failures.failed(name, host)
        log.warning("login failed for %r from %s", name, address)
        return f"login failed for user '{name}'"

    # ---- changing (the admin operations call these) ----------------------------------

    async def add(self, name: str, password: str) -> None:
        check_name(name)
        if name.lower() == "public":
            raise BrokerError(
                ErrorCode.BAD_ARGUMENT, "'public' is every login (PUBLIC), not a login of its own"
            )
        check_password(password)
        if name in self._hashes:
            raise BrokerError(
                ErrorCode.ALREADY_EXISTS, f"login '{name}' already exists; use alter_login"
            )
        self._put(name, await _hash_off_loop(password))
        log.info("login %r created", name)

    async def change(self, name: str, password: str) -> None:
        self.require(name)
        check_password(password)
        self._put(name, await _hash_off_loop(password))
        log.info("password of login %r changed", name)

    def drop(self, name: str) -> None:
        self.require(name)
        if name == ADMIN:
            raise BrokerError(
                ErrorCode.BAD_ARGUMENT,
                f"the '{ADMIN}' login cannot be dropped; change its password with alter_login",
            )
        for holders, why in (
            (
                [f"certificate '{c}'" for c in self.mapped_by(name)],
                "{} maps another broker to it; drop_certificate first (or create the"
                " certificate again with another login)",
            ),
            (
                [f"queue '{q}'" for q in self.activated_as(name)],
                "the activation of {} runs as it (EXECUTE AS); give each another login"
                " first, alter_queue(QUEUE, activation={{'execute_as': None}}) for the"
                " queue's owner, or drop the queue",
            ),
            (
                self.owned_by(name),
                "it owns {}; drop what it owns first (a login made later under that name"
                " would own it), or keep the login and shut it out: alter_login to a long"
                " random password told to no one",
            ),
        ):
            if holders:
                more = len(holders) - _NAMED_AT_MOST
                named = ", ".join(holders[:_NAMED_AT_MOST]) + (
                    f" and {more} more" if more > 0 else ""
                )
                raise BrokerError(
                    ErrorCode.IN_USE, f"login '{name}' cannot be dropped: {why.format(named)}"
                )
        del self._hashes[name]
        self._created.pop(name, None)
        self._verified.pop(name, None)
        self.store.delete_login(name)
        log.info("login %r dropped", name)
        self.on_change(name)

    # ---- the admin operations and the view -------------------------------------------

    def operations(self) -> dict[str, Callable[..., object]]:
        return {
            "create_login": self._create_login,
            "alter_login": self._alter_login,
            "drop_login": self._drop_login,
        }

    def views(self) -> dict[str, Callable[[], list[dict[str, object]]]]:
        return {"logins": self.rows}

    # CONTROL of the broker, which these need, is checked before they run (_permissions)

    async def _create_login(
        self, session: Session, name: object, password: object = None
    ) -> dict[str, str]:
        """A new login; with no password given, a random one, returned once."""
        chosen = secrets.token_urlsafe(24) if password is None else check_password(password)
        await self.add(check_name(name), chosen)
        return {"name": str(name), **({"password": chosen} if password is None else {})}

    async def _alter_login(self, session: Session, name: object, password: object) -> None:
        await self.change(self.require(name), check_password(password))

    def _drop_login(self, session: Session, name: object) -> None:
        self.drop(self.require(name))

    def require(self, name: object) -> str:
        check_name(name)
        assert isinstance(name, str)
        if name not in self._hashes:
            raise BrokerError(ErrorCode.UNKNOWN_LOGIN, f"there is no login '{name}'")
        return name

    def rows(self) -> list[dict[str, object]]:
        return [{"name": n, "created": self._created.get(n)} for n in self.names()]

    def _put(self, name: str, stored: str) -> None:
        created = self._created.get(name, time.time())
        self._hashes[name] = stored
        self._created[name] = created
        self._verified.pop(name, None)
        self.store.put_login((name, stored, created))
        self.on_change(name)


async def _hash_off_loop(password: str) -> str:
    return await asyncio.get_running_loop().run_in_executor(None, hash_password, password)


@functools.cache
def _decoy() -> str:
    """A hash no password matches, checked for unknown names (made once, when needed)."""
    return hash_password(secrets.token_urlsafe(16))
