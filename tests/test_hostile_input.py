"""Hostile input on a live daemon: every bad number or frame is a clear error, nothing of
it is applied, the views stay readable, and other sessions keep being served."""

from __future__ import annotations

import asyncio
import math
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import BrokerProcess
from test_logins import HOST, _error, session_frames

from ssb import client
from ssb.protocol import ErrorCode, encode_frame
from ssb.protocol._client_wire import REPLY_OK
from ssb.tools import wait_until


@pytest.fixture
def hbroker(tmp_path: Path) -> Iterator[BrokerProcess]:
    limits = {"locks_per_transaction": 3, "detached_per_login": 2}
    process = BrokerProcess(
        tmp_path / "data",
        durability="os",
        config={"limits": limits, "transport": {"accept_rate": 1}},
    ).start()
    yield process
    process.kill()


async def _objects(conn: client.Connection) -> None:
    await conn.create_queue("Q")
    await conn.create_service("S", queue="Q", contracts=["DEFAULT"])


async def test_deeply_nested_frames_are_refused(hbroker: BrokerProcess) -> None:
    # [1, "view", {"name": [[[...1000 deep...]]]}] as raw msgpack (no encoder makes it)
    payload = b"\x93\x01\xa4view\x81\xa4name" + b"\x91" * 1000 + b"\xc0"
    frames = await session_frames(hbroker, len(payload).to_bytes(4, "big") + payload)
    code, message = _error(frames)
    assert code == ErrorCode.MALFORMED_FRAME and "32 deep" in message
    async with await client.connect(hbroker.url) as conn:
        assert await conn.ping()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 1e300])
async def test_bad_durations_are_refused_and_leave_nothing_behind(
    hbroker: BrokerProcess, bad: float
) -> None:
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        handle = await conn.begin_dialog("S", "S")
        with pytest.raises(client.InvalidArgumentError, match="seconds"):
            await conn.receive("Q", timeout=bad)
        with pytest.raises(client.InvalidArgumentError, match="seconds"):
            await conn.begin_conversation_timer(handle, bad)
        with pytest.raises(client.InvalidArgumentError, match="seconds"):
            await conn.begin_dialog("S", "S", lifetime=bad)
        assert await conn.view("open_transactions") == []
        assert len(await conn.view("conversation_endpoints")) == 1  # readable for everyone
    hbroker.restart()
    async with await client.connect(hbroker.url) as conn:
        assert len(await conn.view("conversation_endpoints")) == 1


async def test_locks_per_transaction_are_bounded(hbroker: BrokerProcess) -> None:
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        await conn.begin_transaction()
        for _ in range(3):
            await conn.begin_dialog("S", "S")
        with pytest.raises(client.TransactionError, match="locks_per_transaction"):
            await conn.begin_dialog("S", "S")
        await conn.commit()
        assert len(await conn.view("conversation_endpoints")) == 3  # the 4th left nothing


async def test_detached_transactions_per_login_are_bounded(hbroker: BrokerProcess) -> None:
    async with await client.connect(hbroker.url) as conn:
        for _ in range(2):
            await conn.begin_transaction(detached=True)
            await conn.detach_transaction()
        with pytest.raises(client.TransactionError, match="detached_per_login"):
            await conn.begin_transaction(detached=True)
        await conn.begin_transaction()  # an ordinary one is not counted
        await conn.rollback()


async def test_incoming_broker_connections_beyond_the_accept_rate_are_closed(
    hbroker: BrokerProcess,
) -> None:
    assert hbroker.broker_port
    closed = 0
    links = []
    for _ in range(6):
        reader, writer = await asyncio.open_connection(HOST, hbroker.broker_port)
        links.append(writer)
        try:
            async with asyncio.timeout(0.5):
                if await reader.read(1) == b"":
                    closed += 1
        except TimeoutError:
            pass  # accepted: waits for our Hello
    for writer in links:
        writer.close()
    assert closed >= 4  # one token a second, a burst of one
    assert "accept_rate" in hbroker.log_text()
    async with await client.connect(hbroker.url) as conn:
        assert await conn.ping()


async def test_requests_after_a_refusal_are_still_answered(hbroker: BrokerProcess) -> None:
    bad = encode_frame([1, "receive", {"queue": "nope", "timeout": math.nan}])
    good = encode_frame([2, "ping", {}])
    frames = await session_frames(hbroker, bad + good, want=3)
    assert frames[1][0] == 1 and frames[1][1] != REPLY_OK
    assert frames[2][0] == 2 and frames[2][1] == REPLY_OK


