"""The daemon's role on a shared database: standby until it holds the broker's lease,
active while it renews it, and done the moment it may have lost it.

Theory of operation. Daemons given one PostgreSQL database are one broker; the lease
(see `_store/lease.py`) says which of them serves. `LeaseKeeper` is one daemon's side
of it, with three roles:

    STANDBY  waits: tries to take the lease every `poll` seconds, ports closed
    ACTIVE   serves: renews the lease every `renew` seconds
    LOST     may have lost it: serves nothing more (the daemon stops)

All of it follows from one setting, `failover_timeout` (F): the lease lasts F / 2, is
renewed every F / 8 (three renewals in a row may fail before it is at risk) and a
standby polls every F / 10 (at most every second). A standby takes over a poll after
the active daemon dies (its lock is freed when the server sees its session end), and at
most F / 2 plus a poll after the active one froze or lost the database; then it
recovers the broker's state, which must take less than the rest of F.

The holder judges its lease by its own monotonic clock, before it hears from the
database: the lease is *held* until the time its last successful renewal was sent plus
the lease's length (less a small margin). The server's deadline is at least that far
after the same moment, so by the time a standby may find the lease expired, the holder's
own clock has said it lost it. `held()` is what the store asks before and after every
commit and the client port before every request, so a daemon that was frozen past its
lease answers nothing when it runs again, whatever its event loop runs first; and the
database fences its commits in any case (`ssb_fence`). `on_lost` is told once, with the
reason, when the clock runs out, a renewal finds the lease gone, or the store's fence
fails.

The lease's round trips never run on the event loop: a standby's on a thread of the
keeper's, an active daemon's renewals on a thread of their own, so that neither a
database that stops answering nor a long stretch of the loop (recovering a large store)
stalls them, and the clock still rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ._store import StoreError, describe_failure
from ._store.lease import DatabaseLease, Holder, Node

log = logging.getLogger("ssb.lease")

T = TypeVar("T")
MARGIN: Final = 0.9  # of the lease's length that the holder counts on
MAX_POLL: Final = 1.0  # seconds between a standby's attempts, at most


class Role(enum.Enum):
    STANDBY = "standby"
    ACTIVE = "active"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class Timing:
    """The lease's times, all from `failover_timeout` (see the module's comment)."""

    failover_timeout: float

    @property
    def duration(self) -> float:
        return self.failover_timeout / 2

    @property
    def renew(self) -> float:
        return self.failover_timeout / 8

    @property
    def poll(self) -> float:
        return min(MAX_POLL, self.failover_timeout / 10)


def new_node() -> str:
    """A daemon's node id: new at every start (12 hex digits)."""
    return uuid.uuid4().hex[:12]


