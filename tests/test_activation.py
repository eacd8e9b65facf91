"""Activation against real daemons: queue monitors, activated tasks in worker processes,
external activation. Procedures live in tests/activation_procs.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from setup_objects import activated_service

from ssb import client
from ssb.broker._activation.monitor import (
    TRANSITIONS,
    MonitorInput,
    MonitorState,
    activation_needed,
)
from ssb.tools import wait_until

TESTS = Path(__file__).parent
FAST = {
    "check_interval": 0.2,
    "empty_rowset_window": 0.5,
    "notification_timeout": 3.0,
    "python_path": [str(TESTS)],
}
Rows = list[dict[str, Any]]


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    """The tests' broker: fast activation checks."""
    return {"durability": "os", "config": {"activation": FAST}}


def monitor(rows: Rows, queue: str) -> dict[str, Any]:
    found = [r for r in rows if r["queue"] == queue]
    return found[0] if found else {}


async def monitors(conn: client.Connection) -> Rows:
    return await conn.view("queue_monitors")


async def failed_task(conn: client.Connection, queue: str, what: str) -> str:
    """Wait until an activated task of `queue` has failed; the last task's error."""
    rows = await wait_until(
        lambda: monitors(conn),
        what,
        15,
        until=lambda r: monitor(r, queue).get("tasks_failed", 0) >= 1,
    )
    return str(monitor(rows, queue)["last_task_error"])


async def tasks_of(conn: client.Connection, queue: str) -> Rows:
    return [t for t in await conn.view("activated_tasks") if t["queue"] == queue]


async def reply_service(conn: client.Connection, *activated: tuple[str, str]) -> None:
    """ReplyService, whose queue ReplyQueue gets the answers; then for each (name,
    procedure) of `activated` that activated service, with one reader."""
    await conn.create_queue("ReplyQueue")
    await conn.create_service("ReplyService", queue="ReplyQueue")
    for name, procedure in activated:
        await activated_service(conn, name, procedure)


async def ask(conn: client.Connection, name: str, body: bytes | str) -> Any:
    handle = await conn.begin_dialog("ReplyService", f"{name}Service")
    await conn.send(handle, "DEFAULT", body)
    return handle


async def answer(conn: client.Connection, handle: Any, timeout: float = 15.0) -> bytes:
    got = await conn.receive("ReplyQueue", timeout=timeout, conversation_handle=handle)
    assert got, f"no answer within {timeout} s"
    return got[0].message_body


# ---- the rules on their own ----------------------------------------------------------


def test_transition_table_is_complete() -> None:
    assert set(TRANSITIONS) == {(s, i) for s in MonitorState for i in MonitorInput}


def test_activation_conditions() -> None:
    base = dict(running=1, waiting=0, last_empty_rowset=None, now=100.0, window=5.0)
    assert activation_needed(ready=1, arrived_into_empty=True, **{**base, "running": 0})
    assert not activation_needed(ready=0, arrived_into_empty=True, **{**base, "running": 0})
    # (b): backlog, nobody waiting, no recent empty RECEIVE
    assert activation_needed(ready=3, arrived_into_empty=False, **base)
    assert not activation_needed(ready=3, arrived_into_empty=False, **{**base, "waiting": 1})
    recent = {**base, "last_empty_rowset": 97.0}
    assert not activation_needed(ready=3, arrived_into_empty=False, **recent)
    assert activation_needed(ready=3, arrived_into_empty=False, **{**recent, "now": 103.0})
    # messages only in held groups: one more reader may come to wait, not a third
    held = {**base, "ready": 3, "arrived_into_empty": False, "receivable": False}
    assert activation_needed(**held)
    assert not activation_needed(**{**held, "running": 2})
    assert activation_needed(**{**held, "running": 2, "receivable": True})


# ---- internal activation ---------------------------------------------------------------


