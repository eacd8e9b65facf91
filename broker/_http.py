"""The HTTP port: /metrics for Prometheus, /healthz for supervisors, and the dashboard
(its root, `/`, leads there).

Theory of operation. One aiohttp application on `http_port`, off unless configured,
listening on the broker's own host. On loopback it speaks plain HTTP; on any other
address HTTPS with the client port's certificate, since a login crosses it.

Who may read what: /healthz answers anyone (it says only whether the broker is live
and ready). /metrics answers loopback callers freely; from anywhere else it needs a
broker login with VIEW (HTTP basic authentication, checked and throttled like a client
login) or the configured bearer token (`http_token`). Every refusal is logged with the
caller's address, never with a secret. So is a request HTTP cannot parse (a line too
long, a byte HTTP does not allow, too many headers): aiohttp answers it 400 and would log
it as an error with a traceback; it is the caller's fault, so it becomes one warning.

What the port may cost: at most MAX_CONNECTIONS connections at once (TLS handshakes
under way included); one more is closed at accept (logged at most once every
REFUSAL_LOG_EVERY seconds, with how many), so that whoever can reach the port cannot
take the file descriptors the client port and the store need. A connection that has
not sent a whole request within IDLE_TIMEOUT seconds (of connecting, or of its last
answer) is closed.

A request from loopback must name a loopback host in its Host header (`localhost`,
127.0.0.1, [::1], or the address listened on): a web page of another site whose name an
attacker points at 127.0.0.1 (DNS rebinding) cannot use the trust loopback callers get.

/healthz answers 200 while the broker is live and ready, 503 with the reason while it
is live but not ready (the store cannot write, or new messages are refused for want
of disk, or the daemon is a standby, or it has lost the broker's lease and is
stopping); `/healthz/live` answers 200 whenever the event loop runs at all. Each answer
names the daemon's role ("active", "standby", "stopping"): an orchestrator that routes
clients to the pods whose /healthz/ready answers 200 routes them to the active daemon.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ._logins import LoginCheck
from ._metrics import CONTENT_TYPE
from ._tls import accepted, is_loopback

log = logging.getLogger("ssb.http")

REALM: Final = 'Basic realm="ssb", charset="UTF-8"'
MAX_REQUEST_BYTES: Final = 64 * 1024  # the dashboard's forms are small
MAX_REASON: Final = 200  # characters of what aiohttp says of a malformed request
MAX_CONNECTIONS: Final = 256  # scrapers, probes and a few browsers, with room to spare
IDLE_TIMEOUT: Final = 15.0  # seconds a connection may wait for, or take over, its request
REFUSAL_LOG_EVERY: Final = 60.0  # seconds between log lines about connections refused


class _MalformedRequests(logging.Filter):
    """aiohttp's error record of a request it could not parse, made one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = None if record.exc_info is None else record.exc_info[1]
        if isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500:
            args = record.args if isinstance(record.args, tuple) else ()
            reason = (exc.message.strip().splitlines() or ["malformed"])[0][:MAX_REASON]
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "HTTP request from %s refused (%d): %s"
            record.args = (args[0] if args else "?", exc.code, reason)
            record.exc_info, record.exc_text = None, None
        return True


# the logger the HTTP server's own errors go to
_server_log = logging.getLogger("ssb.http.server")
_server_log.addFilter(_MalformedRequests())


class Rendered(Protocol):
    """What /metrics shows: the text format of a registry."""

    def render(self) -> bytes: ...


