"""A producer or consumer process for crash tests: logs what the broker acknowledged.

    python load_client.py producer URL LOG HANDLE_FILE
    python load_client.py consumer URL LOG QUEUE

The producer sends batches of bodies "b<batch>:<i>" and, after each acknowledged
send, appends the batch's bodies to LOG. The consumer receives in transactions and
appends "pending <body>" before COMMIT and "commit" after it is acknowledged. Both
stop when the connection is lost, or after a bounded count and time.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ssb import client

MAX_BATCHES = 2000
MAX_SECONDS = 60.0
BATCH = 20


async def producer(url: str, log_path: str, handle_file: str) -> None:
    handles = [uuid.UUID(line) for line in Path(handle_file).read_text().split()]
    conn = await client.connect(url, reconnect=False)  # a kill ends it
    deadline = time.monotonic() + MAX_SECONDS
    with open(log_path, "a", buffering=1) as log:
        for batch in range(MAX_BATCHES):
            if time.monotonic() > deadline:
                break
            bodies = [f"b{batch}:{i}" for i in range(BATCH)]
            try:
                await conn.send_many(handles[batch % len(handles)], "AsyncSent", bodies)
            except client.BrokerError:
                break
            log.write("\n".join(bodies) + "\n")


async def consumer(url: str, log_path: str, queue: str) -> None:
    conn = await client.connect(url, reconnect=False)  # a kill ends it
    deadline = time.monotonic() + MAX_SECONDS
    with open(log_path, "a", buffering=1) as log:
        while time.monotonic() < deadline:
            try:
                await conn.begin_transaction()
                msgs = await conn.receive(queue, top=15, timeout=1.0)
                for m in msgs:
                    log.write(f"pending {m.message_body.decode()}\n")
                await conn.commit()
            except client.BrokerError:
                break
            log.write("commit\n")


if __name__ == "__main__":
    role, url, log_path, extra = sys.argv[1:5]
    asyncio.run((producer if role == "producer" else consumer)(url, log_path, extra))
