"""Conversation endpoints: the registry over the store, conversation timers and lifetimes.

Theory of operation. Every endpoint is a row in the store; memory holds the ones in
use, so a million idle conversations cost their rows on disk, not RAM. `Endpoints` is
an identity map: while anything holds an endpoint object (a transaction, a view) every
lookup returns that same object, so a change made through one reference is seen by all.
It keeps, besides whatever the rest of the core refers to:

- recently used endpoints, up to `cache_size` (an LRU);
- endpoints written in a batch that is not durable yet (pinned until it is): a store
  read would return the row as it was before;
- tombstones of endpoints deleted in such a batch, for the same reason;
- endpoints begun in a transaction that has not committed (never written yet).

So a lookup that misses memory and tombstones may read the store and trust it.

Timers. BEGIN CONVERSATION TIMER and LIFETIME put a time on the endpoint row.
`ConversationTimers` holds a heap of only the times that fall due within HORIZON
seconds, refilled from the store every HORIZON / 2; a time set for later than the heap
covers is found by a refill once its row is long durable. A heap entry fires only if
the endpoint still carries that exact time, so stale and duplicate entries cost nothing.
"""

from __future__ import annotations

import heapq
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from .catalog import Catalog
from .conversations import Endpoint
from .ports import Cancellable, Clock, Journal, Row

ENDPOINT_CACHE: Final = 16384  # endpoints kept in memory after their last use
HORIZON: Final = 60.0  # seconds ahead the timer heap covers

_ConversationKey = tuple[uuid.UUID, bool]