async def test_running_out_of_file_descriptors_is_logged_once_not_ten_times_a_second(
    tmp_path: Path,
) -> None:
    """Connections that use up the daemon's file descriptors make accepting fail until
    some close: each such spell is said once as it begins and once as it ends (with how
    many tries failed), not at every retry, 10 a second; the daemon serves again by
    itself."""
    limits = {"connections_per_address": 10_000, "login_timeout": 1.0}
    process = BrokerProcess(tmp_path / "data", config={"limits": limits}).start()
    descriptors = 64
    resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (descriptors, descriptors))
    writers = []
    try:
        for _ in range(2 * descriptors):
            writers.append((await asyncio.open_connection(HOST, process.client_port))[1])

        async def said(text: str) -> bool:
            return text in process.log_text()

        await wait_until(lambda: said("accepting a client connection failed"), "EMFILE")
        # the accepted ones say nothing: a login timeout later they close, room comes back
        await wait_until(lambda: said("nothing arrived within the login timeout"), "timeouts")
        await wait_until(lambda: said("accepting a client connection again"), "room again")
        text = process.log_text()  # each spell without descriptors: a line as it begins
        spells = text.count("accepting a client connection failed")
        assert spells in (text.count("connection again"), text.count("connection again") + 1)
        for writer in writers:
            writer.close()
        async with await client.connect(process.url) as conn:
            assert await conn.ping() == "pong"
    finally:
        for writer in writers:
            writer.close()
        process.kill()


POISON_POLICY_FAULTS = [
    ("threshold", 2**63, "threshold"),
    ("threshold", True, "threshold"),
    ("delay", math.nan, "delay"),
    ("delay", math.inf, "delay"),
    ("delay", True, "delay"),
    ("max_parks", True, "max_parks"),
    ("max_parks", 2**63, "max_parks"),
    ("error_code", math.nan, "error_code"),
    ("error_code", "500", "error_code"),
    ("error_code", 2**40, "error_code"),
    ("error_code", 0, "error_code"),
    ("description", ["a list"], "description"),
    ("description", "x" * 5000, "description"),
    ("notify_service", ["S"], "notify_service"),
    ("dead_letter_queue", {"Q": 1}, "dead_letter_queue"),
]


async def test_bad_poison_policy_options_are_refused_by_name(hbroker: BrokerProcess) -> None:
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        for option, bad, named in POISON_POLICY_FAULTS:
            policy = {"threshold": 2, "action": "park", option: bad}
            with pytest.raises(client.InvalidArgumentError, match=named):
                await conn.create_queue("Poisoned", poison_policy=policy)
            with pytest.raises(client.InvalidArgumentError, match=named):
                await conn.alter_queue("Q", poison_policy=policy)
        assert [q["name"] for q in await conn.view("service_queues")] == ["Q"]
        assert await conn.ping()
    assert "Traceback" not in hbroker.log_text()


@pytest.mark.parametrize("kind", [["queue"], {"queue": 1}])
async def test_an_object_kind_that_is_not_text_is_refused(
    hbroker: BrokerProcess, kind: object
) -> None:
    drop = encode_frame([1, "drop", {"kind": kind, "name": "Q"}])
    frames = await session_frames(hbroker, drop, want=2)
    code, message = _error(frames)
    assert code == ErrorCode.BAD_ARGUMENT and "kind" in message
    async with await client.connect(hbroker.url) as conn:
        await conn.create_login("reader", "reader-password")
        for grant_or_revoke in (conn.grant, conn.revoke):
            with pytest.raises(client.InvalidArgumentError, match="kind"):
                await grant_or_revoke("RECEIVE", "reader", kind, "Q")  # type: ignore[arg-type]
    assert "Traceback" not in hbroker.log_text()


@pytest.mark.parametrize("order", [2**63, 2**64 - 1, -(2**63), 0, True, 1.0])
async def test_a_queuing_order_out_of_range_is_refused(
    hbroker: BrokerProcess, order: object
) -> None:
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        with pytest.raises(client.InvalidArgumentError, match="queuing_order"):
            await conn.requeue_dead_letter("Q", order)  # type: ignore[arg-type]
        assert await conn.ping()
    assert "Traceback" not in hbroker.log_text()


