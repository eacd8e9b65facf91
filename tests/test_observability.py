"""Seeing into a running broker: /metrics, /healthz, systemd's notification, the log."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import resource
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request
from daemon import BrokerProcess, one_error_line, serve_once
from federation_setup import (
    CONTRACT,
    REQUEST,
    Federation,
    create_contract,
    create_initiator,
    create_target,
    link,
)
from prometheus_client.parser import text_string_to_metric_families
from setup_objects import activated_service

from ssb import client
from ssb.tools import wait_until


@pytest.fixture
def observed(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker with its HTTP port on (any free port)."""
    process = BrokerProcess(tmp_path / "data", config={"http_port": 0}).start()
    yield process
    process.kill()


async def scrape(url: str, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, parsed by prometheus-client's own parser."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics", headers=headers) as r:
        assert r.status == 200, await r.text()
        text = await r.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def of_queue(samples: dict[Any, float], name: str, queue: str) -> float:
    return samples[(name, (("queue", queue),))]


async def health(url: str, path: str = "/healthz") -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}{path}") as r:
        return r.status, await r.json()


async def refused_for_quota(conn: client.Connection, queue: str) -> None:
    """A queue (and its service, of the same name) with room for one message: the second
    SEND to it is refused for its quota."""
    await conn.create_queue(queue, max_messages=1)
    await conn.create_service(queue, queue=queue, contracts=["DEFAULT"])
    handle = await conn.begin_dialog(queue, queue)
    await conn.send(handle, body=b"one")
    with pytest.raises(client.QueueFullError):
        await conn.send(handle, body=b"two")


async def test_metrics_match_the_views(observed: BrokerProcess) -> None:
    async with await client.connect(observed.url) as conn:
        await conn.create_queue("Orders")
        await conn.create_service("OrderService", queue="Orders", contracts=["DEFAULT"])
        handle = await conn.begin_dialog("OrderService", "OrderService")
        for i in range(30):
            await conn.send(handle, body=b"x" * (100 + i))
        async with conn.transaction():
            got = await conn.receive("Orders", top=5)
        assert len(got) == 5
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                assert len(await conn.receive("Orders", top=3)) == 3
                raise RuntimeError("roll back")

        samples = await scrape(observed.http_url)
        (row,) = [q for q in await conn.view("service_queues") if q["name"] == "Orders"]
        assert (
            of_queue(samples, "ssb_queue_messages_ready", "Orders") == row["messages_ready"] == 25
        )
        assert of_queue(samples, "ssb_queue_messages", "Orders") == row["messages_stored"]
        assert of_queue(samples, "ssb_queue_bytes", "Orders") == row["bytes_stored"]
        assert of_queue(samples, "ssb_queue_enabled", "Orders") == 1
        assert of_queue(samples, "ssb_queue_enqueued_total", "Orders") == 30
        assert of_queue(samples, "ssb_queue_received_total", "Orders") == 5
        assert of_queue(samples, "ssb_queue_rolled_back_total", "Orders") == 3
        assert of_queue(samples, "ssb_queue_oldest_message_age_seconds", "Orders") > 0
        assert samples[("ssb_sessions", ())] >= 1
        assert samples[("ssb_store_commit_seconds_count", ())] > 0
        assert samples[("ssb_store_commit_rows_sum", ())] >= 30

        # a reader waiting shows, and a queue going off shows
        await conn.create_queue("Empty")
        waiting = asyncio.ensure_future(receive_waiting(observed.url, "Empty"))
        await wait_until(
            lambda: _queue_sample(observed.http_url, "ssb_queue_readers_waiting", "Empty", 1),
            "a waiting reader in /metrics",
        )
        waiting.cancel()
        await conn.alter_queue("Orders", status="OFF")
        samples = await scrape(observed.http_url)
        assert of_queue(samples, "ssb_queue_enabled", "Orders") == 0

        # a SEND refused for a queue's quota counts
        quota = ("ssb_refused_for_room_total", (("reason", "quota"),))
        before = samples[quota]
        await refused_for_quota(conn, "Small")
        assert (await scrape(observed.http_url))[quota] == before + 1

    assert await health(observed.http_url) == (200, {"live": True, "ready": True, "role": "active"})
    assert (await health(observed.http_url, "/healthz/live"))[0] == 200


async def test_the_http_ports_root_leads_to_the_dashboard(observed: BrokerProcess) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{observed.http_url}/", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/dashboard/queues"
        async with http.get(f"{observed.http_url}/") as r:  # followed: the login form
            assert r.status == 200 and r.url.path == "/dashboard/login", r.url
        async with http.get(f"{observed.http_url}/healthz") as r:
            assert r.status == 200
        async with http.get(f"{observed.http_url}/metrics") as r:
            assert r.status == 200


