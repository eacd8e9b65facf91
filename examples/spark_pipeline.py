"""10,000 messages through Spark and back: the Spark bridge end to end.

A shop sends 10,000 orders (1 KiB bodies, 100 conversations) to OrderService. Spark
reads them, prices each order, and answers on the order's own conversation, so the
answers arrive in the shop's reply queue, each exactly once:

    python examples/spark_pipeline.py                  # Structured Streaming (default)
    python examples/spark_pipeline.py --mode activate  # Spark-activated readers
    python examples/spark_pipeline.py --url "$SSB_URL"

`--mode stream` runs `readStream.format("ssb")` -> a DataFrame transformation ->
`writeStream.format("ssb")`; each micro-batch's messages stay leased until Spark
commits the batch. `--mode activate` runs a SparkActivator whose readers call
`price(message, conn)` in Spark tasks. Without --url the example starts a private
broker. Needs the Spark extra installed from the clone (`pip install -e '.[spark]'`:
pyspark, pyarrow) and Java 17 or 21.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ssb import client
from ssb.tools import BrokerProcess

HERE = Path(__file__).resolve().parent
ORDERS = 10_000
CONVERSATIONS = 100


def price(message: client.Message, conn: client.SyncConnection) -> None:
    """The activated reader's function: answer an order with its price."""
    order = json.loads(message.message_body)
    answer = {"order": order["order"], "price": round(order["quantity"] * 9.99, 2)}
    conn.send(message.conversation_handle, "DEFAULT", json.dumps(answer))


@contextlib.contextmanager
def private_broker() -> Iterator[str]:
    """A throwaway daemon on a free port."""
    with tempfile.TemporaryDirectory(prefix="ssb-spark-") as tmp:
        broker = BrokerProcess(
            Path(tmp) / "data", durability="os", extra_args=["--log-level", "WARNING"]
        )
        with broker:
            yield broker.url  # admin, with the password the start wrote


def setup(conn: client.SyncConnection) -> None:
    conn.create_queue("Orders", activation={"status": "OFF", "max_queue_readers": 4})
    conn.create_service("OrderService", queue="Orders", contracts=["DEFAULT"])
    conn.create_queue("ShopReplies")
    conn.create_service("ShopService", queue="ShopReplies")


def send_orders(conn: client.SyncConnection) -> None:
    pad = "x" * 960  # ~1 KiB bodies
    per = ORDERS // CONVERSATIONS
    with conn.transaction():
        for c in range(CONVERSATIONS):
            handle = conn.begin_dialog("ShopService", "OrderService")
            bodies = [
                json.dumps({"order": c * per + i, "quantity": i % 7 + 1, "note": pad})
                for i in range(per)
            ]
            conn.send_many(handle, "DEFAULT", bodies)


def collect(conn: client.SyncConnection, timeout: float) -> dict[int, float]:
    prices: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(prices) < ORDERS and time.monotonic() < deadline:
        for m in conn.receive("ShopReplies", top=1000, timeout=1.0):
            if m.message_type_name == "DEFAULT":
                answer = json.loads(m.message_body)
                if answer["order"] in prices:
                    raise SystemExit(f"order {answer['order']} answered twice")
                prices[answer["order"]] = answer["price"]
    return prices


def spark_session() -> object:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # executors import price() from this directory in --mode activate
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    from pyspark.sql import SparkSession

    print("starting a Spark session (master local[4]) ...", flush=True)
    began = time.monotonic()
    spark = (
        SparkSession.builder.master("local[4]")
        .appName("ssb spark_pipeline")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.scheduler.mode", "FAIR")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print(f"Spark session ready in {time.monotonic() - began:.1f} s", flush=True)
    return spark


def run_stream(spark: object, url: str, checkpoint: str) -> object:
    from ssb import spark_bridge

    spark_bridge.register(spark)
    orders = (
        spark.readStream.format("ssb")  # type: ignore[attr-defined]
        .option("broker", url)
        .option("queue", "Orders")
        .option("maxMessagesPerBatch", 2000)
        .load()
    )
    # conversation_handle + transaction_id: each answer is sent on its order's
    # conversation inside the lease that received the order, committing with it
    answers = orders.selectExpr(
        "conversation_handle",
        "transaction_id",
        "to_json(named_struct('order', get_json_object(cast(message_body as string), '$.order')"
        " :: int, 'price', round(get_json_object(cast(message_body as string), '$.quantity')"
        " * 9.99, 2))) as message_body",
    )
    return (
        answers.writeStream.format("ssb")
        .option("broker", url)
        .option("checkpointLocation", checkpoint)
        .start()
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an existing broker (default: start a private one)")
    parser.add_argument("--mode", choices=("stream", "activate"), default="stream")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(private_broker())
        conn = stack.enter_context(client.connect_sync(url))
        setup(conn)
        spark = spark_session()
        stack.callback(spark.stop)  # type: ignore[attr-defined]
        began = time.monotonic()
        send_orders(conn)
        print(f"sent {ORDERS} orders in {time.monotonic() - began:.1f} s")
        began = time.monotonic()
        if args.mode == "stream":
            query = run_stream(spark, url, stack.enter_context(tempfile.TemporaryDirectory()))
            stack.callback(query.stop)  # type: ignore[attr-defined]
        else:
            from ssb.spark_bridge import QueueBinding, SparkActivator

            activator = SparkActivator(spark, url, [QueueBinding("Orders", "spark_pipeline:price")])  # type: ignore[arg-type]
            activator.start()
            stack.callback(activator.stop)
        prices = collect(conn, timeout=300)
        seconds = time.monotonic() - began
        print(
            f"{len(prices)} answers in ShopReplies in {seconds:.1f} s ({len(prices) / seconds:,.0f} msgs/s), "
            f"each exactly once; order 42 costs {prices.get(42)}"
        )
        return 0 if len(prices) == ORDERS else 1


if __name__ == "__main__":
    sys.exit(main())
