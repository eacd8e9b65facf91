"""Microsoft's three published Service Broker tutorials, run unchanged with `ssb sql -b`
against a fresh broker: every file of a tutorial in one run, lesson after lesson.

The first two tutorials assume the sample database AdventureWorks2008R2: the run starts
with a one-line CREATE DATABASE. What each lesson SELECTs after a RECEIVE must be what
its SEND sent, and the drop lessons must leave no object and no conversation endpoint
behind. The internal-activation tutorial's procedure compares message type names with
`https://...` names (the published bug): its EndDialog branch never runs, so the target
side stays open (DISCONNECTED_INBOUND) until lesson 4 drops its service, as on SQL Server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from daemon import BrokerProcess, run_ssb

from ssb import client, tools

from .helpers import SCRIPTS

REQUEST = "<RequestMsg>Message for Target service.</RequestMsg>"
REPLY = "<ReplyMsg>Message for Initiator service.</ReplyMsg>"

# between lessons 3 and 4 of the internal-activation tutorial: wait (at most 20 s) until
# the activated procedure has taken the initiator's EndDialog, then show the target side
PUBLISHED_BUG = """USE AdventureWorks2008R2;
GO
DECLARE @tries INT = 0;
WHILE @tries < 200 AND NOT EXISTS (
    SELECT * FROM sys.conversation_endpoints AS e
    JOIN sys.services AS s ON s.service_id = e.service_id
    WHERE s.name = N'//AWDB/InternalAct/TargetService' AND e.state = 'DI')
BEGIN
    WAITFOR DELAY '00:00:00.100';
    SET @tries += 1;
END
SELECT e.state AS TargetSideState, q.messages AS TargetQueueMessages
FROM sys.conversation_endpoints AS e
JOIN sys.services AS s ON s.service_id = e.service_id
CROSS JOIN (SELECT COUNT(*) AS messages FROM TargetQueueIntAct) AS q
WHERE s.name = N'//AWDB/InternalAct/TargetService';
GO
"""


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    # a warm worker for the activated procedure: lesson 3 waits 5 s for its reply
    return {"config": {"activation": {"prestart_workers": 2}}}


def _files(tutorial: str) -> list[Path]:
    return sorted((SCRIPTS / tutorial).glob("*.sql"))


def _shown(stdout: str) -> list[tuple[str, str]]:
    """(column, value) of each one-row, one-column result set, in order."""
    blocks = [b.split("\n") for b in stdout.strip().split("\n\n") if "----" in b]
    return [(block[0].strip(), block[2].strip()) for block in blocks if len(block) == 3]


def _run(broker: BrokerProcess, tmp_path: Path, files: list[Path]) -> str:
    done = run_ssb("sql", "-b", "--url", broker.url, *map(str, files), timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def _adventure_works(tmp_path: Path) -> Path:
    script = tmp_path / "adventure-works.sql"
    script.write_text("CREATE DATABASE AdventureWorks2008R2;\n")
    return script


async def _nothing_left(broker: BrokerProcess, database: str, prefix: str) -> None:
    """No object of the tutorial and no conversation endpoint in `database`."""
    async with await client.connect(broker.url, database=database) as conn:
        assert await conn.view("conversation_endpoints") == []
        assert await conn.view("transmission_queue") == []
        for view in ("services", "service_queues", "procedures", "service_contracts"):
            assert [r for r in await conn.view(view) if r["database"] == database] == []
        names = {m["name"] for m in await conn.view("message_types")}
        assert not any(name.startswith(prefix) for name in names)


async def test_completing_a_conversation_in_a_single_database(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    files = [_adventure_works(tmp_path), *_files("ms-single-database")]
    shown = _shown(_run(broker, tmp_path, files))
    assert shown == [
        ("SentRequestMsg", REQUEST),
        ("ReceivedRequestMsg", REQUEST),
        ("SentReplyMsg", REPLY),
        ("ReceivedReplyMsg", REPLY),
    ]
    await _nothing_left(broker, "AdventureWorks2008R2", "//AWDB/")


async def test_implementing_internal_activation(broker: BrokerProcess, tmp_path: Path) -> None:
    lessons = _files("ms-internal-activation")
    check = tmp_path / "published-bug.sql"
    check.write_text(PUBLISHED_BUG)
    files = [_adventure_works(tmp_path), *lessons[:3], check, lessons[3]]
    sent, received, target = _shown(_run(broker, tmp_path, files))
    # the request the initiator sent; the reply the activated procedure sent back
    assert [sent, received] == [("SentRequestMsg", REQUEST), ("ReceivedReplyMsg", REPLY)]
    # the procedure took the EndDialog but, comparing with https://..., did not end its side
    assert (target[0].split(), target[1].split()) == (
        ["TargetSideState", "TargetQueueMessages"],
        ["DI", "0"],
    )
    await _nothing_left(broker, "AdventureWorks2008R2", "//AWDB/")
    async with await client.connect(broker.url) as conn:

        async def tasks() -> list[dict[str, Any]]:
            return [t for t in await conn.view("activated_tasks") if t["database"] != "master"]

        # the reader ends when its queue is dropped (it notices within its poll)
        await tools.wait_until(tasks, "the dropped queue's reader ends", until=lambda t: t == [])


async def test_completing_a_conversation_between_databases(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    shown = _shown(_run(broker, tmp_path, _files("ms-between-databases")))
    assert shown == [
        ("SentRequestMsg", REQUEST),
        ("ReceivedRequestMsg", REQUEST),
        ("SentReplyMsg", REPLY),
        ("ReceivedReplyMsg", REPLY),
    ]
    async with await client.connect(broker.url) as conn:
        databases = {d["name"]: d for d in await conn.view("databases")}
        assert set(databases) == {"master", "TargetDB", "InitiatorDB"}
        assert databases["InitiatorDB"]["is_trustworthy_on"] is True
        assert databases["TargetDB"]["is_trustworthy_on"] is False
        # both sides ended: no endpoint left in either database
        assert await conn.view("conversation_endpoints") == []
        services = {(s["database"], s["name"]) for s in await conn.view("services")}
        assert services == {
            ("TargetDB", "//TgtDB/2DBSample/TargetService"),
            ("InitiatorDB", "//InitDB/2DBSample/InitiatorService"),
        }
    # the first lesson again: it drops both databases and makes them anew
    again = run_ssb("sql", "-b", "--url", broker.url, str(_files("ms-between-databases")[0]))
    assert again.returncode == 0, again.stderr
    async with await client.connect(broker.url) as conn:
        assert await conn.view("services") == []
