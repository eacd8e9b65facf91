"""Service queues in memory: conversation groups, their messages, and who may take them.

Theory of operation. A queue holds conversation groups; a group holds, per
conversation, the ready messages in arrival order (which is sequence order, since a
dialog delivers in order). A group is *eligible* when it has ready messages and no
transaction holds its lock. Eligible groups sit in a heap keyed by
(-priority, queuing order of the group's oldest ready message): the top is the
highest-priority group and, within a level, the one that has waited longest, so
choosing the next group for RECEIVE is O(log n) and equal levels are served fairly.

The heap is lazy: each group remembers the key of its one live entry; entries whose
key no longer matches are skipped when popped and swept when they outnumber live
groups. Adding a message behind others of the same conversation changes no key and
pushes nothing.
"""

from __future__ import annotations

import heapq
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ssb.protocol import pack

from ._catalog import QueueDef


@dataclass(slots=True, eq=False)
class Message:
    queuing_order: int
    queue: str
    conversation_handle: uuid.UUID
    conversation_group_id: uuid.UUID
    message_sequence_number: int
    service_name: str
    service_contract_name: str
    message_type_name: str
    validation: str
    message_body: bytes
    message_enqueue_time: float
    priority: int
    status: int = 1  # 1 ready, 0 received and retained
    delivery_count: int = 0  # deliveries so far; persisted when a receive rolls back
    parked_until: float | None = None  # poison policy "park": out of the queue until then
    parks: int = 0
    last_error: str = ""  # what the last reader that rolled back reported
    dead_letter_reason: str | None = None  # set on a message moved to a dead-letter queue
    origin_queue: str | None = None  # the queue a dead letter came from

    def extra(self) -> bytes | None:
        """What the store keeps beyond the plain columns (None for most messages)."""
        if (
            self.dead_letter_reason is None
            and self.parked_until is None
            and not self.parks
            and not self.last_error
        ):
            return None
        return pack(
            {
                "reason": self.dead_letter_reason,
                "origin": self.origin_queue,
                "group": self.conversation_group_id,
                "service": self.service_name,
                "contract": self.service_contract_name,
                "priority": self.priority,
                "parked_until": self.parked_until,
                "parks": self.parks,
                "error": self.last_error,
            }
        )

    def wire(self) -> list[Any]:
        """The RECEIVE row, in protocol MESSAGE_COLUMNS order."""
        return [
            self.status,
            self.priority,
            self.queuing_order,
            self.conversation_group_id,
            self.conversation_handle,
            self.message_sequence_number,
            self.service_name,
            self.service_contract_name,
            self.message_type_name,
            self.validation,
            self.message_body,
            self.message_enqueue_time,
            self.delivery_count,
            self.dead_letter_reason,
        ]

    def row(self) -> tuple[Any, ...]:
        """The store row (see _store.MESSAGE_COLUMNS)."""
        return (
            self.queuing_order,
            self.queue,
            self.conversation_handle,
            self.message_sequence_number,
            self.message_type_name,
            self.validation,
            self.message_body,
            self.message_enqueue_time,
            self.status,
            self.delivery_count,
            self.extra(),
        )


GroupKey = tuple[int, int]


class Group:
    """A conversation group: the unit of locking and of RECEIVE."""

    __slots__ = ("convs", "endpoints", "heap_key", "id", "lock_waiters", "owner")

    def __init__(self, group_id: uuid.UUID) -> None:
        self.id = group_id
        self.endpoints: set[uuid.UUID] = set()
        self.convs: dict[uuid.UUID, deque[Message]] = {}
        self.owner: object | None = None  # the Transaction holding the lock
        self.heap_key: GroupKey | None = None
        self.lock_waiters: list[Callable[[], None]] = []

    def key(self) -> GroupKey | None:
        best: GroupKey | None = None
        for conv in self.convs.values():
            head = conv[0]
            key = (-head.priority, head.queuing_order)
            if best is None or key < best:
                best = key
        return best

    def message_count(self) -> int:
        return sum(len(c) for c in self.convs.values())


