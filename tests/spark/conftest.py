"""One local Spark session for the whole test run, and a broker tuned for activation.

Spark settings are SPARK-NOTES' test settings; executors import the test functions
from this directory (PYTHONPATH is set before the JVM starts, so workers inherit it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
ACTIVATION = {"notification_timeout": 1.0, "check_interval": 0.2, "empty_rowset_window": 0.5}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    paths = [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    from pyspark.sql import SparkSession

    from ssb import spark_bridge

    session = (
        SparkSession.builder.master("local[4]")
        .appName("ssb-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.python.task.killTimeout", "200ms")
        .config("spark.sql.streaming.stopTimeout", "20s")
        .config(map=spark_bridge.EXECUTOR_SETTINGS)  # as the bridge's command runs Spark
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_bridge.register(session)
    yield session
    session.stop()


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    """The Spark tests' broker: fast activation checks (durability os: tests are I/O bound)."""
    return {"durability": "os", "config": {"activation": ACTIVATION}}
