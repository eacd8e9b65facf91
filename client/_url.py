"""Connection URLs, the TLS they ask for, and the URL of a local broker.

`ssb://user:password@host:port` is plain TCP; `ssbs://...` is TLS, verified either with
`?ca=FILE` (a CA or the broker's own certificate, and the host name) or with
`?fingerprint=SHA256HEX` (the SHA-256 of the broker's certificate, as its ready line and
`broker.json` print it), or with the system's CAs when neither is given.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import parse_qs, quote, unquote, urlsplit

DEFAULT_PORT: Final = 4021


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    user: str
    password: str
    tls: bool = False
    ca: str | None = None
    fingerprint: str | None = None

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


def parse_url(url: str) -> Target:
    """Split a broker URL; raise ValueError saying what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme not in ("ssb", "ssbs"):
        raise ValueError(
            f"broker URL must start with ssb:// (plain TCP) or ssbs:// (TLS), got {url!r}"
        )
    if not parts.hostname:
        raise ValueError(f"broker URL {url!r} names no host")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"broker URL {url!r} has a bad port") from None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - {"ca", "fingerprint"}
    if unknown:
        raise ValueError(f"broker URL {url!r}: unknown option(s) {', '.join(sorted(unknown))}")
    if query and parts.scheme != "ssbs":
        raise ValueError(f"broker URL {url!r}: ?ca= and ?fingerprint= need ssbs:// (TLS)")
    fingerprint = query.get("fingerprint")
    if fingerprint is not None:
        fingerprint = fingerprint.replace(":", "").lower()
        if len(fingerprint) != 64 or any(c not in "0123456789abcdef" for c in fingerprint):
            raise ValueError(f"broker URL {url!r}: fingerprint must be 64 hex digits (SHA-256)")
    return Target(
        parts.hostname,
        port,
        unquote(parts.username or ""),
        unquote(parts.password or ""),
        parts.scheme == "ssbs",
        query.get("ca"),
        fingerprint,
    )


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