class HttpServer:
    """The aiohttp application and its listener."""

    def __init__(
        self,
        metrics: Rendered,
        readiness: Callable[[], str | None],
        authenticate: LoginCheck,
        may_view: Callable[[str], bool],
        token: str | None,
        role: Callable[[], str] = lambda: "active",
    ) -> None:
        """Args:
        readiness: None when ready, else why not.
        role: the daemon's role, named in every /healthz answer.
        authenticate: a broker login check: None when the password is right.
        may_view: whether a login may read the broker's views (and so /metrics).
        token: the bearer token that also opens /metrics (None: none).
        """
        self.metrics = metrics
        self.readiness = readiness
        self.authenticate = authenticate
        self.may_view = may_view
        self.token = token
        self.role = role
        self.hosts: set[str] = {"localhost", "127.0.0.1", "[::1]"}
        self.app = web.Application(
            client_max_size=MAX_REQUEST_BYTES, middlewares=[self._known_host]
        )
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._ready)
        self.app.router.add_get("/healthz/ready", self._ready)
        self.app.router.add_get("/healthz/live", self._live)
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connecting: set[asyncio.Task[None]] = set()  # TLS handshakes under way
        self._open: set[asyncio.BaseTransport] = set()  # handed over (some closed since)
        self._refused = 0  # connections refused for want of room, not logged yet
        self._refusal_logged = -REFUSAL_LOG_EVERY  # (the loop's clock)
        self.address: tuple[str, int] | None = None
        self.scheme = "http"

    async def start(self, host: str, port: int, context: ssl.SSLContext | None) -> tuple[str, int]:
        """Listen; `context` is used only beyond loopback. Returns the bound address."""
        # a stop must not wait long for a dashboard action: the last batch waits behind it
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=2.0,
            logger=_server_log,
            keepalive_timeout=IDLE_TIMEOUT,
        )
        await runner.setup()
        self._runner = runner
        tls = None if is_loopback(host) else context
        self.scheme = "http" if tls is None else "https"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = sock = socket.create_server((host, port), family=family, backlog=1024)
        sock.setblocking(False)
        self._accepting = asyncio.get_running_loop().create_task(self._accept(sock, tls))
        bound = sock.getsockname()
        self.address = (str(bound[0]), int(bound[1]))
        self.hosts |= {host.lower(), str(bound[0]).lower(), f"[{bound[0]}]".lower()}
        log.info("HTTP port %s://%s:%d (/metrics, /healthz)", self.scheme, *self.address)
        return self.address

    async def close(self) -> None:
        for task in [self._accepting, *self._connecting]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._accepting = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- connections ------------------------------------------------------------------

    async def _accept(self, sock: socket.socket, tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        async for conn, peer in accepted(sock, "an HTTP connection", log):
            self._open = {t for t in self._open if not t.is_closing()}
            if len(self._open) + len(self._connecting) >= MAX_CONNECTIONS:
                conn.close()
                self._refused += 1
                if loop.time() - self._refusal_logged >= REFUSAL_LOG_EVERY:
                    log.warning(
                        "HTTP port full: refused %d connection(s) since the last such line,"
                        " the latest from %s: %d are open, the most it takes; idle ones close"
                        " after %g s",
                        self._refused,
                        peer[0],
                        MAX_CONNECTIONS,
                        IDLE_TIMEOUT,
                    )
                    self._refused, self._refusal_logged = 0, loop.time()
                continue
            task = loop.create_task(self._hand_over(conn, tls))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    async def _hand_over(self, conn: socket.socket, tls: ssl.SSLContext | None) -> None:
        """Give an accepted socket to aiohttp, once its TLS handshake (if any) is done."""
        assert self._runner is not None and self._runner.server is not None
        try:
            transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
                self._runner.server,
                conn,
                ssl=tls,
                ssl_handshake_timeout=None if tls is None else IDLE_TIMEOUT,
            )
            self._open.add(transport)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("HTTP connection failed before its first request: %s", exc)
            conn.close()

    # ---- who may ----------------------------------------------------------------------

    @web.middleware
    async def _known_host(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        name = request.host.lower()
        if name.startswith("["):  # [v6]:port
            name = name.split("]", 1)[0] + "]"
        else:
            name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
        if is_loopback(request.remote) and name not in self.hosts and not is_loopback(name):
            log.warning(
                "HTTP %s from %s refused: Host %r is not this server",
                request.path,
                request.remote,
                request.host[:100],
            )
            return web.Response(status=421, text="this server does not answer for that host\n")
        return await handler(request)

    async def login_of(self, request: web.Request) -> str | None:
        """The login named by the request's basic credentials, or "" for the bearer
        token; None when it carries neither, or a wrong one (logged)."""
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        peer = request.remote or "?"
        if scheme.lower() == "bearer" and self.token is not None:
            given = value.strip().encode("utf-8", "surrogateescape")
            if hmac.compare_digest(given, self.token.encode()):
                return ""
            log.warning("HTTP %s from %s: wrong bearer token", request.path, peer)
            return None
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except ValueError:  # not base64 (non-ASCII too), or not UTF-8
            log.warning("HTTP %s from %s: malformed basic credentials", request.path, peer)
            return None
        # the login throttle counts by host: give it host:port, as client logins do
        refused = await self.authenticate(user, password, f"{peer}:http")
        if refused is not None:
            log.warning("HTTP %s from %s refused: %s", request.path, peer, refused)
            return None
        if not self.may_view(user):
            log.warning("HTTP %s from %s refused: login %r lacks VIEW", request.path, peer, user)
            return None
        return user

    def _challenge(self, request: web.Request) -> web.Response:
        log.warning("HTTP %s from %s refused: no login", request.path, request.remote)
        return web.Response(
            status=401,
            text="a login is needed: HTTP basic authentication with a broker login,"
            " or the configured bearer token\n",
            headers={"WWW-Authenticate": REALM},
        )

    # ---- pages ------------------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if not is_loopback(request.remote) and await self.login_of(request) is None:
            return self._challenge(request)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _ready(self, request: web.Request) -> web.StreamResponse:
        reason = self.readiness()
        role = self.role()
        if reason is None:
            return web.json_response({"live": True, "ready": True, "role": role})
        answer = {"live": True, "ready": False, "role": role, "reason": reason}
        return web.json_response(answer, status=503)

    async def _live(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"live": True, "role": self.role()})
