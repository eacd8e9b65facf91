"""The paths messages must travel between the brokers given, and the routes that carry them.

A *path* is a broker that sends, the broker that hosts the service, and the service. With
services named (`--from S1 --to S2`) the paths are the dialog from S1 to S2 and its replies;
with none, every service a broker routes to another broker. Either way, the far service of
every conversation a broker holds with another broker is a path too. A route that leads to
none of the brokers given is noted, not checked. `route_for` picks the route a broker uses
by Service Broker's rules.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._problem import Problem
from ._survey import Broker, timestamp


@dataclass(frozen=True, slots=True)
class Path:
    """Messages must go from broker `near` to service `service`, hosted on broker `far`."""

    near: Broker
    far: Broker
    service: str
    why: str  # why it is checked, in words
    origin: Literal["named", "route", "conversation"]
    contract: str | None = None  # the conversation's contract; None: those `service` accepts
    to_target: bool = True  # `service` is the target side (its contracts are compared)

    @property
    def relayed(self) -> bool:
        """A route of a broker that hosts no service: it only forwards other brokers'
        dialogs along it (no contract of its own to compare, no replies to route back)."""
        return self.origin == "route" and "services" in self.near.views and not self.near.services

    @property
    def strict(self) -> bool:
        """Every contract `service` accepts must exist on `near` (a route alone does not
        say which of them `near` uses)."""
        return self.origin != "route"

    @property
    def key(self) -> tuple[str, str, str, str | None, bool]:
        return (self.near.instance, self.far.instance, self.service, self.contract, self.to_target)


def unique_paths(paths: Iterable[Path]) -> list[Path]:
    found: dict[tuple[str, str, str, str | None, bool], Path] = {}
    for path in paths:
        found.setdefault(path.key, path)
    return list(found.values())


def hosts(brokers: Sequence[Broker], service: str) -> list[Broker]:
    return [b for b in brokers if service in b.services]


def named_paths(
    brokers: Sequence[Broker],
    from_service: str,
    to_service: str,
    problems: list[Problem],
    notes: list[str],
) -> list[Path]:
    """The dialog from `from_service` to `to_service`, and its replies."""
    ends = []
    for service, role in ((from_service, "initiator"), (to_service, "target")):
        found = hosts(brokers, service)
        if not found and all("services" in b.views for b in brokers):
            problems.append(
                Problem(
                    ", ".join(b.label for b in brokers),
                    "service",
                    f"the {role} service '{service}' exists on none of the brokers given",
                    f"create_service('{service}', queue=...) on the broker that should host it,"
                    " or give that broker's URL too",
                )
            )
        if len(found) > 1:
            notes.append(
                f"service '{service}' exists on {', '.join(b.label for b in found)}; checked"
                f" on {found[0].label}"
            )
        ends.append(found[0] if found else None)
    initiator, target = ends
    if initiator is None or target is None:
        return []
    if initiator is target:
        notes.append(
            f"'{from_service}' and '{to_service}' are both on {target.label}: no routes"
            " or certificates are needed"
        )
        return []
    why = f"the dialog from '{from_service}' to '{to_service}'"
    return [
        Path(initiator, target, to_service, why, "named"),
        Path(target, initiator, from_service, f"replies of {why}", "named", to_target=False),
    ]


def routed_paths(
    brokers: Sequence[Broker], problems: list[Problem], notes: list[str]
) -> list[Path]:
    """Every service a broker routes to another broker."""
    paths = []
    for near in brokers:
        for route in near.views.get("routes", []):
            service, address = route["remote_service_name"], route["address"]
            if address in ("LOCAL", "TRANSPORT") or service in near.services:
                continue
            far = _far_broker(brokers, near, service, route["broker_instance"], address)
            if far is None:
                leads = near.peer_at(host_port(address))
                given = next((b for b in brokers if b.instance == leads), None)
                if given is not None and "services" in given.views:
                    problems.append(
                        _no_such_service(
                            given,
                            service,
                            f"{near.label} routes it there (route '{route['name']}')",
                            near,
                        )
                    )
                elif not any(service in b.services for b in brokers):
                    notes.append(
                        f"{near.label} routes '{service}' to {address}, which is none of"
                        " the brokers given: that route was not checked"
                    )
                continue
            paths.append(
                Path(near, far, service, f"route '{route['name']}' on {near.label}", "route")
            )
    return paths


def conversation_paths(
    brokers: Sequence[Broker],
    problems: list[Problem],
    notes: list[str],
    from_service: str | None,
    to_service: str | None,
) -> list[Path]:
    """The far side of every conversation a broker holds with another broker (of the named
    services only, when some are named)."""
    paths = []
    named = {from_service, to_service} if from_service else None
    elsewhere: Counter[tuple[str, str]] = Counter()
    for near in brokers:
        for ep in near.views.get("conversation_endpoints", []):
            far_service, far_instance = ep["far_service"], ep["far_broker_instance"]
            if named is not None and {ep["service_name"], far_service} != named:
                continue
            if far_instance in (None, near.instance) and far_service in near.services:
                continue  # a dialog within this broker
            why = f"conversation {ep['conversation_handle']} on {near.label}"
            far = next((b for b in brokers if b.instance == far_instance), None)
            if far is None and far_instance is None:
                far = next((b for b in hosts(brokers, far_service) if b is not near), None)
            if far is None:
                elsewhere[(near.label, far_instance or "?")] += 1
                continue
            if "services" in far.views and far_service not in far.services:
                problems.append(_no_such_service(far, far_service, f"{why} is with it", near))
                continue
            paths.append(
                Path(
                    near,
                    far,
                    far_service,
                    why,
                    "conversation",
                    ep["service_contract_name"],
                    bool(ep["is_initiator"]),
                )
            )
    for (label, instance), count in sorted(elsewhere.items()):
        notes.append(
            f"{count} conversation(s) on {label} are with broker {instance}, which is"
            " none of the brokers given: they were not checked"
        )
    return paths


def _no_such_service(far: Broker, service: str, why: str, near: Broker) -> Problem:
    return Problem(
        far.label,
        "service",
        f"broker {far.label} has no service '{service}', yet {why}: messages sent to it"
        f" stop in {far.label}'s transmission queue",
        f"on {far.label}: create_service('{service}', queue=..., contracts=[...]); or, if"
        f" '{service}' lives elsewhere, fix the route on {near.label} and end the"
        " conversations begun to it",
        f"no service {service}",
    )


def _far_broker(
    brokers: Sequence[Broker], near: Broker, service: str, instance: str | None, address: str
) -> Broker | None:
    """Which broker given hosts `service` for `near`: the instance its route names, else the
    one its address leads to, else any other broker that has it."""
    others = [b for b in hosts(brokers, service) if b is not near]
    for wanted in (instance, near.peer_at(host_port(address))):
        for b in others:
            if b.instance == wanted:
                return b
    return others[0] if others else None


def host_port(address: str) -> str | None:
    if not address.startswith("tcp://"):
        return None
    return address[len("tcp://") :].split("/", 1)[0]


def broker_address(brokers: Sequence[Broker], far: Broker) -> str:
    """Where `far`'s broker port is, as far as the other brokers know it (for fixes)."""
    for b in brokers:
        for row in b.views.get("broker_connections", []):
            if row["peer"] == far.instance and row["direction"] == "outbound" and row["address"]:
                return f"tcp://{row['address']}"
    for b in brokers:
        for route in b.views.get("routes", []):
            if route["broker_instance"] == far.instance and host_port(route["address"]):
                return str(route["address"])
    return f"tcp://HOST:BROKER_PORT of {far.label}"