class LeaseKeeper:
    """One daemon's side of the broker's lease (see the module's comment)."""

    def __init__(self, lease: DatabaseLease, timing: Timing, address: str) -> None:
        """Args:
        lease: the database's lease, on a session of its own.
        timing: its times.
        address: where this daemon serves clients when active (for other daemons and
            operators to read in `broker_nodes`).
        """
        self.lease = lease
        self.timing = timing
        self.node = lease.node
        self.address = address
        self.role = Role.STANDBY
        self.epoch = 0
        self.holder: Holder | None = None  # as last seen by this daemon as a standby
        self.reason = ""  # why it lost the lease
        self.on_lost: Callable[[str], None] = lambda reason: None
        self._valid_until = 0.0  # monotonic
        self._renewed = 0.0  # monotonic time the last successful renewal was sent
        self._failing = ""  # why the last attempt failed, as logged
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssb-lease")
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadline: asyncio.TimerHandle | None = None

    # ---- what the rest of the daemon asks -------------------------------------------

    def held(self) -> bool:
        """Whether this daemon holds the lease by its own clock (any thread may ask)."""
        return self.role is Role.ACTIVE and time.monotonic() < self._valid_until

    def lease_age(self) -> float | None:
        """Seconds since the lease was last taken or renewed (None: not held)."""
        if self.role is not Role.ACTIVE:
            return None
        return max(0.0, time.monotonic() - self._renewed)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def nodes(self) -> list[Node]:
        """Every daemon that has used the database lately (a round trip)."""
        try:
            return await self._call(self.lease.nodes)
        except Exception as exc:
            raise StoreError(describe_failure(exc)) from exc

    # ---- standby ----------------------------------------------------------------------

    async def try_take(self) -> bool:
        """One attempt at the lease (as a standby); True when this daemon holds it now."""
        sent = time.monotonic()
        try:
            await self._call(self.lease.seen, Role.STANDBY.value, self.address)
            taken = await self._call(self.lease.take, self.timing.duration)
        except Exception as exc:
            reason = describe_failure(exc)
            if reason != self._failing:
                log.warning("standby: the database does not answer (%s); trying again", reason)
            self._failing = reason
            return False
        self._failing = ""
        if isinstance(taken, int):
            self._took(taken, sent)
            return True
        self._saw(taken)
        return False

    async def wait(self, stopping: asyncio.Event) -> bool:
        """Wait as a standby until this daemon takes the lease (True), or `stopping` is
        set (False)."""
        while not stopping.is_set():
            if await self.try_take():
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.timing.poll)
        return False

    def _saw(self, holder: Holder) -> None:
        before = self.holder
        self.holder = holder
        if before is None or before.node != holder.node or before.live != holder.live:
            if holder.live:
                log.info(
                    "standby: the broker is served by daemon %s (lease epoch %d); this daemon"
                    " takes over if that one stops renewing its lease (failover_timeout %g s)",
                    holder.node,
                    holder.epoch,
                    self.timing.failover_timeout,
                )
            elif holder.node:
                log.warning(
                    "standby: daemon %s has not renewed its lease for %.1f s; ending its"
                    " sessions on the database to take over",
                    holder.node,
                    holder.renewed_age or 0.0,
                )

    def _took(self, epoch: int, sent: float) -> None:
        self.epoch = epoch
        self.role = Role.ACTIVE
        self._held_from(sent)
        log.warning("took the broker's lease (epoch %d): this daemon is now the active one", epoch)

    # ---- active -----------------------------------------------------------------------

    def start(self, on_lost: Callable[[str], None]) -> None:
        """Renew the lease from now on, on a thread of its own (a long synchronous stretch
        of the event loop, such as recovering a large store, must not let it lapse);
        `on_lost` hears, once and on the event loop, why it was lost."""
        self.on_lost = on_lost
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._renewing, name="ssb-lease-renew", daemon=True)
        self._thread.start()
        self._arm()

    def _held_from(self, sent: float) -> None:
        self._renewed = sent
        self._valid_until = sent + self.timing.duration * MARGIN

    def _arm(self) -> None:
        """Check the clock when the lease would run out, unless renewed by then."""
        if self.role is not Role.ACTIVE:
            return
        delay = max(0.0, self._valid_until - time.monotonic())
        self._deadline = asyncio.get_running_loop().call_later(delay, self._expired)

    def _expired(self) -> None:
        if self.role is not Role.ACTIVE:
            return
        if time.monotonic() < self._valid_until:
            self._arm()  # renewed meanwhile
            return
        self.lost(
            f"no renewal of the lease succeeded for {time.monotonic() - self._renewed:.1f} s"
            f" (the lease lasts {self.timing.duration:g} s): it may have lapsed, and another"
            " daemon may take over"
        )

    def _renewing(self) -> None:
        """The renewal thread."""
        timing = self.timing
        failing = ""
        while not self._stopping.wait(timing.renew) and self.role is Role.ACTIVE:
            sent = time.monotonic()
            try:
                renewed = self.lease.renew(self.epoch, timing.duration)
                self.lease.seen(Role.ACTIVE.value, self.address)
            except Exception as exc:
                reason = describe_failure(exc)
                if reason != failing:
                    log.warning("renewing the lease failed (%s); trying again", reason)
                failing = reason
                continue
            if failing:
                log.info("the lease is renewed again")
                failing = ""
            if not renewed:
                reason = (
                    f"another daemon has taken the lease over (this one held epoch {self.epoch})"
                )
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self.lost, reason)
                return
            if self.role is Role.ACTIVE:
                self._held_from(sent)

    def lost(self, reason: str) -> None:
        """This daemon may no longer hold the lease: from now on it holds nothing (the
        first reason is told to `on_lost`)."""
        if self.role is Role.LOST:
            return
        self.role = Role.LOST
        self.reason = reason
        self._valid_until = 0.0
        self._stopping.set()
        if self._deadline is not None:
            self._deadline.cancel()
        log.critical("lost the broker's lease: %s; this daemon serves nothing more", reason)
        self.on_lost(reason)

    # ---- stop -------------------------------------------------------------------------

    async def close(self) -> None:
        """Give the lease up if it is held (a standby then takes over at once), and close."""
        self._stopping.set()
        if self._deadline is not None:
            self._deadline.cancel()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)
        if self.role is Role.ACTIVE:
            self.role = Role.STANDBY
            try:
                await asyncio.wait_for(self._call(self.lease.release, self.epoch), 5.0)
            except (TimeoutError, Exception) as exc:  # the deadline gives it up anyway
                log.warning("could not give the lease up (%s)", describe_failure(exc))
        self.lease.close()
        self._executor.shutdown(wait=False)


def node_name(host: str) -> str:
    """What a daemon is called in `broker_nodes`: its machine and process."""
    return f"{os.uname().nodename} pid {os.getpid()} {host}"
