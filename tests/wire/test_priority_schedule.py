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


def _large_sender(peer: DialogPeer, priority: int, sizes: list[int]) -> uuid.UUID:
    conv = _sender(peer, priority, 0)
    for seq, size in enumerate(sizes):
        peer.queue_message(conv, Direction.FROM_INITIATOR, seq, "T", bytes(size))
    return conv


def test_a_call_bounded_by_bytes_takes_what_fits_and_chooses_the_rest_later() -> None:
    """A writer asks for what its socket takes (`max_bytes`): nothing beyond it is chosen
    in advance, so a low-priority dialog whose wait reaches the bound goes next, even
    behind a long run of large high-priority messages."""
    bound = 2.0
    peer = DialogPeer(
        fragment_size=64 * 1024,
        starvation_bound=bound,
        retry=RetryPolicy(initial=1000.0, maximum=1000.0),
    )
    high = _large_sender(peer, 10, [200 * 1024] * 60)  # four fragments of 50 KiB each
    low = _sender(peer, 1, 1)
    first = peer.frames_to_send(0.0, max_bytes=64 * 1024)
    assert [(f.conversation_id, len(f.payload)) for f in first] == [(high, 50 * 1024)]
    two = peer.frames_to_send(0.0, max_bytes=100 * 1024)
    assert [f.conversation_id for f in two] == [high, high]  # 100 KiB: two fit
    one = peer.frames_to_send(0.0, max_bytes=1)  # the first frame goes whatever its size
    assert [f.conversation_id for f in one] == [high]
    assert peer.frames_to_send(1.9, max_bytes=64 * 1024)[0].conversation_id == high
    # the bound passed: the low dialog's message is the next frame the socket takes
    waited = peer.frames_to_send(bound, max_bytes=64 * 1024)
    assert [f.conversation_id for f in waited] == [low, high]  # 1 byte, then 50 KiB fit
    # unbounded, one call takes everything that is ready (the former behaviour)
    rest = peer.frames_to_send(bound, limit=1000)
    assert len(rest) == 60 * 4 - 6 and {f.conversation_id for f in rest} == {high}


def test_a_bundle_bounded_by_bytes_holds_what_fits() -> None:
    peer = DialogPeer(fragment_size=64 * 1024)
    peer.bundling = True
    conv = _sender(peer, 5, 0)
    sender = peer.sender(conv, Direction.FROM_INITIATOR)
    assert sender is not None
    sender.confirmed = True
    for seq in range(100):
        peer.queue_message(conv, Direction.FROM_INITIATOR, seq, "T", bytes(1000))
    (bundle,) = peer.frames_to_send(0.0, max_bytes=10_000)
    assert len(bundle.payloads) == 10
    (bundle,) = peer.frames_to_send(0.0, limit=1)
    assert len(bundle.payloads) == 65  # one fragment's worth


def test_a_dialogs_wait_counts_from_when_it_became_ready() -> None:
    """A peer quiet for a long time: a low-priority message queued now has not waited since
    the peer's last frames, and the high one queued with it goes first."""
    peer = DialogPeer(starvation_bound=2.0)
    peer.frames_to_send(100.0)  # the peer's last look, long ago
    high, low = _sender(peer, 10, 0), _sender(peer, 1, 0)
    for conv in (low, high):
        peer.queue_message(conv, Direction.FROM_INITIATOR, 0, "T", b"x", now=1000.0)
    assert [f.conversation_id for f in peer.frames_to_send(1000.0)] == [high, low]


def test_priorities_never_travel_on_the_wire() -> None:
    from dataclasses import fields

    assert not [f.name for f in fields(FragmentFrame) if "prior" in f.name]


def test_honor_broker_priority_off_transmits_everything_at_five() -> None:
    from ssb.broker._transport import transmission_priority

    assert [transmission_priority(level, True) for level in (1, 5, 10)] == [1, 5, 10]
    assert [transmission_priority(level, False) for level in (1, 5, 10)] == [5, 5, 5]
