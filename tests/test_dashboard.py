"""The web dashboard, in a real headless Chromium (Playwright) against real daemons.

Debian's `chromium` package is the browser: Playwright drives it by its path, and these
tests fail, saying what to install, when it is missing. Cross-site requests are sent
with aiohttp's client, since a browser would not let a page forge them.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from daemon import BrokerProcess
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright

from ssb import client
from ssb.broker._dashboard import sessions as web_sessions
from ssb.broker._dashboard.history import DepthHistory, depth_chart
from ssb.broker._dashboard.sessions import SESSION_LIFETIME, WebSessions
from ssb.tools import wait_until

pytestmark = pytest.mark.slow  # a real browser

TESTS_DIR = Path(__file__).parent
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SAMPLE_INTERVAL = 0.1  # seconds between the dashboard's depth samples, for the chart
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>&amp;"
TIMEOUT_MS = 10_000


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "the dashboard tests drive Debian's Chromium and none was found on the PATH:"
            " install the `chromium` package (sudo apt-get install chromium)"
        )
    return found


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    """The tests' broker: the HTTP port on, depth samples often."""
    return {"config": {"http_port": 0, "chart_sample_seconds": SAMPLE_INTERVAL}, "cwd": TESTS_DIR}


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = chromium_path()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


class Watched:
    """A page whose console errors, script errors and dialogs are collected."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        page.set_default_timeout(TIMEOUT_MS)
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        page.on("dialog", lambda dialog: self.errors.append(f"dialog: {dialog.message}"))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")


async def new_page(browser: Browser) -> Watched:
    context = await browser.new_context()
    return Watched(await context.new_page())


async def log_in(page: Page, broker: BrokerProcess, user: str, password: str) -> None:
    """Fill the login form: the one on the page, or the login page's."""
    if "/dashboard/login" not in page.url:
        await page.goto(f"{broker.http_url}/dashboard/login")
    await page.fill("input[name=user]", user)
    await page.fill("input[name=password]", password)
    async with page.expect_navigation():
        await page.click("form.login button")


async def admin_page(browser: Browser, broker: BrokerProcess) -> Watched:
    watched = await new_page(browser)
    await log_in(watched.page, broker, "admin", broker.admin_password())
    assert watched.page.url.endswith("/dashboard/queues"), watched.page.url
    return watched


async def queue_row(page: Page, queue: str) -> str:
    return await page.locator(
        "tr", has=page.locator(f"td:first-child >> text='{queue}'")
    ).inner_text()


async def disable_by_poison(conn: client.Connection, queue: str) -> None:
    """Five rollbacks in a row of a receiving transaction: Service Broker disables it."""
    await conn.create_queue("Replies")
    await conn.create_service("Client", queue="Replies")
    await conn.create_queue(queue)
    await conn.create_service(f"{queue}Service", queue=queue, contracts=["DEFAULT"])
    handle = await conn.begin_dialog("Client", f"{queue}Service")
    await conn.send(handle, body="poison")
    for _ in range(5):
        await conn.begin_transaction()
        assert await conn.receive(queue, top=1, timeout=5)
        await conn.rollback(error="boom")


async def with_dead_letter(conn: client.Connection) -> int:
    """Orders moves a message that failed once to OrdersDLQ; returns its queuing order."""
    await conn.create_queue("OrdersDLQ")
    await conn.create_queue(
        "Orders",
        poison_policy={"threshold": 1, "action": "dead_letter", "dead_letter_queue": "OrdersDLQ"},
    )
    await conn.create_service("Shop", queue="Orders", contracts=["DEFAULT"])
    await conn.create_queue("Buyers")
    await conn.create_service("Buyer", queue="Buyers")
    handle = await conn.begin_dialog("Buyer", "Shop")
    await conn.send(handle, body=HOSTILE)
    await conn.begin_transaction()
    assert await conn.receive("Orders", top=1, timeout=5)
    await conn.rollback(error="cannot parse <order>")
    (letter,) = await conn.peek("OrdersDLQ")
    return int(letter.queuing_order)


# ---- tests ---------------------------------------------------------------------------------