class Queue:
    """One service queue's live state."""

    def __init__(self, definition: QueueDef) -> None:
        self.definition = definition
        self.groups: dict[uuid.UUID, Group] = {}
        self.ready = 0
        self.retained: dict[uuid.UUID, list[Message]] = {}
        self._heap: list[tuple[int, int, uuid.UUID]] = []
        self.waiters: deque[Any] = deque()
        self.kick_scheduled = False
        self.rollback_streak = 0
        self.disabled_reason = ""
        self.last_empty_rowset: float | None = None
        self.last_receive: float | None = None

    @property
    def name(self) -> str:
        return self.definition.name

    def group(self, group_id: uuid.UUID) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        return group

    # ---- eligibility -------------------------------------------------------

    def touch(self, group: Group) -> None:
        """Recompute the group's place in the heap after any change to it."""
        if group.owner is not None or not group.convs:
            group.heap_key = None
            return
        key = group.key()
        if key != group.heap_key:
            group.heap_key = key
            assert key is not None
            heapq.heappush(self._heap, (key[0], key[1], group.id))
            if len(self._heap) > 2 * len(self.groups) + 64:
                self._sweep()

    def _sweep(self) -> None:
        live = []
        for group in self.groups.values():
            if group.heap_key is not None:
                live.append((group.heap_key[0], group.heap_key[1], group.id))
        heapq.heapify(live)
        self._heap = live

    def peek_eligible(self) -> Group | None:
        heap = self._heap
        while heap:
            negprio, order, gid = heap[0]
            group = self.groups.get(gid)
            if group is not None and group.heap_key == (negprio, order):
                return group
            heapq.heappop(heap)
        return None

    # ---- messages ----------------------------------------------------------

    def add(self, message: Message) -> Group:
        group = self.group(message.conversation_group_id)
        conv = group.convs.get(message.conversation_handle)
        if conv:
            conv.append(message)
            self.ready += 1
            return group  # a message behind others changes no key
        group.convs[message.conversation_handle] = deque((message,))
        self.ready += 1
        self.touch(group)
        return group

    def take(self, group: Group, top: int | None, handle: uuid.UUID | None) -> list[Message]:
        """Remove up to `top` ready messages of `group` (of one conversation if given)."""
        if handle is not None:
            conv = group.convs.get(handle)
            order = [(handle, conv)] if conv else []
        else:
            order = sorted(
                group.convs.items(), key=lambda kv: (-kv[1][0].priority, kv[1][0].queuing_order)
            )
        taken: list[Message] = []
        limit = top if top is not None else 1 << 62
        for conv_handle, conv in order:
            assert conv is not None
            while conv and len(taken) < limit:
                taken.append(conv.popleft())
            if not conv:
                del group.convs[conv_handle]
            if len(taken) >= limit:
                break
        self.ready -= len(taken)
        self.touch(group)
        return taken

    def add_front(self, message: Message) -> Group:
        """Put one message at the head of its conversation (re-queue, end of a park)."""
        group = self.group(message.conversation_group_id)
        conv = group.convs.get(message.conversation_handle)
        if conv is None:
            conv = group.convs[message.conversation_handle] = deque()
        conv.appendleft(message)
        self.ready += 1
        self.touch(group)
        return group

    def remove(self, group: Group, message: Message) -> None:
        """Take one ready message out of its conversation (poison handling)."""
        conv = group.convs[message.conversation_handle]
        conv.remove(message)
        if not conv:
            del group.convs[message.conversation_handle]
        self.ready -= 1
        self.touch(group)

    def restore(self, group: Group, messages: list[Message]) -> None:
        """Put taken messages back exactly where they were (newest first)."""
        for message in reversed(messages):
            conv = group.convs.get(message.conversation_handle)
            if conv is None:
                conv = group.convs[message.conversation_handle] = deque()
            conv.appendleft(message)
        self.ready += len(messages)
        self.touch(group)

    def drop_conversation(self, group: Group, handle: uuid.UUID) -> list[Message]:
        """Remove every ready and retained message of one conversation."""
        removed = list(group.convs.pop(handle, ()))
        self.ready -= len(removed)
        removed += self.retained.pop(handle, [])
        self.touch(group)
        return removed

    def all_messages(self) -> list[Message]:
        """Every message in the queue (ready and retained), by queuing order."""
        found = [m for g in self.groups.values() for c in g.convs.values() for m in c]
        found += [m for kept in self.retained.values() for m in kept]
        found.sort(key=lambda m: m.queuing_order)
        return found
