"""What a first activation does not wait for: PySpark's daemon with the reader imported,
and the bridge's warm-up job at start()."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from daemon import BrokerProcess
from spark_funcs import parent_command
from spark_setup import work_queue

from ssb import client
from ssb.spark_bridge import QueueBinding, SparkActivator

pytestmark = pytest.mark.slow  # a local Spark session


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_python_workers_are_forked_by_the_bridges_daemon(spark: Any) -> None:
    commands = spark.sparkContext.parallelize(range(2), 2).map(parent_command).collect()
    assert all("ssb.spark_bridge._daemon" in command for command in commands), commands


def test_start_warms_the_workers_up_and_names_a_function_they_cannot_import(
    spark: Any, broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    with client.connect_sync(broker.url) as conn:
        work_queue(conn, "Orders", readers=2)
    activator = SparkActivator(
        spark,
        broker.url,
        [
            QueueBinding("Orders", "spark_funcs:reply"),
            QueueBinding("OrdersReplies", "no_such_module_here:handle"),
        ],
    )
    with caplog.at_level(logging.WARNING, logger="ssb.spark_bridge"):
        activator.start()
    try:
        assert activator.warm_up_seconds is not None
        assert activator.jobs == []  # the warm-up is no job of readers
        problems = [r.getMessage() for r in caplog.records if "cannot import" in r.getMessage()]
        assert len(problems) == 1 and "no_such_module_here" in problems[0], problems
    finally:
        activator.stop(grace=5)
