"""Two daemons of one broker sharing a PostgreSQL database: one serves, one stands by.

`DaemonPair(root, database, make)` starts two daemons (`make(data_dir)` builds each
`BrokerProcess`, so that a caller gives them its own settings) on fixed free ports of
127.0.0.1, each with a data directory of its own, the second one empty; the first to
take the broker's lease serves. `url` names both addresses (the client tries them in
turn), `active` and `standby` say which is which, and `fail_over(how)` kills (kill -9)
or freezes (SIGSTOP) the active one and returns the seconds until the standby printed
its ready line: the takeover time. `restart` starts a killed daemon again, as a standby.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ._daemon import BrokerProcess

TAKEOVER_TIMEOUT: Final = 60.0  # seconds a takeover may take before a run fails


class DaemonPair:
    """Two daemons of one broker (see the module's comment)."""

    def __init__(self, root: Path, database: str, make: Callable[[Path], BrokerProcess]) -> None:
        self.daemons: list[BrokerProcess] = []
        root.mkdir(parents=True, exist_ok=True)
        for name in ("a", "b"):  # (each keeps the ports its first start takes: free_port)
            daemon = make(root / name)
            daemon.store = database
            self.daemons.append(daemon)

    def start(self) -> DaemonPair:
        """Start the first daemon (it serves), then the second (it stands by)."""
        first, second = self.daemons
        first.start()
        if first.role != "active":
            raise RuntimeError(f"the first daemon did not serve; log:\n{first.log_text()[-3000:]}")
        second.start()
        if second.role != "standby":
            raise RuntimeError(f"the second daemon did not stand by: {second.role}")
        return self

    @property
    def active(self) -> BrokerProcess:
        return next(d for d in self.daemons if d.role == "active")

    @property
    def standby(self) -> BrokerProcess:
        return next(d for d in self.daemons if d.role == "standby")

    def url_for(self, user: str, password: str) -> str:
        """A login's URL naming both daemons' client ports."""
        one = self.daemons[0].url_for(user, password)
        head, _, _ = one.rpartition("@")
        ports = ",".join(f"127.0.0.1:{d.client_port}" for d in self.daemons)
        return f"{head}@{ports}"

    @property
    def url(self) -> str:
        """The admin URL naming both daemons (the admin password is the broker's)."""
        return self.url_for("admin", self.active.admin_password())

    def fail_over(self, how: str = "kill") -> float:
        """Kill ("kill": kill -9) or freeze ("freeze": SIGSTOP) the active daemon; return
        the seconds until the standby was serving."""
        old, new = self.active, self.standby
        started = time.monotonic()
        if how == "kill":
            old.kill()
        elif how == "freeze":
            old.freeze()
        else:
            raise ValueError(f"fail over by 'kill' or 'freeze', not {how!r}")
        old.role = "failed"
        new.wait_active(TAKEOVER_TIMEOUT)
        return time.monotonic() - started

    def restart(self) -> BrokerProcess:
        """Start the daemon that failed again: it stands by."""
        daemon = next(d for d in self.daemons if d.role not in ("active", "standby"))
        daemon.kill()
        daemon.start()
        return daemon

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.thaw()
            daemon.kill()
