"""Activated readers as Spark tasks, against a real daemon and a real local Spark master."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from daemon import BrokerProcess
from spark_setup import (
    ReaderWatch,
    activated,
    collect_replies,
    one_body_replaced,
    replies_to_load,
    send_load,
    work_queue,
)

from ssb import client
from ssb.spark_bridge import QueueBinding, SparkActivator
from ssb.tools import wait_until_sync

pytestmark = pytest.mark.slow  # a local Spark session


def tasks_of(conn: client.SyncConnection, queue: str) -> list[dict[str, Any]]:
    return [t for t in conn.view("activated_tasks") if t["queue"] == queue]


def test_thousand_messages_each_processed_once_within_the_reader_cap(
    spark: Any, broker: BrokerProcess
) -> None:
    with client.connect_sync(broker.url) as conn:
        work_queue(conn, "Orders", readers=3)
        with (
            ReaderWatch(broker.url, "Orders") as watch,
            activated(
                spark, broker.url, "Orders", "spark_funcs:brisk_reply", batch_size=10
            ) as activator,
        ):
            send_load(conn, "Orders", conversations=50, per_conversation=20)
            seen = collect_replies(conn, "Orders", 1000, timeout=90)
            # readers exit once the queue stays empty: none left, from the broker's side
            wait_until_sync(
                lambda: tasks_of(conn, "Orders"),
                "idle readers to exit",
                20,
                until=lambda rows: not rows,
            )
            assert activator.wait_idle(20)
        assert seen == replies_to_load(50, 20)
        assert conn.receive("OrdersReplies", timeout=0) == []  # nothing twice
        assert watch.samples > 10
        assert 1 <= watch.most <= 3, f"{watch.most} readers at once; MAX_QUEUE_READERS = 3"
        # they were Spark tasks: each external task carried its Spark job and task ids
        assert watch.tasks
        for row in watch.tasks.values():
            assert row["kind"] == "EXTERNAL" and row["activator"] == activator.activator_id
            assert row["job"].startswith(activator.activator_id)
            assert row["job_task_id"] is not None and row["executor"]
        assert any(row["job_id"] is not None for row in watch.tasks.values())
        reports = [r for job in activator.jobs for r in job.reports]
        assert sum(r["processed"] for r in reports) == 1000
        assert not [r for r in reports if r["error"]]


def test_registration_beyond_max_queue_readers_is_refused(broker: BrokerProcess) -> None:
    with client.connect_sync(broker.url) as conn:
        conn.create_queue("Capped", activation={"status": "OFF", "max_queue_readers": 2})
        readers = [client.connect_sync(broker.url) for _ in range(3)]
        try:
            for r in readers[:2]:
                r.register_task("Capped", "test", job="j1")
            with pytest.raises(client.InUseError, match="MAX_QUEUE_READERS = 2"):
                readers[2].register_task("Capped", "test", job="j1")
            assert len(tasks_of(conn, "Capped")) == 2
            readers[0].end_task()
            readers[1].close()  # a dropped reader frees its place too
            wait_until_sync(
                lambda: tasks_of(conn, "Capped"), "places to free", 10, until=lambda rows: not rows
            )
            readers[2].register_task("Capped", "test", job="j1")
            # a stop request: a RECEIVE blocked waiting returns at once, later ones too
            got: list[Any] = []
            waiting = threading.Thread(
                target=lambda: got.append(readers[2].receive("Capped", timeout=30))
            )
            waiting.start()
            wait_until_sync(
                lambda: tasks_of(conn, "Capped"),
                "the wait",
                10,
                until=lambda rows: rows[0]["state"] == "WAITING",
            )
            assert conn.request_stop("Capped") == 1
            waiting.join(timeout=5)
            assert got == [[]]
            assert readers[2].receive("Capped", timeout=30) == []
        finally:
            for r in readers:
                r.close()


def test_a_failing_message_rolls_back_and_the_others_are_processed(
    spark: Any, broker: BrokerProcess
) -> None:
    with client.connect_sync(broker.url) as conn:
        work_queue(conn, "Flaky", readers=2)
        with activated(spark, broker.url, "Flaky", "spark_funcs:flaky") as activator:
            send_load(conn, "Flaky", 5, 10, body=one_body_replaced((2, 3), b"bad"))
            seen = collect_replies(conn, "Flaky", 50, timeout=60)
            assert activator.wait_idle(20)
        assert seen == {**replies_to_load(5, 10, but=(2, 3)), b"done:bad": 1}
        reports = [r for job in activator.jobs for r in job.reports]
        assert sum(r["rolled_back"] for r in reports) == 1
        assert not [r for r in reports if r["error"]]  # the reader survived its function's error
        queue = next(q for q in conn.view("service_queues") if q["name"] == "Flaky")
        assert queue["is_receive_enabled"]


def test_poison_message_ends_in_the_dead_letter_queue(spark: Any, broker: BrokerProcess) -> None:
    with client.connect_sync(broker.url) as conn:
        conn.create_queue("DLQ")
        policy = {"threshold": 3, "action": "dead_letter", "dead_letter_queue": "DLQ"}
        work_queue(conn, "Risky", readers=2, poison_policy=policy)
        with activated(spark, broker.url, "Risky", "spark_funcs:poison") as activator:
            send_load(conn, "Risky", 4, 10, body=one_body_replaced((1, 5), b"poison"))
            seen = collect_replies(conn, "Risky", 39, timeout=60)
            dead = wait_until_sync(
                lambda: conn.peek("DLQ"), "the dead letter", 30, until=lambda rows: len(rows) == 1
            )
            assert activator.wait_idle(20)
        assert seen == replies_to_load(4, 10, but=(1, 5))
        assert dead[0].message_body == b"poison"
        assert "cannot process poison" in (dead[0].dead_letter_reason or "")
        incidents = conn.view("poison_messages")
        assert [i["action"] for i in incidents] == ["dead_letter"]
        assert conn.peek("Risky") == []


def test_bridge_shutdown_mid_load_loses_nothing(spark: Any, broker: BrokerProcess) -> None:
    with client.connect_sync(broker.url) as conn:
        work_queue(conn, "Busy", readers=4)
        activator = SparkActivator(
            spark,
            broker.url,
            [QueueBinding("Busy", "spark_funcs:slow_reply", batch_size=5, idle_timeout=1.0)],
        )
        activator.start()
        send_load(conn, "Busy", 20, 30)  # 600 messages, ~20 ms each: several seconds of work
        wait_until_sync(
            lambda: sum(1 for _ in conn.peek("BusyReplies")),
            "processing to be under way",
            60,
            until=lambda n: n >= 50,
        )
        report = activator.stop(grace=1.0)
        assert report.readers_asked >= 1
        wait_until_sync(
            lambda: tasks_of(conn, "Busy"), "every reader to end", 20, until=lambda rows: not rows
        )
        wait_until_sync(
            lambda: conn.view("open_transactions"),
            "no open transaction",
            10,
            until=lambda rows: not rows,
        )
        # every message was either processed (its reply committed) or is back in the queue
        replies = [m.message_body for m in conn.peek("BusyReplies")]
        left = [m.message_body for m in conn.peek("Busy")]
        assert len(replies) == len(set(replies))
        done = {r.removeprefix(b"done:") for r in replies}
        assert done.isdisjoint(left)
        assert done | set(left) == {f"{c}:{i}".encode() for c in range(20) for i in range(30)}
        assert left, "the bridge stopped after the whole load: the test proves nothing"
        # what is left is picked up by the next bridge: nothing was lost
        second = SparkActivator(
            spark,
            broker.url,
            [QueueBinding("Busy", "spark_funcs:reply", batch_size=50, idle_timeout=1.0)],
        )
        second.start()
        try:
            every = collect_replies(conn, "Busy", 600, timeout=60)
        finally:
            second.stop(grace=5)
        assert every == replies_to_load(20, 30)


def test_a_reader_that_does_not_stop_is_cancelled_and_its_message_returns(
    spark: Any, broker: BrokerProcess
) -> None:
    with client.connect_sync(broker.url) as conn:
        work_queue(conn, "Stuck", readers=1)
        activator = SparkActivator(
            spark, broker.url, [QueueBinding("Stuck", "spark_funcs:stuck", batch_size=1)]
        )
        activator.start()
        send_load(conn, "Stuck", 1, 1)
        wait_until_sync(
            lambda: tasks_of(conn, "Stuck"),
            "the reader to hold the message",
            30,
            until=lambda rows: rows and rows[0]["conversation_group_id"],
        )
        report = activator.stop(grace=0.5)
        assert report.jobs_cancelled == 1
        # the killed task's connection dropped: its transaction rolled back
        back = wait_until_sync(
            lambda: conn.peek("Stuck"),
            "the message to return",
            20,
            until=lambda rows: len(rows) == 1,
        )
        assert back[0].message_body == b"0:0"
        assert conn.peek("StuckReplies") == []
        wait_until_sync(
            lambda: tasks_of(conn, "Stuck"), "the task to end", 20, until=lambda rows: not rows
        )
