"""Transmission order across dialogs: priority first, with starvation prevention."""

from __future__ import annotations

import uuid

from ssb.protocol import DialogPeer, Direction, Envelope, FragmentFrame, RetryPolicy

BROKER_A, BROKER_B = uuid.uuid4(), uuid.uuid4()


def _sender(peer: DialogPeer, priority: int, messages: int) -> uuid.UUID:
    conv = uuid.uuid4()
    envelope = Envelope("From", "To", "C", BROKER_A, BROKER_B)
    peer.open_sender(
        conv,
        Direction.FROM_INITIATOR,
        envelope,
        session_key=b"k" * 16,
        wrapped_session_key=b"w" * 32,
        priority=priority,
    )
    for seq in range(messages):
        peer.queue_message(conv, Direction.FROM_INITIATOR, seq, "T", b"x")
    return conv


def test_higher_priority_goes_first() -> None:
    peer = DialogPeer(starvation_bound=10.0)
    low = _sender(peer, 1, 3)
    high = _sender(peer, 10, 3)
    mid = _sender(peer, 5, 3)
    order = [f.conversation_id for f in peer.frames_to_send(0.0, limit=9)]
    assert order == [high] * 3 + [mid] * 3 + [low] * 3


def test_flood_at_ten_does_not_starve_level_one_beyond_the_bound() -> None:
    bound = 2.0
    # no acks come back in this test: keep retransmissions out of the picture
    peer = DialogPeer(starvation_bound=bound, retry=RetryPolicy(initial=1000.0, maximum=1000.0))
    _sender(peer, 1, 5)
    flood = _sender(peer, 10, 5000)
    now = 0.0
    low_sent_at: list[float] = []
    while now < 10.0:
        for frame in peer.frames_to_send(now, limit=1):
            if frame.conversation_id != flood:
                low_sent_at.append(now)
        now += 0.1
    # the low dialog waited at most the bound (plus one step) each time, and no more often
    assert low_sent_at, "level 1 starved"
    gaps = [b - a for a, b in zip([0.0, *low_sent_at], low_sent_at, strict=False)]
    assert all(gap <= bound + 0.1 + 1e-9 for gap in gaps)
    assert all(gap >= bound - 1e-9 for gap in gaps)


def test_priorities_never_travel_on_the_wire() -> None:
    from dataclasses import fields

    assert not [f.name for f in fields(FragmentFrame) if "prior" in f.name]


def test_honor_broker_priority_off_transmits_everything_at_five() -> None:
    from ssb.broker._transport import transmission_priority

    assert [transmission_priority(level, True) for level in (1, 5, 10)] == [1, 5, 10]
    assert [transmission_priority(level, False) for level in (1, 5, 10)] == [5, 5, 5]
