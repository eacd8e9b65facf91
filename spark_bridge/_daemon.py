"""PySpark's worker daemon with the activated reader already imported.

Theory of operation. An executor runs Python tasks in worker processes that
PySpark's daemon forks on demand; the stock daemon imports nothing of the task's
before it forks, so every new worker imports `pyspark.worker`, the client and the
bridge itself when its first reader arrives (a quarter of a second of CPU each, more
on a busy machine), and the readers of one activation start staggered by that much.
Run as the executors' daemon (`spark.python.daemon.module`, in `EXECUTOR_SETTINGS`),
this module imports them once in the daemon, then hands over to PySpark's own
daemon loop: each forked worker starts with them loaded.

The stock daemon imports after the fork because some libraries start threads when
imported, and a thread does not survive a fork. What is imported here starts none;
the daemon checks that before it forks anything.

A reused worker runs a full garbage collection after every task; over everything
imported here that costs 10-25 ms of CPU a task. The daemon freezes what it holds
before forking (`gc.freeze`), so those collections walk only what a worker made
itself, and the pages the daemon shares with its workers stay shared.
"""

from __future__ import annotations

import gc
import threading

import pyspark.worker  # noqa: F401  (the workers' main loop: loaded once, here)
from pyspark.daemon import manager

from ._reader import EXECUTOR_SETTINGS  # with it, what an activated reader runs

MODULE = EXECUTOR_SETTINGS["spark.python.daemon.module"]


def main() -> None:
    """PySpark's daemon loop, once the imports above are known to have left one thread,
    with what they made frozen out of the workers' collections."""
    if threading.active_count() != 1:
        raise SystemExit(
            f"{MODULE}: importing the reader started threads, and a forked worker would lose"
            " them; leave spark.python.daemon.module unset"
        )
    gc.collect()
    gc.freeze()
    manager()


if __name__ == "__main__":
    main()
