"""Activation by a T-SQL stored procedure, against a real broker: started by the queue
monitor as a Python procedure is, in the queue's database, as its EXECUTE AS login; its
PRINT and errors in the broker's log under ssb.task; and exactly-once replies through a
kill -9 of the broker."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from daemon import BrokerProcess

from ssb import client
from ssb.tools import wait_until

from .helpers import each_fails, new_session, ran

ACTIVATION = {"check_interval": 0.2, "empty_rowset_window": 0.5}

SETUP = """CREATE DATABASE Shop;
GO
USE Shop;
CREATE MESSAGE TYPE Request VALIDATION = NONE;
CREATE MESSAGE TYPE Reply VALIDATION = NONE;
CREATE CONTRACT Work (Request SENT BY INITIATOR, Reply SENT BY TARGET);
CREATE QUEUE TargetQueue;
CREATE SERVICE TargetService ON QUEUE TargetQueue (Work);
CREATE QUEUE InitiatorQueue;
CREATE SERVICE InitiatorService ON QUEUE InitiatorQueue;
GO
CREATE PROCEDURE Answer AS
    DECLARE @h UNIQUEIDENTIFIER, @body VARBINARY(MAX), @type sysname;
    WHILE 1 = 1
    BEGIN
        BEGIN TRANSACTION;
        WAITFOR (RECEIVE TOP (1) @h = conversation_handle, @body = message_body,
            @type = message_type_name FROM TargetQueue), TIMEOUT 2000;
        IF @@ROWCOUNT = 0
        BEGIN
            ROLLBACK TRANSACTION;
            BREAK;
        END
        IF @type = N'Request'
        BEGIN
            IF CAST(@body AS VARCHAR(20)) = 'fail'
                RAISERROR (N'cannot do %s', 16, 1, N'that');
            SEND ON CONVERSATION @h MESSAGE TYPE Reply (@body);
        END
        ELSE IF @type = N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog'
            END CONVERSATION @h;
        PRINT N'answered';
        COMMIT TRANSACTION;
    END
GO
ALTER QUEUE TargetQueue WITH ACTIVATION (STATUS = ON, PROCEDURE_NAME = dbo.Answer,
    MAX_QUEUE_READERS = 4, EXECUTE AS SELF);
GO
"""


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    """This module's broker: quick activation checks."""
    return {"config": {"activation": ACTIVATION}}


async def _setup(broker: BrokerProcess) -> None:
    async with await client.connect(broker.url) as conn:
        await ran(SETUP, conn, login="admin")


async def _replies(conn: client.Connection, top: int = 100) -> list[client.Message]:
    async def take(c: client.Connection) -> list[client.Message]:
        return await c.receive("InitiatorQueue", top=top, timeout=1.0)

    return await conn.run_transaction(take)


async def test_a_t_sql_procedure_is_activated_in_its_queues_database(broker: BrokerProcess) -> None:
    await _setup(broker)
    async with await client.connect(broker.url, database="Shop") as conn:
        handle = await conn.begin_dialog("InitiatorService", "TargetService", contract="Work")
        await conn.send_many(handle, "Request", [b"one", b"two"])
        got: list[client.Message] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += await _replies(conn)
        assert [m.message_body for m in got] == [b"one", b"two"]
        tasks = await wait_until(
            lambda: conn.view("activated_tasks"), "an activated task in the view", 10
        )
        assert (tasks[0]["database"], tasks[0]["queue"], tasks[0]["procedure"]) == (
            "Shop",
            "TargetQueue",
            "Answer",
        )
        assert tasks[0]["execute_as"] == "admin"
        # an error ends the task: the broker logs it, in SQL Server's words
        await conn.send(handle, "Request", b"fail")
        monitors = await wait_until(
            lambda: conn.view("queue_monitors"),
            "the failed task in the queue monitor",
            30,
            until=lambda rows: rows and rows[0]["last_task_error"],
        )
        assert monitors[0]["database"] == "Shop"
        error = monitors[0]["last_task_error"]
        assert "Msg 50000, Level 16, State 1, Procedure Answer" in error
        assert "cannot do that" in error
    log = broker.log_text()
    assert "ssb.task: worker" in log and ": answered" in log
    assert "cannot do that" in log
    assert "Traceback" not in log


async def test_execute_as_names_a_login_and_owner_is_the_queues_owner(
    broker: BrokerProcess,
) -> None:
    await _setup(broker)
    async with await client.connect(broker.url, database="Shop") as conn:
        session, out = new_session(conn, login="admin")
        await each_fails(session, "ALTER QUEUE TargetQueue WITH ACTIVATION (EXECUTE AS 'nobody')")
        assert "there is no login 'nobody'" in out.errors[0].text

        async def execute_as() -> object:
            (queue,) = [q for q in await conn.view("service_queues") if q["name"] == "TargetQueue"]
            return queue["execute_as"]

        assert await execute_as() == "admin"  # (SELF, the setup's)
        await ran("ALTER QUEUE TargetQueue WITH ACTIVATION (EXECUTE AS OWNER)", conn)
        assert await execute_as() is None
        await ran("ALTER QUEUE TargetQueue WITH ACTIVATION (EXECUTE AS 'admin')", conn)
        await ran("ALTER QUEUE TargetQueue WITH ACTIVATION (DROP)", conn)
        assert await execute_as() is None


@pytest.mark.slow
async def test_replies_exactly_once_through_a_kill_9(broker: BrokerProcess) -> None:
    """10,000 requests on 100 dialogs; the broker is killed when about half the replies
    are in; every reply arrives exactly once."""
    await _setup(broker)
    async with await client.connect(broker.url, database="Shop", reconnect_deadline=120) as conn:
        expected: set[bytes] = set()
        for dialog in range(100):
            handle = await conn.begin_dialog("InitiatorService", "TargetService", contract="Work")
            bodies = [f"{dialog}:{n}:{uuid.uuid4()}".encode() for n in range(100)]
            await conn.send_many(handle, "Request", bodies)
            expected.update(bodies)
        assert len(expected) == 10_000
        seen: list[bytes] = []
        killed = False
        deadline = time.monotonic() + 600
        while len(seen) < len(expected):
            assert time.monotonic() < deadline, f"{len(seen)} replies of 10,000"
            seen += [m.message_body for m in await _replies(conn)]
            if not killed and len(seen) >= 5_000:
                broker.kill()
                broker.start()
                killed = True
        assert killed
        assert len(seen) == len(set(seen)) == 10_000  # none lost, none twice
        assert set(seen) == expected
        assert await _replies(conn) == []