async def test_activation_starts_a_reader_for_a_message_on_an_idle_queue(
    conn: client.Connection,
) -> None:
    await reply_service(conn, ("Echo", "echo"), ("AsyncEcho", "async_echo"))
    await conn.create_queue(
        "OneArgQueue",
        activation={
            "status": "ON",
            "procedure": "activation_procs:no_context",
            "execute_as": "admin",
        },
    )
    await conn.create_service("OneArgService", queue="OneArgQueue", contracts=["DEFAULT"])
    rows = await monitors(conn)
    assert monitor(rows, "EchoQueue")["state"] == "INACTIVE"
    assert monitor(rows, "EchoQueue")["tasks_running"] == 0

    echo = await ask(conn, "Echo", b"ping")
    async_echo = await ask(conn, "AsyncEcho", b"ping")
    one_arg = await ask(conn, "OneArg", b"ping")
    assert await answer(conn, echo) == b"ping"
    assert await answer(conn, async_echo) == b"async:ping"
    assert await answer(conn, one_arg) == b"one-arg"

    tasks = await tasks_of(conn, "EchoQueue")
    if tasks:  # still waiting for more work: it is the one the monitor started
        (task,) = tasks
        assert task["procedure"] == "activation_procs:echo"
        assert task["execute_as"] == "admin"
        assert isinstance(task["pid"], int) and task["pid"] != os.getpid()
    rows = await wait_until(
        lambda: monitors(conn),
        "the echo reader to return once the queue stays empty",
        15,
        until=lambda r: monitor(r, "EchoQueue")["tasks_running"] == 0,
    )
    row = monitor(rows, "EchoQueue")
    assert row["tasks_started"] == 1 and row["tasks_failed"] == 0
    assert row["state"] == "INACTIVE"
    assert row["last_activated_time"] is not None
    assert row["last_empty_rowset_time"] is not None


@pytest.mark.slow
async def test_ramps_up_to_max_queue_readers_and_no_further(conn: client.Connection) -> None:
    await reply_service(conn)
    await activated_service(conn, "Slow", "slow", readers=3)
    handles = [await conn.begin_dialog("ReplyService", "SlowService") for _ in range(24)]
    for handle in handles:  # one conversation group each
        await conn.send(handle, "DEFAULT", b"work")
    peak = 0

    async def watched() -> dict[str, Any]:
        nonlocal peak
        row = monitor(await monitors(conn), "SlowQueue")
        running = len(await tasks_of(conn, "SlowQueue"))
        assert row["tasks_running"] <= 3 and running <= 3
        peak = max(peak, row["tasks_running"])
        return row

    row = await wait_until(
        watched,
        "the backlog to drain",
        30,
        0.02,
        until=lambda r: r["messages_ready"] == 0 and r["tasks_running"] == 0,
    )
    assert peak == 3
    assert 3 <= row["tasks_started"] <= 6, row  # ramp to 3; perhaps a reader again at the end


async def test_one_busy_group_gets_one_extra_reader_and_no_third(
    conn: client.Connection, tmp_path: Path
) -> None:
    await reply_service(conn)
    await activated_service(conn, "Hold", "hold", readers=5)
    marker = tmp_path / "release"
    handle = await ask(conn, "Hold", str(marker))
    await wait_until(
        lambda: tasks_of(conn, "HoldQueue"),
        "the first reader to hold the conversation group in its transaction",
        15,
        until=lambda t: len(t) == 1 and t[0]["conversation_group_id"] is not None,
    )
    await conn.send_many(handle, "DEFAULT", [str(marker)] * 4)
    await wait_until(
        lambda: monitors(conn),
        "a second reader waiting in RECEIVE",
        15,
        until=lambda r: (
            monitor(r, "HoldQueue")["tasks_running"] == 2
            and monitor(r, "HoldQueue")["tasks_waiting"] == 1
        ),
    )
    # several check intervals and empty-rowset windows: never a third reader
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        row = monitor(await monitors(conn), "HoldQueue")
        assert row["tasks_running"] <= 2, row
        assert row["tasks_started"] == 2, row
        assert row["messages_ready"] == 4, row
        await asyncio.sleep(0.02)
    marker.touch()
    await wait_until(
        lambda: monitors(conn),
        "the held messages to be processed after the release",
        15,
        until=lambda r: monitor(r, "HoldQueue")["messages_ready"] == 0,
    )
    groups = await wait_until(
        lambda: conn.view("conversation_groups"),
        "the group lock to be released",
        15,
        until=lambda g: not any(row["is_locked"] for row in g),
    )
    assert groups


