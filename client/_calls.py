"""Every broker operation as a pure request builder, shared by both clients.

Each function checks its arguments' shape, and returns a `Call`: the operation
name, its wire arguments and how to decode the answer. The async `Connection` and
the blocking `SyncConnection` turn each builder into a method, so the two clients
have exactly the same methods, signatures and docstrings.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ssb.protocol import ErrorCode, ProtocolError, encode_frame

from ._errors import MessageTooLargeError
from ._message import Message

T = TypeVar("T")
Body = bytes | str
Handle = uuid.UUID | str
Handles = Handle | Sequence[Handle]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    operation: str
    arguments: dict[str, Any]
    decode: Callable[[Any], T]


def encode_request(request_id: int, request: Call[Any], max_message_size: int) -> bytes:
    """The request's frame, after checking its size against the broker's limits.

    Raises: MessageTooLargeError: a body exceeds `max_message_size`, or the whole
        request exceeds the frame limit (nothing is sent).
    """
    if request.operation == "send":
        for body in request.arguments.get("bodies", ()):
            if len(body) > max_message_size:
                raise MessageTooLargeError(
                    f"a message body of {len(body)} bytes exceeds the broker's max_message_size"
                    f" of {max_message_size} bytes; nothing was sent",
                    ErrorCode.MESSAGE_TOO_LARGE,
                )
    try:
        return encode_frame([request_id, request.operation, request.arguments])
    except ProtocolError as exc:
        raise MessageTooLargeError(
            f"{exc}: this {request.operation} request is too large to send; send fewer or"
            " smaller bodies per call (each send_many is one request)",
            ErrorCode.FRAME_TOO_LARGE,
        ) from None


def _none(_: Any) -> None:
    return None


NO_RESULT = _none  # the decoder of every request that answers nothing


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _optional_uuid(value: Any) -> uuid.UUID | None:
    return None if value is None else _uuid(value)


def _messages(rows: Any) -> list[Message]:
    return [Message.from_wire(row) for row in rows]


def _rows(rows: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in rows]


def _handle(value: Handle) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        return uuid.UUID(value)
    raise TypeError(f"a conversation handle is a uuid.UUID, got {type(value).__name__}")


def _handles(value: Handles) -> list[uuid.UUID]:
    if isinstance(value, (uuid.UUID, str)):
        return [_handle(value)]
    return [_handle(v) for v in value]


def _body(value: Body) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a message body is bytes or str, got {type(value).__name__}")


def _some(**arguments: Any) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if v is not None}


# ---- catalog ---------------------------------------------------------------


def create_message_type(name: str, validation: str = "NONE") -> Call[None]:
    """CREATE MESSAGE TYPE.

    Args:
        name: the message type's name.
        validation: NONE, EMPTY, WELL_FORMED_XML or VALID_JSON.
    """
    return Call("create_message_type", {"name": name, "validation": validation}, _none)


def alter_message_type(name: str, validation: str) -> Call[None]:
    """ALTER MESSAGE TYPE: a new validation for messages sent from now on."""
    return Call("alter_message_type", {"name": name, "validation": validation}, _none)


def create_contract(name: str, messages: dict[str, str]) -> Call[None]:
    """CREATE CONTRACT: `messages` maps message type -> INITIATOR, TARGET or ANY."""
    return Call("create_contract", {"name": name, "messages": dict(messages)}, _none)


def create_queue(
    name: str,
    status: str = "ON",
    retention: str = "OFF",
    activation: dict[str, Any] | None = None,
    poison_message_handling: dict[str, Any] | str | None = None,
    poison_policy: dict[str, Any] | None = None,
    max_messages: int | None = None,
    max_bytes: int | None = None,
) -> Call[None]:
    """CREATE QUEUE.

    Args:
        status: "ON" or "OFF" (an OFF queue holds arrivals back and refuses RECEIVE).
        retention: "ON" keeps received messages (status 0) until their conversation ends.
        activation: {"status", "procedure", "max_queue_readers", "execute_as"}; the
            procedure is a Python "package.module:function" or the name of a T-SQL
            stored procedure of the queue's database (see create_procedure).
        poison_message_handling: {"status": "ON" | "OFF"}: disable the queue after
            five rollbacks in a row (default ON).
        poison_policy: {"threshold", "action": "dead_letter" | "end_conversation" |
            "park" | "record", "dead_letter_queue", "delay", "max_parks", "notify_service"}.
        max_messages, max_bytes: quotas: a SEND that would store more messages (or more
            bytes of bodies) in the queue fails with QueueFullError, and a message from
            another broker waits in its sender's transmission queue (default: no limit).
    """
    return Call(
        "create_queue",
        _some(
            name=name,
            status=status,
            retention=retention,
            activation=activation,
            poison_message_handling=poison_message_handling,
            poison_policy=poison_policy,
            max_messages=max_messages,
            max_bytes=max_bytes,
        ),
        _none,
    )


def alter_queue(name: str, **changes: Any) -> Call[None]:
    """ALTER QUEUE: any of status, retention, activation (merged), poison_message_handling,
    poison_policy (None removes it), max_messages, max_bytes (None removes a quota)."""
    return Call("alter_queue", {"name": name, **changes}, _none)


def create_service(name: str, queue: str, contracts: Iterable[str] = ()) -> Call[None]:
    """CREATE SERVICE on a queue; `contracts` it accepts as a target (none = initiator only)."""
    return Call(
        "create_service", {"name": name, "queue": queue, "contracts": list(contracts)}, _none
    )


def alter_service(
    name: str,
    add_contracts: Iterable[str] = (),
    drop_contracts: Iterable[str] = (),
    queue: str | None = None,
) -> Call[None]:
    """ALTER SERVICE [ON QUEUE q] (ADD CONTRACT ..., DROP CONTRACT ...): the contracts it
    accepts as a target from now on (conversations already begun keep theirs); `queue`
    moves it to another queue, while it has no open conversation."""
    return Call(
        "alter_service",
        _some(
            name=name,
            add_contracts=list(add_contracts),
            drop_contracts=list(drop_contracts),
            queue=queue,
        ),
        _none,
    )


def create_route(
    name: str,
    service_name: str,
    address: str,
    broker_instance: str | None = None,
    lifetime: float | None = None,
    mirror_address: str | None = None,
) -> Call[None]:
    """CREATE ROUTE: address is 'tcp://host:port', 'LOCAL' or 'TRANSPORT'; mirror_address
    ('tcp://host:port', with broker_instance) is another address of the same broker,
    tried when the first does not answer."""
    return Call(
        "create_route",
        _some(
            name=name,
            service_name=service_name,
            address=address,
            broker_instance=broker_instance,
            lifetime=lifetime,
            mirror_address=mirror_address,
        ),
        _none,
    )


def alter_route(name: str, **changes: Any) -> Call[None]:
    """ALTER ROUTE: any of service_name, address, broker_instance, lifetime (seconds from
    now; None: for ever); what is not given stays."""
    return Call("alter_route", {"name": name, **changes}, _none)


def create_broker_priority(
    name: str,
    contract: str | None = None,
    local_service: str | None = None,
    remote_service: str | None = None,
    level: int = 5,
) -> Call[None]:
    """CREATE BROKER PRIORITY; None means ANY. Level 1 (lowest) .. 10 (highest)."""
    return Call(
        "create_broker_priority",
        {
            "name": name,
            "contract": contract,
            "local_service": local_service,
            "remote_service": remote_service,
            "level": level,
        },
        _none,
    )


def alter_broker_priority(name: str, **changes: Any) -> Call[None]:
    """ALTER BROKER PRIORITY: any of contract, local_service, remote_service, level."""
    return Call("alter_broker_priority", {"name": name, **changes}, _none)


def create_event_notification(
    name: str, event: str, queue: str, service: str, broker_instance: str | None = None
) -> Call[None]:
    """CREATE EVENT NOTIFICATION for QUEUE_ACTIVATION or BROKER_QUEUE_DISABLED on a queue,
    delivered to `service` (which must accept the PostEventNotification contract)."""
    return Call(
        "create_event_notification",
        _some(
            name=name, event=event, queue=queue, service=service, broker_instance=broker_instance
        ),
        _none,
    )


def _drop(kind: str) -> Callable[[str], Call[None]]:
    def drop(name: str) -> Call[None]:
        return Call("drop", {"kind": kind, "name": name}, _none)

    drop.__name__ = f"drop_{kind}"
    drop.__doc__ = f"DROP {kind.replace('_', ' ').upper()}."
    return drop


drop_message_type = _drop("message_type")
drop_contract = _drop("contract")
drop_queue = _drop("queue")
drop_service = _drop("service")
drop_route = _drop("route")
drop_broker_priority = _drop("broker_priority")
drop_event_notification = _drop("event_notification")


# ---- conversations -----------------------------------------------------------


def begin_dialog(
    from_service: str,
    to_service: str,
    contract: str = "DEFAULT",
    *,
    broker_instance: str | None = None,
    related_conversation: Handle | None = None,
    related_conversation_group: Handle | None = None,
    lifetime: float | None = None,
    encryption: bool = False,
) -> Call[uuid.UUID]:
    """BEGIN DIALOG from a local service to a service on a contract.

    Returns:
        The new conversation handle.
    """
    return Call(
        "begin_dialog",
        _some(
            from_service=from_service,
            to_service=to_service,
            contract=contract,
            broker_instance=broker_instance,
            related_conversation=None
            if related_conversation is None
            else _handle(related_conversation),
            related_conversation_group=None
            if related_conversation_group is None
            else _handle(related_conversation_group),
            lifetime=lifetime,
            encryption=encryption or None,
        ),
        _uuid,
    )


def send(handles: Handles, message_type: str = "DEFAULT", body: Body = b"") -> Call[None]:
    """SEND one message on one conversation, or the same message on several at once."""
    return Call(
        "send",
        {"handles": _handles(handles), "message_type": message_type, "bodies": [_body(body)]},
        _none,
    )


def send_many(handles: Handles, message_type: str, bodies: Iterable[Body]) -> Call[None]:
    """SEND many messages (in order) in one round trip; atomic as one statement."""
    return Call(
        "send",
        {
            "handles": _handles(handles),
            "message_type": message_type,
            "bodies": [_body(b) for b in bodies],
        },
        _none,
    )


def end_conversation(
    handle: Handle,
    error: int | None = None,
    description: str | None = None,
    cleanup: bool = False,
) -> Call[None]:
    """END CONVERSATION [WITH ERROR = error DESCRIPTION = description | WITH CLEANUP]."""
    return Call(
        "end_conversation",
        _some(
            handle=_handle(handle),
            error=error,
            description=description,
            cleanup=cleanup or None,
        ),
        _none,
    )


def begin_conversation_timer(handle: Handle, timeout: float) -> Call[None]:
    """BEGIN CONVERSATION TIMER: a DialogTimer message arrives after `timeout` seconds."""
    return Call("begin_conversation_timer", {"handle": _handle(handle), "timeout": timeout}, _none)


def move_conversation(handle: Handle, group_id: Handle) -> Call[None]:
    """MOVE CONVERSATION into another conversation group of the same queue."""
    return Call(
        "move_conversation", {"handle": _handle(handle), "group_id": _handle(group_id)}, _none
    )


def receive(
    queue: str,
    top: int | None = None,
    timeout: float | None = 0.0,
    *,
    conversation_handle: Handle | None = None,
    conversation_group_id: Handle | None = None,
) -> Call[list[Message]]:
    """RECEIVE [TOP n] FROM queue [WHERE ...] [WAITFOR timeout].

    Returns messages of one conversation group, which stays locked until the
    transaction ends (outside a transaction: committed at once).

    Args:
        top: at most this many messages (None: all of the group's ready messages).
        timeout: seconds to wait for a message; 0 returns at once, None waits forever.
    Returns:
        The messages; [] when none arrived in time.
    """
    arguments: dict[str, Any] = {"queue": queue, "top": top, "timeout": timeout}
    if conversation_handle is not None:
        arguments["conversation_handle"] = _handle(conversation_handle)
    if conversation_group_id is not None:
        arguments["conversation_group_id"] = _handle(conversation_group_id)
    return Call("receive", arguments, _messages)


def get_conversation_group(queue: str, timeout: float | None = 0.0) -> Call[uuid.UUID | None]:
    """GET CONVERSATION GROUP: lock and return the next group with messages (None if none)."""
    return Call("get_conversation_group", {"queue": queue, "timeout": timeout}, _optional_uuid)


# ---- transactions, views, broker --------------------------------------------------


def begin_transaction(
    detached: bool = False, timeout: float | None = None, txn_id: Handle | None = None
) -> Call[uuid.UUID | None]:
    """BEGIN TRANSACTION on this connection.

    Args:
        txn_id: the transaction's id (a UUID; default: a fresh one, see
            `Connection.transaction_id`): after a lost connection,
            `transaction_outcome(txn_id)` tells whether it committed. Never reuse one.
        detached: give the transaction an id so that it can outlive this connection:
            `detach_transaction()` lets go of it, and any connection may then
            `attach_transaction(id)`, `commit_transaction(id)` or `rollback_transaction(id)`.
        timeout: seconds a detached transaction may stay open before it rolls back
            (default 300).
    Returns:
        The detached transaction's id (None for an ordinary transaction).
    """
    return Call(
        "begin_transaction",
        _some(
            detached=detached or None,
            timeout=timeout,
            txn_id=None if txn_id is None else _handle(txn_id),
        ),
        _optional_uuid,
    )


def detach_transaction() -> Call[uuid.UUID]:
    """Let go of this connection's detached transaction; it stays open, locks and all."""
    return Call("detach_transaction", {}, _uuid)


