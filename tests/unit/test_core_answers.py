"""What an answer shows decides what it waits for.

No daemon: the engine on an in-memory store whose batches become durable only at
`flush()`. The client port sends an answer once everything applied before it is durable,
unless the operation said which store batch its answer shows at most
(`Session.answer_after`): BEGIN TRANSACTION shows nothing stored, a RECEIVE in a
transaction shows its rows only. A consumer then does not wait for the producers'
writes of the moment, and still never sees a message a crash could take back.
"""

from __future__ import annotations

from .core_harness import BODY, Core


def test_a_receive_in_a_transaction_waits_only_for_the_rows_it_shows() -> None:
    core = Core()
    core.services()
    core.op("send", core.dialog(), "DEFAULT", [b"stored"])
    core.flush()
    core.op("send", core.dialog(), "DEFAULT", [b"pending"])  # another producer, not durable
    store, session = core.store, core.session
    assert store.watermark() > store.durable

    core.op("begin_transaction")
    assert session.answer_after == 0
    rows = core.op("receive", "Target", top=10)
    assert [r[BODY] for r in rows] == [b"stored"]
    assert session.answer_after is not None and session.answer_after <= store.durable

    rows = core.op("receive", "Target", top=10)  # the other conversation's group
    assert [r[BODY] for r in rows] == [b"pending"]
    assert session.answer_after == store.watermark()  # shown only once durable
    core.op("commit")


def test_a_receive_outside_a_transaction_waits_for_everything() -> None:
    core = Core()
    core.services()
    core.op("send", core.dialog(), "DEFAULT", [b"stored"])
    core.flush()
    session = core.session
    session.answer_after = None
    rows = core.op("receive", "Target", top=10)  # deletes as it answers: a write
    assert [r[BODY] for r in rows] == [b"stored"]
    assert session.answer_after is None