async def receive_waiting(url: str, queue: str) -> None:
    async with await client.connect(url) as other, other.transaction():
        await other.receive(queue, top=1, timeout=30)


async def _queue_sample(url: str, name: str, queue: str, value: float) -> bool:
    return of_queue(await scrape(url), name, queue) == value


async def test_healthz_says_not_ready_while_messages_are_refused(tmp_path: Path) -> None:
    process = BrokerProcess(
        tmp_path / "data", config={"http_port": 0, "min_free_disk": 1 << 50}
    ).start()
    try:

        async def not_ready() -> dict[str, Any] | None:
            status, body = await health(process.http_url)
            return body if status == 503 else None

        body = await wait_until(not_ready, "/healthz to say not ready")
        assert body["live"] is True and body["ready"] is False
        assert "min_free_disk" in body["reason"] or "disk" in body["reason"]
        samples = await scrape(process.http_url)
        assert samples[("ssb_refusing_messages", ())] == 1
        async with await client.connect(process.url) as conn:
            await conn.create_queue("Q")
            await conn.create_service("S", queue="Q", contracts=["DEFAULT"])
            for _ in range(2):
                with pytest.raises(client.DiskFullError):
                    await conn.begin_dialog("S", "S")
        await log_has(process, "below min_free_disk", "refusing new messages", "refused ")
        samples = await scrape(process.http_url)
        assert samples[("ssb_refused_for_room_total", (("reason", "disk"),))] == 2
        assert samples[("ssb_refused_for_room_total", (("reason", "quota"),))] == 0
    finally:
        process.kill()


async def test_the_grafana_dashboard_uses_only_metrics_the_broker_has(
    observed: BrokerProcess,
) -> None:
    async with await client.connect(observed.url) as conn:
        await conn.create_queue("Q")  # per-queue families have samples only with a queue
    async with aiohttp.ClientSession() as http, http.get(f"{observed.http_url}/metrics") as r:
        text = await r.text()
    # every family (with samples or not), every sample name (histograms' _bucket, ...)
    names = set(re.findall(r"^# HELP (\S+)", text, re.M))
    names |= {name for name, _ in await scrape(observed.http_url)}
    dashboard = (Path(__file__).parent.parent / "deploy" / "grafana-dashboard.json").read_text()
    used = set(re.findall(r"\bssb_[a-z_]+", dashboard))
    assert used and used <= names, sorted(used - names)


async def test_a_foreign_host_name_on_loopback_is_refused(observed: BrokerProcess) -> None:
    """A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) gets
    nothing of what loopback callers may read."""
    port = observed.http_url.rsplit(":", 1)[1]
    async with aiohttp.ClientSession() as http:
        for host, status in (
            ("evil.example", 421),
            (f"evil.example:{port}", 421),
            (f"localhost:{port}", 200),
            (f"127.0.0.1:{port}", 200),
        ):
            async with http.get(f"{observed.http_url}/metrics", headers={"Host": host}) as r:
                assert r.status == status, host
    await log_has(observed, "Host 'evil.example' is not this server")


