"""Connection URLs, the TLS they ask for, and the URL of a local broker.

`ssb://user:password@host:port` is plain TCP; `ssbs://...` is TLS, verified either with
`?ca=FILE` (a CA or the broker's own certificate, and the host name) or with
`?fingerprint=SHA256HEX` (the SHA-256 of the broker's certificate, as its ready line and
`broker.json` print it), or with the system's CAs when neither is given.

A URL may name several addresses of one broker, `ssb://user:password@host1:4021,host2:4021`
(its daemons sharing a PostgreSQL database: one serves, the others stand by with their
ports closed): a client tries them in turn, starting with the one that answered last
(`Target.in_turn`), and takes the first that lets it log in.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final
from urllib.parse import SplitResult, parse_qs, quote, unquote, urlsplit

DEFAULT_PORT: Final = 4021
MAX_ADDRESSES: Final = 16  # addresses one URL may name


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    user: str
    password: str
    tls: bool = False
    ca: str | None = None
    fingerprint: str | None = None
    # every address the URL names, (host, port), the first being `host` and `port`
    addresses: tuple[tuple[str, int], ...] = ()

    @property
    def where(self) -> str:
        """The addresses, as a person reads them: host:port[,host:port...]."""
        return ",".join(
            _shown(host, port) for host, port in self.addresses or [(self.host, self.port)]
        )

    def in_turn(self, first: int = 0) -> list[Target]:
        """One target per address, starting with the address numbered `first`."""
        addresses = self.addresses or ((self.host, self.port),)
        start = first % len(addresses)
        ordered = addresses[start:] + addresses[:start]
        return [replace(self, host=host, port=port) for host, port in ordered]

    def index(self, target: Target) -> int:
        """Which of this URL's addresses `target` is (0 if none)."""
        try:
            return self.addresses.index((target.host, target.port))
        except ValueError:
            return 0

    def tls_context(self) -> ssl.SSLContext | None:
        """The client side of TLS for this URL (None for ssb://)."""
        if not self.tls:
            return None
        if self.fingerprint is not None:  # the pin is the check: no CA, no host name
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        context = ssl.create_default_context(cafile=self.ca)
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # a self-signed broker certificate
        return context

    def check_pin(self, certificate_der: bytes | None) -> None:
        """ssl.SSLError unless the broker's certificate has the pinned fingerprint."""
        if self.fingerprint is None:
            return
        got = hashlib.sha256(certificate_der or b"").hexdigest()
        if not hmac.compare_digest(got, self.fingerprint):
            raise ssl.SSLError(
                f"the broker's certificate has fingerprint {got}, the URL pins"
                f" {self.fingerprint}: not the broker you meant (or its certificate changed)"
            )


def _shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _without_password(url: str) -> str:
    """`url` as an error may show it: its password (if any) as ***. Read without urlsplit,
    which refuses some of the URLs whose errors show them (a malformed IPv6 host)."""
    scheme, slashes, rest = url.partition("://")
    if not slashes:
        scheme, rest = "", url
    head, tail = _address_part(rest)
    if "@" in head:
        userinfo, at, after = head.rpartition("@")
        after += tail
    else:  # a password with an unencoded /, ? or # hides its @ past them: up to the last
        userinfo, at, after = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not colon:
        return url
    return f"{scheme}{slashes}{user}:***{at}{after}"


def _address_part(rest: str) -> tuple[str, str]:
    """A URL after its scheme, split where its address part ends (at a /, ? or #)."""
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    return rest[:end], rest[end:]


def _check_userinfo(url: str, shown: str) -> None:
    """Refuse a URL whose @ comes only after a /, ? or #: a password holding one of
    those, unencoded, would split the URL before its @ (and put a piece of the password
    where the host is read)."""
    head, tail = _address_part(url.partition("://")[2])
    if "@" not in head and "@" in tail:
        raise ValueError(
            f"broker URL {shown!r}: a '/', '?' or '#' in its user name or password must be"
            " percent-encoded (%2F, %3F, %23)"
        )


def _split(url: str, shown: str) -> SplitResult:
    """urlsplit, its error for a malformed IPv6 host naming the URL (as `shown`)."""
    try:
        return urlsplit(url)
    except ValueError as exc:  # 'Invalid IPv6 URL', or which host is no address
        raise ValueError(
            f"broker URL {shown!r} has a malformed IPv6 host ({exc}); write an IPv6"
            " address in brackets, e.g. [::1]:4021"
        ) from None


def _addresses(shown: str, hosts: str) -> tuple[tuple[str, int], ...]:
    """The (host, port) of each address in a URL's comma-separated host list (`shown`:
    the URL as its errors show it)."""
    found: list[tuple[str, int]] = []
    for item in hosts.split(","):
        parts = _split(f"//{item}", shown)  # one host[:port], parsed as a URL's netloc
        if not item or not parts.hostname:
            raise ValueError(f"broker URL {shown!r} names no host in {item!r}")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"broker URL {shown!r} has a bad port in {item!r}") from None
        found.append((parts.hostname, port))
    if len(found) > MAX_ADDRESSES:
        raise ValueError(f"broker URL {shown!r} names more than {MAX_ADDRESSES} addresses")
    return tuple(found)


def parse_url(url: str) -> Target:
    """Split a broker URL; raise ValueError saying what is wrong with it (never with its
    password: the message may be printed or logged)."""
    shown = _without_password(url)
    _check_userinfo(url, shown)
    parts = _split(url, shown)
    if parts.scheme not in ("ssb", "ssbs"):
        raise ValueError(
            f"broker URL must start with ssb:// (plain TCP) or ssbs:// (TLS), got {shown!r}"
        )
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ValueError(f"broker URL {shown!r} names no host")
    addresses = _addresses(shown, hosts)
    user, _, password = userinfo.partition(":")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - {"ca", "fingerprint"}
    if unknown:
        raise ValueError(f"broker URL {shown!r}: unknown option(s) {', '.join(sorted(unknown))}")
    if query and parts.scheme != "ssbs":
        raise ValueError(f"broker URL {shown!r}: ?ca= and ?fingerprint= need ssbs:// (TLS)")
    fingerprint = query.get("fingerprint")
    if fingerprint is not None:
        fingerprint = fingerprint.replace(":", "").lower()
        if len(fingerprint) != 64 or any(c not in "0123456789abcdef" for c in fingerprint):
            raise ValueError(f"broker URL {shown!r}: fingerprint must be 64 hex digits (SHA-256)")
    host, port = addresses[0]
    return Target(
        host,
        port,
        unquote(user),
        unquote(password),
        parts.scheme == "ssbs",
        query.get("ca"),
        fingerprint,
        addresses,
    )


def url_addresses(url: str) -> list[str]:
    """The addresses a broker URL names, "host:port" each, in its order (never its login).

    Raises:
        ValueError: the URL is malformed (the message says how).
    """
    target = parse_url(url)
    return [_shown(host, port) for host, port in target.addresses]


def local_url(data_dir: str | Path = "ssb-data") -> str | None:
    """The admin URL of the broker running from `data_dir` on this machine (its port from
    `broker.json`, the password its first start wrote to `admin.password`), or None when
    no broker has run there. Reading the password file needs the daemon's OS user."""
    folder = Path(data_dir)
    try:
        info = json.loads((folder / "broker.json").read_text())
        port = int(info["client_port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        password = (folder / "admin.password").read_text().strip()
    except OSError:
        return f"ssb://127.0.0.1:{port}"
    return f"ssb://admin:{quote(password, safe='')}@127.0.0.1:{port}"
