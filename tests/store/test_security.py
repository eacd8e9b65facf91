"""Logins, grants and owners."""

from __future__ import annotations

from ssb.broker._store import ManualStore


def test_logins_are_replaced_and_deleted(storage: ManualStore) -> None:
    storage.put_login(("admin", "hash1", 1.0))
    storage.put_login(("alice", "hash2", 2.0))
    storage.put_login(("admin", "hash3", 3.0))  # a new password
    storage.flush()
    assert sorted(storage.load_logins()) == [("admin", "hash3", 3.0), ("alice", "hash2", 2.0)]
    storage.delete_login("alice")
    storage.flush()
    assert storage.load_logins() == [("admin", "hash3", 3.0)]


def test_grants_and_owners_go_with_their_object_or_login(storage: ManualStore) -> None:
    storage.put_grant(("alice", "SEND", "service", "Orders"))
    storage.put_grant(("alice", "SEND", "service", "Orders"))  # once only
    storage.put_grant(("alice", "RECEIVE", "queue", "Q"))
    storage.put_grant(("bob", "RECEIVE", "queue", "Q"))
    storage.put_grant(("bob", "CONTROL", "", ""))  # on the broker itself
    storage.put_owner(("queue", "Q", "alice"))
    storage.put_owner(("service", "Orders", "alice"))
    storage.put_owner(("queue", "Q", "bob"))  # a new owner
    storage.flush()
    grants, owners = storage.load_permissions()
    assert sorted(grants) == [
        ("alice", "RECEIVE", "queue", "Q"),
        ("alice", "SEND", "service", "Orders"),
        ("bob", "CONTROL", "", ""),
        ("bob", "RECEIVE", "queue", "Q"),
    ]
    assert sorted(owners) == [("queue", "Q", "bob"), ("service", "Orders", "alice")]
    storage.forget_object("queue", "Q")
    storage.delete_grant(("bob", "CONTROL", "", ""))
    storage.delete_grant(("bob", "CONTROL", "queue", "Q"))  # no such grant: nothing
    storage.flush()
    grants, owners = storage.load_permissions()
    assert grants == [("alice", "SEND", "service", "Orders")]
    assert owners == [("service", "Orders", "alice")]
    storage.forget_login("alice")  # the grants go, what alice owns stays
    storage.flush()
    assert storage.load_permissions() == ([], [("service", "Orders", "alice")])
