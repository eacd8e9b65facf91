"""A daemon waiting as a standby: until it takes the broker's lease, it serves nothing.

Theory of operation. A daemon whose store is a PostgreSQL database first joins the
broker's lease (see `_lease`), which also makes the database's schema and the broker's
instance id if it is the first. Until it takes the lease it is a standby: its client and
broker ports stay closed, it says so on one line of its standard output
(`ssb standby instance=... node=...`), in the log and to systemd (ready, with the
status "standby"), and, when the config gives an HTTP port, it answers there:
`/healthz` (and `/healthz/ready`) 503 with the role "standby" (an orchestrator routes
no client to it), `/healthz/live` 200 (it is alive: nothing to restart), `/metrics` the
role and who holds the lease, to loopback callers only (the port speaks plain HTTP,
the client port's certificate being the active daemon's: no login or token crosses
it). Nothing of the broker's state is read. Once the lease is
taken this port closes, and the daemon starts as any other does, on the same HTTP port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from . import _systemd
from ._config import Config
from ._lease import LeaseKeeper, Role, Timing, new_node, node_name
from ._store.lease import DatabaseLease

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ._http import HttpServer

log = logging.getLogger("ssb.daemon")


class StandbyFigures:
    """/metrics of a standby: its role and who holds the lease."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self.keeper = keeper

    def collect(self) -> Iterator[Metric]:
        from ._metrics import role_figures

        yield from role_figures(self.keeper)

    def describe(self) -> Iterator[Metric]:
        return iter(())


async def open_lease(config: Config) -> LeaseKeeper:
    """This daemon's side of the lease of the database `config.store` names, as a standby
    (the database's schema and the broker's instance id made if need be).

    Raises:
        StoreUnavailable: the database cannot be used (the message says why).
    """
    assert config.store is not None
    timing = Timing(config.failover_timeout)
    node = new_node()
    address = f"{config.host}:{config.client_port}"
    lease = await asyncio.get_running_loop().run_in_executor(
        None, DatabaseLease, config.store, node, node_name(config.host), timing.duration
    )
    return LeaseKeeper(lease, timing, address)


async def stand_by(
    config: Config, keeper: LeaseKeeper, stopping: asyncio.Event
) -> tuple[bool, int | None]:
    """Wait as a standby until `keeper` takes the lease (True) or `stopping` is set
    (False); the HTTP port this standby bound, if any (the active daemon binds it again)."""
    instance = keeper.lease.instance
    if await keeper.try_take():  # no daemon serves: no need to stand by
        return True, config.http_port
    http: HttpServer | None = None
    port = config.http_port
    if port is not None:
        http = await _standby_http(config, keeper)
        port = None if http.address is None else http.address[1]
    shown = (
        "" if http is None or http.address is None else f" http=http://{config.http_host}:{port}"
    )
    print(f"ssb standby instance={instance} node={keeper.node}{shown}", flush=True)
    log.info(
        "standby for broker %s (node %s): waiting to take the lease of %s; client and broker"
        " ports stay closed meanwhile",
        instance,
        keeper.node,
        keeper.lease.where,
    )
    _systemd.notify(f"READY=1\nSTATUS=standby for broker {instance}: ports closed")
    try:
        taken = await keeper.wait(stopping)
    finally:
        if http is not None:
            await http.close()
    if taken:
        _systemd.notify("STATUS=taking over: recovering the broker's state")
    return taken, port


async def _standby_http(config: Config, keeper: LeaseKeeper) -> HttpServer:
    from ._http import HttpServer
    from ._metrics import StandbyMetrics

    async def no_login(user: str, password: str, address: str) -> str | None:
        return "a standby has no logins: read /metrics from loopback or with http_token"

    def readiness() -> str:
        holder = keeper.holder
        served = f" by daemon {holder.node}" if holder is not None and holder.node else ""
        return f"standby: the broker is served{served}; this daemon waits to take over"

    # plain HTTP (the client port's certificate is the active daemon's): the bearer token
    # would cross in clear, so /metrics answers loopback callers only
    http = HttpServer(
        StandbyMetrics(StandbyFigures(keeper)),
        readiness,
        no_login,
        lambda user: False,
        None,
        role=lambda: keeper.role.value if keeper.role is not Role.LOST else "stopping",
    )
    await http.start(config.http_host, config.http_port or 0, None)
    return http
