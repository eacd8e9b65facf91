"""Capacity: the limits that keep the broker alive whatever clients send.

Theory of operation. Two kinds of limit. `max_message_size` bounds every body, at
SEND and on arrival from another broker, and always fits a frame (see protocol's
size limits). Free disk space is watched from outside the core (the daemon measures
it; the store reports failed writes): while the free space is below `min_free_disk`,
while the store cannot write, or while the store's disk reserve is given up (the disk
filled, see the store), statements that add data (SEND, BEGIN DIALOG, a message from
another broker) are refused with the reason, and everything that frees space (RECEIVE,
END CONVERSATION) goes on. The refusal lifts by itself when the space comes back. Each
cause is logged when it begins and ends, and the first statement it refuses; the
statements refused after that are counted, and the count logged when the refusal lifts
(a producer that retries must not fill the log, often on the very disk that is full).
Queue quotas are the queues' own (see `queues.Queue.over_quota`); a statement one would
break is refused here too, and logged for each queue: its first refusal, then at most a
line a minute with the count since the last (a queue held at its quota, a reader taking
a message and a producer filling its place, would otherwise log twice a message), until
the queue takes a statement a minute or more after the last line (it has room again),
its quota is changed or it is dropped.

A statement or COMMIT refused for want of room (disk or a queue's quota) marks its
transaction (`Transaction.refused_for_room`): the rollback that follows is the broker's
doing, not the fault of what the transaction received, so it does not count toward the
poison rules (a reader whose replies are refused would otherwise disable its own queue).
"""

from __future__ import annotations

import logging
from typing import Final

from ssb.protocol import ErrorCode

from .._errors import BrokerError
from .queues import Queue, Told
from .transactions import Transaction

log = logging.getLogger("ssb.core")

QUOTA_LOG_EVERY: Final = 60.0  # seconds between lines about one queue's quota refusals


def readable_size(n: int) -> str:
    """`n` bytes in the unit that shows them best: 900 bytes, 6.0 KiB, 1.5 MiB, 3.0 GiB."""
    if n < 1024:
        return f"{n} bytes"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 1024:.1f} KiB"


