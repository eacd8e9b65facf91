"""The Spark side of ssb (activated readers as Spark tasks). Not built yet."""

from __future__ import annotations

__all__: list[str] = []
