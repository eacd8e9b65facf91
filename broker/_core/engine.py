"""The engine: the core's parts, built and wired in one place, and their operations.

Theory of operation. Everything runs on one thread (the daemon's event loop), so each
operation is atomic with respect to the others: it checks all its input first, then
changes memory and appends its store writes in one synchronous stretch, so a store
batch never holds half of an operation. Operations that must wait (RECEIVE ... WAITFOR,
a lock another transaction holds) return a coroutine instead of a value.

Parts, each owning its state (imports run one way, top to bottom):

    catalog, routes      the objects, and where services live (across databases)
    queues, backlog      groups, conversations, the message cache
    endpoints            conversation endpoints over the store, timers
    outcomes             committed transaction ids, for reconnecting clients
    transactions         sessions, transactions, locks (hooks call back here)
    transmission         the transmission queue: what waits, by dialog direction
    delivery, remote     local delivery and enqueue; messages to and from other brokers
    receive              RECEIVE, GET CONVERSATION GROUP, waiters
    tables               users' table statements, table locks; effects at commit
    dialogs              BEGIN DIALOG, SEND, END, timers, MOVE; effects at commit
    events, poison, ddl  notifications, poison rules, catalog statements
    databases            CREATE / ALTER / DROP DATABASE, USE

The engine implements `TransactionHooks` by delegating: commit applies the dialog
actions then settles received messages; rollback puts received messages back and
forgets begun endpoints, and once the locks are free runs the poison rules.

Start-up reads the catalog and one summary of the stored messages (per conversation:
count, bytes, first queuing order) and of the transmission queue (per direction); it
does not read the messages themselves (see `backlog`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ssb.protocol import DEFAULT_MAX_MESSAGE_SIZE

from .._operations import Operation, methods
from . import catalog as cat
from .backlog import DEFAULT_CACHE_BYTES, MessageCache
from .capacity import Capacity
from .conversations import Endpoint
from .databases import Databases
from .ddl import Ddl
from .delivery import Delivery
from .dialogs import Dialogs
from .endpoints import Endpoints
from .events import Events
from .outcomes import DEFAULT_WINDOW_COUNT, DEFAULT_WINDOW_SECONDS, PRUNED_THROUGH, Outcomes
from .poison import Poison
from .ports import (
    Clock,
    Journal,
    NoListener,
    NoTransport,
    OutboundSink,
    QueueListener,
    Row,
    Span,
)
from .queues import Conversation, Queue, Status, dead_letter_identity
from .receive import Receiving
from .remote import RemoteDelivery
from .routes import Routes
from .tables import DEFAULT_STATEMENT_TIMEOUT, Tables
from .transactions import (
    DEFAULT_MAX_DETACHED,
    DEFAULT_MAX_LOCKS,
    Savepoint,
    Session,
    Transaction,
    Transactions,
)
from .transmission import Outbound, TransmissionQueue

log = logging.getLogger("ssb.core")

DEFAULT_MIN_FREE_DISK: Final = 1 << 30


class StoredState:
    """What the engine reads from the store at start (the Journal's start-up queries)."""

    def __init__(
        self,
        catalog: list[tuple[str, str, str]],
        max_ids: tuple[int, int, int],
        meta: dict[str, str] | None = None,
    ) -> None:
        self.catalog = catalog
        self.max_ids = max_ids
        self.meta = meta or {}


@dataclass(frozen=True, slots=True)
class CoreLimits:
    """The numbers one broker's core is bounded by (the daemon takes them from its config)."""

    lock_timeout: float = 30.0  # how long a statement waits for a conversation group's lock
    max_locks: int = DEFAULT_MAX_LOCKS  # conversation-group locks per transaction
    max_detached: int = DEFAULT_MAX_DETACHED  # open detached transactions per login
    message_cache_bytes: int = DEFAULT_CACHE_BYTES  # message bodies held in memory
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # the largest message body SEND takes
    min_free_disk: int = DEFAULT_MIN_FREE_DISK  # SEND is refused below it
    # how long committed transaction ids are remembered for reconnecting clients
    outcome_window_seconds: float = DEFAULT_WINDOW_SECONDS
    outcome_window_count: int = DEFAULT_WINDOW_COUNT
    # how long a table statement may wait for a table lock, and run
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT


class Engine:
    """One broker's core."""

    def __init__(
        self,
        journal: Journal,
        clock: Clock,
        instance_id: str,
        *,
        listener: QueueListener | None = None,
        sink: OutboundSink | None = None,
        check_procedure: Callable[[str], None] = lambda procedure: None,
        limits: CoreLimits | None = None,
    ) -> None:
        """The core of one broker over `journal` and `clock`.

        Args:
            listener: hears what happens to queues (activation's queue monitors);
                default: nobody.
            sink: hears of transmission-queue work (the broker-to-broker transport,
                through an `OutboundRelay`); default: none (messages wait, with a reason).
            check_procedure: refuses (raises) an activation procedure the broker may not
                run, at CREATE / ALTER QUEUE; default: any.
            limits: the numbers the core is bounded by; default: `CoreLimits()`.
        """
        limits = CoreLimits() if limits is None else limits
        self.journal = journal
        self.clock = clock
        self.instance_id = instance_id
        self.listener: QueueListener = NoListener() if listener is None else listener
        self.catalog = cat.Catalog()
        self.capacity = Capacity(limits.max_message_size, limits.min_free_disk)
        self.cache = MessageCache(limits.message_cache_bytes, journal, clock)
        self.queues: dict[str, Queue] = {}
        self.routes = Routes(self.catalog, clock, instance_id)
        self.endpoints = Endpoints(journal, self.catalog)
        self.outcomes = Outcomes(
            journal, clock, limits.outcome_window_seconds, limits.outcome_window_count
        )
        self.transactions = Transactions(
            clock,
            self,
            limits.lock_timeout,
            self.outcomes,
            limits.max_locks,
            limits.max_detached,
        )
        self.tables = Tables(journal, clock, self.transactions, limits.statement_timeout)
        self.transmission = TransmissionQueue(journal, self.cache, self.catalog, self.queues)
        self.delivery = Delivery(
            journal,
            clock,
            self.catalog,
            self.routes,
            self.queues,
            self.endpoints,
            self.transmission,
            self.capacity,
            instance_id,
            self.listener,
            NoTransport() if sink is None else sink,
        )
        self.remote = RemoteDelivery(self.delivery, self.transmission)
        self.receiving = Receiving(
            clock,
            journal,
            self.queues,
            self.endpoints,
            self.transactions,
            self.delivery,
            self.listener,
        )
        self.dialogs = Dialogs(
            clock,
            self.catalog,
            self.routes,
            self.queues,
            self.endpoints,
            self.transactions,
            self.delivery,
            self.transmission,
            self.capacity,
        )
        self.events = Events(
            clock, self.catalog, self.routes, self.endpoints, self.delivery, instance_id
        )
        self.poison = Poison(
            journal, clock, self.queues, self.endpoints, self.delivery, self.events
        )
        self.ddl = Ddl(
            journal,
            clock,
            self.catalog,
            self.routes,
            self.queues,
            self.cache,
            self.capacity,
            self.endpoints,
            self.delivery,
            self.receiving,
            self.events,
            self.listener,
            check_procedure,
            self.transactions,
            self.dialogs.end_now,
        )
        self.databases = Databases(
            self.catalog,
            self.ddl,
            self.transactions,
            self.endpoints,
            self.dialogs.end_now,
            self.dialogs.remove_now,
            instance_id,
        )
        # the parts' own cycles, closed here: delivery wakes readers and forgets
        # conversations, poison disables queues
        self.delivery.kick = self.receiving.kick
        self.delivery.conversation_removed = self._conversation_removed
        self.poison.disable_queue = self.ddl.disable_queue
        self.databases.dropping = self.tables.drop_database

    def _conversation_removed(self, ep: Endpoint) -> None:
        self.poison.forget_conversation(ep.handle)
        self.delivery.sink.endpoint_removed(ep)

    # ---- TransactionHooks -------------------------------------------------------------

    def check_commit(self, txn: Transaction) -> None:
        self.dialogs.check_commit(txn)

    def apply_commit(self, txn: Transaction) -> None:
        self.dialogs.apply_commit(txn)
        if txn.received:
            self.receiving.commit_received(txn)
        self.tables.apply_commit(txn)

    def undo(self, txn: Transaction, error: str) -> None:
        txn.restored = self.receiving.restore_received(txn, error, failed=not txn.refused_for_room)
        self.dialogs.undo(txn)
        self.tables.undo(txn)

    def undo_to(self, txn: Transaction, savepoint: Savepoint) -> None:
        # messages go back as they were: the poison rules count only transactions that
        # roll back whole, as Service Broker's do, and a delivery_count only the
        # deliveries they count (what a poison policy's threshold is compared with)
        self.receiving.restore_received(txn, "", savepoint.received, failed=False)
        self.dialogs.undo(txn, savepoint.new_endpoints)
        self.tables.undo_to(txn, savepoint.table_statements)

    def after_rollback(self, txn: Transaction, error: str) -> None:
        for queue, messages in txn.restored:
            if messages and not txn.refused_for_room:
                self.poison.after_rollback(queue, messages)
            elif messages:
                self.capacity.gave_back(queue, len(messages), error, self.clock.time())
            self.listener.rolled_back(queue)
        txn.restored = []

    def released(self, queue: Queue) -> None:
        self.receiving.kick(queue)

    def session_closed(self, session: Session) -> None:
        self.tables.session_closed(session)
        self.listener.session_closed(session)

    # ---- start ---------------------------------------------------------------------------

    def load(self, state: StoredState) -> None:
        """Rebuild memory from the store: the catalog, and a summary of the backlog."""
        for kind, _name, body in state.catalog:
            self.catalog.load(kind, body)
        self.databases.ensure_default()
        for definition in self.catalog.queues.values():
            self.ddl.add_queue(definition)
        self.ddl.count_quotas()
        max_order, max_outbound, max_incident = state.max_ids
        self.delivery.restore_ids(max_order)
        self.transmission.restore_ids(max_outbound)
        self.poison.restore_ids(max_incident)
        self.outcomes.load(state.meta.get(PRUNED_THROUGH))
        self.tables.load(self.journal.load_table_names())
        self._load_messages()
        self._load_transmission()

    def _load_messages(self) -> None:
        journal = self.journal
        statuses = (Status.READY, Status.RETAINED, Status.PARKED, Status.REQUEUED)
        services = self.catalog.services
        for row in journal.message_summary(statuses):
            status, queue_name, raw, count, nbytes, first, service, group, priority, contract = row
            queue = self.queues.get(queue_name)
            handle = uuid.UUID(bytes=raw)
            if queue is None:
                log.warning("dropping %d message(s) of unknown queue %s", count, queue_name)
                journal.delete_conversation_messages(queue_name, handle)
                continue
            queue.messages += count
            queue.bytes += nbytes
            if status == Status.RETAINED:
                queue.retained[handle] = [count, nbytes]
            elif status == Status.READY:
                known = services.get(service) if service is not None else None
                conv: Conversation | None
                if known is not None and known.queue == queue_name:  # the endpoint's queue
                    conv = queue.conversation(
                        queue.group(uuid.UUID(bytes=group)), handle, priority, service, contract
                    )
                else:  # dead letters, orphans
                    conv = self.stored_conversation(queue, handle, first)
                if conv is None:
                    queue.messages -= count
                    queue.bytes -= nbytes
                    continue
                conv.count = conv.spilled = count
                conv.bytes = nbytes
                conv.spilled_from = first
                queue.ready += count
                queue.touch(conv.group)
        for row in sorted(
            journal.read_messages_with_status((Status.PARKED, Status.REQUEUED)),
            key=lambda r: -r[0],
        ):
            self._load_out_of_order(row)

    def identity(
        self, queue: Queue, handle: uuid.UUID, first: int
    ) -> tuple[uuid.UUID, int, str, str, bool] | None:
        """(group, priority, service, contract, dead letters?) of a queue's stored messages
        of conversation `handle`, from its endpoint or, for dead letters, from the row."""
        ep = self.endpoints.get(handle)
        if ep is not None and ep.queue == queue.name:
            return ep.group_id, ep.priority, ep.service, ep.contract, False
        row = self.journal.read_message(first)
        found = dead_letter_identity(row[10] if row is not None else None)
        if found is None:
            return None
        group_id, service, contract, priority = found
        return group_id, priority, service, contract, True

    def stored_conversation(
        self, queue: Queue, handle: uuid.UUID, first: int, register: bool = True
    ) -> Conversation | None:
        """The conversation record of a queue's stored messages (or None: orphans, deleted)."""
        found = self.identity(queue, handle, first)
        if found is None:
            log.warning(
                "dropping the messages of conversation %s in queue %s: the conversation"
                " no longer exists",
                handle,
                queue.name,
            )
            self.journal.delete_conversation_messages(queue.name, handle)
            return None
        group_id, priority, service, contract, dead = found
        if register:
            conv = queue.conversation(queue.group(group_id), handle, priority, service, contract)
        else:
            conv = queue.loose_conversation(group_id, handle, priority, service, contract)
        conv.dead_letters = dead
        return conv

    def _load_out_of_order(self, row: Row) -> None:
        queue = self.queues.get(row[1])
        handle = uuid.UUID(bytes=row[2])
        parked = row[8] == Status.PARKED
        if queue is None:
            return
        conv = self.stored_conversation(queue, handle, row[0], register=not parked)
        if conv is None:
            return
        message = conv.message(row)
        if parked:
            self.poison.park_loaded(queue, message)
        else:
            queue.add_front(message)

    def _load_transmission(self) -> None:
        for conversation_id, is_initiator, count, first in self.journal.transmission_summary():
            rows = self.journal.read_transmission(
                uuid.UUID(bytes=conversation_id), bool(is_initiator), Span(first, None, 1, 0)
            )
            if not rows:
                continue
            out = Outbound.from_row(rows[0])
            local = self.routes.is_local(out.to_service, out.to_broker_instance)
            self.transmission.restore(out, count, local)

    def start(self) -> None:
        """Arm timers and deliver what waited for queues that are ON (on the loop)."""
        self.dialogs.timers.start()
        self.outcomes.start()
        for queue in list(self.queues.values()):
            if queue.definition.status:
                self.delivery.release_held(queue.name)

    def close(self) -> None:
        self.dialogs.timers.close()
        self.outcomes.close()

    # ---- operations ------------------------------------------------------------------------

    def operations(self) -> dict[str, Operation]:
        """The client operations the core answers, by name."""
        return {
            **methods(
                self.ddl,
                "create_message_type",
                "alter_message_type",
                "create_contract",
                "create_queue",
                "alter_queue",
                "create_service",
                "alter_service",
                "create_route",
                "create_broker_priority",
                "alter_broker_priority",
                "create_event_notification",
                "alter_route",
                "create_procedure",
                "alter_procedure",
                "procedure",
                "drop",
            ),
            **methods(
                self.dialogs,
                "begin_dialog",
                "send",
                "end_conversation",
                "begin_conversation_timer",
                "move_conversation",
            ),
            **methods(self.receiving, "receive", "get_conversation_group"),
            **methods(
                self.transactions,
                "begin_transaction",
                "commit",
                "rollback",
                "save_transaction",
                "rollback_to_savepoint",
                "detach_transaction",
                "attach_transaction",
                "commit_transaction",
                "rollback_transaction",
                "transaction_outcome",
            ),
            **methods(self, "transaction_messages", "requeue_dead_letter", "broker_instance"),
            **self.databases.operations(),
            **self.tables.operations(),
        }

    def transaction_messages(self, session: Session, transaction_id: object) -> list[list[Any]]:
        """Operation: the rows a detached transaction received (leases; changes nothing)."""
        return self.receiving.rows(self.transactions.transaction_messages(session, transaction_id))

    def requeue_dead_letter(self, session: Session, queue: object, queuing_order: object) -> None:
        self.poison.requeue(queue, queuing_order)

    def broker_instance(self, session: Session) -> str:
        return self.instance_id
