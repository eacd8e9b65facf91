"""The door of a port: TLS and plain TCP on one port, told apart by the first byte.

Theory of operation. The broker accepts client connections itself and, before any
protocol object exists, waits (at most the login timeout) until the first byte can be
peeked without reading it: 0x16 opens a TLS handshake record, anything else is the
first byte of a plain frame's length. A TLS connection is handed to the event loop with
the server's SSL context, a plain one without; either way the same `ClientConnection`
speaks to it, so logins, limits and everything after are identical. Plain TCP is
accepted when the broker listens on loopback only, or when the config says
`allow_plain = true`; otherwise a plain client gets one error frame that says to use
ssbs://, and the connection closes. Connections still waiting for their first byte
count against `connections_per_address`, so idle sockets cannot pile up.

The certificate comes from `tls_cert_file` / `tls_key_file`, or is made on first start
(ECDSA P-256, self-signed, for localhost, 127.0.0.1, ::1 and the listening host) and
kept in the data directory (`tls-cert.pem`, `tls-key.pem`, the key 0600). Its SHA-256
fingerprint is printed on the ready line and written to broker.json, for clients that
pin it (`ssbs://...?fingerprint=...`) instead of trusting a CA.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import ipaddress
import logging
import socket
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ssb.protocol import ErrorCode, encode_error, encode_frame, self_signed

from ._config import ClientLimits, ConfigError
from ._logins import write_secret_file

log = logging.getLogger("ssb.tls")

CERT_FILE: Final = "tls-cert.pem"
KEY_FILE: Final = "tls-key.pem"
TLS_RECORD_HANDSHAKE: Final = 0x16
ACCEPT_RETRY: Final = 0.1  # seconds between tries while accepting fails (no descriptors)


async def accepted(
    sock: socket.socket, one: str, logger: logging.Logger
) -> AsyncIterator[tuple[socket.socket, Any]]:
    """The connections the listening `sock` accepts, for ever, each with Nagle's delay
    off (as the loop's own servers do: small answers leave at once). While accepting
    fails (out of file descriptors) it tries again every ACCEPT_RETRY seconds; each such
    spell is logged once as it begins and once as it ends, with how many tries failed
    (`one`: what is accepted, e.g. "a client connection")."""
    loop = asyncio.get_running_loop()
    failures = 0  # in a row
    while True:
        try:
            conn, peer = await loop.sock_accept(sock)
        except OSError as exc:
            if not failures:
                logger.warning(
                    "accepting %s failed: %s; retrying every %g s", one, exc, ACCEPT_RETRY
                )
            failures += 1
            await asyncio.sleep(ACCEPT_RETRY)
            continue
        if failures:
            logger.warning("accepting %s again (%d tries failed)", one, failures)
            failures = 0
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        yield conn, peer


def is_loopback(host: str | None) -> bool:
    """Whether `host` (an address, with or without a scope id, or a name) is this machine's
    loopback; None or empty (an unknown peer) is not."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_context(
    data_dir: Path, host: str, cert_file: Path | None, key_file: Path | None
) -> tuple[ssl.SSLContext, str]:
    """The client port's SSL context and its certificate's SHA-256 fingerprint (hex)."""
    if (cert_file is None) != (key_file is None):
        raise ConfigError("give both tls_cert_file and tls_key_file, or neither")
    if cert_file is None or key_file is None:
        cert_file, key_file = data_dir / CERT_FILE, data_dir / KEY_FILE
        if not (cert_file.exists() and key_file.exists()):
            cert_pem, key_pem = _self_signed(host)
            write_secret_file(key_file, key_pem)
            cert_file.write_text(cert_pem)
            log.info("made a TLS certificate for the client port: %s", cert_file)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert_file, key_file)
        return context, fingerprint(cert_file.read_text())
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            f"cannot use the TLS certificate {cert_file} / key {key_file}: {exc}"
        ) from None


