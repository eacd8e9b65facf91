"""A config section's settings are checked from their own declarations (`setting`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from ssb.broker._config import ConfigError, checked_section, setting


@dataclass(frozen=True)
class _Section:
    interval: float = setting(5.0, 0.5, 60.0)
    count: int = setting(3, 1, 10)
    enabled: bool = True


@pytest.mark.parametrize(
    ("given", "complaint"),
    [
        ({"interval": 0.1}, "[s] interval must be a number from 0.5 to 60, not 0.1"),
        ({"interval": float("inf")}, "[s] interval must be a number from 0.5 to 60, not inf"),
        ({"count": 2.0}, "[s] count must be a whole number from 1 to 10, not 2.0"),
        ({"count": True}, "[s] count must be a whole number from 1 to 10, not True"),
        ({"enabled": 1}, "[s] enabled must be true or false, not 1"),
        ({"cuont": 2}, "unknown [s] setting(s) cuont; known: count, enabled, interval"),
    ],
)
def test_a_value_out_of_its_declared_range_is_refused_saying_what_is_allowed(
    given: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        checked_section("s", given, _Section)
    assert str(refused.value) == complaint


def test_values_within_their_ranges_make_the_section() -> None:
    values = checked_section("s", {"interval": 0.5, "count": 10, "enabled": False}, _Section)
    assert _Section(**values) == _Section(0.5, 10, False)
    assert _Section() == _Section(5.0, 3, True)  # the defaults setting() declared


@dataclass(frozen=True)
class _Unchecked:
    paths: tuple[str, ...] = ()


def test_a_setting_that_says_neither_its_range_nor_that_it_is_a_switch_is_our_mistake() -> None:
    with pytest.raises(TypeError, match="paths is neither"):
        checked_section("s", {}, _Unchecked)
    assert checked_section("s", {"paths": ["a"]}, _Unchecked, elsewhere=("paths",)) == {
        "paths": ["a"]
    }