def leads_to(
    brokers: Sequence[Broker], at: str | None, service: str, far: Broker, hops: int = 8
) -> bool:
    """Whether the routes from broker `at` on lead `service` to broker `far` through
    forwarders (each hop's route for it, as a route without a broker instance does); a hop
    that was not surveyed (give its URL too) or whose routes were not read leads nowhere
    known."""
    by_instance = {b.instance: b for b in brokers}
    for _ in range(hops):
        if at == far.instance:
            return True
        broker = by_instance.get(at) if at is not None else None
        if broker is None or "routes" not in broker.views:
            return False
        route, _ = route_for(broker, service, far.instance)
        if route is None or route["address"] in ("LOCAL", "TRANSPORT"):
            return False
        at = broker.peer_at(host_port(route["address"]))
    return False


def route_for(
    broker: Broker, service: str, instance: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The route `broker` uses for `service` on broker `instance`, by Service Broker's rules
    (service and instance, then service, then TRANSPORT), and the expired ones it ignores.
    A route naming another instance is what a new dialog that names none takes, so it
    beats one naming only the service (and `check_route` reports it)."""
    now = time.time()
    best: dict[str, Any] | None = None
    best_score = -1
    expired = []
    for route in broker.views.get("routes", []):
        if route["address"] == "TRANSPORT":
            score = 0
        elif route["remote_service_name"] != service:
            continue
        elif route["broker_instance"] is None:
            score = 1
        elif route["broker_instance"] == instance:
            score = 3
        else:
            score = 2
        if route["lifetime"] is not None and timestamp(route["lifetime"]) <= now:
            expired.append(route)
            continue
        if score > best_score:
            best, best_score = route, score
    return best, expired
