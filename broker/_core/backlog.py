"""Backlogs: ordered sequences that live on disk and keep only a bounded part in memory.

Theory of operation. A backlog is the ready messages of one conversation in a queue,
or the transmission-queue entries of one dialog direction. Its items are in order
(queuing order, or transmission id) and every item is a row in the store. Memory
holds three parts:

    head      items at the front, resident (with their bodies)
    spilled   `spilled` items after the head that are only on disk; the first has
              key `spilled_from`; their keys are below every key in the tail
    tail      items after the spilled range, resident (arrivals since it formed)

and the totals `count` and `bytes` of all three. Taking from the front reads the
spilled range from the store in chunks as the head runs out; a range read is bounded
above by the tail's first key, so it never returns an item that is also resident.

Only an item whose row is durable (its `batch` <= the journal's durable batch) may be
spilled: the store's reads see committed rows only. Spilling extends the spilled
range at one of its two edges (the front of the tail, or the back of the head), so
the range stays contiguous. Items that do not sort by key (a message re-queued at the
head of its conversation) are never spilled.

`MessageCache` keeps the bodies resident in all backlogs under one byte budget
(`message_cache_bytes`): when an arrival takes it over budget, it spills from the
backlogs that have held bodies longest until it is under again. Bodies that are not
durable yet cannot go; the cache tries again when the next batch is durable. So memory
holds, per backlog, a small fixed record plus what the budget allows, whatever the
number of items.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Final, Generic, Protocol, TypeVar

from .ports import Clock, Journal, Span

log = logging.getLogger("ssb.core")

DEFAULT_CACHE_BYTES: Final = 48 << 20  # `message_cache_bytes`: with the records of 10,000
# busy conversations, within 150 MB of growth (the backlog benchmark)
PREFETCH: Final = 16  # items read beyond what a take needs, so the next take hits memory
ITEM_OVERHEAD: Final = 256  # memory a resident item costs beyond its body (charged to the cache)
LOAD_BYTES: Final = 1 << 20  # bodies one read brings in at most (plus one item)
TRIM_TO: Final = 0.9  # a trim spills down to this fraction of the budget


class Item(Protocol):
    """What a backlog needs of its items."""

    @property
    def size(self) -> int:
        """Body bytes."""
        ...

    @property
    def batch(self) -> int:
        """The store batch of the item's insert: durable once the journal says so."""
        ...

    @property
    def key(self) -> int: ...

    @property
    def resident_size(self) -> int:
        """Memory the item holds while resident: its body (if held) and ITEM_OVERHEAD."""
        ...

    @property
    def spillable(self) -> bool:
        """Whether a range read would find it (it sorts by key among its peers)."""
        ...


T = TypeVar("T", bound=Item)


