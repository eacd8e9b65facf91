"""What a check finds: one `Problem`, said once however many checks find it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong: where, what, and what to do about it."""

    broker: str  # the broker's label (host:port of its URL)
    kind: str  # permission, service, route, certificate, contract, queue, activation, ...
    text: str
    fix: str
    # what it is about, when several checks may find the same thing in other words
    subject: str = field(default="", compare=False)


def unique_problems(problems: Iterable[Problem]) -> list[Problem]:
    """Each problem once: the first words found for each subject."""
    found: dict[tuple[str, str, str], Problem] = {}
    for p in problems:
        found.setdefault((p.broker, p.kind, p.subject or p.text), p)
    return list(found.values())
