"""The blocking client: the same methods as `Connection`, over a plain socket.

Meant for code that is not async: activated procedures given a blocking
connection, Spark tasks, scripts. Each call writes its request and reads frames
until its answer arrives. Not thread-safe: one connection per thread.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ssb.protocol import (
    NEED_DATA,
    NEVER_POLL,
    WIRE_VERSION,
    Backoff,
    Backoffs,
    FrameDecoder,
    Hello,
    ProtocolError,
    Reply,
    Welcome,
    check_poll_window,
    encode_frame,
)

from . import _calls as calls
from ._errors import (
    BrokerError,
    ConnectionLostError,
    LoginFailedError,
    ProtocolViolationError,
    TLSError,
    error_for,
    handshake_unfinished,
    login_error,
)
from ._operations import Operations
from ._polling import DEFAULT_WINDOW, receive
from ._recovery import (
    DEFAULT_RETRIES,
    RECONNECT_DEADLINE,
    RETRIED,
    Options,
    Redial,
    Retries,
    Sent,
    Settling,
    check_connect_timeout,
    check_deadline,
    none_answered,
    opened_database,
    unsettled_text,
)
from ._scheduler import get_scheduler_sync, install_scheduler_sync
from ._session import Stepper
from ._url import Target, parse_url

log = logging.getLogger("ssb.client")

T = TypeVar("T")


class _Lost(Exception):
    """The request's answer was lost with the connection."""


@dataclass(eq=False)
class _Ahead:
    """A BEGIN TRANSACTION held back to leave with the next request (see
    `SyncConnection.transaction`)."""

    sent: Sent
    written: bool = False
    request_id: int = 0
    answer: tuple[bool, Any] | None = None  # (ok, its result or the error to raise)
    lost: bool = False  # written, and its answer lost with the connection


