"""A data directory written by the code before this change opens and is migrated.

The test writes a store exactly as the previous version laid it out (schema 1: no
`user_version`, endpoints keyed by handle, messages without a size column, the
scheduler's procedure outside the ssb namespace, a parked message kept as status 1 with
its park in `extra`), starts today's daemon on it and reads everything back: the
catalog (with the procedure renamed), the dialog's two endpoints, which go on working
in both directions, the ready messages in order, the retained one, and the parked one
kept out of its queue. The store is schema 2 afterwards, and opens again as such.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from daemon import BrokerProcess

from ssb import client
from ssb.protocol import pack

# frozen copy of the previous version's DDL (schema 1); never import it from the broker
SCHEMA_1 = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS catalog (kind TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, name))",
    "CREATE TABLE IF NOT EXISTS endpoints (handle BLOB PRIMARY KEY, conversation_id BLOB NOT NULL, is_initiator INTEGER NOT NULL, service TEXT NOT NULL, far_service TEXT NOT NULL, far_broker_instance TEXT, contract TEXT NOT NULL, group_id BLOB NOT NULL, state TEXT NOT NULL, send_seq INTEGER NOT NULL, receive_seq INTEGER NOT NULL, priority INTEGER NOT NULL, lifetime_expiry REAL, timer_at REAL, far_handle BLOB, created REAL NOT NULL, extra BLOB)",
    "CREATE TABLE IF NOT EXISTS messages (queuing_order INTEGER PRIMARY KEY, queue TEXT NOT NULL, handle BLOB NOT NULL, seq INTEGER NOT NULL, message_type TEXT NOT NULL, validation TEXT NOT NULL, body BLOB NOT NULL, enqueue_time REAL NOT NULL, status INTEGER NOT NULL, delivery_count INTEGER NOT NULL, extra BLOB)",
    "CREATE TABLE IF NOT EXISTS transmission_queue (id INTEGER PRIMARY KEY, handle BLOB NOT NULL, conversation_id BLOB NOT NULL, to_service TEXT NOT NULL, to_broker_instance TEXT, from_service TEXT NOT NULL, contract TEXT NOT NULL, is_initiator INTEGER NOT NULL, seq INTEGER NOT NULL, message_type TEXT NOT NULL, validation TEXT NOT NULL, body BLOB NOT NULL, enqueue_time REAL NOT NULL, priority INTEGER NOT NULL, status TEXT NOT NULL, extra BLOB)",
    "CREATE TABLE IF NOT EXISTS remote_dialogs (conversation_id BLOB NOT NULL, direction INTEGER NOT NULL, side TEXT NOT NULL, peer TEXT NOT NULL, session_key BLOB, wrapped_key BLOB, next_seq INTEGER NOT NULL, envelope BLOB, PRIMARY KEY (conversation_id, direction, side))",
    "CREATE TABLE IF NOT EXISTS held_fragments (conversation_id BLOB NOT NULL, direction INTEGER NOT NULL, seq INTEGER NOT NULL, fragment_index INTEGER NOT NULL, fragment_count INTEGER NOT NULL, message_type TEXT NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (conversation_id, direction, seq, fragment_index))",
    "CREATE TABLE IF NOT EXISTS poison_messages (id INTEGER PRIMARY KEY, queue TEXT NOT NULL, handle BLOB, queuing_order INTEGER, delivery_count INTEGER, action TEXT NOT NULL, time REAL NOT NULL, error TEXT NOT NULL, body BLOB)",
    "CREATE TABLE IF NOT EXISTS execution_log (log_id INTEGER PRIMARY KEY, caller INTEGER, scheduler_handle BLOB, task TEXT NOT NULL, queued_time REAL NOT NULL, start_time REAL, end_time REAL, activated_task INTEGER, pid INTEGER, session_id INTEGER, error TEXT)",
)

OLD_PROCEDURE = "client._scheduler:run_tasks"
NEW_PROCEDURE = "ssb.client._scheduler:run_tasks"
READY = [
    b"<Command LogID='2'/>",
    b"<Command LogID='3'/>",
    "<Command LogID='4' text='\u00e9t\u00e9'/>".encode(),
]


def _queue(name: str, **fields: Any) -> str:
    """A schema-1 queue: the QueueDef of then (no max_messages / max_bytes)."""
    body: dict[str, Any] = {
        "name": name,
        "status": True,
        "retention": False,
        "activation": {"status": False, "procedure": "", "max_queue_readers": 1, "execute_as": ""},
        "poison_message_handling": True,
        "poison_policy": None,
    }
    body.update(fields)
    return json.dumps(body, sort_keys=True)


def _service(name: str, queue: str, contracts: list[str]) -> str:
    return json.dumps({"name": name, "queue": queue, "contracts": contracts}, sort_keys=True)


class OldStore:
    """What the test put into the schema-1 store."""

    def __init__(self) -> None:
        self.instance = str(uuid.uuid4())
        self.conversation = uuid.uuid4()
        self.initiator = uuid.uuid4()
        self.target = uuid.uuid4()
        self.initiator_group = uuid.uuid4()
        self.target_group = uuid.uuid4()

    def write(self, path: Path) -> None:
        now = time.time()
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in SCHEMA_1:
                db.execute(statement)
            db.execute("BEGIN")
            db.execute("INSERT INTO meta VALUES ('broker_instance', ?)", (self.instance,))
            catalog = [
                ("queue", "InitQ", _queue("InitQ")),
                (
                    "queue",
                    "TargetQ",
                    _queue(
                        "TargetQ",
                        retention=True,
                        activation={
                            "status": False,
                            "procedure": OLD_PROCEDURE,
                            "max_queue_readers": 2,
                            "execute_as": "",
                        },
                    ),
                ),
                ("service", "InitSvc", _service("InitSvc", "InitQ", [])),
                ("service", "TargetSvc", _service("TargetSvc", "TargetQ", ["DEFAULT"])),
            ]
            db.executemany("INSERT INTO catalog VALUES (?, ?, ?)", catalog)
            # (handle, conversation_id, is_initiator, service, far_service, far_broker_instance,
            #  contract, group_id, state, send_seq, receive_seq, priority, lifetime_expiry,
            #  timer_at, far_handle, created, extra); UUIDs as their 16 bytes
            endpoints = [
                (
                    self.initiator.bytes,
                    self.conversation.bytes,
                    1,
                    "InitSvc",
                    "TargetSvc",
                    None,
                    "DEFAULT",
                    self.initiator_group.bytes,
                    "CO",
                    5,
                    1,
                    5,
                    None,
                    None,
                    self.target.bytes,
                    now - 60,
                    None,
                ),
                (
                    self.target.bytes,
                    self.conversation.bytes,
                    0,
                    "TargetSvc",
                    "InitSvc",
                    self.instance,
                    "DEFAULT",
                    self.target_group.bytes,
                    "CO",
                    1,
                    5,
                    5,
                    None,
                    None,
                    self.initiator.bytes,
                    now - 59,
                    None,
                ),
            ]
            db.executemany(f"INSERT INTO endpoints VALUES ({', '.join('?' * 17)})", endpoints)
            parked = pack(
                {
                    "reason": None,
                    "origin": None,
                    "group": self.target_group,
                    "service": "TargetSvc",
                    "contract": "DEFAULT",
                    "priority": 5,
                    "parked_until": now + 3600.0,
                    "parks": 1,
                    "error": "boom",
                }
            )
            t = self.target.bytes
            # (queuing_order, queue, handle, seq, message_type, validation, body,
            #  enqueue_time, status, delivery_count, extra)
            messages = [
                (1, "TargetQ", t, 0, "DEFAULT", "N", b"retained", now - 50, 0, 1, None),
                (2, "TargetQ", t, 1, "DEFAULT", "N", b"parked", now - 50, 1, 3, parked),
                (3, "TargetQ", t, 2, "DEFAULT", "N", READY[0], now - 40, 1, 0, None),
                (
                    4,
                    "InitQ",
                    self.initiator.bytes,
                    0,
                    "DEFAULT",
                    "N",
                    b"reply 0",
                    now - 35,
                    1,
                    0,
                    None,
                ),
                (5, "TargetQ", t, 3, "DEFAULT", "N", READY[1], now - 30, 1, 0, None),
                (6, "TargetQ", t, 4, "DEFAULT", "N", READY[2], now - 20, 1, 0, None),
            ]
            db.executemany(f"INSERT INTO messages VALUES ({', '.join('?' * 11)})", messages)
            db.execute("COMMIT")
            assert db.execute("PRAGMA user_version").fetchone()[0] == 0
        finally:
            db.close()


def _sql(path: Path, query: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(query).fetchall()
    finally:
        db.close()


async def _queue_row(conn: client.Connection, name: str) -> dict[str, Any]:
    (row,) = [q for q in await conn.view("service_queues") if q["name"] == name]
    return row


async def test_a_schema_1_store_is_migrated_and_its_messages_read_back(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    old = OldStore()
    old.write(data_dir / "broker.db")

    broker = BrokerProcess(data_dir).start()
    try:
        assert broker.instance == old.instance
        conn = await client.connect(broker.url)
        assert await conn.broker_instance() == old.instance

        target_q = await _queue_row(conn, "TargetQ")
        assert target_q["activation_procedure"] == NEW_PROCEDURE
        assert target_q["is_activation_enabled"] is False
        assert target_q["max_readers"] == 2
        assert target_q["is_retention_enabled"] is True
        assert (target_q["max_messages"], target_q["max_bytes"]) == (None, None)
        assert (target_q["messages_ready"], target_q["messages_retained"]) == (3, 1)
        assert target_q["messages_stored"] == 5  # the parked one is stored too
        assert (await _queue_row(conn, "InitQ"))["activation_procedure"] is None
        endpoints = {r["conversation_handle"]: r for r in await conn.view("conversation_endpoints")}
        assert set(endpoints) == {old.initiator, old.target}
        assert {r["state"] for r in endpoints.values()} == {"CO"}

        peeked = await conn.peek("TargetQ")
        assert [(m.status, m.message_body) for m in peeked] == [
            (0, b"retained"),
            *((1, body) for body in READY),
        ]

        got = await conn.receive("TargetQ", timeout=5)
        assert [m.message_body for m in got] == READY
        assert [m.message_sequence_number for m in got] == [2, 3, 4]
        assert [m.queuing_order for m in got] == [3, 5, 6]
        for m in got:
            assert m.conversation_handle == old.target
            assert m.conversation_group_id == old.target_group
            assert (m.service_name, m.service_contract_name) == ("TargetSvc", "DEFAULT")
            assert m.delivery_count == 1
        assert await conn.receive("TargetQ", timeout=0) == []  # the parked one stays out

        await conn.close()
        assert broker.stop() == 0
        store = data_dir / "broker.db"
        assert _sql(store, "PRAGMA user_version") == [(2,)]
        rows = _sql(store, "SELECT queuing_order, status, size, length(body) FROM messages")
        assert all(size == length for _, _, size, length in rows), rows
        # retention keeps what was received (0); the park is status 6 now
        assert {order: status for order, status, _, _ in rows} == {
            1: 0,
            2: 6,
            3: 0,
            4: 1,
            5: 0,
            6: 0,
        }
        (body,) = _sql(store, "SELECT body FROM catalog WHERE kind = 'queue' AND name = 'TargetQ'")
        assert json.loads(body[0])["activation"]["procedure"] == NEW_PROCEDURE

        broker.start()  # schema 2 now: opens as it is, and the dialog goes on both ways
        conn = await client.connect(broker.url)
        await conn.send(old.target, "DEFAULT", b"reply 1")
        replies = await conn.receive("InitQ", timeout=5, conversation_handle=old.initiator)
        assert [(m.message_body, m.message_sequence_number) for m in replies] == [
            (b"reply 0", 0),
            (b"reply 1", 1),
        ]
        assert replies[1].conversation_group_id == old.initiator_group
        await conn.send(old.initiator, "DEFAULT", b"more")
        (more,) = await conn.receive("TargetQ", timeout=5)
        assert (more.message_body, more.message_sequence_number) == (b"more", 5)
        assert more.conversation_handle == old.target

        await conn.end_conversation(old.initiator)
        (end,) = await conn.receive("TargetQ", timeout=5)
        assert end.message_type_name == client.END_DIALOG
        await conn.end_conversation(old.target)
        assert await conn.view("conversation_endpoints") == []
        assert (await _queue_row(conn, "TargetQ"))["messages_stored"] == 0
        await conn.close()
        assert broker.stop() == 0
        assert _sql(store, "PRAGMA user_version") == [(2,)]
    finally:
        broker.kill()
