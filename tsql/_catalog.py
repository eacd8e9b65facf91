"""Service Broker's catalog views and DMVs over ssb's views, under SQL Server's names.

Each `sys.` view is built from one or more of the broker's views (fetched only when a
query names it) with Service Broker's column names. ssb names its objects, so the
integer ids Service Broker's views join on (object_id, service_id,
service_contract_id, message_type_id, ...) are derived from the object's kind and name:
stable for a name across queries and sessions, equal wherever two views refer to the
same object, and never reused for another name in practice (31-bit CRC). A column ssb
has no value for is NULL (principal ids, create dates, session keys, ...), and
`docs/tsql.md` lists them. A queue named in FROM reads its messages without receiving
them, as SELECT on a queue does in Service Broker.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from . import _types as t

Rows = list[dict[str, Any]]
Fetch = Mapping[str, list[Any]]


def object_id(kind: str, name: str | None) -> int | None:
    """The id Service Broker's views would carry for ssb's object `kind` `name`."""
    if name is None:
        return None
    return zlib.crc32(f"{kind}:{name}".encode()) & 0x7FFFFFFF or 1


@dataclass(frozen=True, slots=True)
class SysView:
    name: str  # lower case, e.g. sys.services
    columns: tuple[tuple[str, t.SqlType], ...]
    sources: tuple[str, ...]  # the broker's views it reads
    build: Callable[[Fetch, str], list[Any]]


_I, _B, _S, _G, _D = t.INT, t.BIT, t.SYSNAME, t.GUID, t.DATETIME
_N = t.NVARCHAR_MAX
_BIN = t.VARBINARY_MAX


def _cols(spec: str, kinds: Mapping[str, t.SqlType]) -> tuple[tuple[str, t.SqlType], ...]:
    return tuple((name, kinds.get(name, _I)) for name in spec.split())


def _service_queues(f: Fetch, db: str) -> list[Any]:
    return [
        (
            q["name"],
            object_id("queue", q["name"]),
            None,
            1,
            0,
            "SQ",
            "SERVICE_QUEUE",
            None,
            None,
            0,
            0,
            0,
            q.get("max_readers"),
            q.get("activation_procedure"),
            None,
            q["is_activation_enabled"],
            q["is_receive_enabled"],
            q["is_enqueue_enabled"],
            q["is_retention_enabled"],
            q["is_poison_message_handling_enabled"],
        )
        for q in f["service_queues"]
    ]


def _services(f: Fetch, db: str) -> list[Any]:
    return [
        (s["name"], object_id("service", s["name"]), None, object_id("queue", s["queue_name"]))
        for s in f["services"]
    ]


def _contracts(f: Fetch, db: str) -> list[Any]:
    names = dict.fromkeys(row["name"] for row in f["service_contracts"])
    return [(name, object_id("contract", name), None) for name in names]


_VALIDATION: Final = {
    "NONE": ("N", "NONE"),
    "EMPTY": ("E", "EMPTY"),
    "WELL_FORMED_XML": ("X", "XML"),
    "VALID_JSON": ("J", "JSON"),
}


def _message_types(f: Fetch, db: str) -> list[Any]:
    return [
        (
            m["name"],
            object_id("message_type", m["name"]),
            None,
            *_VALIDATION.get(m["validation"], ("N", "NONE")),
            None,
        )
        for m in f["message_types"]
    ]


def _message_usages(f: Fetch, db: str) -> list[Any]:
    return [
        (
            object_id("contract", r["name"]),
            object_id("message_type", r["message_type_name"]),
            r["sent_by"] in ("INITIATOR", "ANY"),
            r["sent_by"] in ("TARGET", "ANY"),
        )
        for r in f["service_contracts"]
    ]


def _contract_usages(f: Fetch, db: str) -> list[Any]:
    return [
        (object_id("service", s["name"]), object_id("contract", c.strip()))
        for s in f["services"]
        for c in (s["contracts"] or "").split(",")
        if c.strip()
    ]


def _queue_usages(f: Fetch, db: str) -> list[Any]:
    return [
        (object_id("service", s["name"]), object_id("queue", s["queue_name"]))
        for s in f["services"]
    ]


def _endpoints(f: Fetch, db: str) -> list[Any]:
    return [
        (
            e["conversation_handle"],
            e["conversation_id"],
            e["is_initiator"],
            object_id("contract", e["service_contract_name"]),
            e["conversation_group_id"],
            object_id("service", e["service_name"]),
            e.get("lifetime"),
            e["state"],
            e["state_desc"],
            e["far_service"],
            e["far_broker_instance"],
            None,
            None,
            None,
            None,
            None,
            e.get("dialog_timer"),
            e["send_sequence"],
            None,
            None,
            e["receive_sequence"],
            0,
            None,
            None,
            None,
            None,
            0,
            e["priority"],
        )
        for e in f["conversation_endpoints"]
    ]


def _groups(f: Fetch, db: str) -> list[Any]:
    return [(g["conversation_group_id"], None, 0) for g in f["conversation_groups"]]


def _transmission(f: Fetch, db: str) -> list[Any]:
    return [
        (
            r["conversation_handle"],
            r["to_service_name"],
            r["to_broker_instance"],
            r["from_service_name"],
            r["service_contract_name"],
            r["enqueue_time"],
            r["message_sequence_number"],
            r["message_type_name"],
            r["is_conversation_error"],
            r["is_end_of_dialog"],
            None,
            r["transmission_status"],
            r["priority"],
        )
        for r in f["transmission_queue"]
    ]


def _routes(f: Fetch, db: str) -> list[Any]:
    return [
        (
            r["name"],
            object_id("route", r["name"]),
            None,
            r["remote_service_name"],
            r["broker_instance"],
            r["lifetime"],
            r["address"],
            r.get("mirror_address"),
        )
        for r in f["routes"]
    ]


def _priorities(f: Fetch, db: str) -> list[Any]:
    def named(value: str | None) -> str | None:
        return None if value in (None, "ANY") else value

    return [
        (
            object_id("broker_priority", p["name"]),
            p["name"],
            object_id("contract", named(p["service_contract_name"])),
            object_id("service", named(p["local_service_name"])),
            named(p["remote_service_name"]),
            p["priority"],
        )
        for p in f["conversation_priorities"]
    ]


def _bindings(f: Fetch, db: str) -> list[Any]:
    return [
        (
            b.get("name"),
            object_id("remote_service_binding", b.get("name")),
            None,
            b.get("service") or b.get("remote_service_name"),
            None,
            None,
            0,
        )
        for b in f["remote_service_bindings"]
    ]


def _certificates(f: Fetch, db: str) -> list[Any]:
    rows = []
    for c in f["certificates"]:
        fingerprint = c.get("fingerprint")
        thumbprint = bytes.fromhex(fingerprint) if isinstance(fingerprint, str) else None
        rows.append(
            (
                c.get("name"),
                object_id("certificate", c.get("name")),
                None,
                "NA",
                "NO_PRIVATE_KEY",
                1,
                None,
                None,
                None,
                None,
                c.get("broker_instance"),
                None,
                None,
                thumbprint,
                None,
                None,
                None,
            )
        )
    return rows


def _database_ids(f: Fetch) -> dict[str, int]:
    return {str(d["name"]): int(d["database_id"]) for d in f["databases"]}


def _monitors(f: Fetch, db: str) -> list[Any]:
    ids = _database_ids(f)
    return [
        (
            ids.get(m.get("database", db), 1),
            object_id("queue", m.get("queue")),
            m.get("state"),
            m.get("last_empty_rowset_time"),
            m.get("last_activated_time"),
            m.get("tasks_waiting"),
        )
        for m in f["queue_monitors"]
    ]


def _tasks(f: Fetch, db: str) -> list[Any]:
    ids = _database_ids(f)
    return [
        (
            a.get("session_id"),
            ids.get(a.get("database", db), 1),
            object_id("queue", a.get("queue")),
            a.get("procedure"),
            a.get("execute_as"),
        )
        for a in f["activated_tasks"]
    ]


def _connections(f: Fetch, db: str) -> list[Any]:
    rows = []
    for n, c in enumerate(f["broker_connections"], 1):
        rows.append(
            (
                uuid.uuid5(uuid.NAMESPACE_URL, f"{c.get('peer')}|{c.get('address')}|{n}"),
                None,
                None,
                c.get("state"),
                None,
                None,
                None,
                "CERTIFICATE",
                None,
                None,
                c.get("last_activity"),
                c.get("direction") == "inbound",
                None,
                c.get("login_state"),
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                c.get("bytes_sent"),
                c.get("bytes_received"),
                c.get("fragments_sent"),
                c.get("fragments_received"),
                c.get("frames_sent"),
                c.get("frames_received"),
                None,
                c.get("peer"),
                c.get("address"),
            )
        )
    return rows


def _forwarded(f: Fetch, db: str) -> list[Any]:
    return [
        (
            r.get("conversation_id"),
            r.get("is_initiator"),
            r.get("to_service_name"),
            r.get("to_broker_instance"),
            r.get("from_service_name"),
            r.get("from_broker_instance"),
            r.get("next_hop") or r.get("adjacent_broker_address"),
            None,
            None,
            None,
            None,
            None,
            None,
        )
        for r in f["forwarded_conversations"]
    ]


def _databases(f: Fetch, db: str) -> list[Any]:
    return list(f["__databases__"])


def _object_row(name: str, kind: str, code: str, desc: str) -> tuple[object, ...]:
    return (name, object_id(kind, name), None, 1, 0, code, desc, None, None, 0)


def _procedures(f: Fetch, db: str) -> list[Any]:
    return [
        _object_row(name, "procedure", "P", "SQL_STORED_PROCEDURE") for name in f["__procedures__"]
    ]


def _objects(f: Fetch, db: str) -> list[Any]:
    queues = [_object_row(q["name"], "queue", "SQ", "SERVICE_QUEUE") for q in f["service_queues"]]
    return queues + _procedures(f, db)


def _notifications(f: Fetch, db: str) -> list[Any]:
    return [
        (
            n["name"],
            object_id("event_notification", n["name"]),
            17,
            "QUEUE",
            object_id("queue", n["queue_name"]),
            None,
            None,
            n["service_name"],
            n.get("broker_instance") or "current database",
            None,
            None,
        )
        for n in f["event_notifications"]
    ]


_KINDS: Final = {
    "name": _S,
    "type": t.SqlType("CHAR", 2),
    "type_desc": _N,
    "activation_procedure": _N,
    "create_date": _D,
    "modify_date": _D,
    "is_ms_shipped": _B,
    "is_published": _B,
    "is_schema_published": _B,
    "is_activation_enabled": _B,
    "is_receive_enabled": _B,
    "is_enqueue_enabled": _B,
    "is_retention_enabled": _B,
    "max_readers": t.SqlType("SMALLINT"),
    "is_poison_message_handling_enabled": _B,
    "validation": t.SqlType("CHAR", 2),
    "validation_desc": _N,
    "is_sent_by_initiator": _B,
    "is_sent_by_target": _B,
    "conversation_handle": _G,
    "conversation_id": _G,
    "is_initiator": _B,
    "conversation_group_id": _G,
    "lifetime": _D,
    "state": t.SqlType("CHAR", 2),
    "state_desc": _N,
    "far_service": _N,
    "far_broker_instance": _N,
    "outbound_session_key_identifier": _G,
    "inbound_session_key_identifier": _G,
    "security_timestamp": _D,
    "dialog_timer": _D,
    "last_send_tran_id": t.SqlType("BINARY", 6),
    "send_sequence": t.BIGINT,
    "end_dialog_sequence": t.BIGINT,
    "receive_sequence": t.BIGINT,
    "system_sequence": t.BIGINT,
    "first_out_of_order_sequence": t.BIGINT,
    "last_out_of_order_sequence": t.BIGINT,
    "is_system": _B,
    "priority": t.SqlType("TINYINT"),
    "to_service_name": _S,
    "to_broker_instance": _N,
    "from_service_name": _S,
    "service_contract_name": _S,
    "enqueue_time": _D,
    "message_sequence_number": t.BIGINT,
    "message_type_name": _S,
    "is_conversation_error": _B,
    "is_end_of_dialog": _B,
    "message_body": _BIN,
    "transmission_status": _N,
    "remote_service_name": _N,
    "broker_instance": _N,
    "address": _N,
    "mirror_address": _N,
    "is_anonymous_on": _B,
    "pvt_key_encryption_type": t.SqlType("CHAR", 2),
    "pvt_key_encryption_type_desc": _N,
    "is_active_for_begin_dialog": _B,
    "issuer_name": _N,
    "cert_serial_number": _N,
    "sid": _BIN,
    "string_sid": _N,
    "subject": _N,
    "expiry_date": _D,
    "start_date": _D,
    "thumbprint": _BIN,
    "attested_by": _N,
    "pvt_key_last_backup_date": _D,
    "last_empty_rowset_time": _D,
    "last_activated_time": _D,
    "procedure_name": _N,
    "execute_as": _N,
    "connection_id": _G,
    "transport_stream_id": _G,
    "state_desc_conn": _N,
    "connect_time": _D,
    "login_time": _D,
    "authentication_method": _N,
    "principal_name": _N,
    "remote_user_name": _N,
    "last_activity_time": _D,
    "is_accept": _B,
    "login_state": _N,
    "login_state_desc": _N,
    "encryption_algorithm_desc": _N,
    "is_receive_flow_controlled": _B,
    "is_send_flow_controlled": _B,
    "total_bytes_sent": t.BIGINT,
    "total_bytes_received": t.BIGINT,
    "total_fragments_sent": t.BIGINT,
    "total_fragments_received": t.BIGINT,
    "total_sends": t.BIGINT,
    "total_receives": t.BIGINT,
    "peer_arbitration_id": _G,
    "peer_broker_instance": _N,
    "peer_address": _N,
    "from_broker_instance": _N,
    "adjacent_broker_address": _N,
    "message_fragment_number": _I,
    "hops_remaining": t.SqlType("TINYINT"),
    "time_to_expiry": _I,
    "time_consumed": _I,
    "message_id": _G,
    "is_broker_enabled": _B,
    "service_broker_guid": _G,
    "is_trustworthy_on": _B,
    "parent_class_desc": _N,
    "service_name": _N,
    "creator_sid": _BIN,
}

_VIEWS: Final = [
    SysView(
        "sys.service_queues",
        _cols(
            "name object_id principal_id schema_id parent_object_id type type_desc create_date"
            " modify_date is_ms_shipped is_published is_schema_published max_readers"
            " activation_procedure execute_as_principal_id is_activation_enabled"
            " is_receive_enabled is_enqueue_enabled is_retention_enabled"
            " is_poison_message_handling_enabled",
            _KINDS,
        ),
        ("service_queues",),
        _service_queues,
    ),
    SysView(
        "sys.services",
        _cols("name service_id principal_id service_queue_id", _KINDS),
        ("services",),
        _services,
    ),
    SysView(
        "sys.service_contracts",
        _cols("name service_contract_id principal_id", _KINDS),
        ("service_contracts",),
        _contracts,
    ),
    SysView(
        "sys.service_message_types",
        _cols(
            "name message_type_id principal_id validation validation_desc xml_collection_id", _KINDS
        ),
        ("message_types",),
        _message_types,
    ),
    SysView(
        "sys.service_contract_message_usages",
        _cols("service_contract_id message_type_id is_sent_by_initiator is_sent_by_target", _KINDS),
        ("service_contracts",),
        _message_usages,
    ),
    SysView(
        "sys.service_contract_usages",
        _cols("service_id service_contract_id", _KINDS),
        ("services",),
        _contract_usages,
    ),
    SysView(
        "sys.service_queue_usages",
        _cols("service_id service_queue_id", _KINDS),
        ("services",),
        _queue_usages,
    ),
    SysView(
        "sys.conversation_endpoints",
        _cols(
            "conversation_handle conversation_id is_initiator service_contract_id"
            " conversation_group_id service_id lifetime state state_desc far_service"
            " far_broker_instance principal_id far_principal_id outbound_session_key_identifier"
            " inbound_session_key_identifier security_timestamp dialog_timer send_sequence"
            " last_send_tran_id end_dialog_sequence receive_sequence receive_sequence_frag"
            " system_sequence first_out_of_order_sequence last_out_of_order_sequence"
            " last_out_of_order_frag is_system priority",
            _KINDS,
        ),
        ("conversation_endpoints",),
        _endpoints,
    ),
    SysView(
        "sys.conversation_groups",
        _cols("conversation_group_id service_id is_system", _KINDS),
        ("conversation_groups",),
        _groups,
    ),
    SysView(
        "sys.transmission_queue",
        _cols(
            "conversation_handle to_service_name to_broker_instance from_service_name"
            " service_contract_name enqueue_time message_sequence_number message_type_name"
            " is_conversation_error is_end_of_dialog message_body transmission_status priority",
            _KINDS,
        ),
        ("transmission_queue",),
        _transmission,
    ),
    SysView(
        "sys.routes",
        _cols(
            "name route_id principal_id remote_service_name broker_instance lifetime address"
            " mirror_address",
            _KINDS,
        ),
        ("routes",),
        _routes,
    ),
    SysView(
        "sys.conversation_priorities",
        _cols(
            "priority_id name service_contract_id local_service_id remote_service_name priority",
            _KINDS,
        ),
        ("conversation_priorities",),
        _priorities,
    ),
    SysView(
        "sys.remote_service_bindings",
        _cols(
            "name remote_service_binding_id principal_id remote_service_name service_contract_id"
            " remote_principal_id is_anonymous_on",
            _KINDS,
        ),
        ("remote_service_bindings",),
        _bindings,
    ),
    SysView(
        "sys.certificates",
        _cols(
            "name certificate_id principal_id pvt_key_encryption_type pvt_key_encryption_type_desc"
            " is_active_for_begin_dialog issuer_name cert_serial_number sid string_sid subject"
            " expiry_date start_date thumbprint attested_by pvt_key_last_backup_date key_length",
            _KINDS,
        ),
        ("certificates",),
        _certificates,
    ),
    SysView(
        "sys.databases",
        _cols("name database_id is_broker_enabled service_broker_guid is_trustworthy_on", _KINDS),
        (),
        _databases,
    ),
    SysView(
        "sys.dm_broker_queue_monitors",
        _cols(
            "database_id queue_id state last_empty_rowset_time last_activated_time tasks_waiting",
            {**_KINDS, "state": _N},
        ),
        ("queue_monitors", "databases"),
        _monitors,
    ),
    SysView(
        "sys.dm_broker_activated_tasks",
        _cols("spid database_id queue_id procedure_name execute_as", _KINDS),
        ("activated_tasks", "databases"),
        _tasks,
    ),
    SysView(
        "sys.dm_broker_connections",
        _cols(
            "connection_id transport_stream_id state state_desc connect_time login_time"
            " authentication_method principal_name remote_user_name last_activity_time is_accept"
            " login_state login_state_desc peer_certificate_id encryption_algorithm"
            " encryption_algorithm_desc receives_posted is_receive_flow_controlled sends_posted"
            " is_send_flow_controlled total_bytes_sent total_bytes_received total_fragments_sent"
            " total_fragments_received total_sends total_receives peer_arbitration_id"
            " peer_broker_instance peer_address",
            {**_KINDS, "state": _N, "login_state": _N},
        ),
        ("broker_connections",),
        _connections,
    ),
    SysView(
        "sys.dm_broker_forwarded_messages",
        _cols(
            "conversation_id is_initiator to_service_name to_broker_instance from_service_name"
            " from_broker_instance adjacent_broker_address message_sequence_number"
            " message_fragment_number hops_remaining time_to_expiry time_consumed message_id",
            _KINDS,
        ),
        ("forwarded_conversations",),
        _forwarded,
    ),
    SysView(
        "sys.objects",
        _cols(
            "name object_id principal_id schema_id parent_object_id type type_desc create_date"
            " modify_date is_ms_shipped",
            _KINDS,
        ),
        ("service_queues",),
        _objects,
    ),
    SysView(
        "sys.procedures",
        _cols(
            "name object_id principal_id schema_id parent_object_id type type_desc create_date"
            " modify_date is_ms_shipped",
            _KINDS,
        ),
        (),
        _procedures,
    ),
    SysView(
        "sys.event_notifications",
        _cols(
            "name object_id parent_class parent_class_desc parent_id create_date modify_date"
            " service_name broker_instance creator_sid principal_id",
            _KINDS,
        ),
        ("event_notifications",),
        _notifications,
    ),
]
SYS_VIEWS: Final = {view.name: view for view in _VIEWS}

# a queue read with SELECT: Service Broker's queue columns, then ssb's own
QUEUE_COLUMNS: Final = _cols(
    "status priority queuing_order conversation_group_id conversation_handle"
    " message_sequence_number service_name service_id service_contract_name"
    " service_contract_id message_type_name message_type_id validation message_body"
    " message_enqueue_time delivery_count",
    {
        **_KINDS,
        "status": t.SqlType("TINYINT"),
        "queuing_order": t.BIGINT,
        "service_name": _N,
        "service_contract_name": _N,
        "message_enqueue_time": t.DATETIME,
        "validation": t.SqlType("NCHAR", 2),
    },
)


def queue_rows(rows: Rows) -> list[Any]:
    return [
        (
            r["status"],
            r["priority"],
            r["queuing_order"],
            r["conversation_group_id"],
            r["conversation_handle"],
            r["message_sequence_number"],
            r["service_name"],
            object_id("service", r["service_name"]),
            r["service_contract_name"],
            object_id("contract", r["service_contract_name"]),
            r["message_type_name"],
            object_id("message_type", r["message_type_name"]),
            r["validation"],
            r["message_body"],
            r["message_enqueue_time"],
            r.get("delivery_count"),
        )
        for r in rows
    ]