class SyncConnection(Operations):
    """A blocking session with the broker; make one with `client.connect_sync(url)`."""

    def __init__(
        self,
        sock: socket.socket,
        welcome: Welcome,
        decoder: FrameDecoder,
        url: str,
        options: Options,
        at: int = 0,
        database: str = "",
        busy_poll: float = DEFAULT_WINDOW,
    ):
        self._sock = sock
        self._backoffs = Backoffs(busy_poll)
        self._at = at  # which of the URL's addresses answered last
        self._decoder = decoder
        self._next_id = 1
        self._open_session(welcome, url, options, database)
        self._lost: str | None = None
        self._closed = False
        self._ahead: _Ahead | None = None  # a BEGIN held back (see `transaction`)
        # functions run after each reconnect, before anything in flight is settled
        self.on_reconnect: list[Callable[[SyncConnection], object]] = []

    def call(self, request: calls.Call[T]) -> T:
        self._connected()
        sent = self._tracker.prepare(request, time.monotonic())
        if sent is None:
            return cast(T, None)
        return cast(T, self._run(sent))

    def _run(self, sent: Sent) -> Any:
        try:
            return self._send(sent)
        except _Lost:
            pass
        return self._settle_lost(sent)

    def _settle_lost(self, sent: Sent) -> Any:
        """Settle a request whose answer was lost."""
        try:
            return self._settle(sent)
        except ConnectionLostError as exc:
            raise ConnectionLostError(unsettled_text(sent, exc)) from exc

    def transaction_outcome(self, txn_id: uuid.UUID | str) -> str:
        outcome, _ = self.call(self._outcome_request(txn_id, time.monotonic()))
        return outcome

    def _settle(self, sent: Sent) -> Any:
        self._connected()
        stepper = Stepper(self._tracker.settle(sent, time.monotonic()))
        while (step := stepper.next()) is not None:
            try:
                stepper.answered(self._send(step))
            except _Lost:
                try:
                    stepper.answered(self._settle(step))
                except BrokerError as exc:
                    stepper.failed(exc)
            except BrokerError as exc:
                stepper.failed(exc)
        log.info("settled %s after the reconnect", sent.call.operation)
        return stepper.result

    def _send(self, sent: Sent) -> Any:
        """Write one request (behind a BEGIN held back for it, see `transaction`) and read
        until its answer; `_Lost` if the connection drops."""
        if self._lost is not None:
            raise _Lost()
        ahead = self._ahead if self._ahead is not None and not self._ahead.written else None
        frames = []
        if ahead is not None:
            ahead.written = True
            ahead.request_id = self._next_id
            self._next_id += 1
            frames.append(
                calls.encode_request(ahead.request_id, ahead.sent.call, self.max_message_size)
            )
        request_id = self._next_id
        self._next_id += 1
        try:
            frames.append(calls.encode_request(request_id, sent.call, self.max_message_size))
        except (TypeError, ValueError, BrokerError):
            self._tracker.answered(sent, False, None)
            if ahead is not None:
                ahead.written = False  # it leaves with the next request instead
            raise
        backoff = self._backoffs.of((sent if ahead is None else ahead.sent).call.operation)
        try:
            self._sock.sendall(b"".join(frames))
            while True:
                reply = Reply.decode(_read_frame(self._sock, self._decoder, backoff))
                if ahead is not None and reply.request_id == ahead.request_id:
                    ahead.answer = self._outcome(ahead.sent, reply)
                    continue
                if reply.request_id == request_id:
                    break
                if reply.request_id == 0 and not reply.ok and reply.code is not None:
                    raise ConnectionResetError(str(error_for(reply.code, reply.text)))
        except OSError as exc:
            self._drop(str(exc))
            unanswered = [sent]
            if ahead is not None and ahead.answer is None:
                ahead.lost = True
                unanswered.insert(0, ahead.sent)
            if not self._options.reconnect:
                raise ConnectionLostError(f"connection to the broker lost: {exc}") from exc
            self._tracker.lost(str(exc), unanswered)
            raise _Lost() from exc
        except ProtocolError as exc:
            self._drop(str(exc))
            raise ProtocolViolationError(str(exc), exc.code) from exc
        ok, result = self._outcome(sent, reply)
        if not ok:
            raise result
        return result

    def _outcome(self, sent: Sent, reply: Reply) -> tuple[bool, Any]:
        """(True, the decoded result) of an answer, or (False, the error to raise)."""
        tracker = self._tracker
        if not reply.ok:
            assert reply.code is not None
            tracker.answered(sent, False, None)
            return False, error_for(reply.code, reply.text)
        try:
            result = sent.call.decode(reply.result)
        except Exception as exc:
            tracker.answered(sent, False, None)
            problem = ProtocolViolationError(f"bad answer to {sent.call.operation}: {exc!r}")
            problem.__cause__ = exc
            return False, problem
        tracker.answered(sent, True, result)
        return True, result

    def _drop(self, reason: str) -> None:
        self._lost = reason
        with contextlib.suppress(OSError):
            self._sock.close()

    def _connected(self) -> None:
        """Return once connected; reconnect first if the connection dropped."""
        if self._closed:
            raise ConnectionLostError("the connection was closed")
        if self._lost is None:
            return
        if not self._options.reconnect:
            raise ConnectionLostError(f"not connected to the broker: {self._lost}")
        redial = Redial(self.url, self._options, self._lost, time.monotonic())
        while True:
            try:
                database = self._tracker.database
                sock, welcome, decoder, self._at = _open(
                    redial.target, self._options.timeout, self._at, database
                )
            except (TLSError, LoginFailedError, ProtocolViolationError):
                raise
            except ConnectionLostError as exc:
                time.sleep(redial.pause(exc, time.monotonic()))
                continue
            try:
                redial.accept(welcome.broker_instance, self.broker_instance_id, time.monotonic())
                opened_database(welcome, database)
            except (ConnectionLostError, ProtocolViolationError):
                sock.close()
                raise
            self._sock, self._decoder, self._lost = sock, decoder, None
            self.reconnects += 1
            try:
                self._drive(self._tracker.reattach(time.monotonic()))
                for hook in list(self.on_reconnect):
                    hook(self)
            except _Lost:
                continue
            return

    def _drive(self, settling: Settling) -> None:
        """Run a settling generator of plain questions (no statement in it is re-sent)."""
        stepper = Stepper(settling)
        while (step := stepper.next()) is not None:
            stepper.answered(self._send(step))

    def close(self) -> None:
        self._closed = True
        self._lost = self._lost or "closed"
        with contextlib.suppress(OSError):
            self._sock.close()

    @property
    def closed(self) -> bool:
        return self._closed or (self._lost is not None and not self._options.reconnect)

    def __enter__(self) -> SyncConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SyncConnection]:
        ahead = self._begin_ahead()
        if ahead is None:
            self.begin_transaction()
        try:
            yield self
        except BaseException as exc:
            if ahead is not None and not self._begun(ahead, quietly=True):
                raise  # the BEGIN was refused: no transaction of this block's to undo
            if not self.closed:
                with contextlib.suppress(ConnectionLostError):
                    self.rollback(error=f"{type(exc).__name__}: {exc}")
            raise
        if ahead is not None:
            self._begun(ahead)
        self.commit()

    def _begin_ahead(self) -> _Ahead | None:
        """A BEGIN TRANSACTION held back to leave with the next request, when the broker
        cannot refuse it; None: not held (then it is sent by itself)."""
        if self._lost is not None or self._closed or self._tracker.txn is not None:
            return None
        sent = self._tracker.prepare(calls.begin_transaction(), time.monotonic())
        assert sent is not None  # (None answers a rollback)
        self._ahead = _Ahead(sent)
        return self._ahead

    def _begun(self, ahead: _Ahead, quietly: bool = False) -> bool:
        """Whether the held-back BEGIN succeeded: sent by itself if no request took it,
        settled if its answer was lost; its refusal raised (False if `quietly`)."""
        if self._ahead is ahead:
            self._ahead = None
        try:
            if not ahead.written:
                self._run(ahead.sent)
            elif ahead.lost:
                self._settle_lost(ahead.sent)
            elif ahead.answer is not None and not ahead.answer[0]:
                raise ahead.answer[1]
        except Exception:
            if quietly:
                return False
            raise
        return True

    def run_transaction(
        self, fn: Callable[[SyncConnection], T], retries: int = DEFAULT_RETRIES
    ) -> T:
        retry = Retries(retries)
        while True:
            try:
                with self.transaction():
                    return fn(self)
            except RETRIED as exc:
                if not retry.again(exc):
                    raise

    # ---- the seed-000 scheduler (see _scheduler) --------------------------------------

    install_scheduler = install_scheduler_sync
    get_scheduler = get_scheduler_sync


