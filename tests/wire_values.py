"""Hypothesis strategies for the values the wire's msgpack codec carries, on the client
port and on the broker link alike: None, booleans, 64-bit integers (signed or not),
floats, strings, bytes and UUIDs (the codec's extension type), nested in lists and in
maps keyed by strings. The fuzz tests draw request arguments and frame fields from it."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def wire_values(
    *, text: int, items: int, keys: int, leaves: int, nan: bool = True
) -> st.SearchStrategy[Any]:
    """Scalars (strings of up to `text` characters, bytes of up to 40; floats with NaN
    unless `nan` is false) nested in lists of up to `items` values and maps of up to 4
    entries keyed by strings of up to `keys` characters: at most `leaves` scalars."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats(allow_nan=nan)
        | st.text(max_size=text)
        | st.binary(max_size=40)
        | st.uuids()
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=items)
            | st.dictionaries(st.text(max_size=keys), inner, max_size=4)
        ),
        max_leaves=leaves,
    )
