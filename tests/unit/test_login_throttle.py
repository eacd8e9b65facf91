"""Failed-login throttling and password hashes, without a daemon (a fake clock)."""

from __future__ import annotations

from ssb.broker._logins import FailedLogins, ThrottleSettings, hash_password, verify_password


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failures_lock_a_login_and_address_until_the_window_passes() -> None:
    clock = _Clock()
    failures = FailedLogins(ThrottleSettings(window=60.0, per_login_address=3, per_login=5), clock)
    for _ in range(3):
        assert failures.wait("app", "10.0.0.1") == 0
        failures.failed("app", "10.0.0.1")
        clock.now += 1
    assert 55 < failures.wait("app", "10.0.0.1") <= 60  # from the oldest of the last 3
    assert failures.wait("app", "10.0.0.2") == 0  # the same login elsewhere
    assert failures.wait("worker", "10.0.0.1") == 0  # another login, same address
    clock.now += 58
    assert failures.wait("app", "10.0.0.1") == 0


def test_a_login_guessed_from_many_addresses_is_locked_everywhere() -> None:
    clock = _Clock()
    failures = FailedLogins(ThrottleSettings(window=60.0, per_login_address=3, per_login=5), clock)
    for i in range(5):
        failures.failed("admin", f"10.0.0.{i}")
    assert failures.wait("admin", "10.0.0.99") > 0
    assert failures.wait("other", "10.0.0.1") == 0


def test_hashes_are_salted_and_verify_only_their_password() -> None:
    first, second = hash_password("correct horse"), hash_password("correct horse")
    assert first != second and "correct horse" not in first
    assert verify_password("correct horse", first) and verify_password("correct horse", second)
    assert not verify_password("correct horsf", first)
    assert not verify_password("x", "not-a-hash")
