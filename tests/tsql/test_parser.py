"""The statement parser: every statement ssb's T-SQL has, SQL Server's syntax errors
with the line, column and token, and the published tutorials as they are."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest

from ssb.tsql import SqlError, decode, parse_batch, split_batches
from ssb.tsql import _ast as ast

from .helpers import SCRIPTS

TUTORIALS = sorted(SCRIPTS.glob("*/*.sql"))
assert len(TUTORIALS) == 11, TUTORIALS  # the three tutorials' lessons

STATEMENTS = {
    "CREATE MESSAGE TYPE [//A/B:C] VALIDATION = WELL_FORMED_XML": ast.Ddl,
    "CREATE MESSAGE TYPE m AUTHORIZATION dbo VALIDATION = EMPTY": ast.Ddl,
    "ALTER MESSAGE TYPE m VALIDATION = NONE": ast.Ddl,
    "DROP MESSAGE TYPE [m]": ast.Ddl,
    "CREATE CONTRACT c ([a] SENT BY INITIATOR, b SENT BY TARGET, [DEFAULT] SENT BY ANY)": ast.Ddl,
    "DROP CONTRACT c": ast.Ddl,
    "CREATE QUEUE q": ast.Ddl,
    "CREATE QUEUE dbo.q WITH STATUS = OFF, RETENTION = ON, ACTIVATION (STATUS = ON,"
    " PROCEDURE_NAME = 'm:f', MAX_QUEUE_READERS = 3, EXECUTE AS SELF),"
    " POISON_MESSAGE_HANDLING (STATUS = OFF)": ast.Ddl,
    "ALTER QUEUE q WITH ACTIVATION (STATUS = OFF)": ast.Ddl,
    "ALTER QUEUE q WITH STATUS = ON": ast.Ddl,
    "DROP QUEUE q": ast.Ddl,
    "CREATE SERVICE [//s] ON QUEUE dbo.q ([c], [DEFAULT])": ast.Ddl,
    "CREATE SERVICE s AUTHORIZATION dbo ON QUEUE q": ast.Ddl,
    "ALTER SERVICE s ON QUEUE q2 (ADD CONTRACT c2, DROP CONTRACT c)": ast.Ddl,
    "DROP SERVICE s": ast.Ddl,
    "CREATE ROUTE r WITH SERVICE_NAME = 's', BROKER_INSTANCE = 'x', LIFETIME = 60,"
    " ADDRESS = 'TCP://127.0.0.1:4022'": ast.Ddl,
    "DROP ROUTE r": ast.Ddl,
    "CREATE BROKER PRIORITY p FOR CONVERSATION SET (CONTRACT_NAME = c, LOCAL_SERVICE_NAME ="
    " ANY, REMOTE_SERVICE_NAME = N's', PRIORITY_LEVEL = 7)": ast.Ddl,
    "ALTER BROKER PRIORITY p FOR CONVERSATION SET (PRIORITY_LEVEL = DEFAULT)": ast.Ddl,
    "DROP BROKER PRIORITY p": ast.Ddl,
    "CREATE EVENT NOTIFICATION n ON QUEUE q FOR QUEUE_ACTIVATION TO SERVICE 's',"
    " 'current database'": ast.Ddl,
    "DROP EVENT NOTIFICATION n ON QUEUE q": ast.Ddl,
    "CREATE REMOTE SERVICE BINDING b TO SERVICE 's' WITH USER = u, ANONYMOUS = OFF": ast.Ddl,
    "DROP REMOTE SERVICE BINDING b": ast.Ddl,
    "CREATE CERTIFICATE c FROM FILE = 'peer.pem'": ast.Ddl,
    "DROP CERTIFICATE c": ast.Ddl,
    "CREATE LOGIN app WITH PASSWORD = 'secret-password'": ast.Ddl,
    "GRANT SEND ON SERVICE::[//s] TO app": ast.Ddl,
    "REVOKE RECEIVE ON q FROM app": ast.Ddl,
    "CREATE MASTER KEY ENCRYPTION BY PASSWORD = 'x'": ast.Refused,
    "CREATE USER u WITHOUT LOGIN": ast.Refused,
    "CREATE ENDPOINT e STATE = STARTED AS TCP (LISTENER_PORT = 4022) FOR SERVICE_BROKER"
    " (AUTHENTICATION = CERTIFICATE c)": ast.Refused,
    "BACKUP CERTIFICATE c TO FILE = 'x.cer'": ast.Refused,
    "BEGIN DIALOG CONVERSATION @h FROM SERVICE s TO SERVICE 't', 'CURRENT DATABASE' ON"
    " CONTRACT c WITH RELATED_CONVERSATION_GROUP = @g, LIFETIME = 60, ENCRYPTION = ON": ast.BeginDialog,
    "BEGIN DIALOG @h FROM SERVICE [s] TO SERVICE N't'": ast.BeginDialog,
    "SEND ON CONVERSATION @h MESSAGE TYPE [m] (@body)": ast.Send,
    "SEND ON CONVERSATION (@h1, @h2) MESSAGE TYPE m": ast.Send,
    "SEND ON CONVERSATION @h": ast.Send,
    "RECEIVE TOP (1) @h = conversation_handle, @b = CAST(message_body AS XML) FROM q": ast.Receive,
    "RECEIVE * FROM dbo.q INTO @t WHERE conversation_group_id = @g": ast.Receive,
    "RECEIVE conversation_handle AS h, message_type_name FROM q WHERE conversation_handle"
    " = @h": ast.Receive,
    "WAITFOR (RECEIVE TOP(1) * FROM q), TIMEOUT 1000": ast.Receive,
    "WAITFOR (GET CONVERSATION GROUP @g FROM q), TIMEOUT -1": ast.Receive,
    "GET CONVERSATION GROUP @g FROM q": ast.Receive,
    "END CONVERSATION @h": ast.EndConversation,
    "END CONVERSATION @h WITH ERROR = 31472 DESCRIPTION = N'failed'": ast.EndConversation,
    "END CONVERSATION @h WITH CLEANUP": ast.EndConversation,
    "BEGIN CONVERSATION TIMER (@h) TIMEOUT = 120": ast.ConversationTimer,
    "MOVE CONVERSATION @h TO @g": ast.MoveConversation,
    "DECLARE @a INT = 1, @b NVARCHAR(MAX), @c sysname, @t TABLE (x INT PRIMARY KEY, y XML)": ast.Declare,
    "SET @a += 2": ast.SetVariable,
    "SET NOCOUNT ON": ast.SetOption,
    "SELECT @a = 1, @b = N'x'": ast.SelectStatement,
    "SELECT TOP (5) name, COUNT(*) AS n FROM sys.services s JOIN sys.service_queues q ON"
    " s.service_queue_id = q.object_id WHERE q.is_receive_enabled = 1 GROUP BY name HAVING"
    " COUNT(*) > 0 ORDER BY name DESC": ast.SelectStatement,
    "IF @a = 1 PRINT 'a' ELSE IF @a = 2 PRINT 'b' ELSE PRINT 'c'": ast.If,
    "WHILE (1=1) BEGIN BREAK; CONTINUE END": ast.While,
    "BEGIN TRY SELECT 1/0 END TRY BEGIN CATCH SELECT ERROR_NUMBER(), ERROR_LINE() END CATCH": ast.TryCatch,
    "BEGIN TRAN t1": ast.Transaction,
    "COMMIT TRANSACTION t1": ast.Transaction,
    "ROLLBACK": ast.Transaction,
    "SAVE TRANSACTION s": ast.Transaction,
    "THROW 50001, N'boom', 1": ast.Throw,
    "RAISERROR (N'%s is %d', 16, 1, N'x', 5) WITH NOWAIT": ast.RaiseError,
    "PRINT N'x' + CAST(@a AS NVARCHAR(10))": ast.Print,
    "RETURN": ast.Return,
    "EXEC @rc = dbo.p 1, @x = @y OUTPUT, @z = DEFAULT": ast.Execute,
    "USE [master]": ast.Use,
    "CREATE DATABASE d": ast.Database,
    "ALTER DATABASE d SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE": ast.Database,
    "ALTER DATABASE d SET TRUSTWORTHY ON": ast.Database,
    "DROP DATABASE IF EXISTS d": ast.Database,
    "WAITFOR DELAY '00:00:01'": ast.WaitforDelay,
}


@pytest.mark.parametrize("text", list(STATEMENTS))
def test_every_statement(text: str) -> None:
    statements = parse_batch(text)
    assert [type(s) for s in statements] == [STATEMENTS[text]]


def test_statements_need_no_semicolons() -> None:
    statements = parse_batch(
        "DECLARE @x INT SELECT @x = 1 SELECT @x AS x IF @x = 1 BEGIN PRINT 'one' END"
        " END CONVERSATION @x RECEIVE * FROM q SEND ON CONVERSATION @x"
    )
    assert [type(s).__name__ for s in statements] == [
        "Declare",
        "SelectStatement",
        "SelectStatement",
        "If",
        "EndConversation",
        "Receive",
        "Send",
    ]


def test_table_statements_end_where_they_should_and_name_their_variables() -> None:
    statements = parse_batch(
        "CREATE TABLE t (a INT PRIMARY KEY, b NVARCHAR(10) DEFAULT N'x')"
        " ALTER TABLE t DROP COLUMN b"
        " CREATE UNIQUE NONCLUSTERED INDEX ix ON dbo.t (a DESC);"
        " INSERT INTO dbo.t (a) OUTPUT inserted.a VALUES (@a + 1)"
        " INSERT t SELECT a FROM t WHERE a > @b"
        " UPDATE t SET a = @a WHERE a = @b DELETE FROM t WHERE a = @A"
        " DROP INDEX ix ON t DROP TABLE IF EXISTS t PRINT 'done'"
    )
    assert [type(s).__name__ for s in statements] == [*["TableStatement"] * 9, "Print"]
    tables = [s for s in statements if isinstance(s, ast.TableStatement)]
    assert [s.text for s in tables] == [
        "CREATE TABLE t (a INT PRIMARY KEY, b NVARCHAR(10) DEFAULT N'x')",
        "ALTER TABLE t DROP COLUMN b",
        "CREATE UNIQUE NONCLUSTERED INDEX ix ON dbo.t (a DESC)",
        "INSERT INTO dbo.t (a) OUTPUT inserted.a VALUES (@a + 1)",
        "INSERT t SELECT a FROM t WHERE a > @b",
        "UPDATE t SET a = @a WHERE a = @b",
        "DELETE FROM t WHERE a = @A",
        "DROP INDEX ix ON t",
        "DROP TABLE IF EXISTS t",
    ]
    variables = [(), (), (), ("@A",), ("@B",), ("@A", "@B"), ("@A",), (), ()]
    assert [s.variables for s in tables] == variables


def test_create_procedure_takes_the_rest_of_the_batch() -> None:
    (procedure,) = parse_batch(
        "CREATE PROCEDURE dbo.p (@a INT = 5, @b NVARCHAR(10) OUTPUT) AS\nSET @b = N'x'\nRETURN @a"
    )
    assert isinstance(procedure, ast.CreateProcedure)
    assert [(p.name, p.output, p.default is not None) for p in procedure.parameters] == [
        ("@a", False, True),
        ("@b", True, False),
    ]
    assert len(procedure.body) == 2
    (replacing,) = parse_batch("CREATE OR ALTER PROC dbo.p AS PRINT 1")
    assert isinstance(replacing, ast.CreateProcedure) and replacing.or_alter


@pytest.mark.parametrize(
    ("text", "number", "line", "column", "message"),
    [
        ("SELECT 1\nSELECT FROM x", 156, 2, 8, "Incorrect syntax near the keyword 'FROM'."),
        ("PRINT 'a'\n\n  SEND ON @h", 102, 3, 11, "Incorrect syntax near '@h'."),
        ("RECEIVE TOP (1) * FROM", 102, 1, 19, "Incorrect syntax near 'FROM'."),
        ("IF 1 = 1 BEGIN PRINT 1", 102, 1, 22, "Incorrect syntax near '1'."),
        ("END", 156, 1, 1, "Incorrect syntax near the keyword 'END'."),
    ],
)
def test_syntax_errors_name_line_column_and_token(
    text: str, number: int, line: int, column: int, message: str
) -> None:
    with pytest.raises(SqlError) as caught:
        parse_batch(text)
    error = caught.value
    assert (error.number, error.line, error.column, error.level) == (number, line, column, 15)
    assert error.text.startswith(message)
    assert error.format().startswith(f"Msg {number}, Level 15, State 1, Line {line}\n")


def test_lines_are_counted_in_the_file() -> None:
    batches = split_batches("PRINT 1\nGO\n\nPRINT 2\nSELECT FROM\n")
    with pytest.raises(SqlError) as caught:
        parse_batch(batches[1].text, batches[1].first_line)
    assert caught.value.line == 5


def test_create_route_takes_a_mirror_address() -> None:
    (statement,) = parse_batch(
        "CREATE ROUTE r WITH SERVICE_NAME = 's', ADDRESS = 'TCP://h:1', MIRROR_ADDRESS = 'TCP://m:1'"
    )
    assert isinstance(statement, ast.Ddl) and statement.kind == "route"
    assert set(statement.options) == {"service_name", "address", "mirror_address"}


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_published_tutorials_parse_unchanged(path: Path) -> None:
    for batch in split_batches(decode(path.read_bytes())):
        parse_batch(batch.text, batch.first_line)


def test_a_ten_kilobyte_script_parses_quickly() -> None:
    unit = (
        "DECLARE @h UNIQUEIDENTIFIER, @m NVARCHAR(100);\nBEGIN TRANSACTION;\n"
        "WAITFOR (RECEIVE TOP(1) @h = conversation_handle, @m = message_body FROM q),"
        " TIMEOUT 1000;\nIF @m = N'x' BEGIN SEND ON CONVERSATION @h MESSAGE TYPE [t] (@m);"
        " END CONVERSATION @h; END\nCOMMIT;\nGO\n"
    )
    text = unit * (10_240 // len(unit) + 1)
    started = time.perf_counter()
    for batch in split_batches(text):
        parse_batch(batch.text, batch.first_line)
    # the benchmark holds it to 50 ms; a loaded test machine gets slack
    assert time.perf_counter() - started < 0.5


def test_the_tutorials_are_byte_for_byte_as_published() -> None:
    # SOURCES.md gives each file's SHA-256 as extracted from Microsoft's pages, tutorial
    # by tutorial: any edit (an editor's newline or whitespace fix) would make them no
    # longer the published text
    listed: dict[str, str] = {}
    folder = ""
    for line in (SCRIPTS / "SOURCES.md").read_text().splitlines():
        heading = re.match(r"^### (\S+)/ ", line)
        if heading:
            folder = heading.group(1)
        row = re.match(r"^\| (\S+\.sql) \|.*\| ([0-9a-f]{64}) \|$", line)
        if row:
            listed[f"{folder}/{row.group(1)}"] = row.group(2)
    assert sorted(listed) == sorted(f"{p.parent.name}/{p.name}" for p in TUTORIALS)
    for path in TUTORIALS:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest == listed[f"{path.parent.name}/{path.name}"], path
