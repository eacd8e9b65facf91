"""The "ssb" data source: Structured Streaming source and sink, batch peek."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon import BrokerProcess
from pyspark.errors import StreamingQueryException
from spark_setup import replies_to_load, send_load, work_queue

from ssb import client
from ssb.tools import wait_until_sync

pytestmark = pytest.mark.slow  # a local Spark session

QUERY_TIMEOUT = 60.0


def source(spark: Any, url: str, queue: str, **options: Any) -> Any:
    reader = spark.readStream.format("ssb").option("broker", url).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def user_messages(conn: client.SyncConnection, queue: str) -> list[bytes]:
    return [m.message_body for m in conn.peek(queue) if m.message_type_name == "DEFAULT"]


def start_copy(spark: Any, url: str, checkpoint: Path) -> Any:
    """In -> Spark -> OutService, 40 messages a micro-batch."""
    return (
        source(spark, url, "In", maxMessagesPerBatch=40, leaseTimeout=120)
        .selectExpr("message_body")
        .writeStream.format("ssb")
        .option("broker", url)
        .option("service", "InRepliesService")
        .option("fromService", "InReplyService")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


@contextlib.contextmanager
def running(query: Any) -> Iterator[Any]:
    """A started streaming query, stopped at the end; it must not have failed."""
    try:
        yield query
    finally:
        query.stop()
    assert query.exception() is None


def setup_copy(conn: client.SyncConnection) -> None:
    work_queue(conn, "In", readers=1)
    conn.create_service("InRepliesService", queue="InReplies", contracts=["DEFAULT"])


def test_stream_stopped_and_restarted_delivers_every_message_once_in_order(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    expected = [f"{c}:{i}".encode() for c in range(10) for i in range(50)]
    with client.connect_sync(broker.url) as conn:
        setup_copy(conn)
        send_load(conn, "In", conversations=10, per_conversation=50)
        with running(start_copy(spark, broker.url, checkpoint)):
            wait_until_sync(
                lambda: len(user_messages(conn, "InReplies")),
                "a few batches",
                QUERY_TIMEOUT,
                until=lambda n: n >= 80,
            )
        first_run = len(user_messages(conn, "InReplies"))
        assert first_run < 500, "the query finished before it was stopped: the test proves nothing"
        with running(start_copy(spark, broker.url, checkpoint)):
            out = wait_until_sync(
                lambda: user_messages(conn, "InReplies"),
                "all 500",
                QUERY_TIMEOUT,
                until=lambda rows: len(rows) >= 500,
            )
            # Spark committed the last batch: its lease commits when the next one is planned
            wait_until_sync(
                lambda: conn.peek("In"),
                "the source queue to empty",
                QUERY_TIMEOUT,
                until=lambda rows: not rows,
            )
        assert sorted(out) == sorted(expected), "every message exactly once"
        by_conversation: dict[bytes, list[int]] = defaultdict(list)
        for body in out:
            c, i = body.split(b":")
            by_conversation[c].append(int(i))
        assert all(order == sorted(order) for order in by_conversation.values()), "in order"
        # at most the last batch's lease is open (it settles when the query next runs)
        assert len(conn.view("open_transactions")) <= 1


def test_a_failed_batch_gets_its_messages_again(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    seen: dict[int, list[list[Any]]] = defaultdict(list)  # batch id -> each attempt's rows
    fail_once = {"armed": True}

    def sink(frame: Any, batch_id: int) -> None:
        rows = [(r.message_body, r.delivery_count) for r in frame.collect()]
        seen[batch_id].append(rows)
        if batch_id == 1 and fail_once["armed"]:
            fail_once["armed"] = False
            raise RuntimeError("the sink failed batch 1")

    def run() -> Any:
        return (
            source(spark, broker.url, "In", maxMessagesPerBatch=25, leaseTimeout=120)
            .select("message_body", "delivery_count")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    with client.connect_sync(broker.url) as conn:
        setup_copy(conn)
        send_load(conn, "In", conversations=2, per_conversation=50)
        query = run()
        try:
            with pytest.raises(StreamingQueryException, match="the sink failed batch 1"):
                query.awaitTermination(QUERY_TIMEOUT)
        finally:
            query.stop()
        assert len(seen[1]) == 1
        with running(run()):
            wait_until_sync(
                lambda: sum(len(a[-1]) for a in seen.values()),
                "all 100",
                QUERY_TIMEOUT,
                until=lambda n: n >= 100,
            )
        # batch 1 ran again with exactly the messages it had, in the same order
        assert len(seen[1]) == 2 and seen[1][0] == seen[1][1] and len(seen[1][0]) == 25
        committed = [body for batch in sorted(seen) for body, _ in seen[batch][-1]]
        assert sorted(committed) == sorted(f"{c}:{i}".encode() for c in range(2) for i in range(50))


def test_a_lease_nobody_commits_comes_back(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    got: list[bytes] = []

    def sink(frame: Any, batch_id: int) -> None:
        rows = [r.message_body for r in frame.collect()]
        got.extend(rows)
        if rows:
            # the batch fails after the sink saw it, so Spark never commits its lease (a
            # lease that expired before its task read it gives an empty batch, and the
            # messages come in a later one)
            raise RuntimeError("the sink fails after reading the batch")

    with client.connect_sync(broker.url) as conn:
        setup_copy(conn)
        send_load(conn, "In", conversations=1, per_conversation=5)
        query = (
            source(spark, broker.url, "In", leaseTimeout=2)
            .select("message_body")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "abandoned"))
            .start()
        )
        try:
            wait_until_sync(lambda: len(got), "the batch", QUERY_TIMEOUT, until=lambda n: n == 5)
            wait_until_sync(
                lambda: query.isActive, "the query to fail", QUERY_TIMEOUT, until=lambda a: not a
            )
        finally:
            query.stop()
        # the query never comes back to settle its lease: it expires, the messages return
        back = wait_until_sync(
            lambda: conn.peek("In"), "the lease to expire", 20, until=lambda rows: len(rows) == 5
        )
        assert [m.message_body for m in back] == [f"0:{i}".encode() for i in range(5)]


def test_batch_read_peeks_without_receiving(spark: Any, broker: BrokerProcess) -> None:
    with client.connect_sync(broker.url) as conn:
        setup_copy(conn)
        send_load(conn, "In", conversations=3, per_conversation=4)
        frame = spark.read.format("ssb").option("broker", broker.url).option("queue", "In").load()
        rows = frame.orderBy("queuing_order").collect()
        assert [r.message_body for r in rows] == [
            f"{c}:{i}".encode() for c in range(3) for i in range(4)
        ]
        assert rows[0].service_name == "InService" and rows[0].message_type_name == "DEFAULT"
        assert len(conn.peek("In")) == 12  # still there


def test_batch_write_sends_rows_as_messages(spark: Any, broker: BrokerProcess) -> None:
    with client.connect_sync(broker.url) as conn:
        setup_copy(conn)
        frame = spark.createDataFrame([(f"row {n}",) for n in range(20)], "message_body string")
        (
            frame.coalesce(1)
            .write.format("ssb")
            .option("broker", broker.url)
            .option("service", "InService")
            .option("fromService", "InReplyService")
            .mode("append")
            .save()
        )
        assert user_messages(conn, "In") == [f"row {n}".encode() for n in range(20)]


def test_replies_commit_with_the_lease_that_received_their_messages(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    with client.connect_sync(broker.url) as conn:
        setup_copy(conn)
        send_load(conn, "In", conversations=4, per_conversation=25)
        with running(
            source(spark, broker.url, "In", maxMessagesPerBatch=30)
            .selectExpr(
                "conversation_handle",
                "transaction_id",
                "concat(cast('done:' as binary), message_body) as message_body",
            )
            .writeStream.format("ssb")
            .option("broker", broker.url)
            .option("checkpointLocation", str(tmp_path / "replies"))
            .start()
        ):
            replies = wait_until_sync(
                lambda: user_messages(conn, "InReplies"),
                "100 replies",
                QUERY_TIMEOUT,
                until=lambda r: len(r) >= 100,
            )
        assert sorted(replies) == sorted(replies_to_load(4, 25))
        # a reply becomes visible only when its lease commits, and the lease's RECEIVE with it
        assert conn.peek("In") == []
