"""Tools that work a broker from outside, through the public client only.

- `ssb.tools.diagnose`: `ssb diagnose`, which finds what keeps messages from flowing
  between brokers.
- `BrokerProcess`: a broker daemon as a child process on free ports, which can be stopped,
  killed (kill -9) and started again on the same data directory; `read_ready_line`, the
  wait for the line a command prints when it is ready.
- `DaemonPair`: two daemons of one broker on one PostgreSQL database, one serving and
  one standing by, whose active one can be killed or frozen (`fail_over`) and the
  takeover timed; `free_port`.
- `wait_until` and `wait_until_sync`: poll a condition with a deadline.

Tests, benchmarks and examples start their brokers and wait with these.
"""

from __future__ import annotations

from ._daemon import BrokerProcess, read_ready_line
from ._pair import DaemonPair
from ._polling import wait_until, wait_until_sync
from ._ports import free_port

__all__ = [
    "BrokerProcess",
    "DaemonPair",
    "free_port",
    "read_ready_line",
    "wait_until",
    "wait_until_sync",
]
