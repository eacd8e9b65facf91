"""The Spark bridge: activated readers as Spark tasks, the seed-000 scheduler on Spark,
and the "ssb" data source (batch peek, Structured Streaming source and sink).

    from ssb.spark_bridge import SparkActivator
    SparkActivator(spark, "ssb://admin:pw@127.0.0.1:4021",
                   {"Orders": "myjobs.orders:process"}).serve()

    spark_bridge.register(spark)        # format("ssb") for read, readStream, writeStream

Needs pyspark (>= 4.2) and pyarrow: `pip install -e '.[spark]'` from the clone.
"""

from __future__ import annotations

from ._activator import JobRecord, SparkActivator, StopReport, event_queue
from ._cli import DEFAULT_SPARK_SETTINGS, main
from ._reader import (
    EXECUTOR_SETTINGS,
    QueueBinding,
    ReaderReport,
    ReaderSpec,
    TaskInfo,
    run_reader,
)
from ._scheduler import (
    get_spark_scheduler,
    get_spark_scheduler_async,
    install_spark_scheduler,
    spark_scheduler_binding,
)
from ._source import (
    SCHEMA,
    LeaseStreamReader,
    MessageStreamWriter,
    MessageWriter,
    PeekReader,
    SsbDataSource,
    register,
)

__all__ = [
    "DEFAULT_SPARK_SETTINGS",
    "EXECUTOR_SETTINGS",
    "SCHEMA",
    "JobRecord",
    "LeaseStreamReader",
    "MessageStreamWriter",
    "MessageWriter",
    "PeekReader",
    "QueueBinding",
    "ReaderReport",
    "ReaderSpec",
    "SparkActivator",
    "SsbDataSource",
    "StopReport",
    "TaskInfo",
    "event_queue",
    "get_spark_scheduler",
    "get_spark_scheduler_async",
    "install_spark_scheduler",
    "main",
    "register",
    "run_reader",
    "spark_scheduler_binding",
]
