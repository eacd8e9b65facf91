"""`ssb diagnose`: why messages do not flow between brokers, in the manner of ssbdiagnose.

Theory of operation. Diagnosis is read-only and runs in two steps. First `survey` logs in to
each broker given (with the login its URL carries) and copies what the checks need: its
instance id and broker certificate, a fixed set of views, and for each activation procedure
whether the broker may run it (`check_procedure`). A view the login may not read, or one the
broker does not have, is recorded as such instead of failing the survey. Then `examine` runs
the checks, pure functions of the surveys that never touch a broker again: each returns
`Problem` records (what is wrong, on which broker, and what to do); problems that several
checks find in other words (a `subject` in common) are reported once. A check that needs a view a broker did not
give skips that broker: the permission check has already said which grant is missing, so
diagnose never claims a route is absent when it could not read the routes.

What is checked depends on the services named. With `--from S1 --to S2`: the dialog from S1
to S2 and its replies. With none named: every service a broker routes to, and the far service
of every conversation a broker holds with another broker. Each such *path* (a broker that
sends, the broker that hosts the service, the service) needs a live route on the sending
broker that leads to the hosting broker, mutual trust of the two brokers' certificates, and
(towards the target service) the same contracts on both sides: the same message types, sent
by the same side, with the same validation. Whatever the services named, every broker's
queues (enabled, activation procedures allowed and starting), transmission queue (each
message that waits, and why), conversations in error, broker links and resources are checked.

Trust is read from the brokers' `certificates` view. A broker of an older ssb lacks it: then
only links that failed show trust (a TLS verification failure names the broker that does not
trust the other), and a note says so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final, Literal
from urllib.parse import unquote, urlsplit

from ssb import client
from ssb.protocol import ErrorCode

from ._procedures import BUILT_IN
from ._tls import fingerprint

CONNECT_TIMEOUT: Final = 10.0
# a message with no reason to wait that waited this long is reported as unacknowledged
STUCK_AFTER: Final = 60.0
VIEWS: Final = (
    "services",
    "service_contracts",
    "message_types",
    "routes",
    "service_queues",
    "queue_monitors",
    "transmission_queue",
    "conversation_endpoints",
    "broker_connections",
    "broker_resources",
    "logins",
)
# views a broker may not have (older versions): their checks fall back or are skipped
OPTIONAL_VIEWS: Final = ("certificates",)
VIEW_ROWS: Final = 100_000  # rows read of each view (the broker's most)
# always allowed by the broker: refused only when the login lacks EXECUTE
EXECUTE_PROBE: Final = BUILT_IN[0]
# transmission statuses that are a consequence of another problem, not one of their own
# (messages held for a disabled queue are counted in the queue's own problem)
_CONSEQUENCES: Final = ("waiting behind earlier messages", "partial message (status 2)")
_HELD: Final = "is disabled (STATUS = OFF)"
_LINK_STATES: Final = ("", "NONE", "HANDSHAKE", "AUTHENTICATED")
_LINK_ERRORS: Final = (
    "TLS with ",
    "handshake with ",
    "connection refused by ",
    "connection to ",
    "cannot connect to ",
)


class CannotDiagnose(Exception):
    """Nothing can be checked: a broker given cannot be reached or refuses the login, a URL
    is malformed, or two URLs lead to the same broker."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong: where, what, and what to do about it."""

    broker: str  # the broker's label (host:port of its URL)
    kind: str  # permission, service, route, certificate, contract, queue, activation, ...
    text: str
    fix: str
    # what it is about, when several checks may find the same thing in other words
    subject: str = field(default="", compare=False)


