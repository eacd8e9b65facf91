"""The seed-000 scheduler with its tasks run as Spark tasks."""

from __future__ import annotations

from typing import Any

import pytest
from daemon import BrokerProcess

from ssb import client
from ssb.spark_bridge import SparkActivator, get_spark_scheduler
from ssb.tools import wait_until_sync

pytestmark = pytest.mark.slow  # a local Spark session


def test_scheduler_tasks_run_on_spark_executors(spark: Any, broker: BrokerProcess) -> None:
    with client.connect_sync(broker.url) as conn:
        scheduler = get_spark_scheduler(conn, "Jobs", max_queue_readers=2)
        queue = next(q for q in conn.view("service_queues") if q["name"] == "Jobs/TargetQueue")
        assert not queue["is_activation_enabled"] and queue["max_readers"] == 2
        activator = SparkActivator(spark, broker.url)
        activator.add_scheduler("Jobs")
        activator.start()
        try:
            with scheduler:
                ids = [scheduler.exec_async("spark_funcs:add", n, 10) for n in range(4)]
                first = scheduler.synchronize(timeout=60)
                failing = scheduler.exec_async("operator:truediv", 1, 0)
                second = scheduler.synchronize(timeout=60)
        finally:
            activator.stop(grace=2)
        assert sorted((o.log_id, o.ok, o.result) for o in first) == [
            (log_id, True, n + 10) for n, log_id in enumerate(ids)
        ]
        assert [(o.log_id, o.ok) for o in second] == [(failing, False)]
        assert "ZeroDivisionError" in (second[0].error or "")
        log = {row["log_id"]: row for row in conn.view("execution_log")}
        for log_id in [*ids, failing]:
            row = log[log_id]
            assert row["status"] == ("FAILED" if log_id == failing else "DONE")
            # the execution log names the executor and the Spark task that ran it
            assert row["executor"] and row["job_task_id"] is not None
            assert row["job"].startswith(activator.activator_id)
            assert row["activated_task"] is not None
        wait_until_sync(
            lambda: [t for t in conn.view("activated_tasks") if t["queue"] == "Jobs/TargetQueue"],
            "the scheduler's readers to end",
            20,
            until=lambda rows: not rows,
        )
