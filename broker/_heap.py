"""Giving an idle daemon's free memory back to the operating system.

A drained backlog leaves the process's heaps full of holes: Python's cycle collector
may not have run since the last large change, and the C allocator keeps freed blocks
for reuse instead of returning them. When the daemon has been idle for a while, and
again when the store has nothing left to tidy, it runs `collect()` (a full collection)
and then `trim()` (with glibc, `malloc_trim(0)`, which returns every free page it can;
elsewhere nothing).

The cycle collector's young generation is collected, by Python's default, every 700
net container allocations. A busy broker allocates a handful per message and keeps
many of them a while (queued messages, fragments in flight), so at the default it
collects every hundred or so messages and promotes what survives into the older
generations, which later collections walk again. `tune()` raises the young threshold
to YOUNG_THRESHOLD at start: the collector runs a few dozen times less often and the
cyclic garbage it leaves for longer is bounded by the same number of objects.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable
from typing import Final

YOUNG_THRESHOLD: Final = 20_000  # net container allocations between young collections


def _find_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _find_trim()


def tune() -> None:
    """Collect the young generation every YOUNG_THRESHOLD allocations (see above); the
    older generations keep Python's ratios."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def collect() -> None:
    """Free cyclic garbage (on the event loop: it needs the interpreter)."""
    gc.collect()


def trim() -> None:
    """Return free heap pages to the system where the C library can (glibc); it may take
    a while on a large heap, so the daemon runs it off the event loop."""
    if _TRIM is not None:
        _TRIM(0)
