"""The "ssb" data source: broker queues as Spark batch and streaming sources, and a sink.

Theory of operation, streaming source. Each micro-batch is one *lease*: while Spark
plans the batch (`latestOffset`, in the query's planning process) the reader
RECEIVEs up to maxMessagesPerBatch messages in a detached broker transaction and
lets go of it; the messages stay leased (neither redelivered nor deleted). The
offset is {"lease": n, "txn": id, "pending": "n:id,..."}: the lease number, its
transaction, and earlier leases not yet known to be committed. The batch's one
partition names the transaction; the Spark task reads the leased messages with
`transaction_messages` (which changes nothing), so a re-run of the batch after a
failure or restart reads exactly the same rows in the same order.

A lease's transaction commits once Spark has committed its batch. Spark tells the
source late (`commit(end)` comes when the next batch is planned, and after stop() or
availableNow only when the query runs again), but it plans a new batch only after
the previous one is committed, so `latestOffset(start)` also commits every lease up
to `start` (and `commit(end)` every lease up to `end`). Both read the transaction
ids from the checkpointed offset itself, so a restarted query, in a fresh process,
commits leftover leases deterministically; a batch that Spark logged but did not
commit is re-run from its lease. A lease nobody commits within leaseTimeout (the
query never came back) rolls back and its messages are received again, in order:
at-least-once into Spark, exactly-once with a checkpointed, idempotent sink.

Sink. Each writer task sends its rows in a detached transaction (on the row's
conversation_handle when the row has one, else on a dialog it begins from
fromService to service, ended after the rows) and hands the transaction id to
Spark; `commit` commits every task's transaction when Spark commits the batch,
`abort` rolls them back. A reply to a message this source leased (a row with both
conversation_handle and the source's transaction_id column) cannot be sent from
another transaction: the lease holds its conversation group's lock. It is sent in
the lease itself, at `commit` (a lease that already has sends got them from an
earlier commit of the same batch), and commits with the RECEIVE when the source
commits the lease: Service Broker's receive-process-reply in one transaction. Re-running a batch after its commit must not send twice:
each (query, partition) keeps a marker message, the last batch it committed, in the
bridge's SinkState queue, received and re-sent in the same transaction as the rows,
so a task of a batch already committed sends nothing.

Batch reads (`spark.read.format("ssb")`) peek the queue without receiving.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ssb import client
from ssb.protocol import ErrorCode

log = logging.getLogger("ssb.spark_bridge")

FORMAT: Final = "ssb"
DEFAULT_BATCH: Final = 1000
HARD_BATCH: Final = 100_000  # even ReadAllAvailable takes at most this many per lease
DEFAULT_LEASE: Final = 600.0
STATE_PREFIX: Final = "spark-bridge"

SCHEMA: Final = StructType(
    [
        StructField("status", IntegerType()),
        StructField("priority", IntegerType()),
        StructField("queuing_order", LongType()),
        StructField("conversation_group_id", StringType()),
        StructField("conversation_handle", StringType()),
        StructField("message_sequence_number", LongType()),
        StructField("service_name", StringType()),
        StructField("service_contract_name", StringType()),
        StructField("message_type_name", StringType()),
        StructField("validation", StringType()),
        StructField("message_body", BinaryType()),
        StructField("message_enqueue_time", TimestampType()),
        StructField("delivery_count", IntegerType()),
        StructField("transaction_id", StringType()),  # the lease (streaming reads only)
    ]
)


def message_row(m: client.Message, lease: str | None = None) -> tuple[Any, ...]:
    """A received message as a row of SCHEMA (`lease`: the transaction holding it)."""
    return (
        m.status,
        m.priority,
        m.queuing_order,
        str(m.conversation_group_id),
        str(m.conversation_handle),
        m.message_sequence_number,
        m.service_name,
        m.service_contract_name,
        m.message_type_name,
        m.validation,
        bytes(m.message_body),
        m.message_enqueue_time,
        m.delivery_count,
        lease,
    )


def _option(options: dict[str, str], name: str, default: str | None = None) -> str:
    value = options.get(name, options.get(name.lower(), default))
    if value is None:
        raise ValueError(f'the ssb data source needs .option("{name}", ...)')
    return value


@dataclass(frozen=True, slots=True)
class _Settings:
    url: str
    queue: str | None
    max_batch: int
    lease_timeout: float
    service: str | None
    from_service: str | None
    contract: str
    message_type: str
    end_dialog: bool
    sink_name: str | None
    state_prefix: str

    @classmethod
    def parse(cls, options: dict[str, str]) -> _Settings:
        lowered = {k.lower(): v for k, v in options.items()}
        return cls(
            url=_option(lowered, "broker"),
            queue=lowered.get("queue"),
            max_batch=int(lowered.get("maxmessagesperbatch", DEFAULT_BATCH)),
            lease_timeout=float(lowered.get("leasetimeout", DEFAULT_LEASE)),
            service=lowered.get("service"),
            from_service=lowered.get("fromservice"),
            contract=lowered.get("contract", "DEFAULT"),
            message_type=lowered.get("messagetype", "DEFAULT"),
            end_dialog=lowered.get("enddialog", "true").lower() == "true",
            sink_name=lowered.get("sinkname"),
            state_prefix=lowered.get("stateprefix", STATE_PREFIX),
        )

    def need_queue(self) -> str:
        if not self.queue:
            raise ValueError('reading needs .option("queue", NAME)')
        return self.queue


class SsbDataSource(DataSource):
    """`format("ssb")`: read a queue (batch: peek; streaming: receive), write messages.

    Options: broker (URL, required); queue (reading); maxMessagesPerBatch (1000),
    leaseTimeout (600 s); service, fromService, contract, messageType, endDialog,
    sinkName (writing).
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return PeekReader(_Settings.parse(dict(self.options)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LeaseStreamReader(_Settings.parse(dict(self.options)))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return MessageWriter(_Settings.parse(dict(self.options)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return MessageStreamWriter(_Settings.parse(dict(self.options)))


# ---- batch read: peek ------------------------------------------------------------------


class PeekReader(DataSourceReader):
    """One partition: the queue's messages as they are, nothing received."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        with client.connect_sync(self.settings.url) as conn:
            for m in peek_all(conn, self.settings.need_queue()):
                yield message_row(m)


PEEK_PAGE: Final = 1000


def peek_all(conn: client.SyncConnection, queue: str) -> Iterator[client.Message]:
    """Every message of a queue, without receiving any, a page at a time (a page is also
    cut by bytes, so only an empty page ends the queue)."""
    after: int | None = None
    while True:
        page = conn.peek(queue, limit=PEEK_PAGE, after=after)
        if not page:
            return
        yield from page
        after = page[-1].queuing_order


# ---- streaming read: leases ------------------------------------------------------------


class LeasePartition(InputPartition):
    """The leased messages of one micro-batch: its detached transaction."""

    def __init__(self, txn: str) -> None:
        super().__init__(txn)
        self.txn = txn


def _leases(offset: dict[str, Any]) -> dict[int, str]:
    """Lease number -> transaction id, for every lease an offset names."""
    found: dict[int, str] = {}
    if offset.get("txn"):
        found[int(offset["lease"])] = str(offset["txn"])
    for item in str(offset.get("pending") or "").split(","):
        if item:
            number, _, txn = item.partition(":")
            found[int(number)] = txn
    return found


T = TypeVar("T")


def _unless_gone(call: Callable[[], T]) -> T | None:
    """`call()` on a lease's transaction, or None when that transaction no longer exists:
    committed before, rolled back, or expired (its messages went back to their queue)."""
    try:
        return call()
    except client.TransactionError as exc:
        if exc.code != ErrorCode.NO_TRANSACTION:
            raise
        return None


class LeaseStreamReader(DataSourceStreamReader):
    """Micro-batches of received messages, each held in a detached transaction."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings
        self.queue = settings.need_queue()
        self._conn: client.SyncConnection | None = None
        self._open: dict[int, str] = {}  # leases this process made, not yet committed
        self._committed: set[str] = set()

    def _connection(self) -> client.SyncConnection:
        if self._conn is None or self._conn.closed:
            self._conn = client.connect_sync(self.settings.url)
        return self._conn

    def initialOffset(self) -> dict[str, Any]:
        return {"lease": 0, "txn": "", "pending": ""}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.settings.max_batch)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Spark plans a batch only after the previous one committed: settle them
        self._settle(start)
        if isinstance(limit, ReadMaxRows):
            wanted = min(int(limit.max_rows), HARD_BATCH)
        elif isinstance(limit, ReadAllAvailable):
            wanted = HARD_BATCH
        else:
            wanted = self.settings.max_batch
        conn = self._connection()
        txn = conn.begin_transaction(detached=True, timeout=self.settings.lease_timeout)
        got = 0
        try:
            while got < wanted:
                messages = conn.receive(self.queue, top=wanted - got, timeout=0)
                if not messages:
                    break
                got += len(messages)
        except BaseException:
            with contextlib.suppress(client.BrokerError):
                conn.rollback(error="the stream reader failed while leasing a batch")
            raise
        if got == 0:
            conn.commit()  # nothing received: nothing to hold
            return start
        conn.detach_transaction()
        number = int(start["lease"]) + 1
        pending = {k: t for k, t in self._open.items() if k < number}
        self._open[number] = str(txn)
        return {
            "lease": number,
            "txn": str(txn),
            "pending": ",".join(f"{k}:{t}" for k, t in sorted(pending.items())),
        }

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first = int(start["lease"])
        return [
            LeasePartition(txn) for number, txn in sorted(_leases(end).items()) if number > first
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, LeasePartition)
        with client.connect_sync(self.settings.url) as conn:
            messages = _unless_gone(lambda: conn.transaction_messages(partition.txn))
            if messages is None:
                # the lease expired and rolled back: its messages are back in the queue
                # and a later batch receives them again
                log.warning("lease %s is gone; its messages return in a later batch", partition.txn)
                return
        for m in messages:
            yield message_row(m, partition.txn)

    def commit(self, end: dict[str, Any]) -> None:
        self._settle(end)

    def _settle(self, done: dict[str, Any]) -> None:
        """Commit every lease up to `done`'s."""
        upto = int(done["lease"])
        leases = _leases(done)
        leases.update({k: t for k, t in self._open.items() if k <= upto})
        if not leases:
            return
        conn = self._connection()
        for number, txn in sorted(leases.items()):
            if txn not in self._committed:
                _unless_gone(functools.partial(conn.commit_transaction, txn))
                self._committed.add(txn)
            self._open.pop(number, None)
        if len(self._committed) > 10_000:
            self._committed.clear()

    def stop(self) -> None:
        # leases stay open: the batch may not be committed; a restart settles them
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# ---- writing: rows as messages -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SentBatch(WriterCommitMessage):
    """One writer task's work: its detached transaction (None when it had nothing to do)."""

    txn: str | None
    rows: int
    skipped: bool = False
    # replies to leased messages: (lease, handle, message type, body), sent in the lease
    replies: tuple[tuple[str, str, str, bytes], ...] = ()


def _body(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


class _State:
    """The (sink, partition) -> last committed batch markers (see the module's docstring)."""

    def __init__(self, prefix: str) -> None:
        self.queue = f"{prefix}/SinkState"
        self.service = f"{prefix}/SinkStateService"

    def install(self, conn: client.SyncConnection) -> None:
        with contextlib.suppress(client.AlreadyExistsError):
            # a marker may be received and put back many times: not a poison message
            conn.create_queue(self.queue, poison_message_handling={"status": "OFF"})
        with contextlib.suppress(client.AlreadyExistsError):
            conn.create_service(self.service, queue=self.queue, contracts=["DEFAULT"])

    def claim(
        self, conn: client.SyncConnection, key: str, batch: int, wait: float
    ) -> tuple[uuid.UUID, bool]:
        """Inside the open transaction: take (key)'s marker. Returns the initiator handle
        to send the new marker on, and whether `batch` was committed already."""
        for m in peek_all(conn, self.queue):
            marker = json.loads(m.message_body)
            if marker.get("key") == key:
                got = conn.receive(
                    self.queue, conversation_handle=m.conversation_handle, timeout=wait
                )
                last = max((int(json.loads(g.message_body)["batch"]) for g in got), default=-1)
                return uuid.UUID(marker["initiator"]), last >= batch
        handle = conn.begin_dialog(self.service, self.service)
        return handle, False

    def mark(self, conn: client.SyncConnection, handle: uuid.UUID, key: str, batch: int) -> None:
        body = {"key": key, "batch": batch, "initiator": str(handle)}
        conn.send(handle, "DEFAULT", json.dumps(body))


def _send_rows(
    conn: client.SyncConnection,
    settings: _Settings,
    rows: Iterator[Any],
    replies: list[tuple[str, str, str, bytes]],
) -> int:
    """SEND every row in the open transaction, except replies to leased messages
    (rows with conversation_handle and transaction_id), which go to `replies`;
    returns how many rows were sent or kept."""
    dialog: uuid.UUID | None = None
    count = 0
    pending: list[bytes] = []
    pending_type: str | None = None

    def flush() -> None:
        nonlocal dialog, pending
        if not pending:
            return
        if dialog is None:
            if not settings.service or not settings.from_service:
                raise ValueError(
                    'rows without conversation_handle need .option("service", TO) and '
                    '.option("fromService", FROM)'
                )
            dialog = conn.begin_dialog(settings.from_service, settings.service, settings.contract)
        conn.send_many(dialog, pending_type or settings.message_type, pending)
        pending = []

    for row in rows:
        fields = row.asDict() if hasattr(row, "asDict") else dict(row)
        if "message_body" not in fields:
            raise ValueError("the ssb sink needs a message_body column (binary or string)")
        body = _body(fields["message_body"])
        message_type = fields.get("message_type_name") or settings.message_type
        handle = fields.get("conversation_handle")
        lease = fields.get("transaction_id")
        if handle and lease:
            # its conversation group is locked by the lease until the lease commits:
            # the reply goes into the lease, so it commits with the RECEIVE
            replies.append((str(lease), str(handle), message_type, body))
        elif handle:
            flush()
            conn.send(str(handle), message_type, body)
        else:
            if pending and message_type != pending_type:
                flush()
            pending_type = message_type
            pending.append(body)
        count += 1
    flush()
    if dialog is not None and settings.end_dialog:
        conn.end_conversation(dialog)
    return count


def _write(settings: _Settings, rows: Iterator[Any], streaming: bool) -> SentBatch:
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = sink = None
    partition = 0
    if context is not None:
        partition = context.partitionId()
        if streaming:
            raw = context.getLocalProperty("streaming.sql.batchId")
            batch = int(raw) if raw is not None else None
            sink = settings.sink_name or context.getLocalProperty("sql.streaming.queryId")
    with client.connect_sync(settings.url) as conn:
        state = _State(settings.state_prefix)
        if batch is not None and sink:
            state.install(conn)
        txn = conn.begin_transaction(detached=True, timeout=settings.lease_timeout)
        try:
            marker: uuid.UUID | None = None
            key = f"{sink}/{partition}"
            if batch is not None and sink:
                marker, done = state.claim(conn, key, batch, settings.lease_timeout)
                if done:  # a re-run of a batch this partition committed already
                    conn.rollback()
                    return SentBatch(None, 0, skipped=True)
            replies: list[tuple[str, str, str, bytes]] = []
            count = _send_rows(conn, settings, rows, replies)
            if marker is not None and batch is not None:
                state.mark(conn, marker, key, batch)
        except BaseException as exc:
            with contextlib.suppress(client.BrokerError):
                conn.rollback(error=f"{type(exc).__name__}: {exc}")
            raise
        conn.detach_transaction()
    return SentBatch(str(txn), count, replies=tuple(replies))


def _finish(
    settings: _Settings, messages: Sequence[WriterCommitMessage | None], commit: bool
) -> None:
    batches = [m for m in messages if isinstance(m, SentBatch)]
    txns = [m.txn for m in batches if m.txn]
    replies = [r for m in batches for r in m.replies]
    if not txns and not replies:
        return
    with client.connect_sync(settings.url) as conn:
        if commit and replies:
            _reply_in_leases(conn, replies)
        for txn in txns:
            if commit:
                conn.commit_transaction(txn)
            else:
                _unless_gone(
                    functools.partial(conn.rollback_transaction, txn, "Spark aborted the batch")
                )


def _reply_in_leases(
    conn: client.SyncConnection, replies: list[tuple[str, str, str, bytes]]
) -> None:
    """Send replies inside the leases of the messages they answer. A lease that has
    pending sends already got them from an earlier commit of this batch: skip it."""
    open_now = {str(r["transaction_id"]): r for r in conn.view("open_transactions")}
    by_lease: dict[str, list[tuple[str, str, bytes]]] = {}
    for lease, handle, message_type, body in replies:
        by_lease.setdefault(lease, []).append((handle, message_type, body))
    for lease, sends in by_lease.items():
        row = open_now.get(lease)
        if row is None:
            raise client.NotFoundError(
                f"lease {lease} is gone (expired?): its messages return to the queue and "
                "their replies are sent when they are read again",
            )
        if row["pending_actions"]:
            continue
        conn.attach_transaction(lease)
        try:
            for handle, message_type, body in sends:
                conn.send(handle, message_type, body)
        finally:
            conn.detach_transaction()


class MessageStreamWriter(DataSourceStreamWriter):
    """Rows as messages; the batch's sends commit when Spark commits the batch."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write(self.settings, iterator, streaming=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _finish(self.settings, messages, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _finish(self.settings, messages, commit=False)


class MessageWriter(DataSourceWriter):
    """`df.write.format("ssb")`: rows as messages, all committed when the job succeeds."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write(self.settings, iterator, streaming=False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _finish(self.settings, messages, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _finish(self.settings, messages, commit=False)


def register(spark: Any) -> None:
    """Register format "ssb" with a SparkSession (once per session is enough)."""
    spark.dataSource.register(SsbDataSource)