async def test_a_table_parameter_beyond_64_bits_is_a_statement_error(
    hbroker: BrokerProcess,
) -> None:
    async with await client.connect(hbroker.url) as conn:
        await conn.execute("CREATE TABLE T (a BIGINT)")
        await conn.execute("INSERT INTO T VALUES (@p1)", 1)
        await conn.begin_transaction()
        await conn.execute("INSERT INTO T VALUES (@p1)", 2)
        for huge in (2**63, 2**64 - 1):  # (msgpack carries no integer below -2**63)
            with pytest.raises(client.SqlError, match=r"64 bits|bigint out of range"):
                await conn.execute("INSERT INTO T VALUES (@p1)", huge)
            with pytest.raises(client.SqlError, match=r"64 bits|bigint out of range"):
                await conn.execute("INSERT INTO T OUTPUT inserted.a VALUES (@p1)", huge)
            with pytest.raises(client.SqlError, match=r"64 bits|bigint out of range"):
                await conn.executemany("INSERT INTO T VALUES (@p1)", [[3], [huge]])
        await conn.commit()  # the transaction goes on without the refused statements
        result = await conn.execute("SELECT a FROM T ORDER BY a")
        assert result.rows == [(1,), (2,)]
    assert "Traceback" not in hbroker.log_text()


@pytest.mark.parametrize("after", [2**63, 2**64 - 1, True, 1.5])
async def test_paging_after_an_order_out_of_range_is_refused(
    hbroker: BrokerProcess, after: object
) -> None:
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        for name in ("queue:Q", "transmission_queue"):
            with pytest.raises(client.InvalidArgumentError, match="after"):
                await conn.view(name, after=after)  # type: ignore[arg-type]
        with pytest.raises(client.InvalidArgumentError, match="after"):
            await conn.peek("Q", after=after)  # type: ignore[arg-type]
        assert await conn.view("queue:Q", after=2**63 - 1) == []
    assert "Traceback" not in hbroker.log_text()