async def _raw_http(url: str, request: bytes) -> bytes:
    """The status line the HTTP port answers `request` (raw bytes) with."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


async def test_a_malformed_http_request_is_one_warning_not_a_traceback(
    observed: BrokerProcess,
) -> None:
    """Requests HTTP cannot parse are the caller's fault: each is answered 400 and logged
    as one line that names the caller and what was wrong, never as an error with a
    traceback (anyone who can reach the port could fill the log with them)."""
    tail = b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    malformed = {
        "a request line too long": b"GET /metrics?" + b"q" * 20_000 + tail + b"\r\n",
        "a byte HTTP does not allow": b"GET /dashboard/queues?\xff=1" + tail + b"\r\n",
        "too many headers": b"GET /healthz"
        + tail
        + b"".join(b"X-%d: y\r\n" % i for i in range(500))
        + b"\r\n",
    }
    for what, request in malformed.items():
        status = await _raw_http(observed.http_url, request)
        assert status.startswith(b"HTTP/1.0 400") or status.startswith(b"HTTP/1.1 400"), what
    assert await health(observed.http_url) == (200, {"live": True, "ready": True, "role": "active"})
    said = await log_has(observed, "HTTP request from 127.0.0.1 refused (400)")
    lines = [line for line in said.splitlines() if "refused (400)" in line]
    assert len(lines) == len(malformed) and all(" WARNING " in line for line in lines), lines
    assert "Traceback" not in said and " ERROR " not in said, said[-3000:]


async def test_idle_http_connections_cannot_starve_the_broker_of_file_descriptors(
    observed: BrokerProcess,
) -> None:
    """Whoever reaches the HTTP port may open connections and send nothing: beyond the
    port's limit they are closed at once (logged once), and an idle one is closed after
    IDLE_TIMEOUT, so the client port still takes new sessions and the broker works."""
    from ssb.broker._http import IDLE_TIMEOUT, MAX_CONNECTIONS

    descriptors = MAX_CONNECTIONS + 256  # the daemon's own files and sockets fit beside
    resource.prlimit(observed.pid, resource.RLIMIT_NOFILE, (descriptors, descriptors))
    host, port = observed.http_url.removeprefix("http://").rsplit(":", 1)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(descriptors + 100):
            held.append(await asyncio.open_connection(host, int(port)))
        async with await client.connect(observed.url, reconnect=False) as conn:
            assert await asyncio.wait_for(conn.ping(), 10) == "pong"
        await log_has(observed, "HTTP port full: refused", f"{MAX_CONNECTIONS} are open")
        # every connection ends: those beyond the limit at once, the rest once idle
        closed = await asyncio.wait_for(
            asyncio.gather(*(reader.read() for reader, _ in held)), IDLE_TIMEOUT + 10
        )
        assert closed == [b""] * len(held)
    finally:
        for _, writer in held:
            writer.close()
    assert await health(observed.http_url) == (200, {"live": True, "ready": True, "role": "active"})
    assert observed.log_text().count("HTTP port full") == 1  # once a minute at most


def test_http_is_off_unless_configured(broker: BrokerProcess) -> None:
    assert broker.http_url == ""
    info = json.loads((broker.data_dir / "broker.json").read_text())
    assert info["http_port"] is None


@pytest.mark.parametrize(
    "setting",
    ['http_host = "::1"', 'http_token = "a-token-of-20-chars!"', "chart_sample_seconds = 1"],
)
def test_an_http_setting_without_http_port_is_refused_at_start(
    tmp_path: Path, setting: str
) -> None:
    """Without http_port there is no HTTP port: a setting of it would do nothing."""
    config = tmp_path / "ssb.toml"
    config.write_text(setting + "\n")
    line = one_error_line(serve_once(tmp_path / "data", "--config", str(config)))
    assert setting.split()[0] in line and "set http_port too" in line, line


async def test_metrics_beyond_loopback_need_a_login_with_view() -> None:
    """The daemon's own handler, given requests as if from another host."""
    from ssb.broker._http import HttpServer

    checked: list[tuple[str, str]] = []

    async def authenticate(user: str, password: str, peer: str) -> str | None:
        checked.append((user, peer))
        right = {"ops": "right", "nobody": "pw"}
        return None if right.get(user) == password else "login failed"

    class Scrape:
        def render(self) -> bytes:
            return b"ssb_sessions 1.0\n"

    server = HttpServer(
        Scrape(),  # type: ignore[arg-type]
        lambda: None,
        authenticate,
        lambda user: user == "ops",  # only ops has VIEW
        "t" * 20,
    )

    def request(remote: str, **headers: str) -> Any:
        transport = _Transport(remote)
        return make_mocked_request("GET", "/metrics", headers=headers, transport=transport)

    handler = server._metrics
    assert (await handler(request("127.0.0.1"))).status == 200
    refused = await handler(request("192.0.2.7"))
    assert refused.status == 401 and "Basic" in refused.headers["WWW-Authenticate"]
    basic = base64.b64encode(b"ops:right").decode()
    assert (await handler(request("192.0.2.7", Authorization=f"Basic {basic}"))).status == 200
    wrong = base64.b64encode(b"ops:wrong").decode()
    assert (await handler(request("192.0.2.7", Authorization=f"Basic {wrong}"))).status == 401
    assert checked == [("ops", "192.0.2.7:http"), ("ops", "192.0.2.7:http")]
    nobody = base64.b64encode(b"nobody:pw").decode()  # the right password, but no VIEW
    assert (await handler(request("192.0.2.7", Authorization=f"Basic {nobody}"))).status == 401
    for garbage in ("Basic \u00e9\u00e9", "Basic !!!", "Bearer \u00e9"):  # no traceback
        assert (await handler(request("192.0.2.7", Authorization=garbage))).status == 401
    assert (await handler(request("192.0.2.7", Authorization=f"Bearer {'t' * 20}"))).status == 200
    assert (await handler(request("192.0.2.7", Authorization="Bearer nope"))).status == 401


class _Transport:
    def __init__(self, remote: str) -> None:
        self.remote = remote

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.remote, 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False