def fingerprint(pem: str) -> str:
    """A certificate's SHA-256 fingerprint (of its DER form), in hex: what clients pin
    and what views and the ready line show."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def _self_signed(host: str) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ssb broker")])
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    try:
        address = ipaddress.ip_address(host)
        if not address.is_unspecified and not address.is_loopback:
            names.append(x509.IPAddress(address))
    except ValueError:
        if host != "localhost":
            names.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    key_pem, cert_pem = self_signed(
        key,
        name,
        now - dt.timedelta(days=1),
        now + dt.timedelta(days=3650),
        [
            (x509.SubjectAlternativeName(names), False),
            (x509.BasicConstraints(ca=True, path_length=0), True),
        ],
    )
    return cert_pem.decode("ascii"), key_pem.decode("ascii")


@dataclass(eq=False, repr=False)
class Door:
    """Accepts connections, sorts them into TLS and plain, hands them over (the client
    port's, and the broker port's, where plain TCP is allowed only when TLS is off).

    `context` may be replaced at any time (a new trust store): the next connection uses
    it. `admit`, when given, decides per address at accept time, before any handshake
    work (the broker port's accept rate)."""

    factory: Callable[[], asyncio.Protocol]
    context: ssl.SSLContext | None
    allow_plain: bool
    limits: ClientLimits
    open_count: Callable[[str], int]  # logged-in-or-logging-in connections per address
    admit: Callable[[str], bool] | None = None
    # connections not yet sorted, per address
    waiting: Counter[str] = field(default_factory=Counter, init=False)
    sock: socket.socket | None = field(default=None, init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.allow_plain = self.allow_plain or is_loopback(host)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=1024)
        sock.setblocking(False)
        self.sock = sock
        self._own(self._accept(sock))
        name = sock.getsockname()
        return str(name[0]), int(name[1])

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _own(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, sock: socket.socket) -> None:
        async for conn, peer in accepted(sock, "a client connection", log):
            host = str(peer[0])
            if self.admit is not None and not self.admit(f"{host}:{peer[1]}"):
                conn.close()
                continue
            if self.waiting[host] + self.open_count(host) >= self.limits.connections_per_address:
                log.warning(
                    "refusing client %s:%s: too many connections from that address (the limit,"
                    " [limits] connections_per_address)",
                    host,
                    peer[1],
                )
                self._refuse(conn, f"too many connections from {host}; close some and retry")
                continue
            self.waiting[host] += 1
            self._own(self._sort(conn, host, f"{host}:{peer[1]}"))

    async def _sort(self, conn: socket.socket, host: str, peer: str) -> None:
        loop = asyncio.get_running_loop()
        handed_over = False
        try:
            async with asyncio.timeout(self.limits.login_timeout):
                first = await self._peek(loop, conn)
                if not first:
                    return  # closed before saying anything
                tls = first[0] == TLS_RECORD_HANDSHAKE and self.context is not None
                if not tls and not self.allow_plain:
                    log.warning("refusing plain TCP from %s: this broker accepts only TLS", peer)
                    self._refuse(
                        conn,
                        "this broker accepts only TLS beyond loopback: connect with"
                        " ssbs://USER:PASSWORD@HOST:PORT?fingerprint=... (or ?ca=FILE)",
                    )
                    return
                self.waiting[host] -= 1
                handed_over = True
                await loop.connect_accepted_socket(
                    self.factory,
                    conn,
                    ssl=self.context if tls else None,
                    ssl_handshake_timeout=self.limits.login_timeout if tls else None,
                )
        except TimeoutError:
            log.info("closing client %s: nothing arrived within the login timeout", peer)
            if handed_over:  # the TLS handshake did not finish
                conn.close()
            else:
                self._refuse(conn, f"no login within {self.limits.login_timeout:g} s")
        except (OSError, ssl.SSLError) as exc:
            log.info("TLS with client %s failed: %s", peer, exc)
            conn.close()
        finally:
            if not handed_over:
                self.waiting[host] -= 1
            if self.waiting[host] <= 0:
                del self.waiting[host]

    @staticmethod
    async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
        """The first byte, left unread; b"" when the client closed or the socket failed.
        A readiness report may be spurious (libuv's poll says so): then wait again."""
        while True:
            ready: asyncio.Future[None] = loop.create_future()

            def readable(ready: asyncio.Future[None] = ready) -> None:
                if not ready.done():
                    ready.set_result(None)

            loop.add_reader(conn.fileno(), readable)
            try:
                await ready
            finally:
                loop.remove_reader(conn.fileno())
            try:
                return conn.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return b""

    @staticmethod
    def _refuse(conn: socket.socket, text: str) -> None:
        with contextlib.suppress(OSError):
            conn.send(encode_frame(encode_error(0, ErrorCode.HANDSHAKE_FAILED, text)))
        conn.close()
