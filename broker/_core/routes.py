"""Routes: where a service lives, by Service Broker's matching rules.

The most specific live route wins: one naming the service and the broker instance,
then one naming the service, then a TRANSPORT route. A service of this broker with no
route, or with a LOCAL one, is local. Answers are cached until a route changes or the
next route lifetime ends, so a SEND pays for a dictionary lookup, not a scan. A route
may carry a mirror address (Service Broker's MIRROR_ADDRESS): `mirrors` maps each live
route's address to it, for the transport to try when the address does not answer.

Local services, across databases (Service Broker's local route). Each database has
a service_broker_guid; `master`'s is the broker instance id other brokers know. A
message for a service of this broker goes to the database its broker instance names
(given at BEGIN DIALOG, in a LOCAL route, or learned when the target first answered);
without one, to the service of that name in the sending database, else in `master`,
else in the other databases by database id, the first found. A message from another
broker names this broker, not a database: its service is looked for the same way from
`master`. The answers are cached until a route, a service or a database changes.
"""

from __future__ import annotations

from typing import Final

from .catalog import Catalog, Route
from .names import DEFAULT_DATABASE, SEPARATOR, qualify
from .ports import Clock

_CACHE_LIMIT: Final = 10_000


class Routes:
    def __init__(self, catalog: Catalog, clock: Clock, instance_id: str) -> None:
        self.catalog = catalog
        self.clock = clock
        self.instance_id = instance_id
        self._cache: dict[tuple[str, object], tuple[Route | None, float]] = {}
        self._targets: dict[tuple[str, object, str], str | None] = {}

    def changed(self) -> None:
        """A route, a service or a database changed: forget every answer."""
        self._cache.clear()
        self._targets.clear()

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

    def local_target(
        self, service: str, broker_instance: object, database: str = DEFAULT_DATABASE
    ) -> str | None:
        """The key of this broker's service that a message for (`service`,
        `broker_instance`) sent from `database` goes to; None: it goes to another broker
        (or to no service at all)."""
        cache_key = (service, broker_instance, database)
        try:
            return self._targets[cache_key]
        except KeyError:
            pass
        found = self._local_target(service, broker_instance, database)
        if len(self._targets) > _CACHE_LIMIT:
            self._targets.clear()
        if not any(r.expires is not None for r in self.catalog.routes.values()):
            self._targets[cache_key] = found  # a route's lifetime would change the answer
        return found

    def _local_target(self, service: str, broker_instance: object, database: str) -> str | None:
        catalog = self.catalog
        route = self.find(service, broker_instance)
        if route is not None and route.address != "LOCAL":
            return None
        named = broker_instance
        if named is None and route is not None:
            named = route.broker_instance
        if named is not None:
            owner = catalog.database_by_guid(named)
            if owner is None:
                return None
            key = qualify(owner.name, service)
            return key if key in catalog.services else None
        order = [database, DEFAULT_DATABASE] + [
            d.name
            for d in sorted(catalog.databases.values(), key=lambda d: d.database_id)
            if d.name not in (database, DEFAULT_DATABASE)
        ]
        for name in order:
            key = qualify(name, service)
            if key in catalog.services:
                return key
        return None

    def is_local(self, service: str, broker_instance: object) -> bool:
        """Whether a transmission-queue entry for `service` waits for this broker (after a
        restart): its `service` is the key of the target it was held for, or a service
        named by another broker's message."""
        if SEPARATOR in service:  # the key of a service of another database
            return service in self.catalog.services
        if broker_instance is not None and self.catalog.database_by_guid(broker_instance) is None:
            return False
        if service not in self.catalog.services:
            return self.local_target(service, broker_instance) is not None
        route = self.find(service, broker_instance)
        return route is None or route.address == "LOCAL"