@dataclass
class Broker:
    """What `survey` read from one broker."""

    label: str
    login: str
    instance: str
    certificate: str  # its broker certificate, PEM
    views: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # view -> the broker's refusal
    missing: set[str] = field(default_factory=set)  # views this broker does not have
    truncated: set[str] = field(default_factory=set)  # views with more rows than were read
    procedures: dict[str, str | None] = field(default_factory=dict)  # spec -> refusal, if any
    may_execute: bool = True

    def rows(self, view: str) -> list[dict[str, Any]] | None:
        return self.views.get(view)

    @cached_property
    def services(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in self.views.get("services", [])}

    def accepted_contracts(self, service: str) -> list[str]:
        row = self.services.get(service)
        text = str(row.get("contracts") or "") if row else ""
        return [c for c in text.split(", ") if c]

    def contract(self, name: str) -> dict[str, str] | None:
        """A contract's message types and who sends each, or None where it does not exist."""
        found = {
            r["message_type_name"]: r["sent_by"]
            for r in self.views.get("service_contracts", [])
            if r["name"] == name
        }
        return found or None

    @cached_property
    def validations(self) -> dict[str, str]:
        return {r["name"]: r["validation"] for r in self.views.get("message_types", [])}


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
    def strict(self) -> bool:
        """Every contract `service` accepts must exist on `near` (a route alone does not
        say which of them `near` uses)."""
        return self.origin != "route"

    @property
    def key(self) -> tuple[str, str, str, str | None, bool]:
        return (self.near.instance, self.far.instance, self.service, self.contract, self.to_target)


@dataclass
class Report:
    brokers: list[Broker]
    problems: list[Problem]
    notes: list[str]
    paths: list[Path]

    @property
    def healthy(self) -> bool:
        return not self.problems


# ---- survey ------------------------------------------------------------------------------------


def label_of(url: str) -> str:
    """host:port of a broker URL (never its password)."""
    parts = urlsplit(url)
    try:
        port = parts.port or 4021
    except ValueError:
        port = 0
    return f"{parts.hostname or '?'}:{port}"


async def survey(url: str, timeout: float = CONNECT_TIMEOUT) -> Broker:
    """Read what the checks need from the broker at `url`.

    Raises:
        CannotDiagnose: the URL is malformed, the broker cannot be reached or refused the login.
    """
    label = label_of(url)
    password = urlsplit(url).password

    def redacted(text: str) -> str:
        return text.replace(password, "***") if password else text

    try:
        conn = await client.connect(url, timeout=timeout, reconnect=False)
    except ValueError as exc:
        raise CannotDiagnose(redacted(str(exc))) from None
    except client.LoginFailedError as exc:
        raise CannotDiagnose(f"broker {label} refused the login: {exc.message}") from None
    except client.BrokerError as exc:
        raise CannotDiagnose(f"cannot reach broker {label}: {exc.message}") from None
    try:
        broker = Broker(
            label,
            unquote(urlsplit(url).username or ""),
            await conn.broker_instance(),
            await conn.broker_certificate(),
        )
        names = (*VIEWS, *OPTIONAL_VIEWS)
        answers = await asyncio.gather(*(_view(conn, n) for n in names))
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, list):
                broker.views[name] = answer
                if len(answer) >= VIEW_ROWS:
                    broker.truncated.add(name)
            elif answer is None:
                broker.missing.add(name)
            else:
                broker.refused[name] = answer
        await _procedures(conn, broker)
    except client.BrokerError as exc:
        raise CannotDiagnose(f"broker {label} failed during the survey: {exc.message}") from None
    finally:
        await conn.close()
    return broker


async def _view(conn: client.Connection, name: str) -> list[dict[str, Any]] | str | None:
    """A view's rows; the refusal text when the login may not read it; None when the broker
    has no such view."""
    try:
        return await conn.view(name, limit=VIEW_ROWS)
    except client.PermissionDeniedError as exc:
        return exc.message
    except client.NotFoundError as exc:
        if exc.code is ErrorCode.UNKNOWN_VIEW:
            return None
        raise


async def _procedures(conn: client.Connection, broker: Broker) -> None:
    specs = {
        str(r["activation_procedure"])
        for r in broker.views.get("service_queues", [])
        if r["is_activation_enabled"] and r["activation_procedure"]
    }
    if not specs:
        return
    try:
        await conn.check_procedure(EXECUTE_PROBE)
    except client.PermissionDeniedError:
        broker.may_execute = False
        return
    for spec in sorted(specs):
        try:
            await conn.check_procedure(spec)
            broker.procedures[spec] = None
        except client.PermissionDeniedError as exc:
            broker.procedures[spec] = exc.message


# ---- the whole diagnosis ---------------------------------------------------------------------


