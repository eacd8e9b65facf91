"""NATS JetStream as bench.peers' peer: Debian's nats-server, a child process with
JetStream on and its file store in a temp directory, on a free loopback port; its client
nats-py (in the `bench` extra).

Its workloads, each on a work-queue stream of its own in the file store (a message is
deleted once acknowledged, as a RECEIVE's COMMIT deletes it):
  end to end  the producer publishes with a PubAck for each message, a window of
              `batch * in_flight` unacknowledged at most; the consumer fetches batches of
              `batch` from a durable pull consumer and acknowledges each batch (its
              messages' acks written together, the last one waited for);
  round trip  publish and wait for the PubAck, fetch one, ack_sync; one at a time.
JetStream's file store acknowledges a write once it is in the operating system, syncing
later: what ssb's durability "os" means, so it runs beside ssb at "os".
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from ssb import tools

from . import e2e
from ._common import BenchFailure, run, started_together
from ._peer import (
    Options,
    Target,
    not_installed,
    stop_server,
    two_processes,
    wait_for_port,
)

NATS_SERVER: Final = Path("/usr/sbin/nats-server")
E2E_STREAM: Final = "E2E"
ROUND_TRIP_STREAM: Final = "RT"
CONSUMER: Final = "bench"
FETCH_TIMEOUT: Final = 1.0  # seconds a fetch waits for a message


class JetStream:
    """Debian's nats-server with JetStream on (see the module's comment)."""

    name = "jetstream"

    def missing(self) -> str | None:
        return not_installed(NATS_SERVER, "nats-server", "nats", "nats-py")

    def durabilities(self, opts: Options) -> list[str]:
        return ["os"]

    @contextlib.contextmanager
    def running(self, opts: Options, durability: str) -> Iterator[Target]:
        root = Path(tempfile.mkdtemp(prefix="ssb-bench-jetstream-"))
        port = tools.free_port()
        log_path = root / "server.out"
        log = open(log_path, "wb")  # noqa: SIM115 - the child's
        proc = subprocess.Popen(
            [
                str(NATS_SERVER),
                "-a",
                "127.0.0.1",
                "-p",
                str(port),
                "-js",
                "-sd",
                str(root / "store"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
        log.close()
        url = f"nats://127.0.0.1:{port}"
        try:
            wait_for_port(
                "nats-server", port, proc, log_path, lambda: b"ready" in log_path.read_bytes()
            )
            run(_make_streams(url))
            yield Target(url, [proc.pid])
        finally:
            stop_server(proc, 30, proc.terminate)
            shutil.rmtree(root, ignore_errors=True)

    def end_to_end(self, target: Target, opts: Options) -> tuple[float, int]:
        work = {"producer": _produce, "consumer": _consume}
        return two_processes(self.name, work, target.url, opts)

    def round_trip(self, target: Target, opts: Options) -> list[float] | None:
        return run(_round_trips(target.url, opts))


async def _make_streams(url: str) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for stream, subject in ((E2E_STREAM, "e2e"), (ROUND_TRIP_STREAM, "rt")):
            await js.add_stream(
                name=stream,
                subjects=[subject],
                storage=StorageType.FILE,
                retention=RetentionPolicy.WORK_QUEUE,
            )
            await js.add_consumer(
                stream, ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT)
            )
    finally:
        await nc.close()


async def _produce(role: str, url: str, opts: Options, go: Any, results: Any) -> dict[str, Any]:
    """Publish every message, each acknowledged (PubAck) once in the file store, a window
    of `batch * in_flight` unacknowledged at most."""
    import asyncio

    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=opts.batch * opts.in_flight)
        pad = b"p" * max(0, opts.body_size - e2e.TAG.size)
        await started_together(role, go, results, 60)
        acks = [
            await js.publish_async("e2e", e2e.body(e2e.PHASE_E2E, i, pad))
            for i in range(opts.messages)
        ]
        await asyncio.wait_for(js.publish_async_completed(), opts.phase_timeout)
        for ack in acks:
            ack.result()  # a refusal raises
    finally:
        await nc.close()
    return {"sent": opts.messages}


async def _consume(role: str, url: str, opts: Options, go: Any, results: Any) -> dict[str, Any]:
    """Take every message in fetched batches, each batch acknowledged before the next
    fetch."""

    import nats
    from nats.errors import TimeoutError as FetchTimeout

    seen = bytearray(opts.messages)
    count = 0
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        pull = await js.pull_subscribe("e2e", durable=CONSUMER, stream=E2E_STREAM)
        await started_together(role, go, results, 60)
        deadline = time.monotonic() + opts.phase_timeout
        while count < opts.messages:
            if time.monotonic() > deadline:
                raise BenchFailure(f"consumer: {count} of {opts.messages} in time")
            try:
                batch = await pull.fetch(opts.batch, timeout=FETCH_TIMEOUT)
            except FetchTimeout:
                continue
            for message in batch:
                phase, index = e2e.TAG.unpack_from(message.data)
                if phase != e2e.PHASE_E2E or index >= opts.messages or seen[index]:
                    raise BenchFailure(f"consumer: message {index} foreign or twice")
                seen[index] = 1
                count += 1
            for message in batch[:-1]:
                await message.ack()  # (written, not waited for)
            await batch[-1].ack_sync()  # the batch's acks have all arrived
        finished = time.monotonic()
    finally:
        await nc.close()
    return {"received": count, "finished": finished}


async def _round_trips(url: str, opts: Options) -> list[float]:
    """publish (PubAck) -> fetch 1 -> ack_sync, one at a time; microseconds each."""
    import nats

    pad = b"l" * max(0, opts.body_size - e2e.TAG.size)
    samples: list[float] = []
    total = opts.round_trip_warmup + opts.round_trips
    deadline = time.monotonic() + opts.phase_timeout
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        pull = await js.pull_subscribe("rt", durable=CONSUMER, stream=ROUND_TRIP_STREAM)
        for i in range(total):
            if time.monotonic() > deadline:
                raise BenchFailure(f"round trip: only {i} of {total} in time")
            started = time.perf_counter_ns()
            await js.publish("rt", e2e.body(e2e.PHASE_LATENCY, i, pad))
            messages = await pull.fetch(1, timeout=10.0)
            await messages[0].ack_sync()
            elapsed = time.perf_counter_ns() - started
            if len(messages) != 1 or e2e.TAG.unpack_from(messages[0].data) != (
                e2e.PHASE_LATENCY,
                i,
            ):
                raise BenchFailure(f"round trip {i} got {len(messages)} messages")
            if i >= opts.round_trip_warmup:
                samples.append(elapsed / 1000)
    finally:
        await nc.close()
    return samples
