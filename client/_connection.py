"""The async client: one connection to the broker's client port, one session.

Requests are written as soon as they are made and may be pipelined; the broker
runs them in order and answers in order, and each answer resolves the future of
its request id. A lost connection fails every pending request with
`ConnectionLostError`; the broker rolls back whatever the session had open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, cast

from ssb.protocol import (
    NEED_DATA,
    REPLY_OK,
    WIRE_VERSION,
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
from ._polling import DEFAULT_WINDOW, answers_poller
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
from ._scheduler import get_scheduler, install_scheduler
from ._session import Stepper
from ._url import Target, parse_url

T = TypeVar("T")

HIGH_WATER: Final = 4 * 1024 * 1024
CONNECT_TIMEOUT: Final = 10.0
# requests written at the event loop's next turn, with those written meanwhile: a
# program's table statements sent without waiting for each answer go in one segment,
# and the broker answers them in one pass
_CORKED: Final = frozenset({"execute", "execute_many"})

log = logging.getLogger("ssb.client")

# the requests every transaction() block makes (a Call is never changed: built once)
_BEGIN: Final = calls.begin_transaction()
_COMMIT: Final = calls.commit()


class _Wire(asyncio.Protocol):
    def __init__(self) -> None:
        self.decoder = FrameDecoder(nesting=False)  # answers of the broker it chose
        self.transport: asyncio.Transport | None = None
        self.frames: asyncio.Queue[Any] = asyncio.Queue()  # only before the welcome
        self.connection: Connection | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        decoder = self.decoder
        decoder.receive_data(data)
        while True:
            try:
                frame = decoder.next_frame()
            except ProtocolError as exc:
                self._fail(exc)
                return
            if frame is NEED_DATA:
                return
            if self.connection is not None:
                self.connection._on_frame(frame)
            else:
                self.frames.put_nowait(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("the broker closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        if self.lost is None:
            self.lost = exc
        self.writable.set()
        if self.connection is not None:
            self.connection._on_lost(self, exc)
        else:
            self.frames.put_nowait(exc)
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()


class _Lost(Exception):
    """A request's answer was lost with the connection (settled after a reconnect)."""


