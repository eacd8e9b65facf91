"""Transaction outcomes: which of a login's transactions committed, kept for a window.

Theory of operation. A client names each transaction with a UUID of its own choosing (a
statement outside a transaction is a transaction of its own; a detached transaction is
named by the broker). When a named transaction commits, its id joins the open store
batch's *outcome record*: one row per batch (number, time, count, the ids by login),
written by a deferred writer as the batch is taken, so the record and the commits'
effects become durable together or not at all, and a busy broker writes one row per
group commit, not one per transaction. A client that lost the answer to a commit asks
for the outcome: its id in a record means "committed". Looking an id up scans the
kept records newest first; that is rare (only after a lost connection) and cheap next
to keeping an index up to date on every commit.

No record means "rolled_back" only if a record could not have been pruned. Records are
numbered in commit order and pruned oldest first: those older than `window_seconds`,
and the oldest while more than `window_count` ids are kept. `pruned_through` is the
time of the newest record ever pruned (kept in the store's meta table). The client says
how long ago, at most, it sent the commit (`age`, measured on its own monotonic clock):
a commit applied after `now - age` that is later than `pruned_through` would still have
its record. A record older than `window_seconds` counts as gone, whether or not the
pruning has run yet, so the window behaves as configured. Anything else is "unknown".

An answer must stay true: before it is given the id is *fenced*. A fenced id may never
begin or commit afterwards (the session running it is aborted by `Transactions`, a later
BEGIN or statement with it is refused and its connection closed), so a commit still
queued behind a connection the broker has not yet seen drop cannot make "rolled_back"
false. Fences live in memory for the window; after a restart no old connection is left.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, Literal

from ssb.protocol import pack, unpack

from .ports import Cancellable, Clock, Journal

log = logging.getLogger("ssb.core")

Outcome = Literal["committed", "rolled_back", "unknown", "open"]

DEFAULT_WINDOW_SECONDS: Final = 3600.0
DEFAULT_WINDOW_COUNT: Final = 1_000_000
PRUNE_INTERVAL: Final = 1.0  # seconds between prunes
PRUNE_ROWS: Final = 1000  # records pruned at most per tick
MAX_FENCES: Final = 100_000  # resolved ids remembered at most (oldest forgotten first)
PRUNED_THROUGH: Final = "outcomes_pruned_through"  # meta key


@dataclass(eq=False)
class Outcomes:
    """The window of committed transaction ids, and the ids already resolved."""

    journal: Journal
    clock: Clock
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    window_count: int = DEFAULT_WINDOW_COUNT

    def __post_init__(self) -> None:
        self.first = 1  # the oldest record kept (records first..next-1 exist)
        self.next = 1
        self.kept = 0  # ids in the kept records
        self.pruned_through = 0.0
        self._open: dict[str, bytearray] = {}  # the open batch's ids, by login
        self._open_count = 0
        self._fences: OrderedDict[tuple[str, uuid.UUID], float] = OrderedDict()
        self._timer: Cancellable | None = None

    def load(self, pruned_through: str | None) -> None:
        """Pick up the records kept by the store (at start)."""
        span = self.journal.outcome_span()
        if span is not None:
            self.first, last, self.kept = span
            self.next = last + 1
        self.pruned_through = float(pruned_through) if pruned_through else 0.0

    def start(self) -> None:
        self._timer = self.clock.call_at(self.clock.time() + PRUNE_INTERVAL, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---- recording and fencing ------------------------------------------------------------

    def record(self, login: str, txn: uuid.UUID) -> None:
        """`login`'s transaction `txn` commits: its id joins the open batch's record."""
        if not self._open_count:
            self.journal.defer(self._write)
        self._open.setdefault(login, bytearray()).extend(txn.bytes)
        self._open_count += 1

    def _write(self) -> None:
        """The open batch is taken: its record is written into it."""
        ids = pack({login: bytes(found) for login, found in self._open.items()})
        self.journal.insert_outcomes(self.next, self.clock.time(), self._open_count, ids)
        self.next += 1
        self.kept += self._open_count
        self._open, self._open_count = {}, 0

    def fenced(self, login: str, txn: uuid.UUID) -> bool:
        return (login, txn) in self._fences

    def fence(self, login: str, txn: uuid.UUID) -> None:
        """`txn` of `login` is resolved: it may never begin or commit from now on."""
        key = (login, txn)
        self._fences[key] = self.clock.time()
        self._fences.move_to_end(key)
        while len(self._fences) > MAX_FENCES:
            self._fences.popitem(last=False)

    # ---- answering ---------------------------------------------------------------------------

    def committed_at(self, login: str, txn: uuid.UUID) -> float | None:
        """When `login`'s `txn` committed, if a durable record keeps it."""
        wanted = txn.bytes
        for _, at, blob in self.journal.read_outcome_batches(self.first):
            ids = unpack(blob).get(login)
            if not ids:
                continue
            found = ids.find(wanted)
            while found >= 0:
                if found % 16 == 0:
                    return float(at)
                found = ids.find(wanted, found + 1)
        return None

    def lookup(self, login: str, txn: uuid.UUID, age: float | None) -> Outcome:
        """The outcome of a fenced `txn`, from durable records only (the caller waits until
        everything applied so far is durable)."""
        now = self.clock.time()
        horizon = now - self.window_seconds
        committed = self.committed_at(login, txn)
        if committed is not None:
            return "committed" if committed >= horizon else "unknown"
        if age is None:
            return "unknown"
        earliest = now - age
        if earliest <= max(self.pruned_through, horizon):
            return "unknown"
        return "rolled_back"

    def describe_unknown(self, age: float | None) -> str:
        """Why an outcome is unknown, for the client's error."""
        if age is None:
            return "the question did not say when the transaction was committed"
        return (
            f"the transaction was sent {age:.1f} s ago and the broker keeps committed"
            f" transaction ids for {self.window_seconds:g} s (outcome_window_seconds), at"
            f" most {self.window_count} of them (outcome_window_count)"
        )

    # ---- pruning ------------------------------------------------------------------------------

    def _tick(self) -> None:
        self._timer = self.clock.call_at(self.clock.time() + PRUNE_INTERVAL, self._tick)
        self.prune()

    def prune(self) -> None:
        """Drop records beyond the window (by count, then by age) and fences past it."""
        now = self.clock.time()
        horizon = now - self.window_seconds
        while self._fences:
            key, at = next(iter(self._fences.items()))
            if at >= horizon:
                break
            del self._fences[key]
        upto, dropped = self.first - 1, 0
        while self.kept - dropped > self.window_count:  # by count: the oldest records
            heads = self.journal.outcome_batch_heads(upto + 1, PRUNE_ROWS)
            if not heads:
                break
            for seq, _, count in heads:
                if self.kept - dropped <= self.window_count:
                    break
                upto, dropped = seq, dropped + count
        # by age: binary search over the kept records (numbered in commit order)
        low, high = max(upto + 1, self.first), self.next - 1
        while low <= high:
            middle = (low + high) // 2
            stamp = self.journal.outcome_at(middle)
            if stamp is None or stamp >= horizon:  # not durable yet, or young enough
                high = middle - 1
            else:
                upto, low = middle, middle + 1
        upto = min(upto, self.first + PRUNE_ROWS - 1)  # a bounded step per tick
        if upto < self.first:
            return
        newest = self.journal.outcome_at(upto)
        if newest is None:
            return  # not durable yet: prune on a later tick
        heads = self.journal.outcome_batch_heads(self.first, upto - self.first + 1)
        removed = sum(count for _, _, count in heads)
        self.journal.delete_outcomes_upto(upto)
        self.pruned_through = max(self.pruned_through, newest)
        self.journal.put_meta(PRUNED_THROUGH, repr(self.pruned_through))
        log.debug("pruned transaction outcome records %d..%d (%d ids)", self.first, upto, removed)
        self.kept -= removed
        self.first = upto + 1
