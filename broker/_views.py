"""Read-only views of the broker's live state, one list of rows (dicts) per view.

Names follow Service Broker's catalog views and DMVs without the `sys.` prefix.
`queue:NAME` reads a queue's messages without receiving them, like SELECT on a
queue. Extra views can be registered by other modules (activation, transport).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from ssb.protocol import MESSAGE_COLUMNS, ErrorCode

from ._engine import Engine
from ._errors import BrokerError

ViewFn = Callable[[Engine], list[dict[str, Any]]]


def _time(value: float | None) -> str | None:
    if value is None:
        return None
    return dt.datetime.fromtimestamp(value, dt.UTC).isoformat(timespec="milliseconds")


def conversation_endpoints(engine: Engine) -> list[dict[str, Any]]:
    return [
        {
            "conversation_handle": ep.handle,
            "conversation_id": ep.conversation_id,
            "is_initiator": ep.is_initiator,
            "service_name": ep.service,
            "far_service": ep.far_service,
            "far_broker_instance": ep.far_broker_instance,
            "service_contract_name": ep.contract,
            "conversation_group_id": ep.group_id,
            "queue_name": ep.queue,
            "state": ep.state.name,
            "state_desc": ep.state.value,
            "priority": ep.priority,
            "lifetime": _time(ep.lifetime_expiry),
            "dialog_timer": _time(ep.timer_at),
            "send_sequence": ep.send_seq,
            "receive_sequence": ep.receive_seq,
        }
        for ep in engine.all_endpoints()
    ]


def conversation_groups(engine: Engine) -> list[dict[str, Any]]:
    rows = []
    for queue in engine.queues.values():
        for group in queue.groups.values():
            if not group.endpoints:
                continue
            rows.append(
                {
                    "conversation_group_id": group.id,
                    "queue_name": queue.name,
                    "conversations": len(group.endpoints),
                    "messages": group.message_count(),
                    "is_locked": group.owner is not None,
                    "locked_by_session": getattr(
                        getattr(group.owner, "session", None), "ident", None
                    ),
                }
            )
    return rows


def service_queues(engine: Engine) -> list[dict[str, Any]]:
    rows = []
    for queue in engine.queues.values():
        d = queue.definition
        rows.append(
            {
                "name": d.name,
                "is_receive_enabled": d.status,
                "is_enqueue_enabled": d.status,
                "is_retention_enabled": d.retention,
                "is_activation_enabled": d.activation.status,
                "activation_procedure": d.activation.procedure or None,
                "max_readers": d.activation.max_queue_readers,
                "execute_as": d.activation.execute_as or None,
                "is_poison_message_handling_enabled": d.poison_message_handling,
                "poison_policy": None if d.poison_policy is None else d.poison_policy.action,
                "messages_ready": queue.ready,
                "messages_retained": sum(len(v) for v in queue.retained.values()),
                "disabled_reason": queue.disabled_reason or None,
            }
        )
    return rows


def transmission_queue(engine: Engine) -> list[dict[str, Any]]:
    return [
        {
            "conversation_handle": out.handle,
            "to_service_name": out.to_service,
            "to_broker_instance": out.to_broker_instance,
            "from_service_name": out.from_service,
            "service_contract_name": out.contract,
            "message_sequence_number": out.seq,
            "message_type_name": out.message_type,
            "priority": out.priority,
            "enqueue_time": _time(out.enqueue_time),
            "is_conversation_error": out.message_type.endswith("/Error"),
            "is_end_of_dialog": out.message_type.endswith("/EndDialog"),
            "message_body_length": len(out.body),
            "transmission_status": engine.describe_outbound(out),
        }
        for out in sorted(engine.transmission.values(), key=lambda o: o.id)
    ]


def services(engine: Engine) -> list[dict[str, Any]]:
    return [
        {"name": s.name, "queue_name": s.queue, "contracts": ", ".join(s.contracts)}
        for s in engine.catalog.services.values()
    ]


def service_contracts(engine: Engine) -> list[dict[str, Any]]:
    return [
        {"name": name, "message_type_name": mtype, "sent_by": sent_by}
        for name, contract in engine.catalog.contracts.items()
        for mtype, sent_by in contract.messages.items()
    ]


def message_types(engine: Engine) -> list[dict[str, Any]]:
    return [
        {"name": m.name, "validation": m.validation} for m in engine.catalog.message_types.values()
    ]


def routes(engine: Engine) -> list[dict[str, Any]]:
    return [
        {
            "name": r.name,
            "remote_service_name": r.service_name,
            "broker_instance": r.broker_instance,
            "address": r.address,
            "lifetime": _time(r.expires),
        }
        for r in engine.catalog.routes.values()
    ]


def conversation_priorities(engine: Engine) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "service_contract_name": p.contract or "ANY",
            "local_service_name": p.local_service or "ANY",
            "remote_service_name": p.remote_service or "ANY",
            "priority": p.level,
        }
        for p in engine.catalog.priorities.values()
    ]


def event_notifications(engine: Engine) -> list[dict[str, Any]]:
    return [
        {
            "name": n.name,
            "event": n.event,
            "queue_name": n.queue,
            "service_name": n.service,
            "broker_instance": n.broker_instance,
        }
        for n in engine.catalog.notifications.values()
    ]


def poison_messages(engine: Engine) -> list[dict[str, Any]]:
    return [dict(row, time=_time(row["time"])) for row in engine.poison.incidents]


def open_transactions(engine: Engine) -> list[dict[str, Any]]:
    return [
        {
            "transaction_id": txn.ident,
            "attached_session": txn.session.ident if txn.session.txn is txn else None,
            "locked_groups": len(txn.locks),
            "received_messages": sum(len(m) for _, _, m in txn.received),
            "pending_actions": len(txn.actions),
            "expires": _time(txn.expires),
        }
        for txn in engine.detached.values()
    ]


VIEWS: dict[str, ViewFn] = {
    "conversation_endpoints": conversation_endpoints,
    "conversation_groups": conversation_groups,
    "service_queues": service_queues,
    "transmission_queue": transmission_queue,
    "services": services,
    "service_contracts": service_contracts,
    "message_types": message_types,
    "routes": routes,
    "conversation_priorities": conversation_priorities,
    "event_notifications": event_notifications,
    "poison_messages": poison_messages,
    "open_transactions": open_transactions,
}


def queue_contents(engine: Engine, name: str) -> list[dict[str, Any]]:
    queue = engine.queues.get(name)
    if queue is None:
        raise BrokerError(ErrorCode.UNKNOWN_QUEUE, f"queue '{name}' does not exist")
    rows = []
    for m in queue.all_messages():
        row = dict(zip(MESSAGE_COLUMNS, m.wire(), strict=True))
        row["message_enqueue_time"] = _time(m.message_enqueue_time)
        rows.append(row)
    return rows


def render(engine: Engine, name: str) -> list[dict[str, Any]]:
    if name.startswith("queue:"):
        return queue_contents(engine, name[len("queue:") :])
    view = VIEWS.get(name)
    if view is None:
        raise BrokerError(
            ErrorCode.UNKNOWN_VIEW,
            f"there is no view '{name}'; views are {', '.join(sorted(VIEWS))} and queue:NAME",
        )
    return view(engine)