class Endpoints:
    """Every conversation endpoint of this broker, loaded from the store on demand."""

    def __init__(
        self, journal: Journal, catalog: Catalog, cache_size: int = ENDPOINT_CACHE
    ) -> None:
        self.journal = journal
        self.catalog = catalog
        self.cache_size = cache_size
        # identity maps: weak references, each removing its own entry when its endpoint dies
        self._by_handle: dict[uuid.UUID, weakref.ref[Endpoint]] = {}
        self._by_conversation: dict[_ConversationKey, weakref.ref[Endpoint]] = {}
        self._recent: OrderedDict[uuid.UUID, Endpoint] = OrderedDict()
        self._pinned: dict[int, list[Endpoint]] = {}
        self._gone: dict[uuid.UUID, int] = {}
        self._gone_conversations: dict[_ConversationKey, int] = {}
        self._uncommitted: dict[uuid.UUID, Endpoint] = {}
        self._dirty: list[Endpoint] = []  # to write when the open batch is taken
        self.reads = 0  # store reads so far (a miss of memory)

    # ---- lookups -------------------------------------------------------------------

    def get(self, handle: uuid.UUID) -> Endpoint | None:
        ep = self._held(self._by_handle.get(handle))
        if ep is not None or handle in self._gone:
            return ep
        self.reads += 1
        row = self.journal.read_endpoint(handle)
        return None if row is None else self._adopt(row)

    def by_conversation(self, conversation_id: uuid.UUID, is_initiator: bool) -> Endpoint | None:
        key = (conversation_id, is_initiator)
        ep = self._held(self._by_conversation.get(key))
        if ep is not None or key in self._gone_conversations:
            return ep
        self.reads += 1
        row = self.journal.read_endpoint_by_conversation(conversation_id, is_initiator)
        if row is None:
            return None
        ref = self._by_handle.get(uuid.UUID(bytes=row[0]))
        known = None if ref is None else ref()
        return known if known is not None else self._adopt(row)

    def _held(self, ref: weakref.ref[Endpoint] | None) -> Endpoint | None:
        """The endpoint `ref` refers to, if it is still in memory (kept among the recent
        ones again if it had fallen out)."""
        ep = None if ref is None else ref()
        if ep is not None and not ep.cached:
            self._use(ep)
        return ep

    def mark_encrypted(self, conversation_id: uuid.UUID, is_initiator: bool) -> None:
        """A message of the conversation came encrypted from another broker: its endpoint
        shows it (is_encrypted)."""
        ep = self.by_conversation(conversation_id, is_initiator)
        if ep is not None and not ep.encrypted:
            ep.encrypted = True
            self.update(ep)

    def set_far_broker(
        self, conversation_id: uuid.UUID, is_initiator: bool, broker_instance: str
    ) -> None:
        """The conversation's messages went to broker `broker_instance`: an endpoint begun
        without naming the far broker learns it."""
        ep = self.by_conversation(conversation_id, is_initiator)
        if ep is not None and ep.far_broker_instance is None:
            ep.far_broker_instance = broker_instance
            self.update(ep)

    def _adopt(self, row: Row) -> Endpoint:
        service = self.catalog.services.get(row[3])
        ep = Endpoint.from_row(row, service.queue if service else "")
        self._register(ep)
        return ep

    def _register(self, ep: Endpoint) -> None:
        key = (ep.conversation_id, ep.is_initiator)
        handle = ep.handle
        by_handle, by_conversation = self._by_handle, self._by_conversation

        def died(ref: weakref.ref[Endpoint]) -> None:
            if by_handle.get(handle) is ref:
                del by_handle[handle]
            if by_conversation.get(key) is ref:
                del by_conversation[key]

        ref = weakref.ref(ep, died)
        by_handle[handle] = ref
        by_conversation[key] = ref
        self._gone_conversations.pop(key, None)
        self._use(ep)

    def _use(self, ep: Endpoint) -> None:
        # first in, first out: an endpoint in use stays known through whoever holds it,
        # and one that falls out is read again on its next use (cheaper than an LRU's
        # reordering on every lookup)
        if ep.cached:
            return
        recent = self._recent
        ep.cached = True
        recent[ep.handle] = ep
        if len(recent) > self.cache_size:
            recent.popitem(last=False)[1].cached = False

    # ---- changes -------------------------------------------------------------------------

    def begin(self, ep: Endpoint) -> None:
        """An endpoint begun in a transaction: known, but not stored until it commits."""
        ep.committed = False
        self._uncommitted[ep.handle] = ep
        self._register(ep)

    def insert(self, ep: Endpoint) -> None:
        """Store a new endpoint (its transaction committed, or a target was created)."""
        self._uncommitted.pop(ep.handle, None)
        if not ep.cached:
            self._register(ep)
        ep.committed = True
        self.journal.insert_endpoint(ep.row())
        ep.written = ep.indexed()
        self._pin(ep)

    def update(self, ep: Endpoint) -> None:
        """Store an endpoint's new state (written once per batch, with its last state)."""
        if ep.committed and not ep.dirty:
            # held (strongly) until written, then until that write is durable
            ep.dirty = True
            dirty = self._dirty
            dirty.append(ep)
            if len(dirty) == 1:
                self.journal.defer(self._write_dirty)

    def _write_dirty(self) -> None:
        """The batch is being taken: write every endpoint changed in it, once."""
        dirty, self._dirty = self._dirty, []
        journal = self.journal
        for ep in dirty:
            if ep.dirty:
                ep.dirty = False
                indexed = ep.indexed()
                if indexed == ep.written:
                    journal.update_endpoint_hot(ep.hot_row())
                else:
                    journal.update_endpoint(ep.row())
                    ep.written = indexed
        batch = journal.watermark()
        pinned = self._pinned.get(batch)
        if pinned is None:
            self._pinned[batch] = dirty
            journal.when_durable(batch, lambda: self._durable(batch))
        else:
            pinned += dirty

    def remove(self, ep: Endpoint) -> None:
        """The endpoint is gone for good (its row is deleted if it was stored)."""
        if ep.gone:
            return
        self._forget(ep)
        ep.dirty = False
        if ep.committed:
            self.journal.delete_endpoint(ep.handle)
            batch = self.journal.watermark()
            self._gone[ep.handle] = batch
            self._gone_conversations[(ep.conversation_id, ep.is_initiator)] = batch
            if batch not in self._pinned:
                self._pinned[batch] = []
                self.journal.when_durable(batch, lambda: self._durable(batch))

    def forget_uncommitted(self, ep: Endpoint) -> None:
        """An endpoint begun in a transaction that rolled back: it never existed."""
        if self._uncommitted.pop(ep.handle, None) is not None:
            self._forget(ep)

    def _forget(self, ep: Endpoint) -> None:
        ep.gone = True
        self._uncommitted.pop(ep.handle, None)
        ref = self._by_handle.pop(ep.handle, None)
        key = (ep.conversation_id, ep.is_initiator)
        if ref is not None and self._by_conversation.get(key) is ref:
            del self._by_conversation[key]
        if ep.cached:
            ep.cached = False
            self._recent.pop(ep.handle, None)

    @staticmethod
    def known(ep: Endpoint) -> bool:
        """Whether `ep` is still this broker's endpoint (not removed)."""
        return not ep.gone

    def _pin(self, ep: Endpoint) -> None:
        """Hold `ep` until the open batch (which writes it) is durable."""
        batch = self.journal.watermark()
        pinned = self._pinned.get(batch)
        if pinned is None:
            pinned = self._pinned[batch] = []
            self.journal.when_durable(batch, lambda: self._durable(batch))
        pinned.append(ep)

    def _durable(self, batch: int) -> None:
        for ep in self._pinned.pop(batch, ()):
            if not ep.gone and not ep.cached:
                self._use(ep)
        if self._gone:
            self._gone = {h: b for h, b in self._gone.items() if b > batch}
            self._gone_conversations = {
                k: b for k, b in self._gone_conversations.items() if b > batch
            }

    # ---- questions about many endpoints --------------------------------------------------------

    def _fresh(self) -> Iterator[Endpoint]:
        """Endpoints whose current state the store may not show yet."""
        yield from self._uncommitted.values()
        for pinned in self._pinned.values():
            yield from pinned

    def _stored(self, rows: list[Row]) -> Iterator[Endpoint]:
        """The endpoints of store rows as they are now (memory wins; deleted ones skipped)."""
        for row in rows:
            handle = uuid.UUID(bytes=row[0])
            if handle in self._gone:
                continue
            ref = self._by_handle.get(handle)
            current = None if ref is None else ref()
            yield current if current is not None else Endpoint.from_row(row, self._queue_of(row[3]))

    def _queue_of(self, service: str) -> str:
        found = self.catalog.services.get(service)
        return found.queue if found else ""

    def group_queue(self, group_id: uuid.UUID) -> str | None:
        """The queue of conversation group `group_id`, if any endpoint belongs to it."""
        for ep in self._fresh():
            if ep.group_id == group_id:
                return ep.queue
        for ep in self._stored(self.journal.read_endpoints(group_id=group_id, limit=16)):
            if ep.group_id == group_id:
                return ep.queue
        return None

    def count_using(self, *, service: str | None = None, contract: str | None = None) -> int:
        """How many endpoints (up to 1000) use `service` or `contract`."""
        seen: set[uuid.UUID] = set()
        for ep in self._fresh():
            if (service is not None and ep.service == service) or (
                contract is not None and ep.contract == contract
            ):
                seen.add(ep.handle)
        rows = self.journal.read_endpoints(service=service, contract=contract, limit=1000)
        for ep in self._stored(rows):
            if (service is None or ep.service == service) and (
                contract is None or ep.contract == contract
            ):
                seen.add(ep.handle)
        return len(seen)

    def of_service(self, service: str, page: int = 1000) -> list[Endpoint]:
        """Every endpoint of `service`, begun in an open transaction or stored."""
        found = {ep.handle: ep for ep in self._fresh() if ep.service == service and not ep.gone}
        after: uuid.UUID | None = None
        while True:
            rows = self.journal.read_endpoints(service=service, after=after, limit=page)
            for row in rows:
                ep = self.get(uuid.UUID(bytes=row[0]))  # in the identity map: changes stick
                if ep is not None and ep.service == service:
                    found.setdefault(ep.handle, ep)
            if len(rows) < page:
                return list(found.values())
            after = uuid.UUID(bytes=rows[-1][0])

    def page(self, after: uuid.UUID | None, limit: int) -> list[Endpoint]:
        """Committed endpoints in handle order after `after` (for views)."""
        rows = self.journal.read_endpoints(after=after, limit=limit)
        return [ep for ep in self._stored(rows) if ep.committed]

    def in_memory(self) -> int:
        return len(self._by_handle)


