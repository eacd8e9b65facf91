"""The client port: one asyncio protocol object per client connection.

Theory of operation. Bytes are decoded as they arrive; the first frame must be a
Hello, every later one a request. Requests of one connection run strictly one after
another (a session is sequential, like a SQL session): a request whose operation
finishes at once is answered in the same pass, one that must wait (RECEIVE with
WAITFOR, a lock) runs as a task owned by the connection, and the next request
starts when it ends. Answers leave in request order and only once everything the
engine had applied before the answer was produced is durable (see `_store`), so a
client never sees state that a crash could take back. Some answers need not wait for
everything, only for the connection's earlier answers and what they show: a refusal
(it applied nothing), BEGIN TRANSACTION (it stores nothing), a RECEIVE in a
transaction (its rows' store batches: under load the messages it takes were mostly
stored long before, and nothing is written until COMMIT) and, while the store cannot
write, an observation (ping, a view), so that clients hear why while the disk is full.
Reading pauses while too many requests are queued and processing pauses while the
socket's write buffer is full. On a broker whose daemons share a database, nothing
leaves a connection unless this daemon holds the broker's lease by its own clock
(`serving`): a daemon that was frozen past its lease answers nothing when it runs again,
whatever its event loop runs first; the connection is closed instead.
A malformed frame gets a protocol error and the connection is closed; whatever the
session had open is rolled back. Other sessions are not affected.

Before login a connection may send only a small Hello frame and must finish logging in
within the login timeout; the password check runs off the loop (see `_logins`) and
reading pauses until it has answered. The door in front (`_tls`) has already sorted
TLS from plain TCP and bounded the connections per address.
Every refusal is logged with the peer's address, never with a secret: a refused request
at INFO the first time its code is refused on the connection, at DEBUG after that (a
client retrying in a loop must not fill the log); the refusals whose cause logs them
itself (disk, quota, permission) at DEBUG only.

Having answered, the daemon polls a moment for the next request rather than sleeping in
the kernel (`NextRequests`, see `ssb.protocol`'s `Poller`): a request on any connection
ends the poll, and polls that find nothing make the next ones rarer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

from ssb.protocol import (
    MAX_FRAME_SIZE,
    NEED_DATA,
    WIRE_VERSION,
    Backoff,
    ErrorCode,
    FrameDecoder,
    Hello,
    Poller,
    ProtocolError,
    Request,
    Welcome,
    encode_error,
    encode_frame,
    encode_ok,
)

from ._config import ClientLimits
from ._core.transactions import Session, Transactions
from ._errors import BrokerError
from ._operations import Operations
from ._store import Store

log = logging.getLogger("ssb.server")

MAX_QUEUED_REQUESTS: Final = 1024
RESUME_READING_AT: Final = 128
SERVER_NAME: Final = "ssb/0.2"
# characters of an error's message at most: a refusal may quote the value it refuses
MAX_ERROR_TEXT: Final = 16 * 1024
_LOGGED_TEXT: Final = 300  # characters of a refusal's message in its log line
# refusals whose cause logs them itself (once a spell, or each with who was refused)
_LOGGED_WHERE_CAUSED: Final = frozenset(
    {ErrorCode.DISK_FULL, ErrorCode.STORE_FAILED, ErrorCode.QUEUE_FULL, ErrorCode.PERMISSION_DENIED}
)

# (user, password, peer address) -> None when the login may open a session, else why not
Login = Callable[[str, str, str], Awaitable[str | None]]

_give_way: Callable[[], object] = getattr(os, "sched_yield", lambda: None)


def _never(_: Callable[[], None]) -> None:
    raise AssertionError("a window of 0 never polls")


def _bounded(text: str) -> str:
    """An error's message cut to `MAX_ERROR_TEXT` characters, saying so."""
    if len(text) <= MAX_ERROR_TEXT:
        return text
    return f"{text[:MAX_ERROR_TEXT]}... ({len(text) - MAX_ERROR_TEXT} characters cut)"


