"""`ssb sql` as a user runs it: files in one session, sqlcmd's output and exit codes,
the published tutorial, and the interactive shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from daemon import BrokerProcess, run_ssb
from prompt_toolkit import PromptSession
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from ssb import client
from ssb.tsql import Session, TextOutput
from ssb.tsql._shell import shell

from .helpers import SCRIPTS

SETUP = """CREATE MESSAGE TYPE M VALIDATION = NONE;
CREATE CONTRACT C (M SENT BY INITIATOR);
CREATE QUEUE Q;
CREATE SERVICE S ON QUEUE Q (C);
GO
"""


def sql(broker: BrokerProcess, *arguments: str, exits: int) -> subprocess.CompletedProcess[str]:
    """`ssb sql` with `arguments` (its options, then the files to run) against `broker`, seen
    to exit with `exits` (else AssertionError, with what it wrote to stderr)."""
    done = run_ssb("sql", "--url", broker.url, *arguments)
    assert done.returncode == exits, done.stderr
    return done


def test_files_run_in_one_session_batches_go_on_after_an_error(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    first = tmp_path / "a.sql"
    first.write_text(SETUP + "PRINT N'made'\nGO\nSELECT name FROM sys.services WHERE name = 'S'\n")
    second = tmp_path / "b.sql"
    second.write_bytes(
        b"\xff\xfe"
        + "PRINT 'before'\r\nGO\r\n\r\nSELECT 1/0\r\nGO\r\nSELECT COUNT(*) AS queues FROM sys.service_queues\r\n".encode(
            "utf-16-le"
        )
    )
    done = sql(broker, str(first), str(second), exits=1)
    assert done.stdout.split("\n") == [
        "made",
        "name",
        "----",
        "S",
        "",
        "(1 row affected)",
        "",
        "before",
        "queues",
        "------",
        "1",
        "",
        "(1 row affected)",
        "",
        "",
    ]
    assert done.stderr == "Msg 8134, Level 16, State 1, Line 4\nDivide by zero error encountered.\n"


def test_b_stops_at_the_first_error(broker: BrokerProcess, tmp_path: Path) -> None:
    script = tmp_path / "s.sql"
    script.write_text("PRINT 'one'\nGO\nTHROW 50001, N'stop', 1\nGO\nPRINT 'never'\n")
    done = sql(broker, "-b", str(script), exits=1)
    assert done.stdout == "one\n"
    assert "Msg 50001, Level 16, State 1, Line 3\nstop" in done.stderr


def test_csv_and_json_for_scripts(broker: BrokerProcess, tmp_path: Path) -> None:
    script = tmp_path / "s.sql"
    script.write_text("SET NOCOUNT ON\nSELECT 1 AS a, N'x,y' AS b, NULL AS c\n")
    done = sql(broker, "--format", "csv", str(script), exits=0)
    assert done.stdout == 'a,b,c\n1,"x,y",\n\n'
    done = sql(broker, "--format", "json", str(script), exits=0)
    assert json.loads(done.stdout) == {"columns": ["a", "b", "c"], "rows": [[1, "x,y", None]]}


def test_parse_only_needs_no_broker(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sql"
    bad.write_text("PRINT 1\nGO\n\nRECEIVE TOP (1) FROM q\n")
    done = run_ssb("sql", "--parse-only", str(bad))
    assert done.returncode == 1
    assert done.stderr.startswith(
        "Msg 156, Level 15, State 1, Line 4\nIncorrect syntax near the keyword 'FROM'."
    )


def test_parse_only_accepts_all_eleven_tutorial_files_unchanged() -> None:
    files = sorted(str(p) for p in SCRIPTS.glob("*/*.sql"))
    assert len(files) == 11
    done = run_ssb("sql", "--parse-only", *files)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


async def test_the_shell_runs_a_batch_at_go(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    async with await client.connect(broker.url) as conn:
        session = Session(conn, TextOutput(sys.stdout, sys.stderr))
        with create_pipe_input() as pipe:
            pipe.send_text("SELECT 6 * 7\nAS answer\nGO\nPRINT 'second'\nGO\nexit\n")
            reader: PromptSession[str] = PromptSession(input=pipe, output=DummyOutput())
            assert await shell(session, reader) == 0
    assert capsys.readouterr().out == "answer\n------\n42\n\n(1 row affected)\n\nsecond\n"


def test_d_uses_a_database_first(broker: BrokerProcess, tmp_path: Path) -> None:
    script = tmp_path / "s.sql"
    script.write_text("SELECT DB_NAME() AS db\n")
    done = sql(broker, "-d", "master", "--format", "csv", str(script), exits=0)
    assert done.stdout == "db\nmaster\n\n"
    done = sql(broker, "-d", "Sales", str(script), exits=1)
    assert "Msg 911, Level 16" in done.stderr and "Database 'Sales' does not exist" in done.stderr


def test_a_script_keeping_its_state_in_a_table_runs_unchanged(broker: BrokerProcess) -> None:
    script = Path(__file__).resolve().parent / "scripts" / "state_table.sql"
    done = sql(broker, str(script), exits=0)
    # the INSERT of the group's row and the UPDATE after each RECEIVE, then the SELECT
    assert done.stdout.split("\n") == [
        *["(1 row affected)"] * 3,
        "items total",
        "----- -----",
        "2     42",
        "",
        "(1 row affected)",
        "",
        "",
    ]