async def diagnose(
    urls: Sequence[str],
    from_service: str | None = None,
    to_service: str | None = None,
    timeout: float = CONNECT_TIMEOUT,
) -> Report:
    """Survey every broker in `urls`, then run every check.

    Args:
        urls: one ssb://USER:PASSWORD@HOST:PORT per broker.
        from_service, to_service: the dialog to check (both or neither); with neither,
            every routed service and the far side of every conversation.

    Raises:
        CannotDiagnose: a broker cannot be reached, or two URLs lead to the same broker.
        ValueError: only one of `from_service` and `to_service` is given.
    """
    if (from_service is None) != (to_service is None):
        raise ValueError("--from and --to go together: name both services, or neither")
    brokers = list(await asyncio.gather(*(survey(u, timeout) for u in urls)))
    seen: dict[str, str] = {}
    for b in brokers:
        if b.instance in seen:
            raise CannotDiagnose(
                f"{seen[b.instance]} and {b.label} are the same broker (instance {b.instance});"
                " give each broker once"
            )
        seen[b.instance] = b.label
    return examine(brokers, from_service, to_service)


def examine(
    brokers: Sequence[Broker], from_service: str | None = None, to_service: str | None = None
) -> Report:
    """Every check over surveyed brokers (no I/O): the report `diagnose` returns."""
    problems: list[Problem] = []
    notes: list[str] = []
    if from_service is not None and to_service is not None:
        paths = named_paths(brokers, from_service, to_service, problems, notes)
    else:
        paths = routed_paths(brokers, problems, notes)
    paths = _unique(
        [*paths, *conversation_paths(brokers, problems, notes, from_service, to_service)]
    )
    problems += check_permissions(brokers)
    routed: dict[tuple[str, str, str], Path] = {}
    for path in paths:  # one route check per direction and service, the first reason given
        routed.setdefault((path.near.instance, path.far.instance, path.service), path)
        problems += check_contract(path)
    for path in routed.values():
        problems += check_route(path, brokers)
    if from_service is None:
        problems += check_replies(paths, brokers)
    problems += check_trust(paths, brokers, notes)
    for broker in brokers:
        if broker.truncated:
            notes.append(
                f"{broker.label}: only the first {VIEW_ROWS} rows of"
                f" {', '.join(sorted(broker.truncated))} were read; what lies beyond is unchecked"
            )
    for check in (
        check_queues,
        check_activation,
        check_transmission_queue,
        check_conversations,
        check_links,
        check_resources,
    ):
        problems += check(brokers)
    return Report(list(brokers), _unique_problems(problems), notes, paths)


def _unique(paths: Iterable[Path]) -> list[Path]:
    found: dict[tuple[str, str, str, str | None, bool], Path] = {}
    for path in paths:
        found.setdefault(path.key, path)
    return list(found.values())


def _unique_problems(problems: Iterable[Problem]) -> list[Problem]:
    """Each problem once: the first words found for each subject."""
    found: dict[tuple[str, str, str], Problem] = {}
    for p in problems:
        found.setdefault((p.broker, p.kind, p.subject or p.text), p)
    return list(found.values())


# ---- which paths to check ---------------------------------------------------------------------


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
                leads = _peer_at(near, _host_port(address))
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
    for wanted in (instance, _peer_at(near, _host_port(address))):
        for b in others:
            if b.instance == wanted:
                return b
    return others[0] if others else None


def _host_port(address: str) -> str | None:
    if not address.startswith("tcp://"):
        return None
    return address[len("tcp://") :].split("/", 1)[0]


def _peer_at(broker: Broker, host_port: str | None) -> str | None:
    """The broker instance `broker` met at `host_port` when it connected there, if it did."""
    for row in broker.views.get("broker_connections", []):
        if row["address"] == host_port and row["direction"] == "outbound" and row["peer"]:
            return str(row["peer"])
    return None


def broker_address(brokers: Sequence[Broker], far: Broker) -> str:
    """Where `far`'s broker port is, as far as the other brokers know it (for fixes)."""
    for b in brokers:
        for row in b.views.get("broker_connections", []):
            if row["peer"] == far.instance and row["direction"] == "outbound" and row["address"]:
                return f"tcp://{row['address']}"
    for b in brokers:
        for route in b.views.get("routes", []):
            if route["broker_instance"] == far.instance and _host_port(route["address"]):
                return str(route["address"])
    return f"tcp://HOST:BROKER_PORT of {far.label}"


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
        if route["lifetime"] is not None and _timestamp(route["lifetime"]) <= now:
            expired.append(route)
            continue
        if score > best_score:
            best, best_score = route, score
    return best, expired


