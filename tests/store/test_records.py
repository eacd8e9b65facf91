"""The catalog and meta values, transaction outcomes, poison incidents and the
scheduler's execution log."""

from __future__ import annotations

import uuid

from ssb.broker._store import EXECUTION_LOG_COLUMNS, POISON_COLUMNS, ManualStore

from .rows import stored


def test_catalog_objects_and_meta_values_are_replaced_and_deleted(storage: ManualStore) -> None:
    storage.put_catalog("queue", "Q", "{1}")
    storage.put_catalog("service", "Q", "{2}")  # another kind, the same name
    storage.put_catalog("queue", "Q", "{3}")
    storage.put_meta("a", "1")
    storage.put_meta("a", "2")
    storage.flush()
    assert sorted(storage.load_catalog()) == [("queue", "Q", "{3}"), ("service", "Q", "{2}")]
    assert storage.load_meta() == {"a": "2"}
    storage.delete_catalog("queue", "Q")
    storage.delete_catalog("queue", "nothing")
    storage.flush()
    assert storage.load_catalog() == [("service", "Q", "{2}")]


def test_outcome_records_are_read_by_number_and_pruned_oldest_first(
    storage: ManualStore,
) -> None:
    assert storage.outcome_span() is None
    for seq in range(1, 6):
        storage.insert_outcomes(seq, 100.0 + seq, seq, bytes([seq]) * seq)
    storage.flush()
    assert storage.outcome_span() == (1, 5, 15)
    assert [tuple(r) for r in storage.read_outcome_batches(3)] == [
        (5, 105.0, bytes([5]) * 5),
        (4, 104.0, bytes([4]) * 4),
        (3, 103.0, bytes([3]) * 3),
    ]
    assert storage.outcome_batch_heads(2, 2) == [(2, 102.0, 2), (3, 103.0, 3)]
    assert storage.outcome_at(4) == 104.0
    storage.delete_outcomes_upto(3)
    storage.flush()
    assert storage.outcome_at(3) is None
    assert storage.outcome_span() == (4, 5, 9)
    assert storage.outcome_batch_heads(0, 10) == [(4, 104.0, 4), (5, 105.0, 5)]


def test_poison_incidents_read_newest_last_without_their_bodies(storage: ManualStore) -> None:
    handle = uuid.uuid4()
    incidents = [
        (ident, "q", handle, ident * 10, 5, "disable", 100.0 + ident, "boom", b"body")
        for ident in range(1, 6)
    ]
    assert len(incidents[0]) == len(POISON_COLUMNS)
    for incident in incidents:
        storage.insert_poison(incident)
    storage.flush()
    assert storage.read_poison(3) == [stored(i[:-1]) for i in incidents[2:]]
    assert storage.read_poison(10) == [stored(i[:-1]) for i in incidents]
    assert storage.max_ids() == (0, 0, 5)


def test_the_execution_log_is_replaced_by_id_pruned_and_read_newest_last(
    storage: ManualStore,
) -> None:
    def entry(log_id: int, error: str | None = None) -> tuple:
        return (log_id, 1, None, "task", 1.0, 2.0, None, 7, 42, 3, error)

    assert len(entry(1)) == len(EXECUTION_LOG_COLUMNS)
    for log_id in range(1, 6):
        storage.put_execution_log(entry(log_id))
    storage.put_execution_log(entry(5, "failed"))  # the run ended: its row replaced
    storage.flush()
    assert storage.execution_log(2) == [entry(4), entry(5, "failed")]
    storage.delete_execution_log_upto(3)
    storage.flush()
    assert storage.execution_log(10) == [entry(4), entry(5, "failed")]