def attach_transaction(transaction_id: Handle) -> Call[None]:
    """Continue a detached transaction on this connection."""
    return Call("attach_transaction", {"transaction_id": _handle(transaction_id)}, _none)


def commit_transaction(transaction_id: Handle) -> Call[None]:
    """COMMIT a detached transaction by id, from any connection."""
    return Call("commit_transaction", {"transaction_id": _handle(transaction_id)}, _none)


def rollback_transaction(transaction_id: Handle, error: str | None = None) -> Call[None]:
    """ROLLBACK a detached transaction by id, from any connection."""
    return Call(
        "rollback_transaction",
        _some(transaction_id=_handle(transaction_id), error=error),
        _none,
    )


def transaction_outcome(txn_id: Handle, age: float | None = None) -> Call[tuple[str, str]]:
    """Whether this login's transaction (or statement outside one) `txn_id` committed.

    Answers ("committed" | "rolled_back" | "unknown" | "open", why). Asking fixes the
    answer: a transaction still running under that id on another connection of this
    login is rolled back (that connection is closed) and the id can never commit later.

    Args:
        age: at most how many seconds ago the commit was sent; without it an id that is
            not recorded is "unknown" (it might have been pruned from the window).
    """
    return Call("transaction_outcome", _some(txn_id=_handle(txn_id), age=age), _outcome)