class Backlog(Generic[T]):
    """One ordered sequence: resident head, spilled range, resident tail."""

    __slots__ = (
        "__weakref__",
        "bytes",
        "cache",
        "count",
        "gone",
        "head",
        "resident",
        "spilled",
        "spilled_from",
        "tail",
    )

    def __init__(self, cache: MessageCache) -> None:
        self.cache = cache
        self.head: deque[T] = deque()
        self.tail: deque[T] = deque()
        self.spilled = 0
        self.spilled_from = 0
        self.count = 0
        self.bytes = 0
        self.resident = 0
        self.gone: set[int] | None = None  # keys discarded from the range (rows deleted)

    # ---- what a subclass reads from the store ------------------------------------

    def _read(self, span: Span) -> list[T]:
        """The spilled items in `span`."""
        raise NotImplementedError

    def _next_key(self, after: int, before: int | None) -> int | None:
        """The key of the first spilled item after `after` (and before `before`)."""
        raise NotImplementedError

    # ---- queries -----------------------------------------------------------------------

    def first_key(self) -> int | None:
        """Key of the item that would be taken next."""
        if self.head:
            return self.head[0].key
        if self.spilled:
            return self.spilled_from
        if self.tail:
            return self.tail[0].key
        return None

    def resident_items(self) -> Iterable[T]:
        yield from self.head
        yield from self.tail

    # ---- adding --------------------------------------------------------------------------

    def append(self, item: T) -> None:
        """A new item at the end (an arrival)."""
        if self.spilled or self.tail:
            self.tail.append(item)
        else:
            self.head.append(item)
        self.count += 1
        self.bytes += item.size
        self._charge(item.resident_size, trim=True)

    def extend(self, items: list[T]) -> None:
        """New items at the end, in order (arrivals)."""
        (self.tail if self.spilled or self.tail else self.head).extend(items)
        self.count += len(items)
        nbytes = resident = 0
        for item in items:
            nbytes += item.size
            resident += item.resident_size
        self.bytes += nbytes
        self.resident += resident
        self.cache.charge(self, resident, True)

    def appendleft(self, item: T) -> None:
        """One item back at the front (end of a park, a re-queued dead letter)."""
        self.head.appendleft(item)
        self.count += 1
        self.bytes += item.size
        self._charge(item.resident_size, trim=False)

    def restore(self, items: list[T]) -> None:
        """Taken items back at the front, exactly where they were (a rollback)."""
        self.head.extendleft(reversed(items))
        self.count += len(items)
        self.bytes += sum(item.size for item in items)
        self._charge(sum(item.resident_size for item in items), trim=False)

    # ---- taking ----------------------------------------------------------------------------

    def take(
        self,
        limit: int,
        max_bytes: int,
        overhead: int = 0,
        ready: Callable[[T], bool] | None = None,
    ) -> list[T]:
        """Remove up to `limit` items from the front, stopping before the item that would
        take the total (size + `overhead` each) past `max_bytes`; the first item is always
        taken. With `ready`, stop before the first item it rejects."""
        taken: list[T] = []
        used = nbytes = resident = 0
        while len(taken) < limit:
            if not self.head:
                if self.spilled:
                    if not self._load(limit - len(taken)):
                        break
                    continue
                if not self.tail:
                    break
                self.head, self.tail = self.tail, self.head
            item = self.head[0]
            cost = item.size + overhead
            if taken and used + cost > max_bytes:
                break
            if ready is not None and not ready(item):
                break
            self.head.popleft()
            taken.append(item)
            used += cost
            nbytes += item.size
            resident += item.resident_size
        if taken:
            self.count -= len(taken)
            self.bytes -= nbytes
            self._credit(resident)
        return taken

    def wants(self, need: int) -> bool:
        """Whether `read_ahead(need)` would read (some of the first `need` items are
        spilled and the cache has room for them)."""
        return (
            self.spilled > 0
            and len(self.head) < need
            and self.cache.resident + LOAD_BYTES <= self.cache.budget
        )

    def read_ahead(self, need: int) -> bool:
        """Top the head up to `need` items from the spilled range before a take asks for
        them, when the cache has room for them; True when it read. (A head left short
        by the last take, the prefetch remainder, is topped up too: else the next take
        of this backlog would read the rest itself, while its client waits.)"""
        if not self.wants(need):
            return False
        return self._load(need - len(self.head))

    def remove(self, item: T) -> bool:
        """Take one resident item out from anywhere (poison handling)."""
        for part in (self.head, self.tail):
            try:
                part.remove(item)
            except ValueError:
                continue
            self.count -= 1
            self.bytes -= item.size
            self._credit(item.resident_size)
            return True
        return False

    def discard(self, key: int, size: int) -> bool:
        """Remove the item with `key` wherever it is, resident or spilled (the caller
        deletes its row)."""
        for part in (self.head, self.tail):
            for item in part:
                if item.key == key:
                    part.remove(item)
                    self.count -= 1
                    self.bytes -= item.size
                    self._credit(item.resident_size)
                    return True
        before = self.tail[0].key if self.tail else None
        if not self.spilled or key < self.spilled_from or (before is not None and key >= before):
            return False
        # a read before the delete is durable must not bring it back
        if self.gone is None:
            self.gone = set()
        self.gone.add(key)
        self.spilled -= 1
        self.count -= 1
        self.bytes -= size
        if self.spilled and key == self.spilled_from:
            following = self._next_key(key, before)
            if following is None:
                self.count -= self.spilled
                self.spilled = 0
            else:
                self.spilled_from = following
        return True

    def clear(self) -> list[T]:
        """Forget everything (the caller deletes the rows); returns the resident items."""
        resident = list(self.resident_items())
        self._credit(self.resident)
        self.head.clear()
        self.tail.clear()
        self.spilled = self.spilled_from = self.count = self.bytes = 0
        self.gone = None
        return resident

    def _load(self, need: int) -> bool:
        """Bring the next spilled items into the head; False when the store had none."""
        before = self.tail[0].key if self.tail else None
        read = self._read(
            Span(self.spilled_from, before, min(self.spilled, need + PREFETCH), LOAD_BYTES)
        )
        if not read:
            log.warning(
                "%s: %d spilled item(s) from key %d were not in the store; forgetting them",
                self,
                self.spilled,
                self.spilled_from,
            )
            self.count -= self.spilled
            self.spilled = 0
            self.bytes = sum(i.size for i in self.head) + sum(i.size for i in self.tail)
            return False
        gone = self.gone
        items = read
        if gone:
            items = [item for item in read if item.key not in gone]
            last = read[-1].key
            self.gone = {key for key in gone if key > last} or None  # the rest was passed
        self.head.extend(items)
        self.spilled -= len(items)
        if self.spilled:
            following = self._next_key(read[-1].key, before)
            if following is None:
                self.count -= self.spilled
                self.spilled = 0
            else:
                self.spilled_from = following
        self._charge(sum(item.resident_size for item in items), trim=False)
        return True

    # ---- spilling ------------------------------------------------------------------------------

    def spill(self, durable: int, want: int) -> int:
        """Drop up to about `want` bytes of durable bodies from memory; returns what it freed."""
        freed = 0
        tail, head = self.tail, self.head
        # the tail's front joins the range: the range grows at its end
        while freed < want and tail and tail[0].batch <= durable and tail[0].spillable:
            item = tail.popleft()
            if not self.spilled:
                self.spilled_from = item.key
            self.spilled += 1
            freed += item.resident_size
        if not self.spilled:
            # no range yet: the head's end that is not durable becomes (part of) the tail,
            # which keeps the order, so that what precedes it can go
            # (only items a range read would find: one that cannot be spilled stays in front)
            while head and head[-1].batch > durable and head[-1].spillable:
                tail.appendleft(head.pop())
        # the head's end joins the range: the range grows at its front
        while freed < want and head and head[-1].batch <= durable and head[-1].spillable:
            item = head.pop()
            self.spilled_from = item.key
            self.spilled += 1
            freed += item.resident_size
        if freed:
            self._credit(freed)
        return freed

    # ---- cache accounting ---------------------------------------------------------------------

    def _charge(self, n: int, trim: bool) -> None:
        if n:
            self.resident += n
            self.cache.charge(self, n, trim)

    def _credit(self, n: int) -> None:
        if n:
            self.resident -= n
            self.cache.credit(self, n)