async def test_every_page_loads_without_console_errors(
    broker: BrokerProcess, conn: client.Connection, browser: Browser
) -> None:
    order = await with_dead_letter(conn)
    (endpoint, *_) = await conn.view("conversation_endpoints")
    handle = endpoint["conversation_handle"]
    await conn.create_queue("Held")  # a local queue that is OFF holds what is sent to it
    await conn.create_service("HeldService", queue="Held", contracts=["DEFAULT"])
    await conn.alter_queue("Held", status="OFF")
    await conn.send(await conn.begin_dialog("Buyer", "HeldService"), body="waits")
    # a service no route leads to yet: its message waits, saying so
    await conn.send(await conn.begin_dialog("Buyer", "RoutedLater"), body="waits too")
    await conn.execute("CREATE TABLE Ledger (id INT PRIMARY KEY)")
    await conn.execute("INSERT INTO Ledger VALUES (1), (2), (3)")
    watched = await admin_page(browser, broker)
    page = watched.page
    paths = {
        "/dashboard/queues": "Queues",
        "/dashboard/queue?name=Orders": "Queue Orders",
        "/dashboard/conversations": "Conversations and groups",
        f"/dashboard/conversations?handle={handle}": "Conversations and groups",
        "/dashboard/transmission": "Transmission queue",
        "/dashboard/connections": "Broker connections",
        "/dashboard/tasks": "Activated tasks",
        "/dashboard/tables": "Tables",
        "/dashboard/poison": "Poison messages and dead letters",
        f"/dashboard/message?queue=OrdersDLQ&order={order}": f"Message {order} in OrdersDLQ",
    }
    for path, title in paths.items():
        response = await page.goto(f"{broker.http_url}{path}")
        assert response is not None and response.status == 200, path
        assert await page.inner_text("h1") == title
        assert "internal error" not in await page.inner_text("main"), path
    assert watched.errors == []

    # what the pages show, escaped: the body is text, never markup
    assert await page.inner_text("pre.body") == HOSTILE
    assert "cannot parse <order>" in await page.inner_text("main")
    await page.goto(f"{broker.http_url}/dashboard/transmission")
    shown = await page.inner_text("table")
    assert "disabled" in shown  # why the message to Held waits
    assert "no route to service 'RoutedLater'" in shown
    await page.goto(f"{broker.http_url}/dashboard/connections")
    daemons = await page.inner_text("table")  # this broker's one daemon serves
    assert "active" in daemons and "standby" not in daemons
    await page.goto(f"{broker.http_url}/dashboard/conversations?handle={handle}")
    assert str(handle) in await page.inner_text("table")
    await page.goto(f"{broker.http_url}/dashboard/tables")
    assert "master\tledger\t3" in await page.inner_text("table")  # its rows, counted
    assert watched.errors == []


async def test_a_login_is_required(broker: BrokerProcess, browser: Browser) -> None:
    watched = await new_page(browser)
    page = watched.page
    await page.goto(f"{broker.http_url}/dashboard/transmission")
    assert "/dashboard/login" in page.url and await page.inner_text("h1") == "Log in"

    await log_in(page, broker, "admin", "not-the-password")
    assert "/dashboard/login" in page.url
    assert "login failed for user 'admin'" in await page.inner_text("main")
    await page.goto(f"{broker.http_url}/dashboard/queues")
    assert await page.inner_text("h1") == "Log in"

    # the right password goes on to the page first asked for
    await page.goto(f"{broker.http_url}/dashboard/transmission")
    await log_in(page, broker, "admin", broker.admin_password())
    assert page.url.endswith("/dashboard/transmission")
    assert await page.inner_text("h1") == "Transmission queue"

    async with page.expect_navigation():
        await page.click("header button")  # log out
    assert await page.inner_text("h1") == "Log in"
    await page.goto(f"{broker.http_url}/dashboard/queues")
    assert await page.inner_text("h1") == "Log in"
    log = broker.log_text()
    assert "dashboard login failed for 'admin'" in log and "dashboard login 'admin'" in log
    assert "not-the-password" not in log and broker.admin_password() not in log


async def test_a_poisoned_queue_shows_why_and_is_enabled_by_a_click(
    broker: BrokerProcess, conn: client.Connection, browser: Browser
) -> None:
    await disable_by_poison(conn, "Work")
    watched = await admin_page(browser, broker)
    page = watched.page
    row = await queue_row(page, "Work")
    assert "disabled" in row and "poison message detected after 5" in row, row
    assert "ON" in await queue_row(page, "Replies")
    assert await page.locator("tr", has_text="Replies").locator("button").count() == 0

    async with page.expect_navigation():
        await page.locator("tr", has_text="Work").get_by_role("button", name="Enable").click()
    assert "queue 'Work' is ON" in await page.inner_text("main")
    assert "poison" not in await queue_row(page, "Work")
    (queue,) = [q for q in await conn.view("service_queues") if q["name"] == "Work"]
    assert queue["is_receive_enabled"] is True
    (again,) = await conn.receive("Work", timeout=5)
    assert again.message_body == b"poison"
    assert watched.errors == []