async def test_one_conversation_in_short_transactions_never_gets_a_third_reader(
    conn: client.Connection,
) -> None:
    """Between a holder's COMMIT and its next RECEIVE the group passes to the waiting
    reader: its messages are still locked, not ready for a new one (seed 001)."""
    await reply_service(conn)
    await activated_service(conn, "Busy", "busy", readers=5)
    handle = await conn.begin_dialog("ReplyService", "BusyService")
    await conn.send_many(handle, "DEFAULT", [b"work"] * 60)
    peak_started = 0

    async def watched() -> dict[str, Any]:
        nonlocal peak_started
        row = monitor(await monitors(conn), "BusyQueue")
        peak_started = max(peak_started, row["tasks_started"])
        assert row["tasks_running"] <= 2, row
        return row

    row = await wait_until(
        watched, "the queue to drain", 30, 0.02, until=lambda r: r["messages_ready"] == 0
    )
    assert peak_started <= 2, row


@pytest.mark.slow
async def test_activation_status_off_stops_starting_readers(conn: client.Connection) -> None:
    await reply_service(conn, ("Echo", "echo"))
    handle = await ask(conn, "Echo", b"one")
    assert await answer(conn, handle) == b"one"
    await wait_until(
        lambda: tasks_of(conn, "EchoQueue"), "the reader to return", 15, until=lambda t: not t
    )
    await conn.alter_queue("EchoQueue", activation={"status": "OFF"})
    await conn.send(handle, "DEFAULT", b"two")
    end = time.monotonic() + 1.5  # many check intervals and empty-rowset windows
    while time.monotonic() < end:
        assert not await tasks_of(conn, "EchoQueue")
        assert not monitor(await monitors(conn), "EchoQueue")
        await asyncio.sleep(0.05)
    assert [m.message_body for m in await conn.peek("EchoQueue")] == [b"two"]
    await conn.alter_queue("EchoQueue", activation={"status": "ON"})
    assert await answer(conn, handle) == b"two"


async def test_execute_as_must_be_a_login(conn: client.Connection) -> None:
    echo = {"status": "ON", "procedure": "activation_procs:echo"}
    # as EXECUTE AS 'user' in SQL Server, the login must exist when the queue is made
    with pytest.raises(client.NotFoundError, match=r"no login 'nobody'.*create_login"):
        await conn.create_queue("NobodyQueue", activation={**echo, "execute_as": "nobody"})
    await conn.create_queue("NobodyQueue", activation=echo)
    with pytest.raises(client.NotFoundError, match="no login 'nobody'"):
        await conn.alter_queue("NobodyQueue", activation={"execute_as": "nobody"})
    for name in ("x" * 129, "two words", 5):  # and it is a login's name
        with pytest.raises(client.InvalidArgumentError, match="execute_as must be a login's name"):
            await conn.alter_queue("NobodyQueue", activation={"execute_as": name})
    for owner in (None, ""):  # the owner again ("": as clients before 0.2 say it)
        await conn.alter_queue("NobodyQueue", activation={"execute_as": "admin"})
        await conn.alter_queue("NobodyQueue", activation={"execute_as": owner})
        (queue,) = [q for q in await conn.view("service_queues") if q["name"] == "NobodyQueue"]
        assert queue["execute_as"] is None
    # a made-up token neither logs in nor attaches
    host, port = conn.url.rsplit("@", 1)[1].split(":")
    with pytest.raises(client.LoginFailedError):
        await client.connect(f"ssb://admin:not-a-token@{host}:{port}")
    with pytest.raises(client.PermissionDeniedError):
        await conn.attach_task("not-a-token")


# ---- faulty procedures leave the broker serving ---------------------------------------


async def still_serving(conn: client.Connection) -> None:
    started = time.monotonic()
    assert await conn.ping() == "pong"
    assert time.monotonic() - started < 0.5
    handle = await ask(conn, "Echo", b"are you there")
    assert await answer(conn, handle, timeout=10) == b"are you there"


async def test_a_raising_procedure_rolls_back_and_ends_its_task(
    conn: client.Connection,
) -> None:
    await reply_service(conn, ("Echo", "echo"), ("Fail", "fail"))
    await ask(conn, "Fail", b"poison")
    error = await failed_task(conn, "FailQueue", "the failing task to end")
    assert "procedure failed on purpose" in error
    await still_serving(conn)
    # every failure rolled back; after five in a row poison handling disables the queue
    queues = await wait_until(
        lambda: conn.view("service_queues"),
        "poison message handling to disable the queue",
        15,
        until=lambda q: not next(r for r in q if r["name"] == "FailQueue")["is_receive_enabled"],
    )
    assert next(r for r in queues if r["name"] == "FailQueue")["messages_ready"] == 1
    (message,) = await conn.peek("FailQueue")
    assert message.delivery_count == 5
    await still_serving(conn)


