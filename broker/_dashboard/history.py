"""Queue depths over time, for the dashboard's charts: a bounded history per queue,
drawn as an inline SVG polyline (server-side, no script)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final

HISTORY_POINTS: Final = 720  # samples kept per queue: an hour at the default 5 s a sample
MAX_CHARTED_QUEUES: Final = 256


class DepthHistory:
    """The ready depth of each queue at the last `points` samples, for at most
    `max_queues` queues (those seen first keep their place)."""

    def __init__(self, points: int = HISTORY_POINTS, max_queues: int = MAX_CHARTED_QUEUES) -> None:
        self.points = points
        self.max_queues = max_queues
        self.times: deque[float] = deque(maxlen=points)  # one time per sample, for all
        self.depths: dict[str, deque[int]] = {}

    def sample(self, now: float, depths: Mapping[str, int]) -> None:
        self.times.append(now)
        for gone in [name for name in self.depths if name not in depths]:
            del self.depths[gone]
        for name, depth in depths.items():
            ring = self.depths.get(name)
            if ring is None:
                if len(self.depths) >= self.max_queues:
                    continue
                ring = self.depths[name] = deque(maxlen=self.points)
            ring.append(depth)

    def series(self, name: str) -> list[tuple[float, int]] | None:
        """(time, depth) oldest first; None when this queue has no history kept."""
        ring = self.depths.get(name)
        if ring is None:
            return None
        times = list(self.times)[-len(ring) :]
        return list(zip(times, ring, strict=True))


def depth_chart(series: Sequence[tuple[float, int]], width: int = 640, height: int = 200) -> str:
    """The series as an inline SVG line chart (escaped, no script, no style attribute)."""
    if len(series) < 2:
        return '<p class="note">Not enough samples yet for a chart; reload in a while.</p>'
    pad = 40
    t0, t1 = series[0][0], series[-1][0]
    span = (t1 - t0) or 1.0
    top = max(1, max(depth for _, depth in series))
    plot_w, plot_h = width - 2 * pad, height - 2 * pad
    points = " ".join(
        f"{pad + (t - t0) / span * plot_w:.1f},{pad + plot_h - depth / top * plot_h:.1f}"
        for t, depth in series
    )
    bottom, right = pad + plot_h, pad + plot_w
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}"'
        f' height="{height}" viewBox="0 0 {width} {height}" role="img"'
        f' aria-label="messages ready over time">'
        f'<rect x="{pad}" y="{pad}" width="{plot_w}" height="{plot_h}" fill="none"'
        f' stroke="#999"/>'
        f'<text x="{pad - 4}" y="{pad + 4}" text-anchor="end">{top}</text>'
        f'<text x="{pad - 4}" y="{bottom + 4}" text-anchor="end">0</text>'
        f'<text x="{pad}" y="{bottom + 16}">{_clock_time(t0)}</text>'
        f'<text x="{right}" y="{bottom + 16}" text-anchor="end">{_clock_time(t1)} UTC</text>'
        f'<polyline class="depth" fill="none" stroke="#1f5fbf" stroke-width="2"'
        f' points="{points}"/></svg>'
    )


def _clock_time(when: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(when))