async def test_a_queue_depth_chart_is_drawn(
    broker: BrokerProcess, conn: client.Connection, browser: Browser
) -> None:
    await conn.create_queue("Deep")
    await conn.create_service("DeepService", queue="Deep", contracts=["DEFAULT"])
    await conn.create_queue("Senders")
    await conn.create_service("Sender", queue="Senders")
    handle = await conn.begin_dialog("Sender", "DeepService")
    watched = await admin_page(browser, broker)
    page = watched.page

    async def points() -> list[str]:
        await page.goto(f"{broker.http_url}/dashboard/queue?name=Deep")
        line = page.locator("svg.chart polyline")
        if not await line.count():
            return []
        found = (await line.get_attribute("points") or "").split()
        return found if len(found) >= 3 else []

    await wait_until(points, "a chart of 3 samples or more", timeout=15)
    for n in range(5):
        await conn.send(handle, body=f"m{n}")

    # the line rises (its last point is higher, a smaller y, than the first) up to a
    # sample that saw all 5 (its top label; an earlier sample may have seen fewer)
    async def risen() -> bool:
        drawn = await points()
        ys = [float(p.split(",")[1]) for p in drawn]
        if not ys or ys[-1] >= ys[0]:
            return False
        return await page.locator("svg.chart text", has_text="5").count() >= 1

    await wait_until(risen, "the chart to show the 5 messages", timeout=15)
    assert watched.errors == []


async def test_requeue_a_dead_letter_and_end_a_conversation_by_click(
    broker: BrokerProcess, conn: client.Connection, browser: Browser
) -> None:
    order = await with_dead_letter(conn)
    watched = await admin_page(browser, broker)
    page = watched.page
    await page.goto(f"{broker.http_url}/dashboard/poison")
    row = page.locator("tr", has_text="cannot parse")
    assert "OrdersDLQ" in await page.inner_text("main")
    async with page.expect_navigation():
        await (
            page.locator("tr", has=page.locator(f"a >> text='{order}'"))
            .get_by_role("button", name="Requeue")
            .click()
        )
    assert f"dead letter {order} went back to its conversation" in await page.inner_text("main")
    assert await conn.peek("OrdersDLQ") == []
    (back,) = await conn.peek("Orders")
    assert back.message_body == HOSTILE.encode()
    assert await row.count() == 1  # the incident stays on record

    (initiator,) = [e for e in await conn.view("conversation_endpoints") if e["is_initiator"]]
    handle = str(initiator["conversation_handle"])
    await page.goto(f"{broker.http_url}/dashboard/conversations?handle={handle}")
    async with page.expect_navigation():
        await page.get_by_role("button", name="End with cleanup").click()
    assert f"conversation {handle} ended with cleanup" in await page.inner_text("main")
    # with cleanup the far side is not told: no EndDialog arrives, only the requeued message
    assert [m.message_type_name for m in await conn.peek("Orders")] == ["DEFAULT"]
    assert handle not in [
        str(e["conversation_handle"]) for e in await conn.view("conversation_endpoints")
    ]
    assert watched.errors == []


async def test_a_login_without_grants_sees_the_refusal(
    broker: BrokerProcess, conn: client.Connection, browser: Browser
) -> None:
    await conn.create_queue("Secret")
    await conn.create_login("viewer", "viewer-password")
    watched = await new_page(browser)
    page = watched.page
    await log_in(page, broker, "viewer", "viewer-password")
    for path in ("queues", "queue?name=Secret", "conversations", "transmission", "poison"):
        await page.goto(f"{broker.http_url}/dashboard/{path}")
        text = await page.inner_text("main")
        assert "login 'viewer' lacks VIEW on the broker" in text, (path, text)
        assert await page.locator("main table").count() == 0, path
    await page.goto(f"{broker.http_url}/dashboard/queues")
    assert "Secret" not in await page.inner_text("main")
    await page.goto(f"{broker.http_url}/dashboard/poison?queue=Secret")
    assert "lacks RECEIVE on queue 'Secret'" in await page.inner_text("main")
    assert watched.errors == []

    await conn.alter_login("viewer", "another-password")  # its web sessions end
    await page.goto(f"{broker.http_url}/dashboard/queues")
    assert await page.inner_text("h1") == "Log in"


