"""Conversation priority assignment (CREATE BROKER PRIORITY).

An endpoint gets its level once, when it is created, from the broker priority that
matches it best; later priority changes never touch existing endpoints. A priority
names a contract, a local service and a remote service, each possibly ANY (None).
`PRECEDENCE` is Service Broker's match order: the first row for which some priority
matches exactly (named fields equal, the others ANY) wins; with no match the level
is 5. For an initiator endpoint the local service is the initiator service; for a
target endpoint it is the target service.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .catalog import BrokerPriority

DEFAULT_LEVEL: Final = 5

# (contract named, local service named, remote service named)
PRECEDENCE: Final = (
    (True, True, True),
    (True, True, False),
    (True, False, True),
    (True, False, False),
    (False, True, True),
    (False, True, False),
    (False, False, True),
    (False, False, False),
)


def assign_level(
    priorities: Iterable[BrokerPriority], contract: str, local_service: str, remote_service: str
) -> int:
    """The level for a new endpoint, by the precedence table."""
    by_shape: dict[tuple[bool, bool, bool], int] = {}
    for p in priorities:
        if p.contract is not None and p.contract != contract:
            continue
        if p.local_service is not None and p.local_service != local_service:
            continue
        if p.remote_service is not None and p.remote_service != remote_service:
            continue
        shape = (p.contract is not None, p.local_service is not None, p.remote_service is not None)
        by_shape.setdefault(shape, p.level)
    for shape in PRECEDENCE:
        if shape in by_shape:
            return by_shape[shape]
    return DEFAULT_LEVEL