async def test_the_daemon_tells_systemd_it_is_ready(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(30)
        process = BrokerProcess(tmp_path / "data", env={"NOTIFY_SOCKET": path}).start()
        try:
            message = sock.recv(4096).decode()
            assert "READY=1" in message.splitlines()
            process.stop()
            assert "STOPPING=1" in sock.recv(4096).decode().splitlines()
        finally:
            process.kill()


# ---- the log ----------------------------------------------------------------------------------


async def log_has(process: BrokerProcess, *needles: str, timeout: float = 30.0) -> str:
    async def probe() -> str | None:
        text = process.log_text()
        return text if all(n in text for n in needles) else None

    missing = lambda: [n for n in needles if n not in process.log_text()]  # noqa: E731
    try:
        return await wait_until(probe, f"log lines {needles}", timeout=timeout)
    except AssertionError:
        raise AssertionError(f"not in the log: {missing()}") from None


async def test_the_log_tells_what_happens(tmp_path: Path) -> None:
    process = BrokerProcess(
        tmp_path / "data", extra_args=["--log-format", "json"], cwd=Path(__file__).parent
    ).start()
    try:
        async with await client.connect(process.url) as conn:
            await log_has(process, "connected", "logged in as 'admin'")
            with pytest.raises(client.LoginFailedError):
                await client.connect(process.url_for("admin", "wrong"), reconnect=False)
            await log_has(process, "login failed for 'admin'")

            await refused_for_quota(conn, "Small")
            await log_has(process, "queue 'Small' is full")

            await conn.alter_queue("Small", status="OFF")
            await conn.alter_queue("Small", status="ON")
            await log_has(process, "queue Small disabled", "queue Small enabled")

            await activated_service(conn, "Echo", "echo")
            await conn.create_queue("Back")
            await conn.create_service("Back", queue="Back")
            echo = await conn.begin_dialog("Back", "EchoService")
            await conn.send(echo, body=b"ping")
            await log_has(process, "activated task", "started: activation_procs:echo")
            await log_has(process, "(activation_procs:echo on queue EchoQueue) ended")

            # what a failing procedure writes (its traceback) reaches the log as log lines
            await activated_service(conn, "Fail", "fail")
            await conn.send(await conn.begin_dialog("Back", "FailService"), body=b"boom")
            await log_has(process, "(activation_procs:fail on queue FailQueue) failed", "Traceback")
        await log_has(process, "('admin', session")
    finally:
        process.stop()
    lines = process.log_text().splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]  # every line is JSON
    assert {"time", "level", "logger", "message"} <= set(entries[0])
    assert any(e["message"] == "stopping" for e in entries)


async def test_a_refused_request_is_logged_with_who_asked_once_a_code(
    broker: BrokerProcess,
) -> None:
    """A client that retries a refused request in a loop does not fill the log: the
    first refusal of each code on a connection is logged, with the client's address."""
    async with await client.connect(broker.url) as conn:
        for _ in range(3):
            with pytest.raises(client.NotFoundError):
                await conn.drop_queue("NoQueueOfThisName")
        with pytest.raises(client.BrokerError, match="max_messages"):
            await conn.create_queue("Refused", max_messages=-1)
        await log_has(broker, "refused create_queue from client 127.0.0.1:")
    text = broker.log_text()
    assert "refused drop from client 127.0.0.1:" in text
    assert "('admin', session" in text and "[2003 UNKNOWN_QUEUE]" in text
    assert text.count("NoQueueOfThisName") == 1


async def test_debug_logs_each_statement(tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path / "data", extra_args=["--log-level", "DEBUG"]).start()
    try:
        async with await client.connect(process.url) as conn:
            await conn.create_queue("Q")
            await log_has(process, "('admin'): create_queue")
    finally:
        process.kill()


async def test_links_going_up_and_down_are_logged(tmp_path: Path) -> None:
    async with Federation(tmp_path, ["a", "b"]) as fed:
        a, b = fed["a"], fed["b"]
        await create_contract(a, b)
        await create_initiator(a, "Asker")
        await create_target(b, "Answerer")
        await link(a, "Asker", b, "Answerer")
        handle = await a.conn.begin_dialog("Asker", "Answerer", contract=CONTRACT)
        await a.conn.send(handle, REQUEST, b"hello")
        await log_has(a.process, f"link to broker {b.instance} up")
        b.process.stop()
        await log_has(a.process, f"link to broker {b.instance} down")


class Remembered(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_a_client_logs_its_reconnect(broker: BrokerProcess) -> None:
    logger, remembered = logging.getLogger("ssb.client"), Remembered()
    logger.addHandler(remembered)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        async with await client.connect(broker.url) as conn:
            await conn.create_queue("Q")
            broker.restart()  # kill -9, and start again on the same ports
            assert any(q["name"] == "Q" for q in await conn.view("service_queues"))
    finally:
        logger.removeHandler(remembered)
        logger.setLevel(level)
    text = "\n".join(remembered.lines)
    assert "lost" in text and "reconnecting" in text and "reconnected to" in text
