"""The web dashboard: server-rendered pages on the HTTP port, behind a broker login.

Theory of operation. Everything lives under /dashboard on the HTTP port's aiohttp
application (the routes are added before it starts: aiohttp freezes its router then).
Pages are plain HTML built here, with one small stylesheet and an icon served by the
broker itself; there is no script at all, and every page says so in a strict
Content-Security-Policy.

- A page needs a web session: a random token in a cookie (HttpOnly, SameSite=Strict,
  Secure over HTTPS) that names a login, made by the login form once `Logins.check`
  accepted the password. Only a digest of the token is kept. A web session ends after
  SESSION_IDLE seconds without a request, SESSION_LIFETIME seconds after its login, at
  "Log out", or when its login's password changes or the login is dropped. A page
  without one redirects to the login form, which comes back to it afterwards.
- Reads and actions run as that login: each one opens a broker session for it, calls the
  operation through `Operations.call` (so the permission checks apply exactly as they do
  to a client) and closes the session. A refusal shows the broker's own words in place
  of the data. An action that changed something answers once the change is durable.
- State changes are POST only, and need the web session's CSRF token (a hidden form
  field, compared in constant time) and an Origin header (or, without one, a Referer)
  naming this very host. Anything else is refused with 403 and logged. The login form,
  which has no session yet, needs the Origin check.
- Output is bounded: a table shows at most ROW_LIMIT rows and says when there are more
  (the transmission queue and dead letters page on by id / queuing order); a message
  body shows at most BODY_LIMIT characters. Everything that comes from the broker or
  the request is HTML-escaped.
- Depth history: every `interval` seconds (`chart_sample_seconds` in the config) the ready depth of each queue (at most
  MAX_CHARTED_QUEUES of them) goes into a ring of HISTORY_POINTS samples, which a
  queue's page draws as an inline SVG polyline, server-side. The samples come from the
  broker's memory, but a queue's page shows them only to a login that may read the
  `service_queues` view.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web
from multidict import MultiDictProxy

from ssb.protocol import ErrorCode, Request

from .._core.catalog import QueueDef
from .._core.names import DEFAULT_DATABASE, database_of
from .._core.ports import Clock, Journal, durable
from .._core.transactions import Transactions
from .._errors import BrokerError
from .._logins import LoginCheck
from .._operations import Operations
from .history import MAX_CHARTED_QUEUES, DepthHistory, depth_chart
from .html import (
    ENDPOINT_COLUMNS,
    HEADERS,
    ICON,
    MAX_NAME,
    ROOT,
    ROW_LIMIT,
    STYLE,
    TRANSMISSION_COLUMNS,
    Rows,
    body_text,
    button,
    capped,
    enable_button,
    esc,
    forbidden,
    form_field,
    layout,
    link,
    local_target,
    login_page,
    monitor_text,
    page_response,
    plain_table,
    queue_status,
    redirect,
    refusal,
    table,
    url,
    whole_number,
)
from .sessions import WebSession, WebSessions, peer_of, same_origin

log = logging.getLogger("ssb.dashboard")

COOKIE: Final = "ssb_dashboard"
SEARCH_LIMIT: Final = 100_000  # endpoints searched for a handle: the view's maximum
LOOKUP_LIMIT: Final = 100_000  # queues read to find one queue's row
BODY_LIMIT: Final = 64 * 1024  # characters of a body on its own page
DURABLE_WAIT: Final = 30.0  # seconds an action waits for its change to be durable

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def dead_letter_queues(queues: Mapping[str, QueueDef]) -> list[str]:
    """The queues of master some poison policy moves dead letters to (the dashboard's
    session is in master)."""
    return sorted(
        {
            q.poison_policy.dead_letter_queue
            for q in queues.values()
            if q.poison_policy is not None
            and q.poison_policy.dead_letter_queue
            and database_of(q.poison_policy.dead_letter_queue) == DEFAULT_DATABASE
        }
    )


# ---- the dashboard ---------------------------------------------------------------------

PageFn = Callable[[web.Request, WebSession], Awaitable[tuple[str, str]]]  # -> (title, body)
ActionFn = Callable[
    [web.Request, WebSession, MultiDictProxy[Any]], Awaitable[tuple[str, str]]
]  # -> (where to go, what happened)


class Dashboard:
    """The pages, the web sessions and the depth sampler."""

    def __init__(
        self,
        operations: Operations,
        transactions: Transactions,
        journal: Journal,
        clock: Clock,
        check: LoginCheck,
        depths: Callable[[], Mapping[str, int]],
        dead_letters: Callable[[], list[str]],
        interval: float,
    ) -> None:
        """The parts of the daemon the dashboard uses, passed in.

        Args:
            operations: the client operations, with their permission checks.
            transactions: where the broker sessions of the dashboard's logins open.
            journal, clock: to wait until an action's change is durable.
            check: a broker login check: None when the password is right.
            depths: the ready depth of every queue, for the history.
            dead_letters: the names of the queues poison policies move dead letters to.
            interval: seconds between depth samples.
        """
        self.operations = operations
        self.transactions = transactions
        self.journal = journal
        self.clock = clock
        self.check = check
        self.depths = depths
        self.dead_letters = dead_letters
        self.interval = interval
        self.sessions = WebSessions()
        self.history = DepthHistory()
        self._sampler: asyncio.Task[None] | None = None

    def add_routes(self, app: web.Application) -> None:
        """Add the dashboard to `app` (before it starts)."""
        router = app.router
        router.add_get("/", self._home)  # the HTTP port's root: the dashboard
        router.add_get(ROOT, self._home)
        router.add_get(f"{ROOT}/", self._home)
        router.add_get(f"{ROOT}/static/dashboard.css", self._style)
        router.add_get(f"{ROOT}/static/icon.svg", self._icon)
        router.add_get(f"{ROOT}/login", self._login_form)
        router.add_post(f"{ROOT}/login", self._login)
        pages: dict[str, tuple[str, PageFn]] = {
            "queues": ("queues", self._queues),
            "queue": ("queues", self._queue),
            "conversations": ("conversations", self._conversations),
            "transmission": ("transmission", self._transmission),
            "connections": ("connections", self._connections),
            "tasks": ("tasks", self._tasks),
            "tables": ("tables", self._tables),
            "poison": ("poison", self._poison),
            "message": ("poison", self._message),
        }
        for path, (here, page) in pages.items():
            router.add_get(f"{ROOT}/{path}", self._page(here, page))
        actions: dict[str, ActionFn] = {
            "logout": self._logout,
            "enable-queue": self._enable_queue,
            "end-conversation": self._end_conversation,
            "requeue": self._requeue,
        }
        for path, action in actions.items():
            router.add_post(f"{ROOT}/{path}", self._action(path, action))

    def start(self) -> None:
        """Start sampling queue depths (on the running loop, until `close`)."""
        self._sampler = asyncio.get_running_loop().create_task(self._sample())

    async def close(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

    def login_changed(self, name: str) -> None:
        """A login's password changed or it was dropped: its web sessions end."""
        ended = self.sessions.forget_login(name)
        if ended:
            log.info("ended %d dashboard session(s) of login %r: it changed", ended, name)

    async def _sample(self) -> None:
        while True:
            try:
                self.history.sample(time.time(), self.depths())
            except Exception:  # a bug here must not end the sampling for good
                log.exception("sampling queue depths for the dashboard failed")
            await asyncio.sleep(self.interval)

    # ---- plumbing ------------------------------------------------------------------------

    def _session_of(self, request: web.Request) -> WebSession | None:
        return self.sessions.find(request.cookies.get(COOKIE))

    def _page(self, here: str, page: PageFn) -> Handler:
        async def serve(request: web.Request) -> web.StreamResponse:
            session = self._session_of(request)
            if session is None:
                return redirect(url("login", next=request.path_qs))
            title, body = await page(request, session)
            return page_response(layout(title, body, session, here))

        return serve

    def _action(self, name: str, action: ActionFn) -> Handler:
        async def serve(request: web.Request) -> web.StreamResponse:
            session = self._session_of(request)
            form = await request.post()
            why = self._cross_site(request, session, form)
            if why is not None:
                log.warning("dashboard %s from %s refused (403): %s", name, peer_of(request), why)
                return forbidden(why)
            assert session is not None
            target, done = await action(request, session, form)
            if done:
                session.flash.append(("ok", done))
            response = redirect(target)
            if self._session_of(request) is None:  # the action ended it: the cookie goes too
                response.del_cookie(COOKIE, path=ROOT)
            return response

        return serve

    def _cross_site(
        self, request: web.Request, session: WebSession | None, form: MultiDictProxy[Any]
    ) -> str | None:
        """Why a state-changing request is refused, or None."""
        if session is None:
            return "no dashboard session (it expired or never was): log in again"
        if not same_origin(request):
            return "the request does not come from this dashboard's own pages (Origin/Referer)"
        token = form.get("csrf")
        if not isinstance(token, str) or not hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), session.csrf.encode()
        ):
            return "the form's CSRF token is missing or wrong: reload the page and try again"
        return None

    async def _call(
        self, request: web.Request, session: WebSession, operation: str, **arguments: Any
    ) -> Any:
        """Run a client operation as the web session's login, with its permission checks.

        Raises:
            BrokerError: the broker's refusal, or an internal error (logged).
        """
        broker_session = self.transactions.open_session(session.user, peer_of(request))
        try:
            result = self.operations.call(broker_session, Request(0, operation, arguments))
            if inspect.isawaitable(result):
                result = await result
        except BrokerError:
            raise
        except Exception as exc:
            log.exception("dashboard: operation %s failed", operation)
            raise BrokerError(
                ErrorCode.INTERNAL_ERROR,
                f"internal error in {operation}; the broker logged it",
            ) from exc
        finally:
            self.transactions.close_session(broker_session)
        if not self.operations.observes(operation):
            await self._settled(operation)
        return result

    async def _settled(self, operation: str) -> None:
        try:
            await asyncio.wait_for(durable(self.journal, self.clock), DURABLE_WAIT)
        except TimeoutError:
            raise BrokerError(
                ErrorCode.INTERNAL_ERROR,
                f"{operation} was applied but is not durable after {DURABLE_WAIT:g} s:"
                " the store cannot write (see /healthz and the log)",
            ) from None

    async def _view(
        self, request: web.Request, session: WebSession, name: str, **arguments: Any
    ) -> tuple[Rows, str | None]:
        """A view's rows (ROW_LIMIT + 1 unless told), or the broker's refusal."""
        arguments.setdefault("limit", ROW_LIMIT + 1)
        try:
            rows = await self._call(request, session, "view", name=name, **arguments)
        except BrokerError as exc:
            return [], exc.message
        return list(rows), None

    async def _act(
        self, request: web.Request, session: WebSession, operation: str, **arguments: Any
    ) -> bool:
        """Run an action; a refusal becomes an error shown on the next page."""
        try:
            await self._call(request, session, operation, **arguments)
        except BrokerError as exc:
            session.flash.append(("error", exc.message))
            return False
        return True

    # ---- login -------------------------------------------------------------------------

    async def _home(self, request: web.Request) -> web.StreamResponse:
        return redirect(url("queues"))

    async def _style(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=STYLE, content_type="text/css", headers=HEADERS)

    async def _icon(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=ICON, content_type="image/svg+xml", headers=HEADERS)

    async def _login_form(self, request: web.Request) -> web.StreamResponse:
        target = local_target(request.query.get("next"))
        if self._session_of(request) is not None:
            return redirect(target)
        return page_response(login_page(target, ""))

    async def _login(self, request: web.Request) -> web.StreamResponse:
        peer = peer_of(request)
        if not same_origin(request):
            log.warning("dashboard login from %s refused (403): not from this host's form", peer)
            return forbidden("the login does not come from this dashboard's own form")
        form = await request.post()
        user, password = form.get("user"), form.get("password")
        target = local_target(form_field(form, "next"))
        if not isinstance(user, str) or not isinstance(password, str) or not user:
            return page_response(login_page(target, "give a login name and its password"))
        try:
            refused = await self.check(user, password, peer)
        except Exception:
            log.exception("checking the dashboard login of %r from %s failed", user, peer)
            refused = "the broker could not check the login; it logged why"
        if refused is not None:
            log.warning("dashboard login failed for %r from %s: %s", user, peer, refused)
            return page_response(login_page(target, refused))
        self.sessions.close(request.cookies.get(COOKIE))  # a new login, a new token
        token, _ = self.sessions.open(user)
        log.info("dashboard login %r from %s", user, peer)
        response = redirect(target)
        response.set_cookie(
            COOKIE, token, path=ROOT, httponly=True, samesite="Strict", secure=request.secure
        )
        return response

    async def _logout(
        self, request: web.Request, session: WebSession, form: MultiDictProxy[Any]
    ) -> tuple[str, str]:
        self.sessions.close(request.cookies.get(COOKIE))
        log.info("dashboard logout %r from %s", session.user, peer_of(request))
        return url("login"), ""

    # ---- queues ------------------------------------------------------------------------

    async def _queues(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        title = "Queues"
        # every queue (rows from memory), so the sort below sees the disabled ones
        queues, refused = await self._view(request, session, "service_queues", limit=LOOKUP_LIMIT)
        if refused is not None:
            return title, refusal(refused)
        monitors, monitor_refusal = await self._view(
            request, session, "queue_monitors", limit=LOOKUP_LIMIT
        )
        by_queue = {(m.get("database"), m.get("queue")): m for m in monitors}
        # queues that are off or disabled first: beyond the row limit they would be lost
        queues.sort(key=lambda q: bool(q.get("is_receive_enabled")))
        shown, note = capped(queues)
        rows = [
            self._queue_row(q, by_queue.get((q.get("database"), q.get("name"))), session)
            for q in shown
        ]
        headings = (
            "queue",
            "database",
            "status",
            "why",
            "max messages",
            "max bytes",
            "ready",
            "stored",
            "readers waiting",
            "activation",
            "",
        )
        body = table(headings, rows) + note
        if monitor_refusal is not None:
            body += refusal(monitor_refusal)
        return title, body

    @staticmethod
    def _queue_row(
        queue: Mapping[str, Any], monitor: Mapping[str, Any] | None, session: WebSession
    ) -> list[str]:
        name = queue.get("name")
        database = queue.get("database", DEFAULT_DATABASE)
        status, reason = queue_status(queue)
        # the dashboard's session is in master: it shows, and acts on, master's queues
        mine = database == DEFAULT_DATABASE
        enable = enable_button(status, name, session) if mine else ""
        return [
            link("queue", name, name=name) if mine else esc(name),
            esc(database),
            f'<span class="status-{esc(status)}">{esc(status)}</span>',
            esc(reason),
            esc(queue.get("max_messages")),
            esc(queue.get("max_bytes")),
            esc(queue.get("messages_ready")),
            esc(queue.get("messages_stored")),
            esc(queue.get("readers_waiting")),
            monitor_text(monitor),
            enable,
        ]

    async def _queue(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        name = request.query.get("name", "")[:MAX_NAME]
        title = f"Queue {name}"
        queues, refused = await self._view(request, session, "service_queues", limit=LOOKUP_LIMIT)
        if refused is not None:
            return title, refusal(refused)
        found = [
            q
            for q in queues
            if q.get("name") == name and q.get("database", DEFAULT_DATABASE) == DEFAULT_DATABASE
        ]
        if not found:
            return title, refusal(f"queue '{name}' does not exist")
        row = found[0]
        status, reason = queue_status(row)
        enable = enable_button(status, name, session)
        series = self.history.series(name)
        chart = (
            depth_chart(series)
            if series is not None
            else f'<p class="note">No history is kept for this queue: the dashboard charts'
            f" at most {MAX_CHARTED_QUEUES} queues.</p>"
        )
        details = table(("column", "value"), ([esc(k), esc(v)] for k, v in row.items()))
        summary = (
            f'<p>Status <span class="status-{esc(status)}">{esc(status)}</span> {esc(reason)}</p>'
        )
        return title, (
            f"{summary}{enable}<h2>Messages ready over time</h2>{chart}<h2>Definition and state"
            f"</h2>{details}"
        )

    async def _enable_queue(
        self, request: web.Request, session: WebSession, form: MultiDictProxy[Any]
    ) -> tuple[str, str]:
        name = form_field(form, "queue")
        if await self._act(request, session, "alter_queue", name=name, status="ON"):
            log.info("dashboard: login %r enabled queue %r", session.user, name)
            return url("queues"), f"queue '{name}' is ON"
        return url("queues"), ""

    # ---- conversations -----------------------------------------------------------------

    async def _conversations(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        title = "Conversations and groups"
        wanted = request.query.get("handle", "").strip()[:MAX_NAME]
        search = (
            f'<form method="get" action="{esc(url("conversations"))}">'
            f'<label>Conversation handle <input name="handle" value="{esc(wanted)}"'
            ' size="40"></label> <button>Find</button></form>'
        )
        if wanted:
            return title, search + await self._found_conversation(request, session, wanted)
        endpoints, refused = await self._view(request, session, "conversation_endpoints")
        if refused is not None:
            return title, search + refusal(refused)
        groups, groups_refused = await self._view(request, session, "conversation_groups")
        body = search + "<h2>Conversation endpoints</h2>" + self._endpoints(endpoints, session)
        body += "<h2>Conversation groups</h2>"
        body += refusal(groups_refused) if groups_refused else self._groups(groups)
        return title, body

    async def _found_conversation(
        self, request: web.Request, session: WebSession, wanted: str
    ) -> str:
        try:
            handle = uuid.UUID(wanted)
        except ValueError:
            return refusal(f"'{wanted}' is not a conversation handle (a UUID)")
        endpoints, refused = await self._view(
            request, session, "conversation_endpoints", limit=SEARCH_LIMIT
        )
        if refused is not None:
            return refusal(refused)
        found = [
            e
            for e in endpoints
            if str(e.get("conversation_handle")) == str(handle)
            or str(e.get("conversation_id")) == str(handle)
        ]
        if not found:
            searched = "" if len(endpoints) < SEARCH_LIMIT else f" (searched {SEARCH_LIMIT:,})"
            return f'<p class="note">No conversation endpoint {esc(handle)}{searched}.</p>'
        return self._endpoints(found, session)

    @staticmethod
    def _endpoints(endpoints: Rows, session: WebSession) -> str:
        shown, note = capped(endpoints)
        if not shown:
            return '<p class="note">None.</p>'
        rows = []
        for e in shown:
            handle = e.get("conversation_handle")
            end = button("end-conversation", "End with cleanup", session.csrf, handle=handle)
            side = "initiator" if e.get("is_initiator") else "target"
            cells = [esc(e.get(key)) for key, _ in ENDPOINT_COLUMNS]
            rows.append([link("conversations", handle, handle=handle), esc(side), *cells, end])
        headings = ["handle", "side", *(h for _, h in ENDPOINT_COLUMNS), ""]
        return table(headings, rows) + note

    @staticmethod
    def _groups(groups: Rows) -> str:
        shown, note = capped(groups)
        return plain_table(shown) + note

    async def _end_conversation(
        self, request: web.Request, session: WebSession, form: MultiDictProxy[Any]
    ) -> tuple[str, str]:
        handle = form_field(form, "handle")
        if await self._act(request, session, "end_conversation", handle=handle, cleanup=True):
            log.info("dashboard: login %r ended conversation %s with cleanup", session.user, handle)
            return url("conversations"), f"conversation {handle} ended with cleanup"
        return url("conversations", handle=handle), ""

    # ---- the transmission queue, broker connections, activated tasks --------------------

    async def _transmission(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        title = "Transmission queue"
        after = whole_number(request.query.get("after"))
        rows, refused = await self._view(request, session, "transmission_queue", after=after)
        if refused is not None:
            return title, refusal(refused)
        shown, _ = capped(rows)
        cells = ([esc(row.get(key)) for key, _ in TRANSMISSION_COLUMNS] for row in shown)
        headings = [h for _, h in TRANSMISSION_COLUMNS]
        body = table(headings, cells) if shown else '<p class="note">Empty.</p>'
        ids = [row["id"] for row in shown if isinstance(row.get("id"), int)]
        if len(rows) > ROW_LIMIT and ids:
            body += f"<p>{link('transmission', 'Next page', after=ids[-1])}</p>"
        return title, body

    async def _connections(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        """The daemons of this broker (which one serves: this page's; which stand by), then
        the connections to other brokers."""
        daemons = await self._plain_view(request, session, "broker_nodes")
        links = await self._plain_view(request, session, "broker_connections")
        body = f"<h2>Daemons of this broker</h2>{daemons}<h2>Links to other brokers</h2>{links}"
        return "Broker connections", body

    async def _tasks(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        return "Activated tasks", await self._plain_view(request, session, "activated_tasks")

    async def _tables(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        """Users' tables, by database, and their rows."""
        return "Tables", await self._plain_view(request, session, "tables")

    async def _plain_view(self, request: web.Request, session: WebSession, name: str) -> str:
        rows, refused = await self._view(request, session, name)
        if refused is not None:
            return refusal(refused)
        shown, note = capped(rows)
        return plain_table(shown) + note

    # ---- poison messages and dead letters ------------------------------------------------

    async def _poison(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        title = "Poison messages and dead letters"
        incidents, refused = await self._view(request, session, "poison_messages")
        body = "<h2>Poison incidents</h2>"
        if refused is not None:
            body += refusal(refused)
            queues: list[str] = []
        else:
            shown, note = capped(incidents)
            body += plain_table(shown) + note
            queues = self.dead_letters()
        chosen = request.query.get("queue", "")[:MAX_NAME] or (queues[0] if queues else "")
        body += "<h2>Dead letters</h2>"
        if queues:
            body += (
                "<p>Dead-letter queues: "
                + ", ".join(link("poison", q, queue=q) for q in queues)
                + "</p>"
            )
        if not chosen:
            return title, body + '<p class="note">No queue has a dead-letter policy.</p>'
        after = whole_number(request.query.get("after"))
        return title, body + await self._dead_letters(request, session, chosen, after)

    async def _dead_letters(
        self, request: web.Request, session: WebSession, queue: str, after: int | None
    ) -> str:
        messages, refused = await self._view(request, session, f"queue:{queue}", after=after)
        body = f"<h3>In queue {esc(queue)}</h3>"
        if refused is not None:
            return body + refusal(refused)
        shown, _ = capped(messages)
        rows = [
            [
                link("message", m.get("queuing_order"), queue=queue, order=m.get("queuing_order")),
                esc(m.get("conversation_handle")),
                esc(m.get("message_type_name")),
                esc(m.get("delivery_count")),
                esc(m.get("dead_letter_reason")),
                esc(m.get("message_body")),
                self._requeue_button(queue, m, session),
            ]
            for m in shown
        ]
        headings = ("queuing order", "handle", "message type", "deliveries", "why", "body", "")
        body += table(headings, rows) if rows else '<p class="note">Empty.</p>'
        if len(messages) > ROW_LIMIT:
            last = shown[-1].get("queuing_order")
            body += f"<p>{link('poison', 'Next page', queue=queue, after=last)}</p>"
        return body

    @staticmethod
    def _requeue_button(queue: str, message: Mapping[str, Any], session: WebSession) -> str:
        if message.get("dead_letter_reason") is None:
            return ""
        order = message.get("queuing_order")
        return button("requeue", "Requeue", session.csrf, queue=queue, order=order)

    async def _message(self, request: web.Request, session: WebSession) -> tuple[str, str]:
        queue = request.query.get("queue", "")[:MAX_NAME]
        order = whole_number(request.query.get("order"))
        title = f"Message {order} in {queue}"
        if order is None:
            return title, refusal("order must be a message's queuing order (a whole number)")
        found, refused = await self._view(
            request, session, f"queue:{queue}", after=order - 1, limit=1
        )
        if refused is not None:
            return title, refusal(refused)
        if not found or found[0].get("queuing_order") != order:
            return title, refusal(
                f"queue '{queue}' holds no message {order} now (received, moved or never there)"
            )
        message = found[0]
        body = message.get("message_body") or b""
        columns = [[esc(k), esc(v)] for k, v in message.items() if k != "message_body"]
        text = body_text(body, BODY_LIMIT) if isinstance(body, bytes) else str(body)
        return title, (
            table(("column", "value"), columns)
            + self._requeue_button(queue, message, session)
            + f'<h2>Body ({len(body):,} bytes)</h2><pre class="body">{esc(text)}</pre>'
        )

    async def _requeue(
        self, request: web.Request, session: WebSession, form: MultiDictProxy[Any]
    ) -> tuple[str, str]:
        queue, order = form_field(form, "queue"), whole_number(form_field(form, "order"))
        if order is None:
            session.flash.append(("error", "order must be a dead letter's queuing order"))
        elif await self._act(
            request, session, "requeue_dead_letter", queue=queue, queuing_order=order
        ):
            log.info(
                "dashboard: login %r requeued dead letter %d of %r", session.user, order, queue
            )
            return url("poison", queue=queue), f"dead letter {order} went back to its conversation"
        return url("poison", queue=queue), ""