class MessageCache:
    """Bodies resident in all backlogs, under one budget in bytes."""

    def __init__(self, budget: int, journal: Journal, clock: Clock) -> None:
        self.budget = budget
        self.journal = journal
        self.clock = clock
        self.resident = 0
        self.spills = 0  # bodies dropped from memory so far (for views and tests)
        self._members: OrderedDict[Backlog[object], None] = OrderedDict()  # type: ignore[type-var]
        self._trim_scheduled = False
        self._retry_armed = False

    def charge(self, backlog: Backlog[T], n: int, trim: bool) -> None:
        self.resident += n
        members = self._members
        if backlog not in members:
            # in the order they became resident: the longest resident goes first
            members[backlog] = None  # type: ignore[index]
        if self.resident > self.budget:
            if trim:
                self.trim()
            elif not self._trim_scheduled:
                self._trim_scheduled = True
                self.clock.call_soon(self._scheduled_trim)

    def credit(self, backlog: Backlog[T], n: int) -> None:
        self.resident -= n
        if backlog.resident <= 0:
            self._members.pop(backlog, None)  # type: ignore[arg-type]

    def _scheduled_trim(self) -> None:
        self._trim_scheduled = False
        self.trim()

    def trim(self) -> None:
        """Spill, least recently filled backlogs first, down to TRIM_TO of the budget."""
        excess = self.resident - int(self.budget * TRIM_TO)
        if self.resident <= self.budget or excess <= 0:
            return
        durable = self.journal.durable
        members = self._members
        tries = len(members)
        while excess > 0 and members and tries > 0:
            tries -= 1
            backlog = next(iter(members))
            freed = backlog.spill(durable, excess)
            excess -= freed
            self.spills += 1 if freed else 0
            if backlog in members:
                members.move_to_end(backlog)
        if (
            self.resident > self.budget
            and not self._retry_armed
            and self.journal.watermark() > durable
        ):
            # what is left is not durable yet: try again once it is (what is durable and
            # still resident cannot be spilled: re-queued messages, until they are received)
            self._retry_armed = True
            self.journal.when_durable(self.journal.watermark(), self._retry)

    def _retry(self) -> None:
        self._retry_armed = False
        self.trim()
