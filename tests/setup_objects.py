"""Catalog set-ups shared by tests and benchmarks."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ssb import client, tools

ASYNC_CONTRACT = {"AsyncSent": "INITIATOR", "AsyncDone": "TARGET"}


@contextlib.asynccontextmanager
async def new_logins(
    broker: tools.BrokerProcess, password: str, *names: str
) -> AsyncIterator[list[client.Connection]]:
    """A connection of the admin login to `broker`, then the logins `names` (with
    `password`, made by admin) and a connection of each, in that order; closed on exit."""
    async with await client.connect(broker.url) as admin:
        for name in names:
            await admin.create_login(name, password)
        connections = [admin]
        try:
            for name in names:
                connections.append(await client.connect(broker.url_for(name, password)))
            yield connections
        finally:
            for conn in connections[1:]:
                await conn.close()


async def initiator_and_target(
    conn: client.Connection,
    target_queue: str = "TargetQ",
    target_service: str = "TargetSvc",
    **queue: Any,
) -> client.Connection:
    """The initiator service InitSvc on the queue InitQ, and the target service
    `target_service` for the DEFAULT contract on the queue `target_queue` (made with the
    options `queue`); returns `conn`."""
    await conn.create_queue("InitQ")
    await conn.create_queue(target_queue, **queue)
    await conn.create_service("InitSvc", queue="InitQ")
    await conn.create_service(target_service, queue=target_queue, contracts=["DEFAULT"])
    return conn


async def activated_service(
    conn: client.Connection, name: str, procedure: str, readers: int = 1, **queue: Any
) -> None:
    """The queue `<name>Queue`, activated by the test procedure `procedure` (run as admin),
    and its service `<name>Service` on the DEFAULT contract."""
    await conn.create_queue(
        f"{name}Queue",
        activation={
            "status": "ON",
            "procedure": f"activation_procs:{procedure}",
            "max_queue_readers": readers,
            "execute_as": "admin",
        },
        **queue,
    )
    await conn.create_service(f"{name}Service", queue=f"{name}Queue", contracts=["DEFAULT"])


async def seed000(conn: client.Connection, suffix: str = "") -> tuple[str, str, str, str]:
    """Seed 000's objects: returns (initiator service, target service, initiator queue, target queue)."""
    await conn.create_message_type("AsyncSent" + suffix, validation="NONE")
    await conn.create_message_type("AsyncDone" + suffix, validation="NONE")
    await conn.create_contract(
        "AsyncContract" + suffix,
        {"AsyncSent" + suffix: "INITIATOR", "AsyncDone" + suffix: "TARGET"},
    )
    await conn.create_queue("QueueAsyncInitiator" + suffix)
    await conn.create_queue("QueueAsyncTarget" + suffix)
    await conn.create_service(
        "ServiceAsyncInitiator" + suffix, queue="QueueAsyncInitiator" + suffix
    )
    await conn.create_service(
        "ServiceAsyncTarget" + suffix,
        queue="QueueAsyncTarget" + suffix,
        contracts=["AsyncContract" + suffix],
    )
    return (
        "ServiceAsyncInitiator" + suffix,
        "ServiceAsyncTarget" + suffix,
        "QueueAsyncInitiator" + suffix,
        "QueueAsyncTarget" + suffix,
    )


async def receive_bodies(
    conn: client.Connection, queue: str, count: int, rounds: int = 200
) -> list[bytes]:
    """The bodies of `queue`'s messages, received in transactions until `count` have come
    (at most `rounds` RECEIVEs of a second each: bounded)."""
    received: list[bytes] = []
    for _ in range(rounds):
        async with conn.transaction():
            batch = await conn.receive(queue, top=50, timeout=1.0)
        received += [m.message_body for m in batch]
        if len(received) >= count:
            break
    return received


def numbered_batches(
    handles: list[uuid.UUID], per: int, batch: int, body: Callable[[int, int], bytes]
) -> Iterator[tuple[uuid.UUID, list[bytes]]]:
    """`per` messages for each conversation of `handles`, `batch` at a time, round robin
    over the conversations: (handle, bodies), each body `body(conversation number, message
    number)`."""
    for first in range(0, per, batch):
        for number, handle in enumerate(handles):
            yield handle, [body(number, i) for i in range(first, min(per, first + batch))]


async def send_numbered(
    conn: client.Connection,
    handles: list[uuid.UUID],
    per: int,
    batch: int,
    body: Callable[[int, int], bytes],
    progress: list[int] | None = None,
) -> None:
    """Send `numbered_batches(handles, per, batch, body)`, a batch per transaction with
    `run_transaction`; `progress[0]` counts the messages sent."""
    for handle, bodies in numbered_batches(handles, per, batch, body):

        async def send(c: client.Connection) -> None:
            await c.send_many(handle, "DEFAULT", bodies)  # noqa: B023 - run at once

        await conn.run_transaction(send)
        if progress is not None:
            progress[0] += len(bodies)
