"""The transport's dialogs with other brokers: rows per direction and side, and the
fragments held until their message is complete."""

from __future__ import annotations

import uuid

from ssb.broker._store import ManualStore

from .rows import stored


def _dialog(conversation: uuid.UUID, direction: int, side: str, next_seq: int = 0) -> tuple:
    return (conversation, direction, side, "peer", b"key", None, next_seq, b"envelope")


def _fragment(conversation: uuid.UUID, direction: int, seq: int, index: int) -> tuple:
    return (conversation, direction, seq, index, 3, "t", bytes([index]) * 5)


def test_dialog_rows_are_replaced_moved_on_and_deleted(storage: ManualStore) -> None:
    conversation = uuid.uuid4()
    storage.put_remote_dialog(_dialog(conversation, 0, "sender"))
    storage.put_remote_dialog(_dialog(conversation, 0, "receiver"))
    storage.put_remote_dialog(_dialog(conversation, 1, "sender"))
    storage.put_remote_dialog(_dialog(conversation, 0, "sender", 4))  # replaces the first
    storage.flush()
    dialogs, fragments = storage.load_remote()
    assert sorted(dialogs) == sorted(
        stored(d)
        for d in (
            _dialog(conversation, 0, "sender", 4),
            _dialog(conversation, 0, "receiver"),
            _dialog(conversation, 1, "sender"),
        )
    )
    assert fragments == []
    storage.set_remote_next_seq(conversation, 0, "receiver", 9)
    storage.set_remote_next_seq(conversation, 5, "receiver", 9)  # no such row: nothing
    storage.delete_remote_dialog(conversation, 1, "sender")
    storage.flush()
    dialogs, _ = storage.load_remote()
    assert sorted(dialogs) == sorted(
        stored(d)
        for d in (_dialog(conversation, 0, "sender", 4), _dialog(conversation, 0, "receiver", 9))
    )


def test_held_fragments_load_in_order_and_go_by_message_or_direction(
    storage: ManualStore,
) -> None:
    conversation = uuid.uuid4()
    held = [
        _fragment(conversation, direction, seq, index)
        for direction in (1, 0)
        for seq in (2, 1)
        for index in (1, 0)
    ]
    for fragment in held:
        storage.put_held_fragment(fragment)
    storage.put_held_fragment(held[0])  # again: replaces it
    storage.flush()
    _, fragments = storage.load_remote()
    assert fragments == sorted(stored(f) for f in held)
    storage.delete_held_message(conversation, 0, 1)
    storage.flush()
    _, fragments = storage.load_remote()
    assert [(f[1], f[2]) for f in fragments] == [(0, 2), (0, 2), (1, 1), (1, 1), (1, 2), (1, 2)]
    storage.delete_held_direction(conversation, 1)
    storage.flush()
    _, fragments = storage.load_remote()
    assert [(f[1], f[2], f[3]) for f in fragments] == [(0, 2, 0), (0, 2, 1)]