class Connection(Operations):
    """An async session with the broker; make one with `client.connect(url)`."""

    def __init__(
        self,
        wire: _Wire,
        welcome: Welcome,
        url: str,
        options: Options,
        at: int = 0,
        database: str = "",
        busy_poll: float = DEFAULT_WINDOW,
    ) -> None:
        self._wire = wire
        self._loop = asyncio.get_running_loop()  # (asked once: asking costs a getpid())
        self._at = at  # which of the URL's addresses answered last
        self._pending: dict[int, tuple[asyncio.Future[Any], Sent]] = {}
        self._next_id = 1
        self._open_session(welcome, url, options, database)
        self._polls = Backoffs(busy_poll)  # (when polling for an answer pays, by operation)
        self._poller = answers_poller(self._pending.__len__, self._loop)
        self._closed = False
        self._redialing: asyncio.Future[None] | None = None
        self._unsettled = 0  # requests whose answers were lost, not yet settled
        self._corked: list[bytes] = []  # requests held to leave with the next one
        self._reconnecting = False  # on_reconnect hooks run (their calls go first)
        # BEGINs written ahead whose answers nobody waits for yet, by their answers' futures
        self._unheard: dict[asyncio.Future[Any], _Begun] = {}
        self._settled = asyncio.Event()
        self._settled.set()
        # coroutines run after each reconnect, before anything in flight is settled
        self.on_reconnect: list[Callable[[Connection], Awaitable[object]]] = []
        wire.connection = self

    # ---- plumbing ------------------------------------------------------------------

    async def call(self, request: calls.Call[T]) -> T:
        if self._unsettled or self._closed or self._wire.lost is not None:
            await self._ready()
        sent = self._tracker.prepare(request, time.monotonic())
        if sent is None:
            return None  # type: ignore[return-value]
        # (`_run` and `_send`, written out here: one coroutine per request rather than three)
        wire = self._wire
        try:
            written = self._write(sent, cork=sent.call.operation in _CORKED)
            if not wire.writable.is_set():
                await wire.writable.wait()
            return await written  # type: ignore[no-any-return]
        except _Lost:
            pass
        return await self._settle_lost(sent)  # type: ignore[no-any-return]

    async def _ready(self) -> None:
        """Wait until what was lost is settled (unless this is a reconnect hook's call),
        then until connected."""
        while self._unsettled and not self._reconnecting:  # lost requests settle first
            await self._settled.wait()
        await self._connected()

    async def transaction_outcome(self, txn_id: uuid.UUID | str) -> str:
        outcome, _ = await self.call(self._outcome_request(txn_id, time.monotonic()))
        return outcome

    async def _run(self, sent: Sent, written: asyncio.Future[Any]) -> Any:
        """`sent`'s answer, once `written` (the future of its answer) is resolved."""
        try:
            return await written
        except _Lost:
            pass
        return await self._settle_lost(sent)

    async def _settle_lost(self, sent: Sent) -> Any:
        """The answer of `sent`, whose answer was lost with the connection."""
        try:
            return await self._settle(sent)
        except ConnectionLostError as exc:
            raise ConnectionLostError(unsettled_text(sent, exc)) from exc
        finally:
            self._one_settled()

    def _one_settled(self) -> None:
        """A request counted at its loss (`_Lost`) is settled, or handed on."""
        self._unsettled -= 1
        if not self._unsettled:
            self._settled.set()

    async def _settle(self, sent: Sent) -> Any:
        """Settle a request whose answer was lost, once connected again."""
        await self._connected()
        stepper = Stepper(self._tracker.settle(sent, time.monotonic()))
        while (step := stepper.next()) is not None:
            try:
                stepper.answered(await self._send(step))
            except _Lost:
                self._one_settled()  # counted again by the loss; settled right here
                try:
                    stepper.answered(await self._settle(step))
                except BrokerError as exc:
                    stepper.failed(exc)
            except BrokerError as exc:
                stepper.failed(exc)
        log.info("settled %s after the reconnect", sent.call.operation)
        return stepper.result

    async def _send(self, sent: Sent) -> Any:
        """Write one request and wait for its answer; `_Lost` if the connection drops."""
        wire = self._wire
        # (table statements sent one after another leave together: see `_CORKED`)
        future = self._write(sent, cork=sent.call.operation in _CORKED)
        if not wire.writable.is_set():
            await wire.writable.wait()
        return await future

    def _write(self, sent: Sent, cork: bool = False) -> asyncio.Future[Any]:
        """Write one request now (`cork`: with the next request written, at the latest
        at the event loop's next turn: one segment for both); the future of its answer.
        `_Lost` if the connection has dropped."""
        wire = self._wire
        transport = wire.transport
        if wire.lost is not None or transport is None or transport.is_closing():
            self._not_written(wire)
        assert transport is not None
        request_id = self._next_id
        self._next_id = request_id + 1
        try:
            frame = calls.encode_request(request_id, sent.call, self.max_message_size)
        except (TypeError, ValueError, BrokerError):
            self._tracker.answered(sent, False, None)
            raise
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[request_id] = (future, sent)
        corked = self._corked
        if not cork and not corked:
            transport.write(frame)
        else:
            if not corked and cork:
                self._loop.call_soon(self._uncork, wire)
            corked.append(frame)
            if not cork:
                self._uncork(wire)
        self._poller.start(self._polls.of(sent.call.operation))
        return future

    def _not_written(self, wire: _Wire) -> None:
        """`_Lost` for a request about to be written on a connection that dropped."""
        if wire.lost is None and wire.transport is not None and wire.transport.is_closing():
            # (closed, its connection_lost still to come: uvloop refuses writes meanwhile)
            wire._fail(ConnectionResetError("the connection to the broker is closing"))
        if wire.lost is not None:
            self._unsettled += 1
            self._settled.clear()
            raise _Lost()

    def _uncork(self, wire: _Wire) -> None:
        """Write the requests held back (none if the connection was lost meanwhile: they
        are settled with the rest)."""
        frames, self._corked = self._corked, []
        transport = wire.transport
        if not frames or wire is not self._wire or wire.lost is not None or transport is None:
            return
        if not transport.is_closing():  # (closing: they are settled with the rest)
            transport.writelines(frames)

    async def _connected(self) -> None:
        """Return once connected; reconnect first if the connection dropped."""
        wire = self._wire
        if wire.lost is None and not self._closed:
            return
        if self._closed:
            raise ConnectionLostError("the connection was closed")
        if not self._options.reconnect:
            raise ConnectionLostError(f"not connected to the broker: {wire.lost}")
        if self._redialing is None or self._redialing.done():
            self._redialing = asyncio.ensure_future(self._redial(str(wire.lost)))
        await asyncio.shield(self._redialing)

    async def _redial(self, reason: str) -> None:
        redial = Redial(self.url, self._options, reason, time.monotonic())
        while True:
            try:
                database = self._tracker.database
                wire, welcome, self._at = await _open(
                    redial.target, self._options.timeout, self._at, database
                )
            except (TLSError, LoginFailedError, ProtocolViolationError):
                raise
            except ConnectionLostError as exc:
                await asyncio.sleep(redial.pause(exc, time.monotonic()))
                continue
            try:
                redial.accept(welcome.broker_instance, self.broker_instance_id, time.monotonic())
                opened_database(welcome, database)
            except (ConnectionLostError, ProtocolViolationError):
                assert wire.transport is not None
                wire.transport.close()
                raise
            self._wire = wire
            wire.connection = self
            self.reconnects += 1
            try:
                await self._drive(self._tracker.reattach(time.monotonic()))
                self._reconnecting = True
                for hook in list(self.on_reconnect):
                    await hook(self)
            except ConnectionLostError:
                continue
            finally:
                self._reconnecting = False
            return

    async def _drive(self, settling: Settling) -> None:
        """Run a settling generator of plain questions (no statement in it is re-sent)."""
        stepper = Stepper(settling)
        while (step := stepper.next()) is not None:
            try:
                stepper.answered(await self._send(step))
            except _Lost:
                self._one_settled()
                raise ConnectionLostError("lost again while reconnecting") from None

    def _on_frame(self, frame: Any) -> None:
        # a success, the usual answer, is taken as it is, without making a `Reply` of it
        if (
            type(frame) is list
            and len(frame) == 3
            and frame[1] == REPLY_OK
            and type(frame[0]) is int
        ):
            request_id, result = frame[0], frame[2]
        else:
            try:
                reply = Reply.decode(frame)
            except ProtocolError as exc:
                self._wire._fail(exc)
                return
            if not reply.ok:
                self._on_error(reply)
                return
            request_id, result = reply.request_id, reply.result
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return
        future, sent = entry
        if future.done():
            return
        try:
            value = sent.call.decode(result)
        except Exception as exc:  # a malformed answer is a protocol problem
            self._tracker.answered(sent, False, None)
            future.set_exception(
                ProtocolViolationError(f"bad answer to {sent.call.operation}: {exc!r}")
            )
            return
        self._tracker.answered(sent, True, value)
        future.set_result(value)

    def _on_error(self, reply: Reply) -> None:
        """The broker refused a request (or, with no request, the session)."""
        assert reply.code is not None
        entry = self._pending.pop(reply.request_id, None)
        if entry is None:
            self._wire._fail(error_for(reply.code, reply.text))
            return
        future, sent = entry
        if future.done():
            return
        self._tracker.answered(sent, False, None)
        future.set_exception(error_for(reply.code, reply.text))

    def _on_lost(self, wire: _Wire, exc: BaseException) -> None:
        if wire is not self._wire:
            return
        pending, self._pending = self._pending, {}
        self._corked = []
        reason = str(exc) or type(exc).__name__
        if self._closed or not self._options.reconnect:
            error = (
                exc
                if isinstance(exc, BrokerError)
                else ConnectionLostError(f"connection to the broker lost: {reason}")
            )
            for future, _ in pending.values():
                if not future.done():
                    future.set_exception(error)
            return
        self._tracker.lost(reason, [sent for _, sent in pending.values()])
        unheard, self._unheard = self._unheard, {}
        for future, _ in pending.values():
            if not future.done():
                self._unsettled += 1
                self._settled.clear()
                begun = unheard.get(future)
                if begun is not None:  # settled at once (see `_Begun`)
                    future.add_done_callback(begun.lost)
                future.set_exception(_Lost())

    async def close(self) -> None:
        self._closed = True
        transport = self._wire.transport
        if transport is not None and not transport.is_closing():
            transport.close()
        await asyncio.sleep(0)

    @property
    def closed(self) -> bool:
        return self._closed or (self._wire.lost is not None and not self._options.reconnect)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def transaction(self) -> _Transaction:
        return _Transaction(self)

    def _begin_at_once(self) -> _Begun | None:
        """Write a BEGIN TRANSACTION to leave with the next request, when it cannot be
        refused (see `transaction`). None: not written."""
        if self._unsettled or self._closed or self._wire.lost is not None:
            return None
        if self._tracker.txn is not None:
            return None
        sent = self._tracker.prepare(_BEGIN, time.monotonic())
        assert sent is not None  # (None answers a rollback)
        return _Begun(self, sent, self._write(sent, cork=True))

    async def run_transaction(
        self, fn: Callable[[Connection], Awaitable[T]], retries: int = DEFAULT_RETRIES
    ) -> T:
        retry = Retries(retries)
        while True:
            try:
                async with self.transaction():
                    return await fn(self)
            except RETRIED as exc:
                if not retry.again(exc):
                    raise

    # ---- the seed-000 scheduler (see _scheduler) --------------------------------------

    install_scheduler = install_scheduler
    get_scheduler = get_scheduler


