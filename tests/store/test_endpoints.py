"""Conversation endpoints: writes of one batch collapse to the last state; reads by
handle, conversation, group, service, timers."""

from __future__ import annotations

import uuid

import pytest

from ssb.broker._store import ENDPOINT_COLUMNS, HOT_ENDPOINT_COLUMNS, ManualStore

from .rows import endpoint, stored

Row = tuple[object, ...]


def _hot(row: Row) -> Row:
    """The hot update of `row`: its hot columns, then its conversation id and side."""
    named = dict(zip(ENDPOINT_COLUMNS, row, strict=True))
    return tuple(named[c] for c in (*HOT_ENDPOINT_COLUMNS, "conversation_id", "is_initiator"))


def _with(row: Row, **values: object) -> Row:
    named = dict(zip(ENDPOINT_COLUMNS, row, strict=True))
    named.update(values)
    return tuple(named[c] for c in ENDPOINT_COLUMNS)


def test_an_endpoint_reads_back_by_handle_and_by_conversation(storage: ManualStore) -> None:
    handle, conversation = uuid.uuid4(), uuid.uuid4()
    row = endpoint(handle, conversation, far_handle=uuid.uuid4(), timer_at=5.0)
    target = endpoint(uuid.uuid4(), conversation, is_initiator=0)  # the other side
    storage.insert_endpoint(row)
    storage.insert_endpoint(target)
    assert storage.read_endpoint(handle) is None  # not committed yet
    storage.flush()
    assert storage.read_endpoint(handle) == stored(row)
    assert storage.read_endpoint_by_conversation(conversation, True) == stored(row)
    assert storage.read_endpoint_by_conversation(conversation, False) == stored(target)
    assert storage.read_endpoint(uuid.uuid4()) is None
    assert storage.count_rows("endpoints") == 2


def test_updates_write_the_whole_state_or_the_hot_columns(storage: ManualStore) -> None:
    handle, conversation = uuid.uuid4(), uuid.uuid4()
    row = endpoint(handle, conversation)
    storage.insert_endpoint(row)
    storage.flush()
    full = _with(row, service="s2", send_seq=4, timer_at=9.0)
    storage.update_endpoint(full)
    storage.flush()
    assert storage.read_endpoint(handle) == stored(full)
    hot = _with(full, state="CLOSED", receive_seq=7, service="ignored")
    storage.update_endpoint_hot(_hot(hot))
    storage.flush()
    assert storage.read_endpoint(handle) == stored(_with(hot, service="s2"))


def test_an_endpoint_written_many_times_in_a_batch_ends_in_its_last_state(
    storage: ManualStore,
) -> None:
    new, old, gone = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    older = endpoint(old, uuid.uuid4())
    storage.insert_endpoint(older)
    storage.flush()
    written = storage.rows_written
    first = endpoint(new, uuid.uuid4())
    storage.insert_endpoint(first)
    storage.update_endpoint(_with(first, send_seq=1))
    storage.update_endpoint(_with(first, send_seq=2))  # inserted with this state
    storage.insert_endpoint(endpoint(gone, uuid.uuid4()))
    storage.delete_endpoint(gone)  # inserted and deleted: never written
    storage.update_endpoint(_with(older, send_seq=1))
    storage.update_endpoint(_with(older, send_seq=3))
    storage.update_endpoint_hot(_hot(_with(older, send_seq=4)))  # after them
    storage.flush()
    assert storage.rows_written - written == 3  # one insert, one update, one hot update
    assert storage.read_endpoint(new) == stored(_with(first, send_seq=2))
    assert storage.read_endpoint(gone) is None
    latest = storage.read_endpoint(old)
    assert latest is not None and latest[ENDPOINT_COLUMNS.index("send_seq")] == 4
    storage.update_endpoint(_with(older, send_seq=5))
    storage.delete_endpoint(old)  # the update is dropped, the row deleted
    storage.flush()
    assert storage.read_endpoint(old) is None


def test_endpoints_are_found_by_group_service_and_contract_in_handle_order(
    storage: ManualStore,
) -> None:
    group = uuid.uuid4()
    rows = [
        endpoint(uuid.uuid4(), uuid.uuid4(), group_id=group, service="a", contract="c1"),
        endpoint(uuid.uuid4(), uuid.uuid4(), group_id=group, service="b", contract="c1"),
        endpoint(uuid.uuid4(), uuid.uuid4(), service="a", contract="c2"),
        endpoint(uuid.uuid4(), uuid.uuid4(), service="a", contract="c1"),
    ]
    for row in rows:
        storage.insert_endpoint(row)
    storage.flush()
    by_handle = sorted(rows, key=lambda r: r[0].bytes)

    def handles(found: list[Row]) -> list[bytes]:
        return [bytes(r[0]) for r in found]

    def expect(chosen: list[Row]) -> list[bytes]:
        return [r[0].bytes for r in sorted(chosen, key=lambda r: r[0].bytes)]

    assert handles(storage.read_endpoints(limit=10)) == expect(rows)
    assert handles(storage.read_endpoints(group_id=group, limit=10)) == expect(rows[:2])
    assert handles(storage.read_endpoints(service="a", contract="c1", limit=10)) == expect(
        [rows[0], rows[3]]
    )
    assert handles(storage.read_endpoints(limit=2)) == expect(by_handle[:2])
    after = by_handle[1][0]
    assert handles(storage.read_endpoints(after=after, limit=10)) == expect(by_handle[2:])
    groups = storage.read_groups(10)
    assert len(groups) == 3
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)
    assert (group.bytes, "a", 2) in [tuple(g) for g in groups]
    assert len(storage.read_groups(2)) == 2


def test_due_timers_and_lifetimes_are_found_by_time(storage: ManualStore) -> None:
    timer, lifetime, both, neither = (uuid.uuid4() for _ in range(4))
    storage.insert_endpoint(endpoint(timer, uuid.uuid4(), timer_at=10.0))
    storage.insert_endpoint(endpoint(lifetime, uuid.uuid4(), lifetime_expiry=20.0))
    storage.insert_endpoint(endpoint(both, uuid.uuid4(), timer_at=15.0, lifetime_expiry=25.0))
    storage.insert_endpoint(endpoint(neither, uuid.uuid4()))
    storage.flush()

    def due(after: float | None, until: float) -> list[tuple[bytes, object, object]]:
        return sorted((bytes(h), t, lt) for h, t, lt in storage.read_due_endpoints(after, until))

    assert due(None, 9.0) == []
    assert due(None, 10.0) == [(timer.bytes, 10.0, None)]
    assert due(10.0, 20.0) == sorted([(lifetime.bytes, None, 20.0), (both.bytes, 15.0, 25.0)])
    assert due(None, 30.0) == sorted(
        [
            (timer.bytes, 10.0, None),
            (lifetime.bytes, None, 20.0),
            (both.bytes, 15.0, 25.0),
            (both.bytes, 15.0, 25.0),  # once for its timer, once for its lifetime
        ]
    )


def test_only_some_tables_are_counted(storage: ManualStore) -> None:
    assert [storage.count_rows(t) for t in ("endpoints", "transmission_queue", "messages")] == [
        0,
        0,
        0,
    ]
    with pytest.raises(ValueError):
        storage.count_rows("logins")
