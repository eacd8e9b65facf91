"""T-SQL against a real broker daemon: the DDL, the conversation statements, bodies as
Service Broker makes them, transactions, and queries over the catalog views."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ssb import client
from ssb.protocol import generate_broker_identity
from ssb.tsql import Collect, ResultSet, Session, SqlError

from .helpers import each_fails, ran, run, table

STATE_TABLE_SCRIPT = Path(__file__).resolve().parent / "scripts" / "state_table.sql"

CATALOG = """
CREATE MESSAGE TYPE [//t/Request] VALIDATION = WELL_FORMED_XML;
CREATE MESSAGE TYPE [//t/Reply] VALIDATION = NONE;
CREATE CONTRACT [//t/Contract] ([//t/Request] SENT BY INITIATOR, [//t/Reply] SENT BY TARGET);
CREATE QUEUE TargetQueue;
CREATE QUEUE InitiatorQueue WITH STATUS = ON, RETENTION = OFF;
CREATE SERVICE [//t/Target] ON QUEUE TargetQueue ([//t/Contract]);
CREATE SERVICE [//t/Initiator] ON QUEUE dbo.InitiatorQueue;
GO
"""


async def _requests(conn: client.Connection, *bodies: bytes) -> uuid.UUID:
    """A dialog from //t/Initiator to //t/Target, `bodies` sent on it as requests: its handle."""
    handle = await conn.begin_dialog("//t/Initiator", "//t/Target", contract="//t/Contract")
    if bodies:
        await conn.send_many(handle, "//t/Request", list(bodies))
    return handle


class Admin:
    """A T-SQL session of admin's on the test's broker, which has run CATALOG, and its
    output in order (`out`)."""

    def __init__(self, session: Session, out: Collect) -> None:
        self.session = session
        self.out = out

    async def run(self, text: str) -> bool:
        """Run the script `text`: whether all its batches succeeded."""
        return await run(self.session, text)

    async def ok(self, text: str) -> list[ResultSet]:
        """Run the script `text`, every batch succeeding (else AssertionError, with the
        errors): the result sets the session has had."""
        assert await run(self.session, text), self.out.errors
        return self.out.results

    async def error(self, text: str) -> SqlError:
        """Run the script `text`, which must fail: the session's last error."""
        assert not await run(self.session, text), text
        return self.out.errors[-1]

    async def each_fails(self, *texts: str) -> list[SqlError]:
        """Run each script of `texts`, every one failing (else AssertionError, naming the
        script): the errors the session has had."""
        await each_fails(self.session, *texts)
        return self.out.errors


@pytest.fixture
async def tsql(conn: client.Connection) -> Admin:
    """Admin's session on the test's broker, with CATALOG made."""
    return Admin(*await ran(CATALOG, conn, login="admin"))


async def test_the_ddl_reaches_the_catalog(tsql: Admin, conn: client.Connection) -> None:
    await tsql.ok(
        "ALTER QUEUE TargetQueue WITH STATUS = OFF, POISON_MESSAGE_HANDLING (STATUS = OFF)\n"
        "CREATE ROUTE R WITH SERVICE_NAME = '//far', ADDRESS = 'TCP://127.0.0.1:4999'\n"
        "CREATE BROKER PRIORITY P FOR CONVERSATION SET (CONTRACT_NAME = [//t/Contract],"
        " LOCAL_SERVICE_NAME = ANY, PRIORITY_LEVEL = 8)\n"
        "ALTER BROKER PRIORITY P FOR CONVERSATION SET (PRIORITY_LEVEL = 9)\n"
        "CREATE QUEUE Events\n"
        "CREATE SERVICE EventService ON QUEUE Events"
        " ([http://schemas.microsoft.com/SQL/Notifications/PostEventNotification])\n"
        "CREATE EVENT NOTIFICATION N ON QUEUE TargetQueue FOR BROKER_QUEUE_DISABLED"
        " TO SERVICE 'EventService', 'current database'\n"
        "CREATE LOGIN app WITH PASSWORD = 'app-password-1'\n"
        "GRANT SEND ON SERVICE::[//t/Target] TO app\n"
        "GRANT RECEIVE ON dbo.TargetQueue TO app\n"
        "GRANT ALTER ON MESSAGE TYPE::[//t/Reply] TO app\n",
    )
    grants = {
        (g["permission"], g["kind"], g["name"])
        for g in await conn.view("permissions")
        if g["login"] == "app"
    }
    assert grants == {
        ("SEND", "service", "//t/Target"),
        ("RECEIVE", "queue", "TargetQueue"),
        ("ALTER", "message_type", "//t/Reply"),
    }
    error = await tsql.error("GRANT CREATE QUEUE TO app")
    assert "CREATE (of every kind at once)" in error.text
    queues = {q["name"]: q for q in await conn.view("service_queues")}
    assert queues["TargetQueue"]["is_receive_enabled"] is False
    assert queues["TargetQueue"]["is_poison_message_handling_enabled"] is False
    assert [(r["remote_service_name"], r["address"]) for r in await conn.view("routes")] == [
        ("//far", "tcp://127.0.0.1:4999")
    ]
    (priority,) = await conn.view("conversation_priorities")
    assert (priority["service_contract_name"], priority["priority"]) == ("//t/Contract", 9)
    (notification,) = await conn.view("event_notifications")
    assert notification["event"] == "BROKER_QUEUE_DISABLED"
    await tsql.ok(
        "DROP EVENT NOTIFICATION N ON QUEUE TargetQueue\nDROP BROKER PRIORITY P\nDROP ROUTE R\n"
        "DROP SERVICE EventService\nDROP QUEUE Events\nDROP SERVICE [//t/Target]\n"
        "DROP SERVICE [//t/Initiator]\nDROP QUEUE TargetQueue\nDROP QUEUE InitiatorQueue\n"
        "DROP CONTRACT [//t/Contract]\nDROP MESSAGE TYPE [//t/Request]\nDROP MESSAGE TYPE [//t/Reply]",
    )
    assert await conn.view("services") == []
    assert await conn.view("routes") == []


async def test_what_ssb_lacks_is_refused_never_ignored(tsql: Admin) -> None:
    errors = await tsql.each_fails(
        "CREATE MASTER KEY ENCRYPTION BY PASSWORD = 'x'",
        "CREATE USER u WITHOUT LOGIN",
        "CREATE REMOTE SERVICE BINDING b TO SERVICE '//far' WITH USER = u",
        "ALTER DATABASE master SET DISABLE_BROKER",
        "ALTER DATABASE master SET RECOVERY SIMPLE",
    )
    assert [e.number for e in errors] == [40517] * 5
    assert "is not supported by ssb" in errors[3].text
    # an activation procedure in T-SQL must exist (in the queue's database)
    error = await tsql.error(
        "ALTER QUEUE TargetQueue WITH ACTIVATION (STATUS = ON, PROCEDURE_NAME = TargetProc,"
        " MAX_QUEUE_READERS = 1, EXECUTE AS SELF)",
    )
    assert error.number == 2812
    assert "stored procedure 'TargetProc' does not exist" in error.text


async def test_alter_message_type_and_service(tsql: Admin, conn: client.Connection) -> None:
    await tsql.ok(
        "ALTER MESSAGE TYPE [//t/Reply] VALIDATION = EMPTY\n"
        "ALTER SERVICE [//t/Target] (ADD CONTRACT [DEFAULT], DROP CONTRACT [//t/Contract])",
    )
    types = {m["name"]: m["validation"] for m in await conn.view("message_types")}
    assert types["//t/Reply"] == "EMPTY"
    services = {s["name"]: s["contracts"] for s in await conn.view("services")}
    assert services["//t/Target"] == "DEFAULT"


async def test_a_conversation_in_t_sql(tsql: Admin) -> None:
    first, replies, endpoints = await tsql.ok(
        "DECLARE @h UNIQUEIDENTIFIER, @body NVARCHAR(100) = N'<Request>é</Request>';\n"
        "BEGIN TRANSACTION;\n"
        "BEGIN DIALOG CONVERSATION @h FROM SERVICE [//t/Initiator] TO SERVICE N'//t/Target',"
        " 'CURRENT DATABASE' ON CONTRACT [//t/Contract] WITH LIFETIME = 600, ENCRYPTION = OFF;\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (@body);\n"
        "COMMIT;\n"
        "DECLARE @got NVARCHAR(100), @type sysname, @th UNIQUEIDENTIFIER, @x XML;\n"
        "WAITFOR (RECEIVE TOP (1) @th = conversation_handle, @got = message_body,"
        " @type = message_type_name, @x = CAST(message_body AS XML) FROM TargetQueue), TIMEOUT 5000;\n"
        "SELECT @got AS got, @type AS type, @@ROWCOUNT AS n, @x.value('(/Request)[1]', 'nvarchar(10)') AS v;\n"
        "SEND ON CONVERSATION @th MESSAGE TYPE [//t/Reply] (CAST(N'réponse' AS VARCHAR(20)));\n"
        "END CONVERSATION @th;\n"
        "RECEIVE TOP (10) message_type_name, CAST(message_body AS VARCHAR(20)) AS body"
        " FROM InitiatorQueue WHERE conversation_handle = @h;\n"
        "END CONVERSATION @h;\n"
        "SELECT COUNT(*) AS endpoints FROM sys.conversation_endpoints",
    )
    assert table(first) == [["<Request>é</Request>", "//t/Request", 1, "é"]]
    assert table(replies) == [
        ["//t/Reply", "réponse"],
        ["http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog", ""],
    ]
    assert table(endpoints) == [[0]]


async def test_bodies_are_the_bytes_sql_server_sends(tsql: Admin, conn: client.Connection) -> None:
    """NVARCHAR is sent as UTF-16 without a byte-order mark, VARCHAR as its bytes, XML as
    UTF-16 with one, VARBINARY as it is."""
    await tsql.ok(
        "DECLARE @h UNIQUEIDENTIFIER\n"
        "BEGIN DIALOG @h FROM SERVICE [//t/Initiator] TO SERVICE '//t/Target' ON CONTRACT"
        " [//t/Contract] WITH ENCRYPTION = OFF\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (N'<a>é</a>')\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] ('<a>e</a>')\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (CAST(N'<a>é</a>' AS XML))\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (0x3C612F3E)",
    )
    messages = await conn.receive("TargetQueue", timeout=5.0)
    assert [m.message_body for m in messages] == [
        "<a>é</a>".encode("utf-16-le"),
        b"<a>e</a>",
        b"\xff\xfe" + "<a>é</a>".encode("utf-16-le"),
        b"<a/>",
    ]


async def test_receive_variants(tsql: Admin, conn: client.Connection) -> None:
    for _ in range(2):  # two conversation groups
        await _requests(conn, b"<one/>", b"<two/>")
    counted, one, rest, rowcount, empty, none = await tsql.ok(
        "DECLARE @t TABLE (h UNIQUEIDENTIFIER, seq BIGINT, body VARBINARY(MAX));\n"
        "DECLARE @g UNIQUEIDENTIFIER;\n"
        "GET CONVERSATION GROUP @g FROM TargetQueue;\n"
        "RECEIVE conversation_handle, message_sequence_number, message_body FROM TargetQueue"
        " INTO @t WHERE conversation_group_id = @g;\n"
        "SELECT COUNT(*) AS n, MIN(seq) AS first, MAX(seq) AS last FROM @t;\n"
        "RECEIVE TOP (1) * FROM TargetQueue;\n"
        "WAITFOR (RECEIVE * FROM TargetQueue), TIMEOUT 100;\n"
        "SELECT @@ROWCOUNT AS n_rows;\n"
        "WAITFOR (RECEIVE * FROM TargetQueue), TIMEOUT 50;\n"
        "SELECT @@ROWCOUNT AS n_rows;",
    )
    assert table(counted) == [[2, 0, 1]]
    assert len(one.rows) == 1 and one.columns[:3] == ["status", "priority", "queuing_order"]
    assert len(rest.rows) == 1
    assert table(rowcount) == [[1]]
    assert empty.rows == [] and table(none) == [[0]]


async def test_receive_top_and_timeout_convert_as_sql_server_converts_them(
    tsql: Admin, conn: client.Connection
) -> None:
    """RECEIVE's TOP and TIMEOUT convert to BIGINT: text that is no number fails (Msg 245),
    a negative TOP too (Msg 1014); TOP (0) receives nothing, and waits for nothing."""
    await _requests(conn, b"<one/>")
    errors = await tsql.each_fails(
        "RECEIVE TOP ('abc') * FROM TargetQueue",
        "RECEIVE TOP (-1) * FROM TargetQueue",
        "WAITFOR (RECEIVE * FROM TargetQueue), TIMEOUT 'abc'",
    )
    conversion = "Conversion failed when converting the varchar value 'abc' to data type bigint."
    assert [(e.number, e.text) for e in errors] == [
        (245, conversion),
        (1014, "A TOP N or FETCH rows count value may not be negative."),
        (245, conversion),
    ]
    none, rowcount, none_again, left = await tsql.ok(
        "RECEIVE TOP (0) message_body FROM TargetQueue; SELECT @@ROWCOUNT AS n;\n"
        "WAITFOR (RECEIVE TOP (0) message_body FROM TargetQueue);\n"
        "SELECT COUNT(*) AS n FROM TargetQueue",
    )
    assert none.columns == ["message_body"] and none.rows == [] and none_again.rows == []
    assert table(rowcount) == [[0]] and table(left) == [[1]]


async def test_lifetimes_and_timer_timeouts_convert_as_sql_server_converts_them(
    tsql: Admin,
) -> None:
    begin = (
        "DECLARE @h UNIQUEIDENTIFIER; BEGIN DIALOG @h FROM SERVICE [//t/Initiator]"
        " TO SERVICE '//t/Target' ON CONTRACT [//t/Contract]"
    )
    errors = await tsql.each_fails(
        f"{begin} WITH LIFETIME = 'x'",
        f"{begin}; BEGIN CONVERSATION TIMER (@h) TIMEOUT = 'x'",
        "CREATE ROUTE R WITH SERVICE_NAME = '//far', ADDRESS = 'LOCAL', LIFETIME = 'x'",
    )
    conversion = "Conversion failed when converting the varchar value 'x' to data type bigint."
    assert [(e.number, e.text) for e in errors] == [(245, conversion)] * 3
    await tsql.ok(
        f"{begin} WITH LIFETIME = '60'; BEGIN CONVERSATION TIMER (@h) TIMEOUT = '30'",
    )


async def test_a_failing_statement_in_a_transaction_leaves_nothing_of_itself(
    tsql: Admin, conn: client.Connection
) -> None:
    handle = await _requests(conn)
    await tsql.run(
        f"DECLARE @h UNIQUEIDENTIFIER = '{handle}'\nSEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (N'<auto/>')",
    )
    error = await tsql.error(
        f"DECLARE @h UNIQUEIDENTIFIER = '{handle}'\n"
        "BEGIN TRANSACTION\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (N'<in/>')\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Reply] (N'wrong way')\n"
        "PRINT 'not reached'",
    )
    assert error.number == 8432 and error.line == 4
    results = await tsql.ok("SELECT @@TRANCOUNT AS open_transactions\nCOMMIT")
    assert table(results[-1]) == [[1]]
    received = await conn.receive("TargetQueue", timeout=5.0)
    assert [m.message_body for m in received] == [
        "<auto/>".encode("utf-16-le"),
        "<in/>".encode("utf-16-le"),
    ]


async def test_a_receive_whose_columns_fail_gives_its_messages_back(
    tsql: Admin, conn: client.Connection
) -> None:
    handle = await _requests(conn, b"<ok/>")
    script = "DECLARE @x INT\nRECEIVE TOP (1) @x = CAST(CAST(message_body AS NVARCHAR(10)) AS INT) FROM TargetQueue"
    error = await tsql.error(script)  # outside a transaction: back in the queue
    assert error.number == 245
    assert len(await conn.peek("TargetQueue")) == 1
    # inside one, a savepoint undoes that RECEIVE alone: what came before it commits
    before = (
        f"BEGIN TRANSACTION\nSEND ON CONVERSATION '{handle}' MESSAGE TYPE [//t/Request]"
        " (CAST(N'<before/>' AS XML))\nGO\n"
    )
    error = await tsql.error(before + script)
    assert error.number == 245
    results = await tsql.ok("SELECT XACT_STATE() AS state\nCOMMIT")
    assert table(results[-1]) == [[1]]
    waiting = await conn.peek("TargetQueue")
    assert [m.message_body for m in waiting] == [b"<ok/>", "<before/>".encode("utf-16")]


async def test_a_receive_into_a_table_that_refuses_the_rows_gives_its_messages_back(
    tsql: Admin, conn: client.Connection
) -> None:
    await _requests(conn, b"<longer-than-the-column/>")
    errors = await tsql.each_fails(
        "DECLARE @t TABLE (b VARBINARY(4)); RECEIVE message_body FROM TargetQueue INTO @t",
    )
    assert [e.number for e in errors] == [8152]
    results = await tsql.ok("SELECT COUNT(*) AS n FROM TargetQueue")
    assert table(results[-1]) == [[1]]


async def test_save_transaction_and_rollback_to_it(tsql: Admin, conn: client.Connection) -> None:
    handle = await _requests(conn, b"<one/>", b"<two/>")
    script = f"""
DECLARE @body VARBINARY(MAX), @h UNIQUEIDENTIFIER = '{handle}', @g UNIQUEIDENTIFIER
BEGIN TRANSACTION outer_work
RECEIVE TOP (1) @body = message_body FROM TargetQueue
SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (CAST(N'<kept/>' AS XML))
SAVE TRANSACTION after_first
RECEIVE TOP (1) @body = message_body FROM TargetQueue
SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (CAST(N'<undone/>' AS XML))
BEGIN DIALOG @g FROM SERVICE [//t/Initiator] TO SERVICE '//t/Target' ON CONTRACT [//t/Contract]
ROLLBACK TRANSACTION after_first
PRINT CAST(@@TRANCOUNT AS NVARCHAR(4))
ROLLBACK TRANSACTION nothing_of_that_name
"""
    error = await tsql.error(script)
    assert tsql.out.messages[-1] == "1"  # the transaction goes on
    assert error.number == 6401
    await tsql.ok("COMMIT")
    waiting = [m.message_body for m in await conn.peek("TargetQueue")]
    # the first RECEIVE and SEND stand; the second RECEIVE's message is back, in its place
    assert waiting == [b"<two/>", "<kept/>".encode("utf-16")]
    endpoints = await conn.view("conversation_endpoints")
    assert len(endpoints) == 2  # the dialog begun after the savepoint never was


async def test_queries_over_the_catalog_views_and_queues(
    tsql: Admin, conn: client.Connection
) -> None:
    handle = await _requests(conn, b"<a/>", b"<b/>")
    services, contracts, counted, bodies, endpoint, databases, objects = await tsql.ok(
        "SELECT s.name, q.name AS queue FROM sys.services s JOIN sys.service_queues q"
        " ON s.service_queue_id = q.object_id WHERE s.name LIKE N'//T/%' ORDER BY s.name DESC;\n"
        "SELECT TOP 1 c.name, COUNT(*) AS types FROM sys.service_contracts c"
        " JOIN sys.service_contract_message_usages u ON u.service_contract_id = c.service_contract_id"
        " GROUP BY c.name HAVING COUNT(*) > 1;\n"
        "IF EXISTS (SELECT * FROM sys.service_message_types WHERE name = N'//t/request'"
        " AND validation_desc = 'XML') PRINT 'found';\n"
        "DECLARE @n INT = (SELECT COUNT(*) FROM TargetQueue);\n"
        "SELECT @n AS n, (SELECT MAX(message_sequence_number) FROM TargetQueue) AS last;\n"
        "SELECT message_type_name, CAST(message_body AS XML).value('local-name(/*[1])', 'nvarchar(10)')"
        " AS root FROM TargetQueue ORDER BY queuing_order;\n"
        "SELECT state_desc, is_initiator FROM sys.conversation_endpoints"
        f" WHERE conversation_handle = '{handle}';\n"
        "SELECT name, is_broker_enabled FROM sys.databases;\n"
        "DECLARE @queue INT = OBJECT_ID(N'dbo.TargetQueue');\n"
        "SELECT COUNT(*) AS objects FROM sys.objects WHERE type = 'SQ' AND object_id = @queue;\n"
        "IF OBJECT_ID('[TargetQueue]', 'SQ') IS NOT NULL AND OBJECT_ID('nope') IS NULL"
        " PRINT 'ids'",
    )
    assert table(services) == [["//t/Target", "TargetQueue"], ["//t/Initiator", "InitiatorQueue"]]
    assert table(contracts) == [["//t/Contract", 2]]
    assert tsql.out.messages == ["found", "ids"]
    assert table(counted) == [[2, 1]]
    assert table(bodies) == [["//t/Request", "a"], ["//t/Request", "b"]]
    assert table(endpoint) == [["CONVERSING", 1]]
    assert table(databases) == [["master", 1]]
    assert table(objects) == [[1]]
    # a queue's columns have their SQL types in a query: CONVERT's style applies to
    # message_enqueue_time, a DATETIME, and SUM adds in the column's type
    results = await tsql.ok(
        "SELECT MIN(CONVERT(VARCHAR(8), message_enqueue_time, 112)) AS day,"
        " SUM(status) AS status, SUM(message_sequence_number) AS numbers FROM TargetQueue",
    )
    ((day, status, numbers),) = table(results[-1])
    assert len(day) == 8 and day.isdigit(), day
    assert (status, numbers) == (2, 1)


async def test_what_a_query_cannot_translate_is_refused(tsql: Admin) -> None:
    errors = await tsql.each_fails(
        "SELECT SOUNDEX(name) FROM sys.services", "SELECT * FROM sys.tables"
    )
    assert [e.number for e in errors] == [40517, 208]


async def test_service_brokers_error_numbers(tsql: Admin) -> None:
    errors = await tsql.each_fails(
        f"END CONVERSATION '{uuid.uuid4()}'",
        "DECLARE @h UNIQUEIDENTIFIER\nEND CONVERSATION @h",
        f"END CONVERSATION '{uuid.uuid4()}' WITH ERROR = NULL DESCRIPTION = N'x'",
        "DECLARE @h UNIQUEIDENTIFIER\nBEGIN DIALOG @h FROM SERVICE [//nope] TO SERVICE '//t/Target'",
        "DECLARE @h UNIQUEIDENTIFIER\nBEGIN DIALOG @h FROM SERVICE [//t/Initiator] TO SERVICE"
        " '//t/Target' ON CONTRACT [//t/Contract]\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (N'<not xml')",
        "DECLARE @h UNIQUEIDENTIFIER, @b VARBINARY(MAX)\n"
        "RECEIVE @h = conversation_handle, message_body FROM TargetQueue",
        "RECEIVE * FROM NoSuchQueue",
        "DROP QUEUE NoSuchQueue",
        "DROP SERVICE [//nope]",
    )
    assert [e.number for e in errors] == [8426, 8418, 8419, 8423, 8430, 8447, 208, 3701, 15151]
    assert errors[-1].text == (
        "Cannot drop the service '//nope', because it does not exist or you do not have permission."
    )


async def test_timers_groups_errors_and_cleanup(tsql: Admin) -> None:
    """Dialogs in one conversation group (WITH RELATED_CONVERSATION_GROUP, MOVE
    CONVERSATION), a conversation timer's message, END CONVERSATION WITH ERROR as the far
    side receives it (an Error message with the code), and WITH CLEANUP."""
    grouped, timer, last = await tsql.ok(
        "SET NOCOUNT ON\n"
        "DECLARE @a UNIQUEIDENTIFIER, @b UNIQUEIDENTIFIER, @g UNIQUEIDENTIFIER, @c UNIQUEIDENTIFIER\n"
        "BEGIN DIALOG @a FROM SERVICE [//t/Initiator] TO SERVICE '//t/Target' ON CONTRACT [//t/Contract]\n"
        "SELECT @g = conversation_group_id FROM sys.conversation_endpoints WHERE conversation_handle = @a\n"
        "BEGIN DIALOG @b FROM SERVICE [//t/Initiator] TO SERVICE '//t/Target' ON CONTRACT"
        " [//t/Contract] WITH RELATED_CONVERSATION_GROUP = @g\n"
        "BEGIN DIALOG @c FROM SERVICE [//t/Initiator] TO SERVICE '//t/Target' ON CONTRACT [//t/Contract]\n"
        "MOVE CONVERSATION @c TO @g\n"
        "SELECT COUNT(*) AS in_group FROM sys.conversation_endpoints WHERE conversation_group_id = @g\n"
        "BEGIN CONVERSATION TIMER (@a) TIMEOUT = 1\n"
        "WAITFOR (RECEIVE message_type_name FROM InitiatorQueue WHERE conversation_handle = @a),"
        " TIMEOUT 10000\n"
        "SEND ON CONVERSATION @b MESSAGE TYPE [//t/Request] (N'<x/>')\n"
        "END CONVERSATION @b WITH ERROR = 31472 DESCRIPTION = N'gave up'\n"
        "END CONVERSATION @c WITH CLEANUP\n"
        "DECLARE @type sysname, @body XML\n"
        "WAITFOR (RECEIVE TOP (1) @type = message_type_name FROM TargetQueue), TIMEOUT 5000\n"
        "WAITFOR (RECEIVE TOP (1) @type = message_type_name, @body = CAST(message_body AS XML)"
        " FROM TargetQueue), TIMEOUT 5000\n"
        "SELECT @type AS type, @body.value('declare namespace e=\"http://schemas.microsoft.com/"
        "SQL/ServiceBroker/Error\"; (/e:Error/e:Code)[1]', 'int') AS code",
    )
    assert table(grouped) == [[3]]
    assert table(timer) == [["http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer"]]
    assert table(last) == [["http://schemas.microsoft.com/SQL/ServiceBroker/Error", 31472]]


async def test_databases_in_t_sql(tsql: Admin, conn: client.Connection) -> None:
    results = await tsql.ok(
        "CREATE DATABASE Sales\nGO\nUSE Sales\nGO\n"
        "CREATE QUEUE TargetQueue\n"  # the same name as master's, in another database
        "SELECT DB_ID() AS id, DB_NAME() AS name, DB_NAME(1) AS first\n"
        "SELECT name FROM sys.databases WHERE database_id = DB_ID()\n"
        "SELECT name FROM sys.service_queues\n",
    )
    ids, named, queues = results[-3:]
    assert table(ids) == [[5, "Sales", "master"]]
    assert table(named) == [["Sales"]]
    assert table(queues) == [["TargetQueue"]]  # Sales's only
    await tsql.ok("RECEIVE * FROM Sales.dbo.TargetQueue")  # this database's
    error = await tsql.error("RECEIVE * FROM master.dbo.TargetQueue")
    assert "an object of another database" in error.text  # never this one's
    error = await tsql.error("DROP DATABASE Sales")
    assert error.number == 3702  # this session uses it
    error = await tsql.error("USE Nowhere")
    assert error.number == 911
    error = await tsql.error("CREATE DATABASE sales")
    assert error.number == 1801
    await tsql.ok("USE master\nGO\nDROP DATABASE Sales\nDROP DATABASE IF EXISTS Sales")
    assert [d["name"] for d in await conn.view("databases")] == ["master"]


async def test_begin_dialog_names_a_broker_instance_as_the_routes_keep_it(
    tsql: Admin,
) -> None:
    # SQL Server prints GUIDs in upper case; the broker's routes keep them in lower case
    far = uuid.uuid4()
    results = await tsql.ok(
        f"CREATE ROUTE Far WITH SERVICE_NAME = '//far', BROKER_INSTANCE = '{far}',"
        " ADDRESS = 'TCP://127.0.0.1:9'\n"
        "DECLARE @h UNIQUEIDENTIFIER\n"
        f"BEGIN DIALOG @h FROM SERVICE [//t/Initiator] TO SERVICE '//far', '{str(far).upper()}'"
        " ON CONTRACT [//t/Contract] WITH ENCRYPTION = OFF\n"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//t/Request] (N'<a/>')\n"
        "SELECT to_broker_instance, transmission_status FROM sys.transmission_queue",
    )
    ((instance, status),) = table(results[-1])
    assert instance == str(far)
    assert "no route" not in (status or "").lower(), status  # the route was found
    error = await tsql.error(
        "DECLARE @h UNIQUEIDENTIFIER\n"
        "BEGIN DIALOG @h FROM SERVICE [//t/Initiator] TO SERVICE '//far', 'not a guid'",
    )
    assert error.number == 101004
    assert "'not a guid' of BEGIN DIALOG is not a GUID" in error.text


async def test_a_certificates_authorization_is_the_login_its_broker_acts_as(
    tsql: Admin, conn: client.Connection, tmp_path: Path
) -> None:
    """CREATE CERTIFICATE ... AUTHORIZATION maps the peer broker presenting it to that
    login, as Service Broker maps it to the certificate's owner; without it, PUBLIC."""
    for name in ("peer", "other", "own"):
        pem = tmp_path / f"{name}.pem"
        pem.write_text(_peer_certificate())
    await tsql.ok(
        "CREATE LOGIN shop WITH PASSWORD = 'shop-password-1'\n"
        f"CREATE CERTIFICATE PeerCert AUTHORIZATION shop FROM FILE = '{tmp_path / 'peer.pem'}'\n"
        f"CREATE CERTIFICATE OtherCert FROM FILE = '{tmp_path / 'other.pem'}'\n"
        f"CREATE CERTIFICATE OwnerCert AUTHORIZATION dbo FROM FILE = '{tmp_path / 'own.pem'}'\n",
    )
    logins = {r["name"]: r["login"] for r in await conn.view("certificates")}
    assert logins == {"PeerCert": "shop", "OtherCert": "public", "OwnerCert": "admin"}


def _peer_certificate() -> str:
    """Another broker's certificate (its key is not needed to trust it)."""
    return generate_broker_identity(uuid.uuid4())[1].decode()


async def test_scripts_as_sql_server_reads_them(tsql: Admin) -> None:
    """Schema-qualified queue names, RECEIVE * into a table variable declared with
    Service Broker's columns, @@ROWCOUNT inside a query, and a procedure's SET NOCOUNT
    that ends when the procedure returns."""
    results = await tsql.ok(
        "CREATE QUEUE dbo.Work\n"
        "CREATE SERVICE WorkService ON QUEUE dbo.Work ([DEFAULT])\n"
        "GO\n"
        "CREATE PROCEDURE dbo.Quiet AS BEGIN SET NOCOUNT ON; SET XACT_ABORT ON; END\n"
        "GO\n"
        "DECLARE @t TABLE (status TINYINT, priority TINYINT, queuing_order BIGINT,"
        " conversation_group_id UNIQUEIDENTIFIER, conversation_handle UNIQUEIDENTIFIER,"
        " message_sequence_number BIGINT, service_name NVARCHAR(512), service_id INT,"
        " service_contract_name NVARCHAR(256), service_contract_id INT,"
        " message_type_name NVARCHAR(256), message_type_id INT, validation NCHAR(2),"
        " message_body VARBINARY(MAX));\n"
        "DECLARE @h UNIQUEIDENTIFIER;\n"
        "BEGIN DIALOG @h FROM SERVICE [//t/Initiator] TO SERVICE 'WorkService'"
        " WITH ENCRYPTION = OFF;\n"
        "SEND ON CONVERSATION @h (0x0102);\n"
        "WAITFOR (RECEIVE * FROM dbo.Work INTO @t), TIMEOUT 5000;\n"
        "SELECT message_body, @@ROWCOUNT AS received FROM @t;\n"
        "EXEC dbo.Quiet;\n",
    )
    assert table(results[-1]) == [[b"\x01\x02", 1]]
    assert (tsql.session.nocount, tsql.session.xact_abort) == (False, False)
    error = await tsql.error("CREATE PROCEDURE Quiet AS PRINT 1")
    assert (error.number, error.text) == (
        2714,
        "There is already an object named 'Quiet' in the database.",
    )
    results = await tsql.ok(
        "ALTER QUEUE dbo.Work WITH ACTIVATION (STATUS = OFF, PROCEDURE_NAME = dbo.Quiet,"
        " MAX_QUEUE_READERS = 3)\n"
        "ALTER QUEUE dbo.Work WITH ACTIVATION (DROP)\n"
        "SELECT activation_procedure, max_readers FROM sys.service_queues WHERE name = 'Work'",
    )
    assert table(results[-1]) == [[None, 1]]  # the procedure forgotten, as on SQL Server


async def test_a_state_table_keyed_by_conversation_group_with_receive_and_send(
    conn: client.Connection,
) -> None:
    """The Service Broker pattern of a state table, written in the same transaction as
    RECEIVE and SEND (the script `ssb sql` also runs, see test_cli)."""
    _, out = await ran(STATE_TABLE_SCRIPT.read_text(), conn, login="admin")
    assert table(out.results[-1]) == [[2, 42]]
    replies = await conn.receive("ShopperQueue", timeout=5)
    assert [m.message_body.decode("utf-16-le") for m in replies] == ["12", "42"]
    # the rows are the broker's: Python reads the same table
    assert (await conn.execute("SELECT items, total FROM OrderState")).rows == [(2, 42)]


async def test_a_stored_procedure_changes_tables_in_its_callers_transaction(
    conn: client.Connection,
) -> None:
    _, out = await ran(
        "CREATE TABLE Audit (id INT IDENTITY(1,1) PRIMARY KEY, note NVARCHAR(50))\n"
        "GO\n"
        "CREATE PROCEDURE Note @text NVARCHAR(50) AS\n"
        "BEGIN\n"
        "  INSERT INTO Audit (note) VALUES (@text);\n"
        "  SELECT COUNT(*) AS notes FROM Audit;\n"
        "END\n"
        "GO\n"
        "BEGIN TRANSACTION\n"
        "EXEC Note N'kept'\n"
        "COMMIT\n"
        "BEGIN TRANSACTION\n"
        "EXEC Note @text = N'undone'\n"
        "ROLLBACK\n"
        "SELECT id, note FROM Audit\n",
        conn,
        login="admin",
    )
    assert [table(r) for r in out.results] == [[[1]], [[2]], [[1, "kept"]]]


async def test_a_failed_table_statement_has_sql_servers_number(tsql: Admin) -> None:
    """Scripts catch 2627 to find the row that is there already; the other common
    failures carry SQL Server's numbers too."""
    results = await tsql.ok(
        "CREATE TABLE Seen (id INT PRIMARY KEY, note NVARCHAR(10))\n"
        "INSERT INTO Seen VALUES (1, N'first')\n"
        "GO\n"
        "BEGIN TRY INSERT INTO Seen VALUES (1, N'again') END TRY\n"
        "BEGIN CATCH SELECT ERROR_NUMBER() AS n END CATCH\n",
    )
    assert table(results[-1]) == [[2627]]
    errors = await tsql.each_fails(
        "INSERT INTO Seen (note) VALUES (N'no key')",
        "SELECT * FROM Missing",
        "SELECT nope FROM Seen",
        "CREATE TABLE Seen (id INT)",
    )
    assert [e.number for e in errors] == [515, 208, 207, 2714]