class _Transaction:
    """The block of `Connection.transaction` (a class rather than a generator: it is on
    the path of every transaction)."""

    __slots__ = ("_begun", "_conn")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._begun: _Begun | None = None

    async def __aenter__(self) -> Connection:
        conn = self._conn
        self._begun = conn._begin_at_once()
        if self._begun is None:
            await conn.begin_transaction()
        return conn

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        conn, begun = self._conn, self._begun
        if exc is not None:  # (raised again once this returns)
            if begun is not None and not await _succeeded(begun.answer()):
                return  # the BEGIN was refused: no transaction of this block's to undo
            if not conn.closed:
                with contextlib.suppress(ConnectionLostError):
                    await conn.rollback(error=f"{type(exc).__name__}: {exc}")
            return
        if begun is not None:
            await begun.answer()
        await conn.call(_COMMIT)


class _Begun:
    """A BEGIN written ahead of its block's statements (see `Connection.transaction`):
    its answer is heard at the block's end, but if the connection drops before anyone
    waits for it, it is settled at once, as every other lost request is, so that
    nothing else waits for it."""

    def __init__(self, conn: Connection, sent: Sent, future: asyncio.Future[Any]) -> None:
        self._conn, self._sent, self.future = conn, sent, future
        self._settling: asyncio.Task[Any] | None = None
        self._heard = False  # `answer` waits for it itself
        conn._unheard[future] = self  # (the connection calls `lost` if it drops meanwhile)

    def lost(self, future: asyncio.Future[Any]) -> None:
        """The connection dropped before the answer came (`future` holds `_Lost`)."""
        if not self._heard:
            self._settling = asyncio.ensure_future(self._conn._run(self._sent, future))

    async def answer(self) -> Any:
        """BEGIN's answer (its refusal raised)."""
        if self._settling is not None:
            return await self._settling
        self._heard = True
        self._conn._unheard.pop(self.future, None)
        return await self._conn._run(self._sent, self.future)