@dataclass(eq=False)
class ConversationTimers:
    """Conversation timers and lifetimes that fall due soon, in one heap."""

    endpoints: Endpoints
    journal: Journal
    clock: Clock
    on_timer: Callable[[Endpoint], None]
    on_lifetime: Callable[[Endpoint], None]

    def __post_init__(self) -> None:
        self._heap: list[tuple[float, int, uuid.UUID, bool]] = []  # (when, tick, handle, lifetime)
        self._tick = 0
        self._upper = float("-inf")  # the heap holds every time up to here
        self._armed: Cancellable | None = None
        self._armed_at: float | None = None
        self._refresher: Cancellable | None = None

    def start(self) -> None:
        self._refill(None)

    def close(self) -> None:
        for handle in (self._armed, self._refresher):
            if handle is not None:
                handle.cancel()
        self._armed = self._refresher = None

    def _refill(self, after: float | None) -> None:
        now = self.clock.time()
        upper = now + HORIZON
        for handle, timer_at, lifetime in self.journal.read_due_endpoints(after, upper):
            ident = uuid.UUID(bytes=handle)
            for when, is_lifetime in ((timer_at, False), (lifetime, True)):
                if when is not None and when <= upper and (after is None or when > after):
                    self._push(when, ident, is_lifetime)
        self._upper = upper
        self._refresher = self.clock.call_at(now + HORIZON / 2, lambda: self._refill(upper))
        self._arm()

    def schedule(self, ep: Endpoint) -> None:
        """The endpoint's timer or lifetime was set: heap it if a refill might miss it."""
        margin = self._upper + HORIZON
        for when, is_lifetime in ((ep.timer_at, False), (ep.lifetime_expiry, True)):
            if when is not None and when <= margin:
                self._push(when, ep.handle, is_lifetime)
        self._arm()

    def _push(self, when: float, handle: uuid.UUID, is_lifetime: bool) -> None:
        self._tick += 1
        heapq.heappush(self._heap, (when, self._tick, handle, is_lifetime))

    def _arm(self) -> None:
        if not self._heap:
            return
        when = self._heap[0][0]
        if self._armed is not None and self._armed_at is not None and self._armed_at <= when:
            return
        if self._armed is not None:
            self._armed.cancel()
        self._armed_at = when
        self._armed = self.clock.call_at(when, self._fire)

    def _fire(self) -> None:
        self._armed = self._armed_at = None
        now = self.clock.time()
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, handle, is_lifetime = heapq.heappop(heap)
            ep = self.endpoints.get(handle)
            if ep is None:
                continue
            if is_lifetime and ep.lifetime_expiry == when:
                self.on_lifetime(ep)
            elif not is_lifetime and ep.timer_at == when:
                self.on_timer(ep)
        self._arm()

    def pending(self) -> int:
        return len(self._heap)
