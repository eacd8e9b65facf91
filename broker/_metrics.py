"""Prometheus metrics: what a running broker holds and does, read when it is scraped.

Theory of operation. Nearly every figure is read at scrape time from state the parts
keep anyway (a custom collector): queue depths and bytes, the counts since start that
queues keep as plain integers (enqueued, received, put back by a rollback), readers
waiting, activated tasks, the transmission queue by destination, broker links,
sessions and transactions. The hot paths pay nothing for them. Only the store's
commits are observed as they happen, once per group commit (not per message): their
size in rows and their duration, as histograms. `ssb_daemon_role` says whether the
daemon is the one serving ("active"), waiting ("standby") or stopping; with a
PostgreSQL store `ssb_lease_age_seconds` says how long ago it last renewed the broker's
lease (an active daemon's; see `_lease`), and a standby's /metrics has only these.

The registry is the broker's own (not the library's process-wide default), so two
brokers in one process, as in tests, never mix their figures. The text format is
`prometheus_client`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ._core.backlog import MessageCache
from ._core.capacity import Capacity
from ._core.delivery import Delivery
from ._core.names import display
from ._core.queues import Queue
from ._core.transactions import Transactions
from ._store import Store, StoreError

if TYPE_CHECKING:
    from ._lease import LeaseKeeper

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
COMMIT_ROWS_BUCKETS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
COMMIT_SECONDS_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


# (kind, name, help, how to read it from a Queue; None: computed by the collector)
QUEUE_FIGURES: Final[tuple[tuple[str, str, str, Callable[[Queue], float] | None], ...]] = (
    (
        "gauge",
        "ssb_queue_messages",
        "Messages stored in the queue (ready, received, retained)",
        lambda q: q.messages,
    ),
    ("gauge", "ssb_queue_messages_ready", "Messages a RECEIVE could take", lambda q: q.ready),
    ("gauge", "ssb_queue_bytes", "Bytes of message bodies stored in the queue", lambda q: q.bytes),
    (
        "gauge",
        "ssb_queue_messages_held",
        "Transmission-queue messages waiting for this queue (it is off or full)",
        lambda q: q.held,
    ),
    (
        "gauge",
        "ssb_queue_oldest_message_age_seconds",
        "Age of the oldest message a RECEIVE could take (0: none)",
        None,
    ),
    ("gauge", "ssb_queue_readers_waiting", "Sessions waiting in RECEIVE", lambda q: len(q.waiters)),
    ("gauge", "ssb_queue_activated_tasks", "Activated readers running", None),
    (
        "gauge",
        "ssb_queue_enabled",
        "1 when the queue is ON, 0 when off or disabled",
        lambda q: 1 if q.definition.status else 0,
    ),
    (
        "counter",
        "ssb_queue_enqueued",
        "Messages put into the queue since start",
        lambda q: q.enqueued,
    ),
    (
        "counter",
        "ssb_queue_received",
        "Messages received by committed transactions since start",
        lambda q: q.received,
    ),
    (
        "counter",
        "ssb_queue_rolled_back",
        "Received messages put back by a rollback since start",
        lambda q: q.rolled_back,
    ),
)


ROLES: Final = ("active", "standby", "stopping")


def role_figures(keeper: LeaseKeeper | None) -> Iterator[Metric]:
    """The daemon's role (one gauge per role, 1 for its own) and its lease's age."""
    from ._lease import Role

    if keeper is None:
        role = "active"
    elif keeper.role is Role.STANDBY:
        role = "standby"
    else:
        role = "active" if keeper.held() else "stopping"
    family = GaugeMetricFamily(
        "ssb_daemon_role",
        "1 for this daemon's role: active (it serves the broker), standby (it waits to"
        " take over) or stopping",
        labels=["role"],
    )
    for name in ROLES:
        family.add_metric([name], 1 if name == role else 0)
    yield family
    if keeper is not None:
        age = keeper.lease_age()
        yield GaugeMetricFamily(
            "ssb_lease_age_seconds",
            "Seconds since this daemon last took or renewed the broker's lease (-1: it"
            " does not hold it)",
            value=-1.0 if age is None else age,
        )
        yield GaugeMetricFamily(
            "ssb_lease_epoch",
            "The epoch of the lease this daemon holds (0: none); each takeover adds one",
            value=keeper.epoch if keeper.role is not Role.STANDBY else 0,
        )


class _Task(Protocol):
    """An activated task, as metrics count them."""

    queue: str


class BrokerCollector(Collector):
    """Reads the broker's state into metric families on each scrape."""

    def __init__(
        self,
        *,
        queues: Mapping[str, Queue],
        delivery: Delivery,
        transactions: Transactions,
        capacity: Capacity,
        cache: MessageCache,
        store: Store,
        sessions: Collection[object],
        transport: Any = None,
        tasks: Mapping[int, _Task] | None = None,
        keeper: LeaseKeeper | None = None,
    ) -> None:
        """What a scrape reads: the core's parts, the store, the client connections
        (`sessions`), the transport (its links and peers), the activated tasks and the
        broker's lease (`keeper`, with a PostgreSQL store)."""
        self.queues = queues
        self.delivery = delivery
        self.transactions = transactions
        self.capacity = capacity
        self.cache = cache
        self.store = store
        self.sessions = sessions
        self.transport = transport
        self.tasks: Mapping[int, _Task] = {} if tasks is None else tasks
        self.keeper = keeper

    def collect(self) -> Iterator[Metric]:
        yield from self._queues()
        yield from self._transmission()
        yield from self._links()
        yield from self._forwarding()
        yield from self._broker()
        yield from role_figures(self.keeper)

    def _queues(self) -> Iterator[Metric]:
        tasks: dict[str, int] = {}
        for task in self.tasks.values():
            tasks[task.queue] = tasks.get(task.queue, 0) + 1
        now = time.time()
        computed: dict[str, Callable[[Queue], float]] = {
            "ssb_queue_oldest_message_age_seconds": lambda q: self._oldest_age(q, now),
            "ssb_queue_activated_tasks": lambda q: tasks.get(q.name, 0),
        }
        queues = list(self.queues.values())
        for kind, name, text, read in QUEUE_FIGURES:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, text, labels=["queue"]
            )
            value = read or computed[name]
            for queue in queues:
                family.add_metric([display(queue.name)], value(queue))
            yield family

    def _oldest_age(self, queue: Queue, now: float) -> float:
        """Seconds since the oldest ready message of an unlocked group was enqueued: the
        groups' keys hold their first message's queuing order (one pass over the
        groups with ready messages, none over messages)."""
        oldest: int | None = None
        for group in queue.groups.values():
            key = group.heap_key
            if key is not None and (oldest is None or key[1] < oldest):
                oldest = key[1]
        if oldest is None:
            return 0.0
        try:
            enqueued = self.store.message_enqueue_time(oldest)
        except StoreError:  # a store in trouble: the scrape still answers
            return 0.0
        return 0.0 if enqueued is None else max(0.0, now - enqueued)

    def _transmission(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "ssb_transmission_queue_messages",
            "Messages in the transmission queue, by destination broker ('local': this one)",
            labels=["destination"],
        )
        counts: dict[str, int] = {}
        for box in list(self.delivery.outboxes.values()):
            where = "local" if box.local else str(box.to_broker_instance or "unrouted")
            counts[where] = counts.get(where, 0) + box.count
        for where, count in sorted(counts.items()):
            depth.add_metric([where], count)
        yield depth
        retries = CounterMetricFamily(
            "ssb_transmission_retransmissions",
            "Fragments sent again to a broker (no acknowledgement in time)",
            labels=["peer"],
        )
        if self.transport is not None:
            for peer in list(self.transport.peers.values()):
                retries.add_metric([str(peer.instance)], peer.dialog.counters.retransmissions)
        yield retries

    def _links(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "ssb_link_up",
            "1 for each broker link that is up (handshake done), by peer and direction",
            labels=["peer", "direction"],
        )
        known = GaugeMetricFamily(
            "ssb_peer_connected", "1 when a known broker has a link up, else 0", labels=["peer"]
        )
        if self.transport is not None:
            for row in self.transport.connections_view():
                if row["state"] == "ESTABLISHED" and row["peer"] is not None and not row["via"]:
                    up.add_metric([row["peer"], row["direction"]], 1)
            for peer in list(self.transport.peers.values()):
                connected = peer.link is not None and not peer.link.closed
                known.add_metric([str(peer.instance)], 1 if connected else 0)
        yield up
        yield known

    def _forwarding(self) -> Iterator[Metric]:
        """What this broker relays for others (all zero unless forwarding is on)."""
        forwarder = None if self.transport is None else self.transport.forwarder
        totals = {} if forwarder is None else forwarder.totals()
        yield GaugeMetricFamily(
            "ssb_forwarded_conversations",
            "Conversations this broker relays for others",
            value=totals.get("relayed_conversations", 0),
        )
        yield GaugeMetricFamily(
            "ssb_forward_held_bytes",
            "Bytes of relayed frames held for next hops that cannot take them yet",
            value=totals.get("held_bytes", 0),
        )
        for name, key, text in (
            ("ssb_forward_relayed_frames", "relayed_frames", "Frames relayed to a next hop"),
            ("ssb_forward_refused_frames", "refused_frames", "Frames refused past forward_size"),
            ("ssb_forward_loops", "loops", "Frames dropped because the routes form a loop"),
            (
                "ssb_forward_unbundled",
                "unbundled",
                "Bundles dropped because their next hop takes no relayed bundles (older)",
            ),
        ):
            yield CounterMetricFamily(name, text, value=totals.get(key, 0))

    def _broker(self) -> Iterator[Metric]:
        transactions = self.transactions
        yield GaugeMetricFamily(
            "ssb_sessions", "Client sessions logged in", value=len(transactions.sessions)
        )
        yield GaugeMetricFamily(
            "ssb_client_connections", "Client connections open", value=len(self.sessions)
        )
        open_txns = sum(1 for s in list(transactions.sessions.values()) if s.txn is not None)
        yield GaugeMetricFamily(
            "ssb_transactions_open",
            "Transactions open (in sessions, and detached)",
            value=open_txns + len(transactions.detached),
        )
        yield GaugeMetricFamily(
            "ssb_transactions_detached",
            "Detached transactions open",
            value=len(transactions.detached),
        )
        yield GaugeMetricFamily(
            "ssb_refusing_messages",
            "1 while new messages are refused (low disk space or the store cannot write)",
            value=1 if self.capacity.refusal else 0,
        )
        refused = CounterMetricFamily(
            "ssb_refused_for_room",
            "Statements and commits refused for want of room: disk (low free space, or the"
            " store cannot write) or a queue's quota",
            labels=["reason"],
        )
        refused.add_metric(["disk"], self.capacity.refusals)
        refused.add_metric(["quota"], self.capacity.quota_refusals)
        yield refused
        yield GaugeMetricFamily(
            "ssb_message_cache_bytes", "Message bodies held in memory", value=self.cache.resident
        )
        yield GaugeMetricFamily(
            "ssb_store_durable_batch",
            "Number of the newest store batch on disk",
            value=self.store.durable,
        )


class CommitHistograms:
    """The store's commits as they happen: rows and seconds of each group commit. Made
    before the store is attached, which tells it of every commit (`observe`)."""

    def __init__(self) -> None:
        self.rows = Histogram(
            "ssb_store_commit_rows",
            "Rows written by one group commit",
            buckets=COMMIT_ROWS_BUCKETS,
            registry=None,
        )
        self.seconds = Histogram(
            "ssb_store_commit_seconds",
            "Duration of one group commit (write and, with durability fsync, the fsync)",
            buckets=COMMIT_SECONDS_BUCKETS,
            registry=None,
        )

    def observe(self, rows: int, seconds: float) -> None:
        self.rows.observe(rows)
        self.seconds.observe(seconds)


class StandbyMetrics:
    """A standby's registry: its role and lease figures only."""

    def __init__(self, collector: Collector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Metrics:
    """The broker's registry: the collector plus the commit histograms."""

    def __init__(self, collector: BrokerCollector, commits: CommitHistograms) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.registry.register(commits.rows)
        self.registry.register(commits.seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
