"""RECEIVE and GET CONVERSATION GROUP: taking messages, waiting for them, and their fate.

Theory of operation. One RECEIVE returns messages of one conversation group and locks
that group for the enclosing transaction. Without WHERE it takes the eligible group at
the top of the queue's heap (highest priority, then oldest), unless the transaction
already holds a group of this queue with messages that rank at least as high; with
WHERE it takes from the named conversation or group if it is not locked by another
transaction. Within the group, conversations go by priority, each in sequence order.
An answer carries at most `queues.ANSWER_BYTES` of rows: the rest stays queued for the
next RECEIVE (an answer never exceeds the frame limit, and nothing taken is ever lost).

When nothing can be taken and the caller gave a timeout, the session becomes a
`Waiter` of the queue. Anything that can make messages takeable (an arrival, a lock
released, a rollback, the queue turned ON) calls `kick`, which schedules one pass over
the queue's waiters in arrival order. A waiter whose session is cancelled after it was
handed messages gives them back untouched (no delivery is counted). A reader that its
activator asked to stop (`listener.stopping`) gets nothing at once.

At commit, received messages are deleted, or kept with status 0 on a queue with
RETENTION ON; at rollback they go back exactly where they were, with one more delivery
counted and the reader's error text kept, unless their conversation ended meanwhile.
Bodies of received messages are dropped from memory once the answer is built (they are
on disk; a rollback that brings them back reads them again when they are next taken).

Read-ahead. After a RECEIVE without WHERE, the next eligible group's first messages are
read from the store if they are on disk only, so that the next RECEIVE finds them in
memory. The read waits one more turn of the event loop: a client's BEGIN, RECEIVE and
COMMIT usually arrive together, and the commit that COMMIT scheduled in the same turn
then runs (and its answers leave) first, so that the read overlaps the client's work on
the answer instead of delaying it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

from ssb.protocol import ErrorCode

from .._errors import BrokerError, bad_argument, not_found
from .delivery import Delivery
from .endpoints import Endpoints
from .ports import Clock, Journal, QueueListener
from .queues import Group, Message, Queue, Status
from .transactions import (
    MaybeAwaitable,
    Session,
    Transaction,
    Transactions,
    as_seconds,
    as_uuid,
)

ALL = 1 << 62  # RECEIVE without TOP


@dataclass(slots=True, eq=False)
class Want:
    """What a RECEIVE or a GET CONVERSATION GROUP asks of `queue`: up to `top` messages
    (of conversation `handle`, or of group `group_id`, when given), or the next group to
    lock (`get_group`)."""

    queue: Queue
    top: int
    handle: uuid.UUID | None
    group_id: uuid.UUID | None
    get_group: bool

    @property
    def unfiltered(self) -> bool:
        """Without WHERE: any conversation group will do."""
        return self.handle is None and self.group_id is None


@dataclass(slots=True, eq=False)
class Waiter:
    txn: Transaction
    want: Want
    future: asyncio.Future[tuple[Group, list[Message]] | None]


Taken = tuple[Group, list[Message]]


@dataclass(eq=False)
class Receiving:
    """RECEIVE, GET CONVERSATION GROUP, and the sessions waiting in them."""

    clock: Clock
    journal: Journal
    queues: dict[str, Queue]
    endpoints: Endpoints
    transactions: Transactions
    delivery: Delivery
    listener: QueueListener

    # ---- the statements -------------------------------------------------------------

    def receivable(self, name: object) -> Queue:
        if not isinstance(name, str):
            raise bad_argument("receive needs a queue name")
        queue = self.queues.get(name)
        if queue is None:
            raise not_found(ErrorCode.UNKNOWN_QUEUE, "queue", name)
        if not queue.definition.status:
            raise disabled_error(queue)
        return queue

    def receive(
        self,
        session: Session,
        queue: object,
        top: object = None,
        timeout: object = 0.0,
        conversation_handle: object = None,
        conversation_group_id: object = None,
    ) -> MaybeAwaitable[list[list[Any]]]:
        q = self.receivable(queue)
        if top is not None and (
            isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= ALL
        ):
            raise bad_argument(f"top must be a positive integer or None, got {top!r}")
        wait = as_seconds(timeout, "timeout", allow_none=True)
        handle, group_id = self._where(q, conversation_handle, conversation_group_id)
        if self.listener.stopping(session):
            return []
        txn = self.transactions.current(session)
        limit = ALL if top is None else top
        want = Want(q, limit, handle, group_id, False)
        got = self._try_take(txn, want)
        if got is None and wait != 0:
            return self._receive_waiting(session, txn, want, wait)
        return self._received(session, txn, q, got, want.unfiltered)

    async def _receive_waiting(
        self, session: Session, txn: Transaction, want: Want, wait: float | None
    ) -> list[list[Any]]:
        got = await self._wait(session, txn, want, wait)
        return self._received(session, txn, want.queue, got, want.unfiltered)

    def _received(
        self, session: Session, txn: Transaction, q: Queue, got: Taken | None, unfiltered: bool
    ) -> list[list[Any]]:
        now = self.clock.time()
        q.last_receive = now
        if got is None or not got[1]:
            if got is not None:
                self.transactions.finish(txn)  # a lock taken for nothing is not kept
            if unfiltered:
                q.last_empty_rowset = now
            self.listener.received(q, session, True)
            return []
        rows = self.rows(got[1])
        if txn.explicit:
            durable = newest = self.journal.durable
            for m in got[1]:
                if m.batch <= durable:
                    m.message_body = None  # it is on disk; the transaction keeps only the record
                elif m.batch > newest:
                    newest = m.batch
            if session.statement is None:
                # nothing is written before COMMIT: the answer waits for its rows only
                session.answer_after = newest
        self.transactions.finish(txn)
        self.listener.received(q, session, False)
        return rows

    def rows(self, messages: list[Message]) -> list[list[Any]]:
        """RECEIVE rows of `messages`, reading the bodies memory no longer holds."""
        missing = [m.queuing_order for m in messages if m.message_body is None]
        if not missing:
            return [m.wire(m.message_body) for m in messages]  # type: ignore[arg-type]
        bodies = self.journal.read_message_bodies(missing)
        return [
            m.wire(
                m.message_body if m.message_body is not None else bodies.get(m.queuing_order, b"")
            )
            for m in messages
        ]

    def get_conversation_group(
        self, session: Session, queue: object, timeout: object = 0.0
    ) -> MaybeAwaitable[uuid.UUID | None]:
        q = self.receivable(queue)
        wait = as_seconds(timeout, "timeout", allow_none=True)
        if self.listener.stopping(session):
            return None
        txn = self.transactions.current(session)
        want = Want(q, 0, None, None, True)
        got = self._try_take(txn, want)
        if got is None and wait != 0:
            return self._group_waiting(session, txn, want, wait)
        return self._got_group(session, txn, q, got)

    async def _group_waiting(
        self, session: Session, txn: Transaction, want: Want, wait: float | None
    ) -> uuid.UUID | None:
        got = await self._wait(session, txn, want, wait)
        return self._got_group(session, txn, want.queue, got)

    def _got_group(
        self, session: Session, txn: Transaction, q: Queue, got: Taken | None
    ) -> uuid.UUID | None:
        now = self.clock.time()
        q.last_receive = now
        if got is None:
            q.last_empty_rowset = now
            self.listener.received(q, session, True)
            return None
        self.transactions.finish(txn)
        self.listener.received(q, session, False)
        return got[0].id

    def _where(
        self, q: Queue, handle: object, group_id: object
    ) -> tuple[uuid.UUID | None, uuid.UUID | None]:
        if handle is not None and group_id is not None:
            raise bad_argument("filter on conversation_handle or conversation_group_id, not both")
        h = None if handle is None else as_uuid(handle, "conversation_handle")
        g = None if group_id is None else as_uuid(group_id, "conversation_group_id")
        if h is not None:
            ep = self.endpoints.get(h)
            if ep is None:
                raise not_found(
                    ErrorCode.UNKNOWN_CONVERSATION, "conversation handle", h, "it may have ended"
                )
            if ep.queue != q.name:
                raise bad_argument(
                    f"conversation {h} receives on queue '{ep.queue}', not '{q.name}'"
                )
        return h, g

    # ---- taking ------------------------------------------------------------------------

    def _try_take(self, txn: Transaction, want: Want) -> Taken | None:
        q, handle, group_id, top = want.queue, want.handle, want.group_id, want.top
        lockable = self.transactions.lockable
        group: Group | None
        if handle is not None:
            ep = self.endpoints.get(handle)
            if ep is None:
                return None
            group = q.groups.get(ep.group_id)
            if (
                group is None
                or not lockable(txn, q, group.id)
                or group.ready_conversation(handle) is None
            ):
                return None
        elif group_id is not None:
            group = q.groups.get(group_id)
            if group is None or not lockable(txn, q, group.id) or not group.ready():
                return None
        else:
            group = q.peek_eligible()
            own = [g for qq, g in txn.locks.values() if qq is q and g.ready()]
            if own:
                best = min(own, key=lambda g: g.key() or (0, 0))
                if group is None or (best.key() or (0, 0)) <= (group.heap_key or (0, 0)):
                    group = best
            if group is None:
                return None
        if group.owner is not txn and len(txn.locks) >= self.transactions.max_locks:
            self.transactions.room(txn, 1)
        self.transactions.lock(txn, q, group.id)
        if want.get_group:
            return group, []
        messages = q.take(group, top, handle)
        for m in messages:
            m.delivery_count += 1
        if messages:
            txn.received.append((q, messages))
            if want.unfiltered:
                # the next RECEIVE likely takes the next eligible group: read it meanwhile
                self.clock.call_soon(lambda: self._read_ahead(q, top))
        return group, messages

    def _read_ahead(self, q: Queue, top: int) -> None:
        """Read the next eligible group's messages from disk, one turn of the event loop
        later (see the module's comment)."""
        if q.to_read_ahead(top) is not None:
            self.clock.call_soon(lambda: q.read_ahead(top))

    # ---- waiting -------------------------------------------------------------------------

    async def _wait(
        self, session: Session, txn: Transaction, want: Want, wait: float | None
    ) -> Taken | None:
        q = want.queue
        future: asyncio.Future[Taken | None] = self.clock.create_future()
        waiter = Waiter(txn, want, future)
        q.waiters.append(waiter)
        session.waiting = waiter
        # a message may have arrived between the first try and now: look once more
        self.kick(q)
        self.listener.waiting_changed(q)
        timer = (
            None
            if wait is None
            else self.clock.call_at(self.clock.time() + wait, lambda: _resolve(future, None))
        )
        try:
            return await future
        except asyncio.CancelledError:
            # the session went away; what was handed to it never reached it
            if (
                future.done()
                and not future.cancelled()
                and future.result() is not None
                and not txn.explicit
            ):
                self.give_back(txn)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            session.waiting = None
            if waiter in q.waiters:
                q.waiters.remove(waiter)
            self.listener.waiting_changed(q)

    def end_wait(self, session: Session) -> None:
        """A RECEIVE the session waits in returns nothing now (its reader must stop)."""
        waiter = session.waiting
        if isinstance(waiter, Waiter) and not waiter.want.get_group:
            _resolve(waiter.future, None)

    def kick(self, queue: Queue) -> None:
        if queue.waiters and not queue.kick_scheduled:
            queue.kick_scheduled = True
            self.clock.call_soon(lambda: self._serve_waiters(queue))

    def _serve_waiters(self, queue: Queue) -> None:
        queue.kick_scheduled = False
        if not queue.definition.status:
            return
        remaining: deque[Waiter] = deque()
        for waiter in queue.waiters:
            if waiter.future.done():
                continue
            got = self._try_take(waiter.txn, waiter.want)
            if got is None:
                remaining.append(waiter)
            else:
                waiter.future.set_result(got)
        queue.waiters = remaining

    def fail_waiters(self, queue: Queue) -> None:
        error = disabled_error(queue)
        for waiter in queue.waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        queue.waiters = deque()

    def end_waiters(self, queue: Queue) -> None:
        """Every RECEIVE waiting on `queue` returns nothing now, as if its timeout passed
        (the queue was dropped)."""
        for waiter in queue.waiters:
            _resolve(waiter.future, None)
        queue.waiters = deque()

    @staticmethod
    def waiting_sessions(queue: Queue) -> int:
        """Sessions blocked in RECEIVE or GET CONVERSATION GROUP without WHERE."""
        return sum(1 for w in queue.waiters if w.want.unfiltered and not w.future.done())

    # ---- at commit and rollback --------------------------------------------------------------

    def commit_received(self, txn: Transaction) -> None:
        """Received messages leave their queue (or stay, received, with RETENTION ON)."""
        for queue, messages in txn.received:
            queue.received += len(messages)
            if queue.definition.retention:
                for m in messages:
                    if self.endpoints.get(m.conversation_handle) is not None:
                        m.status = Status.RETAINED
                        queue.retain(m)
                        self.journal.set_message_status(m.queuing_order, int(Status.RETAINED))
                    else:
                        self.delivery.delete(queue, m)
            else:
                self.journal.delete_messages([m.queuing_order for m in messages])
                nbytes = 0
                for m in messages:
                    nbytes += m.size
                queue.messages -= len(messages)
                queue.bytes -= nbytes
            queue.rollback_streak = 0

    def restore_received(
        self, txn: Transaction, error: str, first: int = 0, failed: bool = True
    ) -> list[tuple[Queue, list[Message]]]:
        """Put received messages back, a failed delivery counted (and `error` kept) unless
        not `failed` (the broker refused the transaction for want of room, or it rolls
        back to a savepoint: they go back as they were); returns them by queue. `first`:
        only those of RECEIVEs from that one on (a rollback to a savepoint)."""
        by_queue: dict[str, tuple[Queue, list[Message]]] = {}
        for queue, messages in reversed(txn.received[first:]):
            alive = self._still_conversing(queue, messages)
            queue.restore(alive)
            queue.rolled_back += len(alive)
            for m in alive:
                if not failed:
                    m.delivery_count -= 1  # the count the store has
                    continue
                if error:
                    m.last_error = error
                    self.journal.set_message_extra(m.queuing_order, m.extra())
                self.journal.set_delivery_count(m.queuing_order, m.delivery_count)
            # spillable only once these updates are durable: a read before would undo them
            batch = self.journal.watermark()
            for m in alive:
                m.batch = batch
            by_queue.setdefault(queue.name, (queue, []))[1].extend(alive)
            self.kick(queue)
        del txn.received[first:]
        return list(by_queue.values())

    def give_back(self, txn: Transaction) -> None:
        """Undo takes that were never delivered: no rollback, no delivery counted."""
        for queue, messages in reversed(txn.received):
            for m in messages:
                m.delivery_count -= 1
            queue.restore(self._still_conversing(queue, messages))
            self.kick(queue)
        txn.received.clear()
        self.transactions.release(txn)

    def _still_conversing(self, queue: Queue, messages: list[Message]) -> list[Message]:
        """The messages whose conversation still exists; the others' rows are deleted."""
        alive = []
        for m in messages:
            conv = m.conversation
            if conv.dead_letters or self.endpoints.get(conv.handle) is not None:
                alive.append(m)
            else:
                self.delivery.delete(queue, m)
        return alive


def disabled_error(queue: Queue) -> BrokerError:
    reason = queue.disabled_reason
    why = f": {reason}" if reason else ""
    return BrokerError(
        ErrorCode.QUEUE_DISABLED,
        f"queue '{queue.name}' is disabled (STATUS = OFF){why}; "
        f"alter_queue('{queue.name}', status='ON') enables it",
    )


def _resolve(future: asyncio.Future[Taken | None], value: Taken | None) -> None:
    if not future.done():
        future.set_result(value)
