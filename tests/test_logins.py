"""Logins: no anonymous door, the first start's admin password, store-kept hashed logins,
throttled failures, and what a connection may cost before it has logged in."""

from __future__ import annotations

import asyncio
import stat
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from daemon import BrokerProcess, run_ssb, serve_once

from ssb import client
from ssb.protocol import (
    NEED_DATA,
    WIRE_VERSION,
    ErrorCode,
    FrameDecoder,
    Hello,
    encode_error,
    encode_frame,
)
from ssb.protocol._client_wire import REPLY_ERROR, REPLY_OK

HOST = "127.0.0.1"


async def _raw_exchange(
    port: int, data: bytes, timeout: float = 10.0, want: int = 1 << 30
) -> list[Any]:
    """Send raw bytes on a new connection to `port`; the frames the broker answers, until
    `want` or until it closes."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(data)
    await writer.drain()
    decoder = FrameDecoder()
    frames: list[Any] = []
    async with asyncio.timeout(timeout):
        while len(frames) < want and (chunk := await reader.read(65536)):
            decoder.receive_data(chunk)
            while (frame := decoder.next_frame()) is not NEED_DATA:
                frames.append(frame)
    writer.close()
    return frames


def _error(frames: list[Any]) -> tuple[int, str]:
    assert frames, "the broker closed without saying why"
    frame = frames[-1]
    assert frame[1] == REPLY_ERROR, frame
    return frame[2][0], frame[2][1]


def test_first_start_writes_the_admin_password_privately(broker: BrokerProcess) -> None:
    path = broker.data_dir / "admin.password"
    text = path.read_text()
    assert text.endswith("\n") and len(text.strip()) >= 24 and "\n" not in text.strip()
    for name in ("admin.password", "broker.db", "broker-key.pem"):
        mode = stat.S_IMODE((broker.data_dir / name).stat().st_mode)
        assert mode == 0o600, f"{name} is {oct(mode)}"
    assert f"its password is in {path}" in broker.log_text()
    assert text.strip() not in broker.log_text()

    broker.restart()  # the password stays; a second start creates nothing
    assert path.read_text() == text
    with client.connect_sync(broker.url) as conn:
        assert conn.ping()


@pytest.mark.parametrize("user,password", [("", ""), ("admin", ""), ("admin", "wrong-password")])
async def test_anonymous_and_wrong_logins_are_refused(
    broker: BrokerProcess, user: str, password: str
) -> None:
    with pytest.raises(client.LoginFailedError) as caught:
        await client.connect(broker.url_for(user, password))
    if not user:
        assert "ssb://USER:PASSWORD@HOST:PORT" in str(caught.value)
    assert f"login failed for {user!r}" in broker.log_text()
    if password:
        assert password not in broker.log_text()


async def test_a_login_an_activation_runs_as_cannot_be_dropped(broker: BrokerProcess) -> None:
    """Dropping it would leave the queue's activation naming no login, and a login created
    later under that name would run its procedures: the drop is refused, naming the queue
    and what to do, and nothing changes."""
    async with await client.connect(broker.url) as admin:
        await admin.create_login("reader", "a-long-password")
        await admin.create_database("Shop")
        await admin.use("Shop")
        await admin.create_queue(
            "Orders", activation={"procedure": "activation_procs:echo", "execute_as": "reader"}
        )
        with pytest.raises(client.InUseError) as refused:
            await admin.drop_login("reader")
        assert "queue 'Shop.Orders'" in refused.value.message
        assert "execute_as" in refused.value.message
        assert "reader" in [r["name"] for r in await admin.view("logins")]
        await admin.alter_queue("Orders", activation={"execute_as": None})
        await admin.drop_login("reader")
        assert "reader" not in [r["name"] for r in await admin.view("logins")]


async def test_a_login_that_owns_objects_cannot_be_dropped(broker: BrokerProcess) -> None:
    """A login made later under its name would own them (and an activation that runs as
    its queue's owner would run as it): the drop is refused, naming what it owns."""
    async with await client.connect(broker.url) as admin:
        await admin.create_login("app", "a-long-password")
        await admin.grant("CREATE", "app")
        await admin.grant("EXECUTE", "app")
        await admin.create_database("Shop")
        await admin.grant("CREATE", "app", "database", "Shop")
        async with await client.connect(broker.url_for("app", "a-long-password")) as app:
            await app.create_queue("AppQueue")
            await app.use("Shop")
            await app.create_queue("Orders", activation={"procedure": "activation_procs:echo"})
            await app.execute("CREATE TABLE dbo.Notes (id INT)")
        with pytest.raises(client.InUseError) as refused:
            await admin.drop_login("app")
        said = refused.value.message
        for owned in ("queue 'AppQueue'", "queue 'Shop.Orders'", "table 'Shop.notes'"):
            assert owned in said, said
        assert "drop what it owns first" in said
        assert "app" in [r["name"] for r in await admin.view("logins")]
        await admin.drop_queue("AppQueue")
        await admin.use("Shop")
        await admin.drop_queue("Orders")
        await admin.execute("DROP TABLE dbo.Notes")
        await admin.drop_login("app")
        assert "app" not in [r["name"] for r in await admin.view("logins")]


async def test_logins_are_added_changed_and_dropped_and_outlive_a_restart(
    broker: BrokerProcess,
) -> None:
    async with await client.connect(broker.url) as admin:
        made = await admin.create_login("app")  # a random password, returned once
        await admin.create_login("ops", "ops-password-1")
        with pytest.raises(client.AlreadyExistsError):
            await admin.create_login("ops", "another-pass")
        with pytest.raises(client.InvalidArgumentError, match=r"8\.\.1024"):
            await admin.create_login("short", "abc")
        with pytest.raises(client.InvalidArgumentError, match="login name"):
            await admin.create_login("no spaces", "long-enough")
        rows = await admin.view("logins")
        assert [r["name"] for r in rows] == ["admin", "app", "ops"]
        assert all(set(r) == {"name", "created"} for r in rows)  # no hash, no password
    async with await client.connect(broker.url_for("app", made["password"])) as app:
        assert await app.ping()
        with pytest.raises(client.PermissionDeniedError, match="CONTROL"):
            await app.create_login("mine", "mine-password")
        with pytest.raises(client.PermissionDeniedError):
            await app.drop_login("ops")

    broker.restart()
    async with await client.connect(broker.url) as admin:
        await admin.alter_login("ops", "ops-password-2")
        await admin.drop_login("app")
        with pytest.raises(client.NotFoundError):
            await admin.drop_login("app")
        with pytest.raises(client.InvalidArgumentError, match="cannot be dropped"):
            await admin.drop_login("admin")
    with pytest.raises(client.LoginFailedError):
        await client.connect(broker.url_for("ops", "ops-password-1"))
    with pytest.raises(client.LoginFailedError):
        await client.connect(broker.url_for("app", made["password"]))
    async with await client.connect(broker.url_for("ops", "ops-password-2")) as ops:
        assert await ops.ping()
    db = (broker.data_dir / "broker.db").read_bytes()
    assert b"ops-password-2" not in db and made["password"].encode() not in db


async def test_failed_logins_are_throttled_per_login_and_address(broker: BrokerProcess) -> None:
    async with await client.connect(broker.url) as admin:
        await admin.create_login("victim", "victim-password")
    for _ in range(5):
        with pytest.raises(client.LoginFailedError, match="login failed"):
            await client.connect(broker.url_for("victim", "guess-guess"))
    # the sixth is refused without a check, even with the right password
    with pytest.raises(client.LoginFailedError, match="too many failed logins"):
        await client.connect(broker.url_for("victim", "victim-password"))
    assert "too many failed logins" in broker.log_text()
    # another login on the same address is not locked out
    async with await client.connect(broker.url) as admin:
        assert await admin.ping()


def test_plaintext_passwords_in_the_config_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "ssb.toml"
    config.write_text('[users]\nadmin = "secret"\n')
    done = serve_once(tmp_path / "data", "--config", str(config))
    assert done.returncode == 2
    assert "[users]" in done.stderr and "ssb login add" in done.stderr
    assert "Traceback" not in done.stderr


def test_ssb_login_commands_and_local_tools_find_the_admin_password(
    broker: BrokerProcess,
) -> None:
    # `ssb status` from the folder that holds the data directory needs no URL
    (broker.data_dir.parent / "ssb-data").symlink_to(broker.data_dir)

    def ssb(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return run_ssb(
            *args, cwd=broker.data_dir.parent, env={"PATH": "/usr/bin:/bin"}, stdin=stdin
        )

    status = ssb("status")
    assert status.returncode == 0, status.stderr
    added = ssb("login", "add", "reporter")
    assert added.returncode == 0, added.stderr
    password = added.stdout.split("password: ")[1].strip()
    with client.connect_sync(broker.url_for("reporter", password)) as conn:
        assert conn.ping()
    changed = ssb("login", "passwd", "reporter", "--password-stdin", stdin="a-new-password\n")
    assert changed.returncode == 0, changed.stderr
    with client.connect_sync(broker.url_for("reporter", "a-new-password")) as conn:
        assert conn.ping()
    assert ssb("login", "drop", "reporter").returncode == 0
    missing = ssb("login", "drop", "reporter")
    assert missing.returncode == 1 and "no login 'reporter'" in missing.stderr
    assert "Traceback" not in missing.stderr


# ---- what a connection may cost before login ---------------------------------------


@pytest.fixture
def tight(tmp_path: Path) -> Any:
    limits = {
        "login_timeout": 0.5,
        "connections_per_address": 4,
        "hello_frame_size": 4096,
        "failed_logins_per_address": 2,
    }
    process = BrokerProcess(tmp_path / "data", durability="os", config={"limits": limits})
    process.start()
    yield process
    process.kill()


async def test_a_large_frame_before_login_is_refused_at_its_header(tight: BrokerProcess) -> None:
    # a 60 MiB length is refused as soon as its 4 bytes arrive: nothing is buffered
    frames = await _raw_exchange(tight.client_port, struct.pack(">I", 60 * 1024 * 1024))
    code, message = _error(frames)
    assert code == ErrorCode.FRAME_TOO_LARGE and "4096" in message
    async with await client.connect(tight.url) as conn:  # others are served
        assert await conn.ping()


async def test_a_connection_that_never_logs_in_is_closed(tight: BrokerProcess) -> None:
    frames = await _raw_exchange(tight.client_port, b"", timeout=10)
    code, message = _error(frames)
    assert code == ErrorCode.HANDSHAKE_FAILED and "no login within 0.5 s" in message


async def test_connections_per_address_are_bounded(tight: BrokerProcess) -> None:
    held = [await asyncio.open_connection(HOST, tight.client_port) for _ in range(4)]
    frames = await _raw_exchange(tight.client_port, b"")
    code, message = _error(frames)
    assert code == ErrorCode.HANDSHAKE_FAILED and "too many connections" in message
    for _, writer in held:
        writer.close()
    assert "connections_per_address" in tight.log_text()


async def session_frames(broker: BrokerProcess, payload: bytes, want: int = 1 << 30) -> list[Any]:
    """Log in as admin with `payload` written right behind the Hello (no waiting); the
    frames the broker answers (the Welcome first), until `want` or until it closes."""
    hello = Hello(WIRE_VERSION, "admin", broker.admin_password()).encode()
    return await _raw_exchange(broker.client_port, encode_frame(hello) + payload, want=want)


async def test_requests_sent_right_behind_the_hello_wait_for_the_login(
    broker: BrokerProcess,
) -> None:
    pings = encode_frame([1, "ping", {}]) + encode_frame([2, "ping", {}])
    frames = await session_frames(broker, pings, want=3)
    assert [f[0] for f in frames[1:]] == [1, 2] and all(f[1] == REPLY_OK for f in frames[1:])


async def test_dropping_a_login_closes_its_sessions_and_rolls_them_back(
    broker: BrokerProcess,
) -> None:
    async with await client.connect(broker.url) as admin:
        await admin.create_login("leaving", "leaving-password")
        await admin.create_queue("Q")
        await admin.create_service("S", queue="Q", contracts=["DEFAULT"])
        await admin.grant("RECEIVE", "leaving", "queue", "Q")
        await admin.grant("SEND", "leaving", "service", "S")
        leaving = await client.connect(broker.url_for("leaving", "leaving-password"))
        await leaving.begin_transaction()
        await leaving.begin_dialog("S", "S")
        await admin.drop_login("leaving")
        with pytest.raises(client.LoginFailedError):  # it reconnects, and may not log in
            await leaving.ping()
        assert await admin.view("conversation_endpoints") == []  # never committed
        assert "closed 1 session(s) of the dropped login 'leaving'" in broker.log_text()
        await leaving.close()


async def test_the_failed_login_allowance_is_a_setting(tight: BrokerProcess) -> None:
    for _ in range(2):
        with pytest.raises(client.LoginFailedError, match="login failed"):
            await client.connect(tight.url_for("admin", "not-the-password"))
    with pytest.raises(client.LoginFailedError, match="too many failed logins"):
        await client.connect(tight.url)


class _NotNow:
    """A listener on 127.0.0.1 that answers every login with `code` (the broker's own
    fault for now, not a refusal), as a daemon whose login check failed does; with no
    code it hangs up without an answer."""

    def __init__(self, code: int | None) -> None:
        self.code = code
        self.logins = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self._answer, HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while (frame := decoder.next_frame()) is NEED_DATA:
            chunk = await reader.read(65536)
            if not chunk:
                writer.close()
                return
            decoder.receive_data(chunk)
        Hello.decode(frame)
        self.logins += 1
        if self.code is None:
            writer.close()
            return
        writer.write(
            encode_frame(encode_error(0, self.code, "the broker could not check the login"))
        )
        await writer.drain()
        writer.close()


@pytest.mark.parametrize("code", [ErrorCode.INTERNAL_ERROR, ErrorCode.SHUTTING_DOWN])
async def test_a_login_the_broker_could_not_check_goes_to_the_next_address(
    broker: BrokerProcess, code: ErrorCode
) -> None:
    """A broker that answers a login with its own fault has not refused it: the client
    goes on to the URL's next address (and a reconnecting client tries again), while a
    refusal (a wrong password) ends the attempt, the next address not tried."""
    password = broker.admin_password()
    not_now = _NotNow(code)
    async with not_now as port:
        url = f"ssb://admin:{password}@{HOST}:{port},{HOST}:{broker.client_port}"
        async with await client.connect(url, timeout=5.0) as conn:
            await conn.ping()

        def blocking() -> None:  # (in a thread: this loop answers for the first address)
            with client.connect_sync(url, timeout=5.0) as sync_conn:
                sync_conn.ping()

        await asyncio.to_thread(blocking)
        assert not_now.logins == 2, "each client asked the first address first"
        wrong = f"ssb://admin:wrong@{HOST}:{broker.client_port},{HOST}:{port}"
        with pytest.raises(client.LoginFailedError):
            await client.connect(wrong, reconnect=False)
        assert not_now.logins == 2, "a refused login tries no other address"


async def test_a_login_answered_with_a_code_this_client_does_not_know_is_not_retried(
    broker: BrokerProcess,
) -> None:
    """A newer broker's refusal, by a code this client does not know, is no fault of the
    broker's for now: the client says so with the number, and tries no other address."""
    password = broker.admin_password()
    newer = _NotNow(6099)
    async with newer as port:
        url = f"ssb://admin:{password}@{HOST}:{port},{HOST}:{broker.client_port}"
        with pytest.raises(client.ProtocolViolationError, match="error 6099, which this client"):
            await client.connect(url, timeout=5.0)

        def blocking() -> None:  # (in a thread: this loop answers for the first address)
            with pytest.raises(client.ProtocolViolationError, match="error 6099"):
                client.connect_sync(url, timeout=5.0)

        await asyncio.to_thread(blocking)
        assert newer.logins == 2


async def test_a_server_that_hangs_up_on_the_hello_is_asked_about_its_port() -> None:
    """Both clients say the same when the handshake does not finish: the likely mistake
    is a URL naming another port than the broker's client port."""
    async with _NotNow(None) as port:
        url = f"ssb://admin:secret@{HOST}:{port}"
        hint = f"is {port} its client port"
        with pytest.raises(client.ConnectionLostError, match=hint):
            await client.connect(url, timeout=5.0, reconnect=False)

        def blocking() -> None:  # (in a thread: this loop runs the listener)
            with pytest.raises(client.ConnectionLostError, match=hint):
                client.connect_sync(url, timeout=5.0, reconnect=False)

        await asyncio.to_thread(blocking)