async def _succeeded(answer: Awaitable[Any]) -> bool:
    """Whether a request's answer, awaited, was a success."""
    try:
        await answer
    except Exception:
        return False
    return True


def _peer_certificate(ssl_object: Any) -> bytes | None:
    return None if ssl_object is None else ssl_object.getpeercert(binary_form=True)


async def _open(
    target: Target, timeout: float, first: int = 0, database: str = ""
) -> tuple[_Wire, Welcome, int]:
    """Connect to the first of the URL's addresses that lets this client log in, trying
    them in turn from the one numbered `first`; returns which one it was."""
    failures: list[ConnectionLostError] = []
    for candidate in target.in_turn(first):
        try:
            wire, welcome = await _open_one(candidate, timeout, database)
        except ConnectionLostError as exc:
            failures.append(exc)
            continue
        return wire, welcome, target.index(candidate)
    raise none_answered(target, failures)


async def _open_one(target: Target, timeout: float, database: str = "") -> tuple[_Wire, Welcome]:
    """Connect to one address, TLS where the URL asks for it, and log in."""
    loop = asyncio.get_running_loop()
    context = target.tls_context()
    try:
        transport, wire = await asyncio.wait_for(
            loop.create_connection(
                _Wire,
                target.host,
                target.port,
                ssl=context,
                server_hostname=target.host if context is not None else None,
            ),
            timeout,
        )
    except ssl.SSLError as exc:
        raise TLSError(
            f"TLS with the broker at {target.host}:{target.port} failed: {exc}; check the URL's"
            " ?ca= or ?fingerprint="
        ) from exc
    except (TimeoutError, OSError) as exc:
        raise ConnectionLostError(
            f"cannot connect to the broker at {target.host}:{target.port}: {exc or 'timed out'}"
        ) from exc
    try:
        target.check_pin(_peer_certificate(transport.get_extra_info("ssl_object")))
    except ssl.SSLError as exc:
        transport.close()
        raise TLSError(str(exc)) from exc
    assert wire.transport is not None
    if wire.lost is not None or wire.transport.is_closing():  # (uvloop refuses the write)
        raise ConnectionLostError(
            f"the broker at {target.host}:{target.port} closed the connection as soon as it"
            f" was made: {wire.lost or 'closing'}"
        )
    hello = Hello(WIRE_VERSION, target.user, target.password, database)
    wire.transport.write(encode_frame(hello.encode()))
    try:
        frame = await asyncio.wait_for(wire.frames.get(), timeout)
        if isinstance(frame, BaseException):
            raise frame
        welcome = Welcome.decode(frame)
    except ProtocolError as exc:
        wire.transport.close()
        raise login_error(exc.code, str(exc), f"{target.host}:{target.port}") from exc
    except (TimeoutError, OSError) as exc:
        wire.transport.close()
        raise handshake_unfinished(target.port, exc) from exc
    return wire, welcome