def _timestamp(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


# ---- configuration checks -----------------------------------------------------------------------


def check_permissions(brokers: Sequence[Broker]) -> list[Problem]:
    """Every view refused, and activation procedures left unchecked for lack of EXECUTE."""
    problems = []
    for b in brokers:
        login = b.login or "the URL's login"
        if b.refused:
            views = ", ".join(f"'{v}'" for v in sorted(b.refused))
            problems.append(
                Problem(
                    b.label,
                    "permission",
                    f"login '{login}' may not read the views {views} on {b.label}, so what they"
                    f" show was not checked ({next(iter(b.refused.values()))})",
                    f"as a login with CONTROL on {b.label}: grant('VIEW', '{login}')",
                )
            )
        if not b.may_execute:
            problems.append(
                Problem(
                    b.label,
                    "permission",
                    f"login '{login}' lacks EXECUTE on {b.label}, so its activation procedures"
                    " were not checked",
                    f"as a login with CONTROL on {b.label}: grant('EXECUTE', '{login}')",
                )
            )
    return problems


def check_route(path: Path, brokers: Sequence[Broker]) -> list[Problem]:
    """`near` has a live route for the service that leads to `far`."""
    near, far, service = path.near, path.far, path.service
    if "routes" not in near.views:
        return []
    route, expired = route_for(near, service, far.instance)
    where = broker_address(brokers, far)
    create = f"on {near.label}: create_route('to_{service}', '{service}', '{where}')"
    if route is None:
        gone = (
            f"; route '{expired[0]['name']}' expired at {expired[0]['lifetime']}" if expired else ""
        )
        return [
            Problem(
                near.label,
                "route",
                f"broker {near.label} has no route to service '{service}' on broker"
                f" {far.label} ({path.why}){gone}",
                create,
            )
        ]
    name = route["name"]
    if route["address"] == "LOCAL":
        return [
            Problem(
                near.label,
                "route",
                f"route '{name}' on {near.label} says service '{service}' is LOCAL, but"
                f" it is on broker {far.label} ({path.why})",
                f"on {near.label}: drop_route('{name}'); then {create}",
            )
        ]
    if route["broker_instance"] not in (None, far.instance):
        return [
            Problem(
                near.label,
                "route",
                f"route '{name}' on {near.label} sends service '{service}' to broker"
                f" instance {route['broker_instance']}, but it is on broker {far.label}"
                f" (instance {far.instance})",
                f"on {near.label}: drop_route('{name}'); then {create}",
            )
        ]
    met = _peer_at(near, _host_port(route["address"]))
    # a route naming the far broker may lead through a forwarding broker
    forwarded = route["broker_instance"] == far.instance
    if route["address"] != "TRANSPORT" and met not in (None, far.instance) and not forwarded:
        other = next((b.label for b in brokers if b.instance == met), f"instance {met}")
        return [
            Problem(
                near.label,
                "route",
                f"route '{name}' on {near.label} leads to {route['address']}, which is"
                f" broker {other}, but service '{service}' is on broker {far.label}",
                f"on {near.label}: drop_route('{name}'); then {create}",
            )
        ]
    return []


def check_replies(paths: Sequence[Path], brokers: Sequence[Broker]) -> list[Problem]:
    """Without services named: a broker that receives dialogs routed to it from another broker
    needs some route back to that broker's services, or replies cannot leave it."""
    problems = []
    directions = {(p.near.instance, p.far.instance) for p in paths}
    for path in paths:
        if path.origin != "route" or "routes" not in path.far.views:
            continue
        if (path.far.instance, path.near.instance) in directions:
            continue  # a known path back is checked exactly by check_route
        near, far = path.near, path.far
        back = [
            r
            for r in far.views.get("routes", [])
            if r["address"] == "TRANSPORT"
            or r["broker_instance"] == near.instance
            or (
                r["address"] != "LOCAL"
                and r["remote_service_name"] in near.services
                and r["remote_service_name"] not in far.services
            )
        ]
        if not back:
            problems.append(
                Problem(
                    far.label,
                    "route",
                    f"broker {far.label} has no route to any service of broker {near.label}:"
                    f" replies from '{path.service}' ({path.why}) cannot leave it",
                    f"on {far.label}: create_route('to_SERVICE', 'SERVICE',"
                    f" '{broker_address(brokers, near)}') for each service of {near.label}"
                    f" that begins dialogs with '{path.service}'",
                )
            )
    return problems


def check_trust(
    paths: Sequence[Path], brokers: Sequence[Broker], notes: list[str]
) -> list[Problem]:
    """Each pair of brokers on a path trusts the other's current broker certificate, as
    the `certificates` view shows (without it, `check_links` reads trust from failed links)."""
    problems = []
    pairs = {(p.near.instance, p.far.instance) for p in paths}
    pairs |= {(far, near) for near, far in pairs}
    by_instance = {b.instance: b for b in brokers}
    unknown: set[str] = set()
    for near_id, far_id in sorted(pairs):
        near, far = by_instance[near_id], by_instance[far_id]
        rows = near.rows("certificates")
        if rows is None:
            if "certificates" in near.missing:
                unknown.add(near.label)
            continue
        theirs = [r for r in rows if r.get("broker_instance") == far.instance]
        trust_it = (
            f"on {near.label}: create_certificate('broker_{far.instance[:8]}',"
            f" PEM) with PEM = broker_certificate() of {far.label}"
        )
        subject = _trusts(near, far)
        if not theirs:
            problems.append(
                Problem(
                    near.label,
                    "certificate",
                    f"broker {near.label} does not trust the certificate of"
                    f" broker {far.label}: they cannot connect",
                    trust_it,
                    subject,
                )
            )
            continue
        current = fingerprint(far.certificate)
        fingerprints = {r.get("fingerprint") for r in theirs} - {None}
        if fingerprints and current not in fingerprints:
            names = ", ".join(f"'{r['name']}'" for r in theirs)
            problems.append(
                Problem(
                    near.label,
                    "certificate",
                    f"broker {near.label} trusts an older certificate of broker"
                    f" {far.label} ({names}), not the one it presents now",
                    trust_it,
                    subject,
                )
            )
    if unknown:
        notes.append(
            f"{', '.join(sorted(unknown))}: no 'certificates' view, so trust between"
            " brokers was judged only from failed links"
        )
    return problems


def _trusts(broker: Broker | None, other: Broker | None) -> str:
    """The subject of a problem of trust, whichever check finds it."""
    if broker is None or other is None:
        return ""
    return f"{broker.instance} trusts {other.instance}"


def check_contract(path: Path) -> list[Problem]:
    """The contracts of the path's dialogs are the same on both brokers: the same message
    types, each sent by the same side and validated the same way."""
    near, far, service = path.near, path.far, path.service
    if not all(
        v in b.views
        for b in (near, far)
        for v in ("services", "service_contracts", "message_types")
    ):
        return []
    accepted = far.accepted_contracts(service)
    problems = []
    if path.contract is not None:
        names = [path.contract]
        if path.to_target and path.contract not in accepted:
            problems.append(
                Problem(
                    far.label,
                    "contract",
                    f"service '{service}' on {far.label} does not accept contract"
                    f" '{path.contract}', which {path.why} uses",
                    f"on {far.label}: create the service again with"
                    f" contracts=[..., '{path.contract}']",
                )
            )
    elif path.to_target:
        names = accepted
        if not accepted and path.strict:
            problems.append(
                Problem(
                    far.label,
                    "contract",
                    f"service '{service}' on {far.label} accepts no contract, so"
                    f" no dialog can begin to it ({path.why})",
                    f"on {far.label}: create_service('{service}', queue=..., contracts=[...])",
                )
            )
        if accepted and not path.strict and all(near.contract(c) is None for c in accepted):
            problems.append(
                Problem(
                    near.label,
                    "contract",
                    f"broker {near.label} defines none of the contracts service"
                    f" '{service}' accepts on {far.label} ({', '.join(accepted)})"
                    f", so it cannot begin dialogs to it ({path.why})",
                    f"on {near.label}: create the message types and contract as on {far.label}",
                )
            )
            return problems
    else:
        return []
    initiator, target = (near, far) if path.to_target else (far, near)
    for name in names:
        problems += _compare_contract(
            initiator, target, name, path.strict or path.contract is not None
        )
    return problems


def _compare_contract(near: Broker, far: Broker, name: str, required: bool) -> list[Problem]:
    """Contract `name` on the initiator's broker `near` against the target's `far` (whose
    definition the fix proposes)."""
    mine, theirs = near.contract(name), far.contract(name)
    recreate = (
        f"contracts cannot be altered: end the conversations on '{name}', drop it and"
        f" create it again with the same message types, senders and validations on"
        f" both brokers ({_describe(far, name) or _describe(near, name)})"
    )
    if mine is None or theirs is None:
        if not required or (mine is None and theirs is None):
            return []
        lacking, having = (near, far) if mine is None else (far, near)
        return [
            Problem(
                lacking.label,
                "contract",
                f"contract '{name}' exists on {having.label} but not on {lacking.label}",
                f"on {lacking.label}: create the message types and the contract"
                f" {_describe(having, name)}",
            )
        ]
    problems = []
    for mtype in sorted(set(mine) | set(theirs)):
        if mtype not in mine or mtype not in theirs:
            lacking, having = (near, far) if mtype not in mine else (far, near)
            problems.append(
                Problem(
                    lacking.label,
                    "contract",
                    f"contract '{name}' differs: on {having.label} it has message"
                    f" type '{mtype}' (sent by"
                    f" {(theirs if mtype in theirs else mine)[mtype]}), on"
                    f" {lacking.label} it does not",
                    recreate,
                )
            )
        elif mine[mtype] != theirs[mtype]:
            problems.append(
                Problem(
                    near.label,
                    "contract",
                    f"contract '{name}' differs: message type '{mtype}' is sent by"
                    f" {mine[mtype]} on {near.label} but by {theirs[mtype]} on"
                    f" {far.label}",
                    recreate,
                )
            )
        else:
            here, there = near.validations.get(mtype), far.validations.get(mtype)
            if here != there:
                problems.append(
                    Problem(
                        near.label,
                        "contract",
                        f"message type '{mtype}' of contract '{name}' is validated"
                        f" {here} on {near.label} but {there} on {far.label}",
                        "drop and create the message type with the same"
                        " validation on both brokers (after its contracts)",
                    )
                )
    return problems


def _describe(broker: Broker, name: str) -> str:
    found = broker.contract(name)
    if found is None:
        return ""
    types = ", ".join(f"'{t}': '{s}'" for t, s in sorted(found.items()))
    return f"create_contract('{name}', {{{types}}}) as on {broker.label}"


# ---- every broker: queues, activation, runtime ------------------------------------------------


def check_queues(brokers: Sequence[Broker]) -> list[Problem]:
    """Every queue is enabled (a disabled one neither receives nor takes messages)."""
    problems = []
    for b in brokers:
        for q in b.views.get("service_queues", []):
            if q["is_receive_enabled"]:
                continue
            reason = q["disabled_reason"] or "STATUS = OFF"
            held = q.get("messages_held_for_it") or 0
            waiting = f"; {held} message(s) wait for it in the transmission queue" if held else ""
            poison = (
                " (see the poison_messages view for what failed first)"
                if "poison" in reason.lower()
                else ""
            )
            problems.append(
                Problem(
                    b.label,
                    "queue",
                    f"queue '{q['name']}' on {b.label} is disabled: {reason}{waiting}",
                    f"on {b.label}: alter_queue('{q['name']}', status='ON'){poison}",
                )
            )
    return problems


def check_activation(brokers: Sequence[Broker]) -> list[Problem]:
    """Activation procedures the broker may run, as a login that exists, and that start."""
    problems = []
    for b in brokers:
        logins = {r["name"] for r in b.views.get("logins", [])} if "logins" in b.views else None
        failing = {
            m["queue"]: m
            for m in b.views.get("queue_monitors", [])
            if m["tasks_failed"] and m["last_task_error"]
        }
        for q in b.views.get("service_queues", []):
            if not q["is_activation_enabled"]:
                continue
            name, spec = q["name"], q["activation_procedure"]
            refusal = b.procedures.get(spec) if spec else None
            if refusal:
                problems.append(
                    Problem(
                        b.label,
                        "activation",
                        f"the activation procedure '{spec}' of queue '{name}' on"
                        f" {b.label} is not one the broker may run: {refusal}",
                        f"add a pattern that covers '{spec}' to procedures = [...]"
                        f" in {b.label}'s config and restart it",
                    )
                )
            execute_as = q["execute_as"]
            if execute_as and logins is not None and execute_as not in logins:
                problems.append(
                    Problem(
                        b.label,
                        "activation",
                        f"queue '{name}' on {b.label} activates as login"
                        f" '{execute_as}', which does not exist",
                        f"on {b.label}: create_login('{execute_as}'), or"
                        f" alter_queue('{name}', activation={{'execute_as': ...}})",
                    )
                )
            monitor = failing.get(name)
            if monitor is not None and not refusal:
                problems.append(
                    Problem(
                        b.label,
                        "activation",
                        f"activated tasks of queue '{name}' on {b.label} failed"
                        f" {monitor['tasks_failed']} time(s); the last:"
                        f" {monitor['last_task_error']}",
                        f"make '{spec}' importable where {b.label} runs (its"
                        " [activation] python_path) and let it run to the end;"
                        " see the broker's log",
                    )
                )
    return problems


def _link_errors(broker: Broker) -> set[str]:
    return {
        str(r["login_state"]) for r in broker.views.get("broker_connections", []) if _link_down(r)
    }


def check_transmission_queue(brokers: Sequence[Broker]) -> list[Problem]:
    """Messages that wait in a transmission queue, grouped by service and reason. Those
    waiting for a link that is down are counted by `check_links` instead."""
    problems = []
    now = time.time()
    for b in brokers:
        down = _link_errors(b)
        waiting: Counter[tuple[str, str]] = Counter()
        stuck: Counter[str] = Counter()
        for row in b.views.get("transmission_queue", []):
            status = str(row["transmission_status"] or "")
            service = str(row["to_service_name"])
            if status in down or status.startswith(_CONSEQUENCES) or status.endswith(_HELD):
                continue
            if status:
                waiting[(service, status)] += 1
            elif row["enqueue_time"] and now - _timestamp(row["enqueue_time"]) > STUCK_AFTER:
                stuck[service] += 1
        for (service, status), count in sorted(waiting.items()):
            problems.append(
                Problem(
                    b.label,
                    "transmission",
                    f"{count} message(s) for service '{service}' wait in the"
                    f" transmission queue of {b.label}: {status}",
                    _transmission_fix(b, brokers, service, status),
                )
            )
        for service, count in sorted(stuck.items()):
            problems.append(
                Problem(
                    b.label,
                    "transmission",
                    f"{count} message(s) for service '{service}' wait in the"
                    f" transmission queue of {b.label} for over"
                    f" {STUCK_AFTER:g} s, unacknowledged",
                    "the receiving broker does not store them: look at its"
                    " service_queues (quotas) and broker_resources (disk)",
                )
            )
    return problems


def _transmission_fix(broker: Broker, brokers: Sequence[Broker], service: str, status: str) -> str:
    if status.startswith("no route to service"):
        far = next((b for b in hosts(brokers, service) if b is not broker), None)
        where = broker_address(brokers, far) if far else "tcp://HOST:BROKER_PORT"
        return f"on {broker.label}: create_route('to_{service}', '{service}', '{where}')"
    if status.endswith("does not exist"):
        return (
            f"on {broker.label}: create the service (and its queue) '{service}'; or end"
            " these conversations where they began, and fix the route that sent them here"
        )
    if status.startswith(_LINK_ERRORS):
        return "see the broker link problem above; the messages go once the link is up"
    return "the status says what is missing; the messages go once it is fixed"


def check_conversations(brokers: Sequence[Broker]) -> list[Problem]:
    """Conversations in error (state ER) wait for their side to end them."""
    problems = []
    for b in brokers:
        for ep in b.views.get("conversation_endpoints", []):
            if ep["state"] != "ER":
                continue
            handle = ep["conversation_handle"]
            problems.append(
                Problem(
                    b.label,
                    "conversation",
                    f"conversation {handle} of service '{ep['service_name']}' with"
                    f" '{ep['far_service']}' on {b.label} is in error (ER)",
                    f"receive its Error message from queue '{ep['queue_name']}'"
                    f" on {b.label}, then end_conversation({handle})",
                )
            )
    return problems


def _link_down(row: dict[str, Any]) -> bool:
    """A link that failed: its login state is an error (a link that closed when idle keeps
    the state it had, AUTHENTICATED; a peer never connected to is NONE)."""
    state = str(row["login_state"] or "")
    return state.startswith("FAILED") or (row["state"] == "CLOSED" and state not in _LINK_STATES)


def check_links(brokers: Sequence[Broker]) -> list[Problem]:
    """Broker links that failed, with what the failure says about trust."""
    problems = []
    by_instance = {b.instance: b for b in brokers}
    for b in brokers:
        rows = b.views.get("transmission_queue", [])
        for row in b.views.get("broker_connections", []):
            if not _link_down(row):
                continue
            error = str(row["login_state"])
            peer = by_instance.get(str(row["peer"]))
            name = peer.label if peer else f"instance {row['peer'] or '?'}"
            held = sum(1 for r in rows if r["transmission_status"] == error)
            waiting = f"; {held} message(s) wait for it" if held else ""
            at = f" at {row['address']}" if row["address"] else ""
            problems.append(_link_problem(b, peer, name, at, error, waiting))
    return problems


def _link_problem(
    b: Broker, peer: Broker | None, name: str, at: str, error: str, waiting: str
) -> Problem:
    if "CERTIFICATE_VERIFY_FAILED" in error:
        cert_name = f"broker_{peer.instance[:8]}" if peer else "broker_PEER"
        return Problem(
            b.label,
            "certificate",
            f"broker {b.label} does not trust the certificate broker {name} presents"
            f"{at}: {error}{waiting}",
            f"on {b.label}: create_certificate('{cert_name}', PEM) with PEM ="
            f" broker_certificate() of {name}",
            _trusts(b, peer),
        )
    if any(s in error for s in ("reset by peer", "refused by peer", "handshake with")):
        return Problem(
            name,
            "certificate",
            f"broker {name} closed the connection from {b.label}{at} in the"
            f" handshake: {error}{waiting}; {name} most likely does not trust the"
            f" certificate of {b.label}",
            f"on {name}: create_certificate('broker_{b.instance[:8]}', PEM) with PEM"
            f" = broker_certificate() of {b.label} (see {name}'s log for why it"
            " refused)",
            _trusts(peer, b),
        )
    return Problem(
        b.label,
        "link",
        f"the link from broker {b.label} to broker {name}{at} is down: {error}{waiting}",
        f"start broker {name}, or correct the route address on {b.label} to its broker port",
    )


def check_resources(brokers: Sequence[Broker]) -> list[Problem]:
    """A broker that refuses new messages (disk full, store in trouble)."""
    problems = []
    for b in brokers:
        for r in b.views.get("broker_resources", []):
            if not r["accepting_messages"]:
                problems.append(
                    Problem(
                        b.label,
                        "resources",
                        f"broker {b.label} refuses new messages: {r['refusal']}",
                        f"free disk space where {b.label} keeps its data",
                    )
                )
    return problems


# ---- the report --------------------------------------------------------------------------------


def format_report(report: Report) -> str:
    """The report for people: one problem per entry with its fix, then a summary line."""
    lines = [f"broker {b.label}: instance {b.instance}, login '{b.login}'" for b in report.brokers]
    for p in report.problems:
        lines.append(f"PROBLEM [{p.kind}] {p.text}")
        lines.append(f"    fix: {p.fix}")
    for note in report.notes:
        lines.append(f"note: {note}")
    if report.healthy:
        counted = _counts(report)
        lines.append(f"no problems found ({counted})")
    else:
        lines.append(f"{len(report.problems)} problem(s) found")
    return "\n".join(lines)


def _counts(report: Report) -> str:
    def total(fn: Callable[[Broker], int]) -> int:
        return sum(fn(b) for b in report.brokers)

    queues = total(lambda b: len(b.views.get("service_queues", [])))
    held = total(lambda b: len(b.views.get("transmission_queue", [])))
    return (
        f"{len(report.brokers)} broker(s), {len(report.paths)} path(s) between services,"
        f" {queues} queue(s), {held} message(s) in transmission queues"
    )


def run(urls: Sequence[str], from_service: str | None, to_service: str | None) -> int:
    """`ssb diagnose`: print the report; 0 when healthy, 1 with problems, 2 for a usage
    mistake or a broker that cannot be reached (one line on stderr)."""
    try:
        report = asyncio.run(diagnose(urls, from_service, to_service))
    except (CannotDiagnose, ValueError) as exc:
        print(f"ssb diagnose: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(format_report(report))
    return 0 if report.healthy else 1