class Capacity:
    def __init__(self, max_message_size: int, min_free_disk: int) -> None:
        self.max_message_size = max_message_size
        self.min_free_disk = min_free_disk
        self.low_space: str | None = None  # why free space is too low, while it is
        self.store_failure: str | None = None  # why the last commit failed, until one succeeds
        self.no_reserve: str | None = None  # the store's disk reserve is given up, while it is
        self.refusal: str | None = None  # why new messages are refused now, if they are
        self.refusals = 0  # statements and commits refused for want of disk, in all
        self.quota_refusals = 0  # and for a queue's quota
        self._said = False  # the first statement refused since the refusal began is logged
        self._unsaid = 0  # statements refused after it, not logged
        self.queue_quotas = 0  # queues with a quota (none: SEND need not look)

    def _update(self) -> None:
        self.refusal = self.store_failure or self.low_space or self.no_reserve
        if self.refusal is None and self._said:
            log.info(
                "%d statement(s) were refused in all while the broker refused new messages",
                self._unsaid + 1,
            )
            self._said, self._unsaid = False, 0

    def check_body(self, size: int) -> None:
        if size > self.max_message_size:
            raise BrokerError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a message body of {size} bytes exceeds this broker's max_message_size of"
                f" {self.max_message_size} bytes; split it, or raise max_message_size in the"
                " broker's config",
            )

    def check_space(self, txn: Transaction | None, what: str) -> None:
        """Raise STORE_FAILED while the store cannot write, DISK_FULL while free space is
        below `min_free_disk`, marking `txn` (see the module's comment)."""
        reason = self.refusal
        if reason is not None:
            if txn is not None:
                txn.refused_for_room = True
            self.refusals += 1
            if not self._said:
                self._said = True
                log.info(
                    "refused %s: %s (statements refused after it are counted, not logged)",
                    what,
                    reason,
                )
            else:
                self._unsaid += 1
            raise BrokerError(
                ErrorCode.STORE_FAILED if self.store_failure is not None else ErrorCode.DISK_FULL,
                f"{what} refused: {reason}; RECEIVE and END CONVERSATION still work and free"
                " space, and the broker accepts new messages again by itself when there is room",
            )

    def check_quota(
        self, txn: Transaction, queue: Queue, count: int, nbytes: int, what: str, now: float
    ) -> None:
        """Raise QUEUE_FULL if `count` more messages of `nbytes` would break `queue`'s
        quota, marking `txn` (see the module's comment)."""
        reason = queue.over_quota(count, nbytes)
        told = queue.quota_refusals
        if reason is None:
            if told.at is not None and told.due(now, QUOTA_LOG_EVERY):
                self.quota_spell_over(queue, "has room again")
            return
        txn.refused_for_room = True
        self.quota_refusals += 1
        if told.at is None:
            log.info(
                "refused %s: %s (refusals for this queue are counted, told at most once a minute)",
                what,
                reason,
            )
            told.tell(now)
        elif told.due(now, QUOTA_LOG_EVERY):
            log.info(
                "refused %s: %s (and %d statement(s) since the last line)",
                what,
                reason,
                told.tell(now),
            )
        else:
            told.count += 1
        raise BrokerError(
            ErrorCode.QUEUE_FULL,
            f"{what} refused: {reason}; nothing of it was applied. Receive from the"
            f" queue, or raise its quota with alter_queue('{queue.name}', max_messages=...,"
            " max_bytes=...)",
        )

    def gave_back(self, queue: Queue, count: int, error: str, now: float) -> None:
        """A transaction refused for want of room rolled back, and `count` messages it
        had received from `queue` went back as they were: logged at most once a minute
        a queue (a reader whose replies stay refused takes them again at once), with how
        many since the last line."""
        told = queue.given_back
        told.count += count
        if not told.due(now, QUOTA_LOG_EVERY):
            return
        log.warning(
            "queue '%s': %d received message(s) went back as they were, their transaction"
            " rolled back for want of room%s; its readers take them again until there is"
            " room (these lines at most once a minute)",
            queue.name,
            told.tell(now),
            f" ({error[:300]})" if error else "",
        )

    def quota_spell_over(self, queue: Queue, how: str) -> None:
        """`queue` was refusing statements for its quota and is no more: `how`."""
        log.info(
            "queue '%s' %s: %d statement(s) were refused after the last line about it",
            queue.name,
            how,
            queue.quota_refusals.count,
        )
        queue.quota_refusals = Told()

    def measured(self, free: int, where: str) -> None:
        """The daemon measured `free` bytes available for the store at `where`."""
        if free < self.min_free_disk:
            if self.low_space is None:
                log.warning(
                    "free disk space for %s is %s, below min_free_disk %s: refusing new messages",
                    where,
                    readable_size(free),
                    readable_size(self.min_free_disk),
                )
            self.low_space = (
                f"free disk space for the store is {readable_size(free)}, below min_free_disk"
                f" ({readable_size(self.min_free_disk)})"
            )
        elif self.low_space is not None:
            log.warning(
                "free disk space for %s is %s again: accepting new messages",
                where,
                readable_size(free),
            )
            self.low_space = None
        self._update()

    def reserve_kept(self, missing: str | None, where: str) -> None:
        """Whether the store's disk reserve is in place (None), else why not (given up
        when the disk filled, or no room to make it yet)."""
        if missing is not None and self.no_reserve is None:
            log.warning("refusing new messages (data in %s): %s", where, missing)
        elif missing is None and self.no_reserve is not None:
            log.warning("the disk reserve for %s is in place: accepting new messages", where)
        self.no_reserve = missing
        self._update()

    def commit_failed(self, reason: str) -> None:
        if self.store_failure is None:
            log.error("the store cannot write (%s): refusing new messages until it can", reason)
        self.store_failure = f"the store cannot write: {reason}"
        self._update()

    def commit_succeeded(self) -> None:
        if self.store_failure is not None:
            log.warning("the store writes again: accepting new messages")
            self.store_failure = None
        self._update()