async def test_a_hanging_procedure_does_not_slow_the_broker(conn: client.Connection) -> None:
    await reply_service(conn, ("Echo", "echo"), ("Burn", "burn"))
    await ask(conn, "Burn", b"spin")
    tasks = await wait_until(
        lambda: tasks_of(conn, "BurnQueue"),
        "the burning task",
        15,
        until=lambda t: len(t) == 1 and t[0]["pid"] is not None and t[0]["session_id"] is not None,
    )
    pid = tasks[0]["pid"]
    try:
        await wait_until(
            lambda: monitors(conn),
            "the burning task to take its message",
            15,
            until=lambda r: monitor(r, "BurnQueue")["messages_ready"] == 0,
        )
        for _ in range(3):
            await still_serving(conn)
        assert len(await tasks_of(conn, "BurnQueue")) == 1  # it still runs
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_a_killed_worker_is_cleaned_up_and_replaced(conn: client.Connection) -> None:
    await reply_service(conn, ("Echo", "echo"), ("Crash", "crash_once"))
    handle = await ask(conn, "Crash", b"hold me")
    tasks = await wait_until(
        lambda: tasks_of(conn, "CrashQueue"),
        "the task holding its message in a transaction",
        15,
        until=lambda t: len(t) == 1 and t[0]["conversation_group_id"] is not None,
    )
    pid = tasks[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    reply = (await answer(conn, handle)).decode()
    new_pid, deliveries = reply.split(":")
    assert int(new_pid) != pid and deliveries == "2"  # rolled back, received again
    row = monitor(await monitors(conn), "CrashQueue")
    assert row["tasks_failed"] == 1 and "SIGKILL" in row["last_task_error"]
    assert row["tasks_started"] == 2
    assert all(w["pid"] != pid for w in await conn.view("activation_workers"))
    await still_serving(conn)


# ---- external activation ------------------------------------------------------------------


@pytest.mark.slow
async def test_external_activation_notifies_once_until_receive_or_timeout(
    conn: client.Connection,
) -> None:
    await reply_service(conn)
    await conn.create_queue("WorkQueue")
    await conn.create_service("WorkService", queue="WorkQueue", contracts=["DEFAULT"])
    await conn.create_queue("EventsQueue")
    await conn.create_service(
        "EventsService", queue="EventsQueue", contracts=[client.POST_EVENT_NOTIFICATION]
    )
    await conn.create_event_notification(
        "WorkActivation", "QUEUE_ACTIVATION", queue="WorkQueue", service="EventsService"
    )
    assert monitor(await monitors(conn), "WorkQueue")["activation"] == "EXTERNAL"

    async def events() -> Rows:
        return [{"body": m.message_body} for m in await conn.peek("EventsQueue")]

    handle = await ask(conn, "Work", b"1")
    (first,) = await wait_until(events, "the first notification", 15, until=lambda e: len(e) == 1)
    body = first["body"].decode()
    for part in (
        "<EventType>QUEUE_ACTIVATION</EventType>",
        "<ObjectName>WorkQueue</ObjectName>",
        f"<BrokerInstance>{conn.broker_instance_id}</BrokerInstance>",
        "<PostTime>",
    ):
        assert part in body
    (note,) = await conn.peek("EventsQueue")
    assert note.message_type_name == client.EVENT_NOTIFICATION

    await conn.send_many(handle, "DEFAULT", [b"2", b"3"])
    end = time.monotonic() + 1.0  # five checks, a third of the response timeout
    while time.monotonic() < end:
        assert len(await events()) == 1
        assert monitor(await monitors(conn), "WorkQueue")["state"] == "NOTIFIED"
        await asyncio.sleep(0.05)

    received_at = time.monotonic()
    assert len(await conn.receive("WorkQueue", top=1)) == 1  # the external reader answers
    await wait_until(events, "a notification after the RECEIVE", 15, until=lambda e: len(e) == 2)
    second_at = time.monotonic()
    assert second_at - received_at < 2.5  # the RECEIVE, not the 3 s timeout, let it through

    await wait_until(events, "a notification after timeout", 10, until=lambda e: len(e) == 3)
    assert time.monotonic() - second_at >= 2.5  # notification_timeout = 3 s
    assert monitor(await monitors(conn), "WorkQueue")["notifications_sent"] == 3
