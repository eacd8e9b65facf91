"""Pure rules of the core: validation, the endpoint state table, priority precedence."""

from __future__ import annotations

import pytest

from ssb.broker._core.catalog import BrokerPriority
from ssb.broker._core.conversations import TRANSITIONS, Endpoint, Event, State, TransitionError
from ssb.broker._core.priorities import PRECEDENCE, assign_level
from ssb.broker._core.validation import validate_body
from ssb.broker._errors import BrokerError


@pytest.mark.parametrize(
    ("validation", "body", "ok"),
    [
        ("NONE", b"\xff\x00 anything", True),
        ("EMPTY", b"", True),
        ("EMPTY", b" ", False),
        ("WELL_FORMED_XML", b"<a x='1'><b/>text</a>", True),
        ("WELL_FORMED_XML", b"<?xml version='1.0' encoding='utf-8'?><r/>", True),
        ("WELL_FORMED_XML", b"<a><b></a>", False),
        ("WELL_FORMED_XML", b"<a/><b/>", False),
        ("WELL_FORMED_XML", b"", False),
        ("VALID_JSON", b'{"k": [1, 2.5, null]}', True),
        ("VALID_JSON", b"[1,", False),
        ("VALID_JSON", b"\xff", False),
    ],
)
def test_validation(validation: str, body: bytes, ok: bool) -> None:
    if ok:
        validate_body("T", validation, body)
    else:
        with pytest.raises(BrokerError, match=validation):
            validate_body("T", validation, body)


def _endpoint(state: State) -> Endpoint:
    import uuid

    u = uuid.uuid4()
    return Endpoint(u, u, True, "s", "f", None, "c", u, "q", state=state)


def test_normal_lifecycle_through_the_table() -> None:
    ep = _endpoint(State.SO)
    assert ep.apply(Event.SENT) == State.CO
    assert ep.apply(Event.RECEIVED_MESSAGE) == State.CO
    assert ep.apply(Event.END) == State.DO
    assert ep.apply(Event.END_ACKED) == State.CD
    target = _endpoint(State.SI)
    assert target.apply(Event.RECEIVED_MESSAGE) == State.CO
    assert target.apply(Event.RECEIVED_END) == State.DI
    assert target.apply(Event.END) == State.CD


def test_every_missing_pair_raises() -> None:
    for state in State:
        for event in Event:
            ep = _endpoint(state)
            if (state, event) in TRANSITIONS:
                assert ep.apply(event) == TRANSITIONS[(state, event)]
            else:
                with pytest.raises(TransitionError):
                    ep.apply(event)
                assert ep.state == state


def test_closed_is_terminal() -> None:
    assert not [key for key in TRANSITIONS if key[0] == State.CD]


def _p(
    name: str, contract: str | None, local: str | None, remote: str | None, level: int
) -> BrokerPriority:
    return BrokerPriority(name, contract, local, remote, level)


def test_precedence_rows_in_order() -> None:
    # one priority per row shape, all matching; removing the best shows the next row wins
    shapes = {
        (True, True, True): 10,
        (True, True, False): 9,
        (True, False, True): 8,
        (True, False, False): 7,
        (False, True, True): 6,
        (False, True, False): 4,
        (False, False, True): 3,
        (False, False, False): 2,
    }
    priorities = [
        _p(f"p{level}", "C" if c else None, "L" if loc else None, "R" if r else None, level)
        for (c, loc, r), level in shapes.items()
    ]
    assert [s for s in PRECEDENCE] == list(shapes)
    for shape in PRECEDENCE:
        assert assign_level(priorities, "C", "L", "R") == shapes[shape]
        priorities = [p for p in priorities if p.level != shapes[shape]]
    assert assign_level(priorities, "C", "L", "R") == 5


def test_non_matching_priorities_are_ignored() -> None:
    priorities = [_p("a", "Other", None, None, 9), _p("b", None, "L", "Elsewhere", 8)]
    assert assign_level(priorities, "C", "L", "R") == 5