class NextRequests:
    """The daemon's polling for the next request after answering, over all connections
    (`window`: seconds, 0 for never), on the event loop running when it is made."""

    def __init__(self, window: float) -> None:
        self.backoff = Backoff(window)
        self.arrived = 0  # requests read, on every connection
        self._seen = 0  # when the last poll started
        schedule = asyncio.get_running_loop().call_soon if window else _never
        self.poller = Poller(
            self._awaiting, time.perf_counter, schedule, _give_way, time.thread_time
        )

    def answered(self) -> None:
        self._seen = self.arrived
        self.poller.start(self.backoff)

    def _awaiting(self) -> bool:
        return self.arrived == self._seen


class ClientConnection(asyncio.Protocol):
    def __init__(
        self,
        transactions: Transactions,
        welcome: Welcome,
        store: Store,
        operations: Operations,
        login: Login,
        connections: set[ClientConnection],
        limits: ClientLimits,
        serving: Callable[[], bool] | None = None,
        next_requests: NextRequests | None = None,
    ) -> None:
        """One client's connection.

        Args:
            transactions: where its session opens and closes.
            welcome: what a client that logged in is told (this broker's identity).
            store: answers leave once what they show is durable.
            operations: what a request may call.
            login: checks a Hello's login.
            connections: the open connections (this one joins while it is open).
            limits: the [limits] a client is held to.
            serving: whether this daemon may answer (it holds the broker's lease; None:
                always).
            next_requests: the daemon's polling for requests (None: it sleeps at once).
        """
        self.transactions = transactions
        self.welcome = welcome
        self.store = store
        self.operations = operations
        self.login = login
        self.connections = connections
        self.limits = limits
        self.serving = serving
        self.next_requests = next_requests or NextRequests(0.0)
        self.decoder = FrameDecoder(limits.hello_frame_size)
        self.greeted = False  # a Hello arrived; its login may still be running
        self.login_timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.peer = ""
        self.host = ""
        self.inbox: deque[Request] = deque()
        self.busy: asyncio.Task[None] | None = None
        self.replies: deque[tuple[int, bytes, int]] = deque()  # (after, data, request id)
        self.waiting_for: int | None = None
        self.write_paused = False
        self.read_paused = False
        self.closed = False
        self.refused: set[ErrorCode] = set()  # codes of requests refused so far

    # ---- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.host = peer[0] if isinstance(peer, tuple) else self.peer
        self.connections.add(self)
        log.info("client %s connected", self.peer)
        self.login_timer = asyncio.get_running_loop().call_later(
            self.limits.login_timeout, self._login_timed_out
        )

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        if self.greeted and self.session is None:
            return  # the login is being checked; later frames wait in the decoder
        try:
            while True:
                frame = self.decoder.next_frame()
                if frame is NEED_DATA:
                    break
                if self.session is None:
                    self._hello(frame)
                    return  # the rest stays buffered until the login has answered
                else:
                    self.inbox.append(Request.decode(frame))
                    self.next_requests.arrived += 1
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        if len(self.inbox) > MAX_QUEUED_REQUESTS and not self.read_paused:
            assert self.transport is not None
            self.transport.pause_reading()
            self.read_paused = True
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        who = f" ({self.session.user!r}, session {self.session.ident})" if self.session else ""
        why = f": {exc}" if exc is not None else ""
        log.info("client %s%s disconnected%s", self.peer, who, why)
        if self.login_timer is not None:
            self.login_timer.cancel()
        self.connections.discard(self)
        if self.busy is not None:
            self.busy.cancel()
        if self.session is not None and not self.session.closed:
            self.transactions.close_session(self.session)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._pump()

    # ---- handshake and errors -------------------------------------------------

    def _hello(self, frame: Any) -> None:
        hello = Hello.decode(frame)
        if hello.version != WIRE_VERSION:
            raise ProtocolError(
                f"client speaks wire version {hello.version}, this broker speaks {WIRE_VERSION}",
                ErrorCode.HANDSHAKE_FAILED,
            )
        self.greeted = True
        assert self.transport is not None
        self.transport.pause_reading()
        self.busy = asyncio.ensure_future(self._login(hello))

    async def _login(self, hello: Hello) -> None:
        try:
            refused = await self.login(hello.user, hello.password, self.peer)
        except Exception:
            # not the client's fault (the daemon stopping, say): it may try again
            log.exception("checking the login of %s failed", self.peer)
            self.busy = None
            if not self.closed:
                text = "the broker could not check the login (it logged why); try again"
                self._send_now(encode_error(0, ErrorCode.INTERNAL_ERROR, text))
                self.close()
            return
        self.busy = None
        if self.closed:
            return
        if refused is not None:
            hint = "" if hello.user else " (the URL names none: ssb://USER:PASSWORD@HOST:PORT)"
            self._send_now(encode_error(0, ErrorCode.LOGIN_FAILED, refused + hint))
            self.close()
            return
        if self.login_timer is not None:
            self.login_timer.cancel()
            self.login_timer = None
        self.session = session = self.transactions.open_session(hello.user, self.peer)
        session.abort = self.abort
        if hello.database:
            try:  # as the session's USE: its permissions and its errors
                self.operations.call(session, Request(0, "use", {"database": hello.database}))
            except BrokerError as exc:
                self._send_now(encode_error(0, exc.code, f"cannot open the database: {exc}"))
                self.close()
                self.transactions.close_session(session)
                return
        log.info(
            "client %s logged in as %r (session %d, database %s)",
            self.peer,
            hello.user,
            session.ident,
            session.database,
        )
        self._send_now(dataclasses.replace(self.welcome, database=session.database).encode())
        self.decoder.max_frame_size = MAX_FRAME_SIZE
        self.decoder.nesting = False  # Request.decode checks each request's arguments
        assert self.transport is not None
        self.transport.resume_reading()
        self.data_received(b"")  # frames sent right behind the Hello

    def _login_timed_out(self) -> None:
        self.login_timer = None
        if self.session is None and not self.closed:
            log.info(
                "closing client %s: no login within %g s", self.peer, self.limits.login_timeout
            )
            self._send_now(
                encode_error(
                    0,
                    ErrorCode.HANDSHAKE_FAILED,
                    f"no login within {self.limits.login_timeout:g} s",
                )
            )
            self.close()

    def _protocol_error(self, exc: ProtocolError) -> None:
        log.info("closing client %s: %s", self.peer, exc)
        self._send_now(encode_error(0, exc.code, str(exc)))
        self.close()

    def _send_now(self, frame: object) -> None:
        if self.transport is not None and not self.transport.is_closing() and self._may_answer():
            self.transport.write(encode_frame(frame))

    def _may_answer(self) -> bool:
        """Whether this daemon may answer; if not, the connection is closed unanswered."""
        if self.serving is None or self.serving():
            return True
        self.abort("this daemon does not hold the broker's lease: it answers nothing")
        return False

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self, reason: str) -> None:
        """Close at once: nothing queued runs, and whatever the session had open rolls back
        now (a reconnected client was told the outcome of what it was running)."""
        log.info("closing client %s: %s", self.peer, reason)
        self.closed = True
        self.inbox.clear()
        if self.busy is not None:
            self.busy.cancel()
            self.busy = None
        if self.transport is not None:
            self.transport.abort()
        session = self.session
        if session is not None and not session.closed:
            self.transactions.close_session(session)

    # ---- running requests in order ----------------------------------------------

    def _pump(self) -> None:
        session = self.session
        while self.inbox and self.busy is None and not self.write_paused and not self.closed:
            assert session is not None
            request = self.inbox.popleft()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("session %d (%r): %s", session.ident, session.user, request.operation)
            session.answer_after = None
            try:
                result = self.operations.call(session, request)
            except BrokerError as exc:
                self._refuse(request, exc)
                continue
            except Exception as exc:  # a bug must not take the daemon down
                self._failed(request, exc)
                continue
            if inspect.isawaitable(result):
                self.busy = asyncio.ensure_future(self._finish(request, result))
                break
            self._succeed(request, result)
        if self.read_paused and len(self.inbox) < RESUME_READING_AT and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()
        self._flush()

    async def _finish(self, request: Request, pending: Any) -> None:
        try:
            result = await pending
        except BrokerError as exc:
            self._refuse(request, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(request, exc)
        else:
            self._succeed(request, result)
        self.busy = None
        self._pump()

    def _succeed(self, request: Request, result: Any) -> None:
        after = None if self.session is None else self.session.answer_after
        if (
            after is None
            and self.store.trouble is not None
            and self.operations.observes(request.operation)
        ):
            after = 0  # the store cannot write: a ping or a view says why at once
        self._answer(encode_ok(request.request_id, result), after=after)

    def _refuse(self, request: Request, exc: BrokerError) -> None:
        if exc.code == ErrorCode.TRANSACTION_RESOLVED:  # what follows it must not run
            self.abort(exc.message)
            return
        text = _bounded(self.operations.shown(self.session, exc.message))
        self._log_refusal(request.operation, exc.code, text)
        self._answer(encode_error(request.request_id, exc.code, text), after=0)

    def _log_refusal(self, operation: str, code: ErrorCode, text: str) -> None:
        first = code not in self.refused and code not in _LOGGED_WHERE_CAUSED
        if not first and not log.isEnabledFor(logging.DEBUG):
            return
        self.refused.add(code)
        session = self.session
        who = f"{session.user!r}, session {session.ident}" if session is not None else "no login"
        log.log(
            logging.INFO if first else logging.DEBUG,
            "refused %s from client %s (%s): [%d %s] %s%s",
            operation,
            self.peer,
            who,
            code,
            code.name,
            text[:_LOGGED_TEXT] + ("..." if len(text) > _LOGGED_TEXT else ""),
            " (this connection's next refusals with this code at debug level)" if first else "",
        )

    def _failed(self, request: Request, exc: Exception) -> None:
        """An operation failed by a bug: logged, and the client told so."""
        log.exception("operation %s failed", request.operation)
        text = _bounded(f"internal error in {request.operation}: {exc!r}; the broker logged it")
        self._answer(encode_error(request.request_id, ErrorCode.INTERNAL_ERROR, text))

    def _answer(self, frame: list[Any], *, after: int | None = None) -> None:
        """Queue an answer behind the connection's earlier ones, to leave once store batch
        `after` is durable (None: everything applied so far)."""
        try:
            data = encode_frame(frame)
        except (TypeError, ValueError, ProtocolError) as exc:
            log.exception("cannot encode the answer to request %s", frame[0])
            data = encode_frame(
                encode_error(frame[0], ErrorCode.INTERNAL_ERROR, f"unencodable answer: {exc}")
            )
        if after is None:
            after = self.store.watermark()
        if self.replies:
            after = max(after, self.replies[-1][0])
        self.replies.append((after, data, frame[0]))

    def _flush(self) -> None:
        """Write every answer whose effects are durable; wait for the rest."""
        store = self.store
        durable = store.durable
        out = []
        replies = self.replies
        while replies and replies[0][0] <= durable:
            out.append(replies.popleft()[1])
        if out and self.transport is not None and not self.transport.is_closing():
            if not self._may_answer():
                return
            self.transport.writelines(out)
            self.next_requests.answered()
        if replies and self.waiting_for != replies[0][0]:
            self.waiting_for = replies[0][0]
            store.when_durable(self.waiting_for, self._durable)

    def abandon(self, durable: int, text: str) -> None:
        """The store gave up every batch after `durable`: the answers that waited for one
        are DiskFullError (`text`: nothing of it was applied), the others go as they are,
        and the connection closes (the broker starts again)."""
        out = [
            data
            if after <= durable
            else encode_frame(encode_error(request_id, ErrorCode.DISK_FULL, text))
            for after, data, request_id in self.replies
        ]
        self.replies.clear()
        self.inbox.clear()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)
        self.close()

    def _durable(self) -> None:
        self.waiting_for = None
        if not self.closed:
            self._flush()