def _outcome(value: Any) -> tuple[str, str]:
    outcome, why = value
    return str(outcome), str(why)


def commit() -> Call[None]:
    """COMMIT: sends become deliverable, received messages go, locks are released."""
    return Call("commit", {}, _none)


def rollback(error: str | None = None) -> Call[None]:
    """ROLLBACK: received messages return where they were, sends are discarded.

    Args:
        error: what went wrong, kept with each received message (poison_messages view,
            dead-letter reason) so whoever looks at a poison message knows why.
    """
    return Call("rollback", _some(error=error), _none)


def save_transaction(name: str) -> Call[None]:
    """SAVE TRANSACTION: a savepoint of the open transaction, to roll back to."""
    return Call("save_transaction", {"name": name}, _none)


def rollback_to_savepoint(name: str) -> Call[None]:
    """ROLLBACK TRANSACTION savepoint: what the transaction did after its latest savepoint
    of that name is undone (received messages go back, later sends, dialogs, ends, timers
    and moves are discarded); the transaction and every lock it holds stay."""
    return Call("rollback_to_savepoint", {"name": name}, _none)


def requeue_dead_letter(queue: str, queuing_order: int) -> Call[None]:
    """Put a message that a poison policy moved to dead-letter `queue` back at the head
    of its conversation in its original queue (delivery count starts again)."""
    return Call("requeue_dead_letter", {"queue": queue, "queuing_order": queuing_order}, _none)