async def test_cross_site_posts_are_refused(broker: BrokerProcess, conn: client.Connection) -> None:
    await conn.create_queue("Guarded")
    await conn.alter_queue("Guarded", status="OFF")
    base = broker.http_url
    host = base.split("://", 1)[1]
    own = {"Origin": base}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        form = {"user": "admin", "password": broker.admin_password(), "next": "/dashboard/queues"}
        async with http.post(
            f"{base}/dashboard/login",
            data=form,
            headers={"Origin": "http://evil.example"},
            allow_redirects=False,
        ) as refused:
            assert refused.status == 403
        async with http.post(
            f"{base}/dashboard/login", data=form, headers=own, allow_redirects=False
        ) as login:
            assert login.status == 303
        async with http.get(f"{base}/dashboard/queues") as page:
            text = await page.text()
        (token,) = set(re.findall(r'name="csrf" value="([^"]+)"', text))

        async def enable(data: dict[str, str], headers: dict[str, str]) -> int:
            async with http.post(
                f"{base}/dashboard/enable-queue",
                data=data,
                headers=headers,
                allow_redirects=False,
            ) as answer:
                return answer.status

        assert await enable({"queue": "Guarded"}, own) == 403  # no token
        assert await enable({"queue": "Guarded", "csrf": token[:-2] + "xx"}, own) == 403
        assert (
            await enable({"queue": "Guarded", "csrf": token}, {"Origin": "http://evil.example"})
            == 403
        )
        assert (
            await enable({"queue": "Guarded", "csrf": token}, {"Origin": f"https://{host}"}) == 403
        )
        assert await enable({"queue": "Guarded", "csrf": token}, {}) == 403  # no Origin, no Referer
        assert (
            await enable({"queue": "Guarded", "csrf": token}, {"Referer": "http://evil.example/x"})
            == 403
        )
        async with http.get(f"{base}/dashboard/enable-queue?queue=Guarded") as get:
            assert get.status == 405
        (queue,) = [q for q in await conn.view("service_queues") if q["name"] == "Guarded"]
        assert queue["is_receive_enabled"] is False  # nothing changed

        # the same request from the dashboard's own page goes through
        referer = {"Referer": f"{base}/dashboard/queues"}
        assert await enable({"queue": "Guarded", "csrf": token}, referer) == 303
        (queue,) = [q for q in await conn.view("service_queues") if q["name"] == "Guarded"]
        assert queue["is_receive_enabled"] is True
    async with (
        aiohttp.ClientSession() as stranger,  # no dashboard session at all
        stranger.post(
            f"{base}/dashboard/enable-queue",
            data={"queue": "Guarded", "csrf": token},
            headers=own,
            allow_redirects=False,
        ) as answer,
    ):
        assert answer.status == 403
    assert "dashboard enable-queue from" in broker.log_text()


# ---- the parts without a browser -----------------------------------------------------------


def test_web_sessions_end_when_idle_or_old_and_stay_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    sessions = WebSessions(clock=lambda: now[0])
    idle, _ = sessions.open("a")
    busy, _ = sessions.open("b")
    for _ in range(4):  # b is used every 10 minutes, a never again
        now[0] += 600
        assert sessions.find(busy) is not None
    assert sessions.find(idle) is None  # 40 minutes idle
    now[0] = SESSION_LIFETIME + 1
    assert sessions.find(busy) is None  # older than its lifetime, however busy
    assert sessions.find("forged") is None and sessions.find(None) is None

    monkeypatch.setattr(web_sessions, "MAX_SESSIONS", 3)
    tokens = [sessions.open("c")[0] for _ in range(5)]
    assert len(sessions) == 3 and sessions.find(tokens[0]) is None
    assert sessions.forget_login("c") == 3 and sessions.find(tokens[-1]) is None

    # one login logging in again and again ends its own oldest sessions, no one else's
    monkeypatch.setattr(web_sessions, "MAX_SESSIONS", 1000)
    admin, _ = sessions.open("admin")
    many = [sessions.open("pest")[0] for _ in range(web_sessions.SESSIONS_PER_LOGIN + 5)]
    assert sessions.find(admin) is not None and sessions.find(many[0]) is None
    assert sessions.forget_login("pest") == web_sessions.SESSIONS_PER_LOGIN


def test_depth_history_is_bounded_and_forgets_dropped_queues() -> None:
    history = DepthHistory(points=4, max_queues=2)
    for t in range(6):
        history.sample(float(t), {"A": t, "B": 10 * t, "C": 1})
    assert history.series("A") == [(2.0, 2), (3.0, 3), (4.0, 4), (5.0, 5)]
    assert history.series("C") is None  # beyond max_queues
    history.sample(6.0, {"B": 7, "D": 0})
    assert history.series("A") is None and history.series("D") == [(6.0, 0)]
    chart = depth_chart(history.series("B") or [])
    assert chart.count("<polyline") == 1 and len(chart.split('points="')[1].split()) == 4
    assert "Not enough samples" in depth_chart(history.series("D") or [])
