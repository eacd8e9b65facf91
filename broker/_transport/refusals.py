"""Refusals in the log: a line per dialog direction at most every REFUSAL_LOG_EVERY seconds,
so that a peer that keeps sending what this broker refuses cannot flood the log; and
`SaidOnce`, a line per topic until the topic is resolved (why messages wait, what a
broker cannot answer), however often it comes up."""

from __future__ import annotations

import logging
import uuid
from typing import Final

from ssb.protocol import Direction

from .ports import Clock

log = logging.getLogger("ssb.transport")

REFUSAL_LOG_EVERY: Final = 60.0  # seconds between log lines about one refused direction
MAX_REMEMBERED: Final = 10_000  # directions (topics) remembered; past it, all are forgotten


class RefusalLog:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._logged: dict[tuple[uuid.UUID, bool], float] = {}

    def __call__(
        self,
        key: tuple[uuid.UUID, Direction],
        text: str,
        *args: object,
        level: int = logging.WARNING,
    ) -> None:
        """Log `text % args` about direction `key`, unless a line about it went lately."""
        now = self.clock.time()
        direction = (key[0], key[1] is Direction.FROM_INITIATOR)
        if now - self._logged.get(direction, -REFUSAL_LOG_EVERY) >= REFUSAL_LOG_EVERY:
            self._logged[direction] = now
            if len(self._logged) > MAX_REMEMBERED:
                self._logged.clear()
            log.log(level, text, *args)


class SaidOnce:
    """A warning per topic, once, until `resolved(topic)`."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def __call__(self, topic: str, text: str, *args: object) -> None:
        if topic not in self._said:
            if len(self._said) >= MAX_REMEMBERED:
                self._said.clear()
            self._said.add(topic)
            log.warning(text, *args)

    def resolved(self, topic: str) -> None:
        """Say it again when it comes up again."""
        self._said.discard(topic)
