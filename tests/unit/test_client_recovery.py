"""The client's settling rules alone: what a lost answer turns into, with scripted answers."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ssb.client import (
    AnswerLostError,
    OutcomeUnknownError,
    TransactionRolledBackError,
)
from ssb.client import _calls as calls
from ssb.client._recovery import Sent, Tracker, uuid7


def _settle(tracker: Tracker, sent: Sent, broker: Callable[[Sent], Any]) -> tuple[Any, list[Sent]]:
    """Run `settle`, answering each request it makes with `broker`; returns (result, asked)."""
    asked: list[Sent] = []
    settling = tracker.settle(sent, sent.at + 1.0)
    answer: Any = None
    while True:
        try:
            step = settling.send(answer)
        except StopIteration as done:
            return done.value, asked
        asked.append(step)
        answer = broker(step)


def _outcome(value: str) -> Callable[[Sent], Any]:
    def broker(step: Sent) -> Any:
        if step.call.operation == "transaction_outcome":
            return (value, "why")
        return None

    return broker


def test_uuid7_is_time_ordered_and_versioned() -> None:
    first, second = uuid7(1000.0), uuid7(1000.002)
    assert first.version == 7 and first.variant == uuid.RFC_4122
    assert first < second


def test_uuid7_is_not_repeated_by_a_seeded_random_or_a_forked_child() -> None:
    """Two clients' ids never agree: the program's random.seed() is not theirs, and a
    forked child draws other bits than its parent at the same millisecond."""
    random.seed(7)
    first = uuid7(1000.0)
    random.seed(7)
    assert uuid7(1000.0) != first
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its id to the parent, then out
        os.write(write, uuid7(1000.0).bytes)
        os._exit(0)
    os.close(write)
    theirs = uuid.UUID(bytes=os.read(read, 16))
    os.close(read)
    os.waitpid(child, 0)
    assert theirs != uuid7(1000.0)


def test_statements_are_named_outside_a_transaction_only() -> None:
    tracker = Tracker()
    send = tracker.prepare(calls.send(uuid.uuid4(), "DEFAULT", b"x"), 0.0)
    assert send is not None and send.name is not None and send.call.arguments["txn"] == send.name
    view = tracker.prepare(calls.view("queues"), 0.0)
    assert view is not None and view.name is None and "txn" not in view.call.arguments
    begin = tracker.prepare(calls.begin_transaction(), 0.0)
    assert begin is not None and begin.call.arguments["txn_id"] == tracker.txn.id  # type: ignore[union-attr]
    inside = tracker.prepare(calls.send(uuid.uuid4(), "DEFAULT", b"x"), 0.0)
    assert inside is not None and inside.name is None and "txn" not in inside.call.arguments


def test_a_lost_open_transaction_is_rolled_back_until_the_application_rolls_it_back() -> None:
    tracker = Tracker()
    begin = tracker.prepare(calls.begin_transaction(), 0.0)
    assert begin is not None
    tracker.answered(begin, True, None)
    send = tracker.prepare(calls.send(uuid.uuid4(), "DEFAULT", b"x"), 0.0)
    assert send is not None
    tracker.lost("cut", [send])
    with pytest.raises(TransactionRolledBackError, match="rolled it back"):
        _settle(tracker, send, _outcome("committed"))
    with pytest.raises(TransactionRolledBackError):
        tracker.prepare(calls.receive("Q"), 1.0)
    assert tracker.prepare(calls.rollback(), 1.0) is None  # answered here
    assert tracker.txn is None
    again = tracker.prepare(calls.begin_transaction(), 1.0)
    assert again is not None and again.call.arguments["txn_id"] != begin.call.arguments["txn_id"]


def test_a_lost_begin_alone_is_begun_again_under_a_new_id() -> None:
    tracker = Tracker()
    begin = tracker.prepare(calls.begin_transaction(), 0.0)
    assert begin is not None
    tracker.lost("cut", [begin])
    _, asked = _settle(tracker, begin, _outcome("rolled_back"))
    assert [s.call.operation for s in asked] == ["begin_transaction"]
    assert asked[0].call.arguments["txn_id"] != begin.call.arguments["txn_id"]
    assert tracker.txn is not None and tracker.txn.id == asked[0].call.arguments["txn_id"]


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ("committed", None),
        ("rolled_back", TransactionRolledBackError),
        ("unknown", OutcomeUnknownError),
    ],
)
def test_a_lost_commit_is_settled_by_its_outcome(outcome: str, expected: Any) -> None:
    tracker = Tracker()
    begin = tracker.prepare(calls.begin_transaction(), 0.0)
    assert begin is not None
    tracker.answered(begin, True, None)
    commit = tracker.prepare(calls.commit(), 0.0)
    assert commit is not None
    tracker.lost("cut", [commit])
    if expected is None:
        result, asked = _settle(tracker, commit, _outcome(outcome))
        assert result is None
        assert asked[0].call.arguments["txn_id"] == begin.call.arguments["txn_id"]
        assert tracker.settled == {"commit committed": 1}
    else:
        with pytest.raises(expected):
            _settle(tracker, commit, _outcome(outcome))


def test_a_lost_statement_is_sent_again_only_when_it_was_not_applied() -> None:
    tracker = Tracker()
    send = tracker.prepare(calls.send(uuid.uuid4(), "DEFAULT", b"x"), 0.0)
    assert send is not None
    result, asked = _settle(tracker, send, _outcome("committed"))
    assert result is None and [s.call.operation for s in asked] == ["transaction_outcome"]
    result, asked = _settle(tracker, send, _outcome("rolled_back"))
    assert [s.call.operation for s in asked] == ["transaction_outcome", "send"]
    assert asked[1].name is not None and asked[1].name != send.name
    receive = tracker.prepare(calls.receive("Q"), 0.0)
    assert receive is not None
    with pytest.raises(AnswerLostError):  # applied, and what it returned is gone
        _settle(tracker, receive, _outcome("committed"))