def view(
    name: str, limit: int | None = None, after: int | None = None
) -> Call[list[dict[str, Any]]]:
    """A view's rows (conversation_endpoints, service_queues, ..., or 'queue:NAME').

    Args:
        limit: at most this many rows (the broker's default is 10,000; 100,000 at most).
        after: for queue:NAME and transmission_queue, rows after this queuing order / id.
    """
    return Call("view", _some(name=name, limit=limit, after=after), _rows)


def peek(queue: str, limit: int | None = None, after: int | None = None) -> Call[list[Message]]:
    """The messages of a queue without receiving them (like SELECT on a queue), in queuing
    order: at most `limit` (and an answer's worth of bytes), after queuing order `after`."""

    def decode(rows: Any) -> list[Message]:
        return [Message.from_wire(list(row.values())) for row in rows]

    return Call("view", _some(name=f"queue:{queue}", limit=limit, after=after), decode)


def broker_instance() -> Call[str]:
    """This broker's persistent instance id."""
    return Call("broker_instance", {}, str)


def broker_certificate() -> Call[str]:
    """This broker's certificate (PEM text), to trust on its peers."""
    return Call("broker_certificate", {}, str)


def create_certificate(name: str, pem: str, login: str | None = None) -> Call[None]:
    """CREATE CERTIFICATE: trust a peer broker's certificate (from its broker_certificate()).
    Its broker's messages act as `login` (None: PUBLIC) and need SEND on the service they
    are for (grant("SEND", login, "service", NAME))."""
    return Call("create_certificate", _some(name=name, pem=pem, login=login), _none)


