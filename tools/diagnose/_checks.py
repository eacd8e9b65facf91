"""The checks: pure functions of the surveys, each returning the `Problem`s it finds.

Along each path: a live route on the sending broker that leads to the hosting broker
(`check_route`), a way back for replies (`check_replies`), mutual trust of the two brokers'
certificates (`check_trust`) and the same contracts on both sides (`check_contract`): the same
message types, sent by the same side, with the same validation. On every broker: views the
login may not read (`check_permissions`), its queues, activation, transmission queue,
conversations in error, broker links and resources.

A check that needs a view a broker did not give skips that broker: the permission check has
already said which grant is missing, so no check claims a route is absent when it could not
read the routes. Trust is read from the brokers' `certificates` view; a broker of an older ssb
lacks it, and then only links that failed show trust (a TLS verification failure names the
broker that does not trust the other).
"""

from __future__ import annotations

import hashlib
import ssl
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

from ._paths import Path, broker_address, host_port, hosts, leads_to, route_for
from ._problem import Problem
from ._survey import Broker, timestamp

# a message with no reason to wait that waited this long is reported as unacknowledged
STUCK_AFTER: Final = 60.0
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


def fingerprint(pem: str) -> str:
    """A certificate's SHA-256 fingerprint (of its DER form) in hex, as the brokers' views
    show it."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


# ---- the login, and along each path ------------------------------------------------------------


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
    met = near.peer_at(host_port(route["address"]))
    # a route may lead through forwarding brokers: one naming the far broker, or one whose
    # next brokers' routes lead on to it (the origin asks along it, see the transport)
    forwarded = route["broker_instance"] == far.instance or leads_to(brokers, met, service, far)
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
        if path.origin != "route" or path.relayed or "routes" not in path.far.views:
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
    if path.relayed or not all(
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
            elif row["enqueue_time"] and now - timestamp(row["enqueue_time"]) > STUCK_AFTER:
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


def _named_in(brokers: Sequence[Broker], status: str, besides: Broker) -> Broker | None:
    """The broker (other than `besides`) whose instance id a status names, if surveyed."""
    return next((b for b in brokers if b is not besides and b.instance in status), None)


def _transmission_fix(broker: Broker, brokers: Sequence[Broker], service: str, status: str) -> str:
    named = _named_in(brokers, status, broker)
    where = named.label if named is not None else "that broker"
    if "no route there leads to service" in status:
        host = next((b for b in hosts(brokers, service) if b is not broker), None)
        address = broker_address(brokers, host) if host else "tcp://HOST:BROKER_PORT"
        return f"on {where}: create_route('to_{service}', '{service}', '{address}')"
    if "whose certificate is not trusted here" in status:
        return (
            f"on {broker.label}: create_certificate('broker_{named.instance[:8] if named else ''}',"
            f" PEM) with PEM = broker_certificate() of {where}"
        )
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