async def test_a_timeout_for_an_ordinary_transaction_is_refused(hbroker: BrokerProcess) -> None:
    async with await client.connect(hbroker.url) as conn:
        for bad in (math.nan, -1.0, "soon"):
            with pytest.raises(client.InvalidArgumentError, match="timeout"):
                await conn.begin_transaction(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(client.InvalidArgumentError, match="detached"):
            await conn.begin_transaction(timeout=5.0)  # it would never roll back at 5 s
        assert await conn.view("open_transactions") == []
        await conn.begin_transaction()
        await conn.rollback()


async def test_a_target_service_name_longer_than_a_service_name_is_refused(
    hbroker: BrokerProcess,
) -> None:
    # another broker refuses a frame naming it (a link frame's names are at most 512
    # characters) and closes the link: through a TRANSPORT route, that link was dialled again
    # and closed again for as long as the dialog lived
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        await conn.create_route("anywhere", "any", "TRANSPORT")
        far = "tcp://127.0.0.1:1/" + "x" * 600
        with pytest.raises(client.InvalidArgumentError, match=r"to_service.*256"):
            await conn.begin_dialog("S", far)
        await conn.begin_dialog("S", "x" * 256)  # as long as a service name may be
        assert len(await conn.view("conversation_endpoints")) == 1


@pytest.mark.parametrize("instance", [math.nan, ["a list"], "not a broker id"])
async def test_an_event_notification_for_a_broker_instance_that_is_no_id_is_refused(
    hbroker: BrokerProcess, instance: object
) -> None:
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        with pytest.raises(client.InvalidArgumentError, match="broker_instance"):
            await conn.create_event_notification(
                "Note",
                "QUEUE_ACTIVATION",
                "Q",
                "S",
                broker_instance=instance,  # type: ignore[arg-type]
            )
        assert await conn.view("event_notifications") == []


async def test_a_send_of_more_messages_than_one_request_may_carry_is_refused(
    hbroker: BrokerProcess,
) -> None:
    # each message costs the daemon's event loop some microseconds: millions in one SEND
    # held every other session (a login waited past its timeout)
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        handles = [await conn.begin_dialog("S", "S") for _ in range(2)]
        with pytest.raises(client.InvalidArgumentError, match="100000 messages"):
            await conn.send_many(handles[0], "DEFAULT", [b""] * 100_001)
        with pytest.raises(client.InvalidArgumentError, match="100000 messages"):
            await conn.send_many(handles, "DEFAULT", [b""] * 50_001)  # to each conversation
        assert await conn.view("queue:Q") == []
        await conn.send_many(handles, "DEFAULT", [b""] * 50_000)
        (queue,) = await conn.view("service_queues")
        assert queue["messages_ready"] == 100_000


async def test_a_refusal_quoting_a_huge_argument_is_cut_to_a_readable_length(
    hbroker: BrokerProcess,
) -> None:
    # the refusal quotes the value it refuses: 20 MB of NULs quote as 80 MB, beyond a frame
    huge = encode_frame([1, "end_conversation", {"handle": b"\x00" * 20_000_000}])
    frames = await session_frames(hbroker, huge + encode_frame([2, "ping", {}]), want=3)
    code, message = frames[1][2]
    assert code == ErrorCode.BAD_ARGUMENT and "must be a UUID" in message
    assert len(message) < 20_000 and message.endswith("characters cut)")
    assert frames[2][1] == REPLY_OK
    assert "Traceback" not in hbroker.log_text()


async def test_a_contract_named_twice_for_a_service_is_refused(hbroker: BrokerProcess) -> None:
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        with pytest.raises(client.InvalidArgumentError, match="'DEFAULT' twice"):
            await conn.create_service("Twice", queue="Q", contracts=["DEFAULT", "DEFAULT"])
        with pytest.raises(client.InvalidArgumentError, match="'DEFAULT' twice"):
            await conn.alter_service("S", drop_contracts=["DEFAULT", "DEFAULT"])
        assert [s["name"] for s in await conn.view("services")] == ["S"]


async def test_poison_message_handling_with_an_unknown_key_is_refused(
    hbroker: BrokerProcess,
) -> None:
    async with await client.connect(hbroker.url) as conn:
        await _objects(conn)
        typo = {"stauts": "OFF"}  # was taken as {} and so as STATUS = ON
        with pytest.raises(client.InvalidArgumentError, match="stauts"):
            await conn.alter_queue("Q", poison_message_handling=typo)
        with pytest.raises(client.InvalidArgumentError, match="stauts"):
            await conn.create_queue("Typo", poison_message_handling=typo)
        await conn.alter_queue("Q", poison_message_handling={"status": "OFF"})
        (queue,) = await conn.view("service_queues")
        assert queue["is_poison_message_handling_enabled"] is False


async def test_a_route_lifetime_of_no_time_is_refused(hbroker: BrokerProcess) -> None:
    async with await client.connect(hbroker.url) as conn:
        for lifetime in (0, 0.5, -1, math.nan):  # a route expired as it is made
            with pytest.raises(client.InvalidArgumentError, match="lifetime is seconds from 1"):
                await conn.create_route("Far", "FarService", "LOCAL", lifetime=lifetime)
        assert await conn.view("routes") == []
        await conn.create_route("Far", "FarService", "LOCAL")
        with pytest.raises(client.InvalidArgumentError, match="None: it never expires"):
            await conn.alter_route("Far", lifetime=0)
        (route,) = await conn.view("routes")
        assert route["lifetime"] is None
        await conn.alter_route("Far", lifetime=1)  # a second is the least


@pytest.mark.parametrize(
    ("numbers", "says"),
    [
        ({"pid": 0}, "pid must be a process id from 1 to 2147483647"),
        ({"pid": 2**31}, "pid must be a process id"),
        ({"pid": 2**63}, "pid must be a process id"),
        ({"job_id": 2**63}, "job_id must be an integer from 0 to 2\\*\\*63-1"),
        ({"job_task_id": 2**64 - 1}, "job_task_id must be an integer from 0"),
    ],
)
async def test_an_external_readers_numbers_out_of_range_are_refused(
    hbroker: BrokerProcess, numbers: dict[str, int], says: str
) -> None:
    async with await client.connect(hbroker.url) as conn:
        await conn.create_queue("Q", activation={"max_queue_readers": 2})
        async with await client.connect(hbroker.url) as reader:
            with pytest.raises(client.InvalidArgumentError, match=says):
                await reader.register_task("Q", "bridge", job="j", **numbers)
            with pytest.raises(client.InvalidArgumentError, match="job_id must be an integer"):
                await reader.label_job("j", 2**63)
        assert await conn.view("activated_tasks") == []
