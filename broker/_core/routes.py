"""Routes: where a service lives, by Service Broker's matching rules.

The most specific live route wins: one naming the service and the broker instance,
then one naming the service, then a TRANSPORT route. A service of this broker with no
route, or with a LOCAL one, is local. Answers are cached until a route changes or the
next route lifetime ends, so a SEND pays for a dictionary lookup, not a scan. A route
may carry a mirror address (Service Broker's MIRROR_ADDRESS): `mirrors` maps each live
route's address to it, for the transport to try when the address does not answer.
"""

from __future__ import annotations

from typing import Final

from .catalog import Catalog, Route
from .ports import Clock

_CACHE_LIMIT: Final = 10_000


class Routes:
    def __init__(self, catalog: Catalog, clock: Clock, instance_id: str) -> None:
        self.catalog = catalog
        self.clock = clock
        self.instance_id = instance_id
        self._cache: dict[tuple[str, object], tuple[Route | None, float]] = {}

    def changed(self) -> None:
        self._cache.clear()

    def find(self, service: str, broker_instance: object) -> Route | None:
        key = (service, broker_instance)
        now = self.clock.time()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        best: Route | None = None
        best_score = -1
        valid_until = float("inf")
        for route in self.catalog.routes.values():
            if route.expires is not None:
                if route.expires <= now:
                    continue
                valid_until = min(valid_until, route.expires)
            if route.address == "TRANSPORT":
                score = 0
            elif route.service_name != service:
                continue
            elif route.broker_instance is None:
                score = 1
            elif broker_instance is None or route.broker_instance == broker_instance:
                score = 2
            else:
                continue
            if score > best_score:
                best, best_score = route, score
        if len(self._cache) > _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = (best, valid_until)
        return best

    def mirrors(self) -> dict[str, str]:
        """The mirror address of each address of a live route that has one."""
        now = self.clock.time()
        return {
            route.address: route.mirror_address
            for route in self.catalog.routes.values()
            if route.mirror_address is not None and (route.expires is None or route.expires > now)
        }

    def is_local(self, service: str, broker_instance: object) -> bool:
        if broker_instance is not None and broker_instance != self.instance_id:
            return False
        if service not in self.catalog.services:
            return False
        route = self.find(service, broker_instance)
        return route is None or route.address == "LOCAL"