def drop_certificate(name: str) -> Call[None]:
    """DROP CERTIFICATE: stop trusting a peer broker."""
    return Call("drop_certificate", {"name": name}, _none)


def next_broker_certificate() -> Call[str]:
    """Stage this broker's next certificate (made once, same instance id) and return it,
    to trust on every peer before rotate_broker_certificate()."""
    return Call("next_broker_certificate", {}, str)


def rotate_broker_certificate() -> Call[str]:
    """Make the staged certificate current (peers reconnect and meet it); returns it."""
    return Call("rotate_broker_certificate", {}, str)


def create_remote_service_binding(name: str, service: str, pem: str) -> Call[None]:
    """CREATE REMOTE SERVICE BINDING: the certificate (PEM) of the broker hosting `service`,
    for dialogs to it begun with encryption=True."""
    return Call(
        "create_remote_service_binding", {"name": name, "service": service, "pem": pem}, _none
    )


def drop_remote_service_binding(name: str) -> Call[None]:
    """DROP REMOTE SERVICE BINDING."""
    return Call("drop_remote_service_binding", {"name": name}, _none)


def create_login(name: str, password: str | None = None) -> Call[dict[str, str]]:
    """A new login (needs CONTROL). With no password the broker makes a random one and
    returns it, once, as {"name", "password"}; it is stored only as a salted hash."""
    return Call("create_login", _some(name=name, password=password), dict)


def alter_login(name: str, password: str) -> Call[None]:
    """Change a login's password (needs CONTROL); its open sessions stay open."""
    return Call("alter_login", {"name": name, "password": password}, _none)


def drop_login(name: str) -> Call[None]:
    """Remove a login (needs CONTROL); it can no longer log in."""
    return Call("drop_login", {"name": name}, _none)


def grant(
    permission: str, login: str, kind: str | None = None, name: str | None = None
) -> Call[None]:
    """GRANT `permission` (CONTROL, CREATE, ALTER, DROP, SEND, RECEIVE, VIEW, EXECUTE) to
    `login`, on the object `kind` `name` (e.g. "service", "Orders") or, with neither, on
    the whole broker. Needs CONTROL of the broker, or of the object (its owner)."""
    return Call("grant", _some(permission=permission, login=login, kind=kind, name=name), _none)


def revoke(
    permission: str, login: str, kind: str | None = None, name: str | None = None
) -> Call[None]:
    """REVOKE what `grant` gave (an object's owner keeps every permission on it)."""
    return Call("revoke", _some(permission=permission, login=login, kind=kind, name=name), _none)


