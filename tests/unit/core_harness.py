"""A broker core without a daemon: the store on an in-memory database, a fake clock.

The journal is the real `SQLiteStore` on SQLite's ":memory:" database with manual commits:
nothing is durable until the test calls `flush()`, so a test decides exactly when the
store thread "would have" committed. The clock is fake: time moves only by
`advance()`, which fires due timers in order; `call_soon` callbacks run at `settle()`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import uuid
from collections.abc import Callable
from typing import Any

from ssb.broker._core.engine import CoreLimits, Engine, StoredState
from ssb.broker._core.ports import OutboundSink, QueueListener
from ssb.broker._core.transactions import Session
from ssb.broker._store import ManualStore, SQLiteStore

INSTANCE = "00000000-0000-4000-8000-000000000001"


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, _Timer, Callable[[], None]]] = []
        self._soon: list[Callable[[], None]] = []
        self._tick = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer()
        heapq.heappush(self._timers, (when, next(self._tick), timer, callback))
        return timer

    def call_soon(self, callback: Callable[[], None]) -> None:
        self._soon.append(callback)

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def run_soon(self) -> int:
        """Run `call_soon` callbacks (and those they schedule); returns how many ran."""
        ran = 0
        while self._soon:
            batch, self._soon = self._soon, []
            for callback in batch:
                callback()
                ran += 1
        return ran

    def turn(self) -> int:
        """One turn of the event loop: run the `call_soon` callbacks scheduled so far (what
        they schedule waits for the next turn); returns how many ran."""
        batch, self._soon = self._soon, []
        for callback in batch:
            callback()
        return len(batch)

    def advance(self, seconds: float) -> None:
        """Move time forward, firing every timer that falls due, in order."""
        target = self.now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer, callback = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                callback()
            self.run_soon()
        self.now = target


class Core:
    """An engine on a fresh in-memory store, with helpers for tests."""

    def __init__(
        self,
        store: ManualStore | None = None,
        clock: FakeClock | None = None,
        instance: str = INSTANCE,
        listener: QueueListener | None = None,
        sink: OutboundSink | None = None,
        **limits: Any,
    ):
        self.store = store if store is not None else SQLiteStore(":memory:", threaded=False)
        self.clock = clock if clock is not None else FakeClock()
        self.engine = Engine(
            self.store,
            self.clock,
            instance,
            listener=listener,
            sink=sink,
            limits=CoreLimits(**limits),
        )
        self.engine.load(
            StoredState(self.store.load_catalog(), self.store.max_ids(), self.store.load_meta())
        )
        self.store.flush()
        self.engine.start()
        self.session = self.new_session()

    def new_session(self, user: str = "tester") -> Session:
        return self.engine.transactions.open_session(user, "test")

    def op(self, name: str, *args: Any, session: Session | None = None, **kwargs: Any) -> Any:
        """Run an operation that must finish at once (no waiting)."""
        result = self.engine.operations()[name](session or self.session, *args, **kwargs)
        assert not asyncio.iscoroutine(result), f"{name} waits; use aop()"
        return result

    async def aop(
        self, name: str, *args: Any, session: Session | None = None, **kwargs: Any
    ) -> Any:
        """Run an operation that may wait."""
        result = self.engine.operations()[name](session or self.session, *args, **kwargs)
        if asyncio.iscoroutine(result):
            return await result
        return result

    def flush(self) -> None:
        """The store commits what is pending (it becomes durable); callbacks run."""
        self.store.flush()
        self.clock.run_soon()

    def restart(self, **limits: Any) -> Core:
        """A new engine on the same store, as after a crash (only what was flushed counts)."""
        self.store.discard_pending()
        return Core(self.store, FakeClock(self.clock.now), self.engine.instance_id, **limits)

    # ---- a two-service setup --------------------------------------------------------

    def services(self, target_queue: str = "Target", **queue_options: Any) -> None:
        self.op("create_queue", target_queue, **queue_options)
        self.op("create_queue", "Initiator")
        self.op("create_service", "TargetService", target_queue, ["DEFAULT"])
        self.op("create_service", "InitiatorService", "Initiator")

    def dialog(self) -> uuid.UUID:
        handle: uuid.UUID = self.op("begin_dialog", "InitiatorService", "TargetService")
        return handle

    def receive_all(self, queue: str = "Target", top: int = 100) -> list[list[Any]]:
        """RECEIVE (committing each at once) until the queue is empty."""
        rows: list[list[Any]] = []
        for _ in range(100_000):
            got = self.op("receive", queue, top=top)
            if not got:
                return rows
            rows += got
        raise AssertionError(f"queue {queue} did not empty after 100,000 RECEIVEs")


BODY = 10  # column of the message body in a RECEIVE row
HANDLE = 4
SEQ = 5
MTYPE = 8
DELIVERY_COUNT = 12