def _read_frame(sock: socket.socket, decoder: FrameDecoder, backoff: Backoff = NEVER_POLL) -> Any:
    while True:
        frame = decoder.next_frame()
        if frame is not NEED_DATA:
            return frame
        data = receive(sock, backoff, 1 << 16)
        if not data:
            raise ConnectionResetError("the broker closed the connection")
        decoder.receive_data(data)


def _open(
    target: Target, timeout: float, first: int = 0, database: str = ""
) -> tuple[socket.socket, Welcome, FrameDecoder, int]:
    """Connect to the first of the URL's addresses that lets this client log in, trying
    them in turn from the one numbered `first`; returns which one it was."""
    failures: list[ConnectionLostError] = []
    for candidate in target.in_turn(first):
        try:
            sock, welcome, decoder = _open_one(candidate, timeout, database)
        except ConnectionLostError as exc:
            failures.append(exc)
            continue
        return sock, welcome, decoder, target.index(candidate)
    raise none_answered(target, failures)


def _open_one(
    target: Target, timeout: float, database: str = ""
) -> tuple[socket.socket, Welcome, FrameDecoder]:
    """Connect to one address, TLS where the URL asks for it, and log in."""
    try:
        sock = socket.create_connection((target.host, target.port), timeout=timeout)
    except OSError as exc:
        raise ConnectionLostError(
            f"cannot connect to the broker at {target.host}:{target.port}: {exc}"
        ) from exc
    context = target.tls_context()
    if context is not None:
        try:
            sock = context.wrap_socket(sock, server_hostname=target.host)
            target.check_pin(sock.getpeercert(binary_form=True))
        except ssl.SSLError as exc:
            sock.close()
            raise TLSError(
                f"TLS with the broker at {target.host}:{target.port} failed: {exc}; check the"
                " URL's ?ca= or ?fingerprint="
            ) from exc
        except OSError as exc:
            sock.close()
            raise ConnectionLostError(f"TLS handshake with the broker failed: {exc}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = FrameDecoder(nesting=False)  # answers of the broker it chose
    try:
        hello = Hello(WIRE_VERSION, target.user, target.password, database)
        sock.sendall(encode_frame(hello.encode()))
        welcome = Welcome.decode(_read_frame(sock, decoder))
    except ProtocolError as exc:
        sock.close()
        raise login_error(exc.code, str(exc), f"{target.host}:{target.port}") from exc
    except OSError as exc:
        sock.close()
        raise handshake_unfinished(target.port, exc) from exc
    sock.settimeout(None)
    return sock, welcome, decoder


def connect_sync(
    url: str = "ssb://127.0.0.1:4021",
    timeout: float = 10.0,
    *,
    reconnect: bool = True,
    reconnect_deadline: float = RECONNECT_DEADLINE,
    database: str | None = None,
    busy_poll: float = DEFAULT_WINDOW,
) -> SyncConnection:
    """Open a blocking session with the broker at `url` (ssb://user:password@host:port;
    several addresses of one broker, host1:port1,host2:port2, are tried in turn).

    Args:
        timeout: seconds one attempt to connect and log in may take (above 0, at most
            3600; else ValueError).
        reconnect: when the connection drops, connect again by itself (with backoff, to
            the same broker, at any of the URL's addresses) and settle what was in
            flight (see `run_transaction`).
        reconnect_deadline: seconds to keep trying before calls fail with
            `ConnectionLostError`.
        database: the database the session starts in (default: master); `use` moves it.
        busy_poll: seconds the connection reads without waiting for an answer before
            it sleeps in the kernel (0: never; see `connect`).
    """
    timeout = check_connect_timeout(timeout)
    options = Options(timeout, reconnect, check_deadline(reconnect_deadline))
    window = check_poll_window(busy_poll)
    sock, welcome, decoder, at = _open(parse_url(url), timeout, 0, database or "")
    try:
        return SyncConnection(sock, welcome, decoder, url, options, at, database or "", window)
    except ProtocolViolationError:
        sock.close()
        raise