async def connect(
    url: str = "ssb://127.0.0.1:4021",
    timeout: float = CONNECT_TIMEOUT,
    *,
    reconnect: bool = True,
    reconnect_deadline: float = RECONNECT_DEADLINE,
    database: str | None = None,
    busy_poll: float = DEFAULT_WINDOW,
) -> Connection:
    """Open a session with the broker at `url` (ssb://user:password@host:port; several
    addresses of one broker, host1:port1,host2:port2, are tried in turn).

    Args:
        timeout: seconds one attempt to connect and log in may take (above 0, at most
            3600; else ValueError).
        reconnect: when the connection drops, connect again by itself (with backoff, to
            the same broker, at any of the URL's addresses) and settle what was in
            flight (see `run_transaction`).
        reconnect_deadline: seconds to keep trying before calls fail with
            `ConnectionLostError`.
        database: the database the session starts in (default: master, where everything
            made without naming a database lives); `use` moves it.
        busy_poll: seconds the connection keeps its event loop polling for an answer
            before it sleeps (0: never), which saves the wake-up when the broker answers
            at once; polls that find nothing make the next ones rarer (see the client
            page of the documentation).

    Raises:
        ConnectionLostError: the broker cannot be reached.
        LoginFailedError: the broker refused the login.
        NotFoundError: there is no such database.
    """
    timeout = check_connect_timeout(timeout)
    options = Options(timeout, reconnect, check_deadline(reconnect_deadline))
    window = check_poll_window(busy_poll)
    wire, welcome, at = await _open(parse_url(url), timeout, 0, database or "")
    try:
        return Connection(wire, welcome, url, options, at, database or "", window)
    except ProtocolViolationError:
        assert wire.transport is not None
        wire.transport.close()
        raise