def ping() -> Call[str]:
    """A round trip that does nothing."""
    return Call("ping", {}, str)


# ---- activation and the scheduler's execution log -------------------------------


def attach_task(token: str) -> Call[dict[str, Any]]:
    """Mark this session as the activated task that `token` was issued for.

    Activation workers call it first thing; procedures never need to.
    """
    return Call("attach_task", {"token": token}, dict)


def log_task(task: str, scheduler: Handle | None = None) -> Call[int]:
    """Add a queued task to the execution log; returns its log id."""
    return Call(
        "log_task",
        _some(task=task, scheduler=None if scheduler is None else _handle(scheduler)),
        int,
    )


def check_procedure(procedure: str) -> Call[None]:
    """Whether the broker allows running `module:function` (its config's `procedures`);
    PermissionDeniedError, saying how to allow it, when not. Readers ask before importing."""
    return Call("check_procedure", {"procedure": procedure}, _none)


def log_task_start(
    log_id: int, conversation_handle: Handle | None = None, reply_type: str | None = None
) -> Call[None]:
    """Log that this session (an activated task) starts task `log_id`.

    Args:
        conversation_handle, reply_type: where the broker sends
            {"log_id", "ok": false, "error", "result": null} itself if this task's
            worker dies before log_task_end.
    """
    return Call(
        "log_task_start",
        _some(
            log_id=log_id,
            conversation_handle=None
            if conversation_handle is None
            else _handle(conversation_handle),
            reply_type=reply_type,
        ),
        _none,
    )


def log_task_end(log_id: int, error: str | None = None) -> Call[None]:
    """Log that task `log_id` ended, with `error` if it failed."""
    return Call("log_task_end", _some(log_id=log_id, error=error), _none)


# ---- external readers (the Spark bridge) and leases ---------------------------------


def register_task(
    queue: str,
    activator: str,
    *,
    procedure: str | None = None,
    job: str | None = None,
    job_id: int | None = None,
    job_task_id: int | None = None,
    executor: str | None = None,
    pid: int | None = None,
) -> Call[dict[str, Any]]:
    """Register this session as an external activated task (reader) of `queue`.

    It shows in `activated_tasks` (kind EXTERNAL) until `end_task()` or until the
    connection closes, and counts against the queue's MAX_QUEUE_READERS together
    with internal tasks. After `request_stop` names it, its RECEIVEs return [] at once.

    Args:
        activator: who started the reader (e.g. "spark-bridge:<id>").
        procedure: what it runs, for the view. job, job_id, job_task_id, executor,
            pid: where it runs (Spark job group, job id, task id, executor).
    Returns:
        {"task_id", "queue", "max_queue_readers"}.
    Raises:
        InUseError: the queue already has MAX_QUEUE_READERS readers.
    """
    return Call(
        "register_task",
        _some(
            queue=queue,
            activator=activator,
            procedure=procedure,
            job=job,
            job_id=job_id,
            job_task_id=job_task_id,
            executor=executor,
            pid=pid,
        ),
        dict,
    )


def end_task(error: str | None = None) -> Call[None]:
    """End this session's external activated task (`error`: why it failed, if it did)."""
    return Call("end_task", _some(error=error), _none)


def request_stop(
    queue: str | None = None,
    *,
    activator: str | None = None,
    job: str | None = None,
    task_id: int | None = None,
) -> Call[int]:
    """Ask the external readers matching every given filter to finish after their
    current transaction (their RECEIVEs return [] from now on).

    Returns:
        How many readers were asked.
    """
    return Call(
        "request_stop", _some(queue=queue, activator=activator, job=job, task_id=task_id), int
    )


def label_job(job: str, job_id: int) -> Call[int]:
    """Record `job_id` on the external readers registered with `job`; returns how many."""
    return Call("label_job", {"job": job, "job_id": job_id}, int)


def transaction_messages(transaction_id: Handle) -> Call[list[Message]]:
    """The messages a detached transaction received, in order, without changing anything."""
    return Call("transaction_messages", {"transaction_id": _handle(transaction_id)}, _messages)
