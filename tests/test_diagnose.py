"""`ssb diagnose` finds what keeps messages from flowing between brokers.

Tier 5: two real brokers (federation_setup) joined by routes and certificates, with an
initiator service on A and a target service on B. A healthy pair reports nothing and exits
0; each planted fault (a missing route, an untrusted certificate on either side, a contract
that differs, a disabled queue, a message held for a service the far broker does not have,
a conversation in error, a login that may not read the views, an activation procedure that
cannot be imported) is found with its words and exit 1; an unreachable broker, a refused
login and a usage mistake exit 2 with one line. What real brokers cannot be made to show
within a test (a `certificates` view, a link caught while it closes, a message unacknowledged
for a minute, a full disk) is checked on surveyed data with those rows put in.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from daemon import BrokerProcess
from federation_setup import (
    CONTRACT,
    REQUEST,
    Federation,
    Node,
    begin_dialogs,
    dialog_services,
    link,
    receive_count,
    route,
    trust,
)

from ssb import client
from ssb.tools import wait_until
from ssb.tools.diagnose import Broker, Report, diagnose, examine, format_report, label_of
from ssb.tools.diagnose._checks import (
    STUCK_AFTER,
    check_links,
    check_resources,
    check_route,
    check_transmission_queue,
    check_trust,
    fingerprint,
)
from ssb.tools.diagnose._paths import named_paths
from ssb.tools.diagnose._survey import VIEW_ROWS

pytestmark = pytest.mark.timeout(60)

TARGET_QUEUE = "TargetBQueue"


@asynccontextmanager
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    """A (service 'Initiator') and B (service 'TargetB' on CONTRACT), routes both ways."""
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b = fed["A"], fed["B"]
        await dialog_services(a, b)
        await link(a, "Initiator", b, "TargetB")
        yield a, b


async def ssb_diagnose(*args: str) -> tuple[int, str, str]:
    """Run `python -m ssb.broker diagnose ARGS` as a subprocess: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ssb.broker",
        "diagnose",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def urls(*nodes: Node) -> list[str]:
    return [n.process.url for n in nodes]


def label(node: Node) -> str:
    return label_of(node.process.url)


async def problems_found(*args: str) -> str:
    """What `ssb diagnose ARGS` prints, having found problems (exit code 1)."""
    code, out, _ = await ssb_diagnose(*args)
    assert code == 1, out
    return out


def waiting(count: int, service: str, node: Node, why: str) -> str:
    """What diagnose says of `count` messages for `service` that wait in the transmission
    queue of `node`, for the reason `why`."""
    return (
        f"{count} message(s) for service '{service}' wait in the transmission queue of"
        f" {label(node)}: {why}"
    )


def texts(report: Report, kind: str) -> list[str]:
    return [f"{p.text} | fix: {p.fix}" for p in report.problems if p.kind == kind]


def one(found: list[str], *words: str) -> str:
    """The one entry of `found` that holds every word (fails showing them all otherwise)."""
    hits = [t for t in found if all(w in t for w in words)]
    assert len(hits) == 1, f"expected one problem with {words}, got: {found}"
    return hits[0]


async def begin_and_deliver(a: Node, b: Node) -> Any:
    """A conversation from Initiator on A to TargetB on B, its first message received."""
    h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
    await a.conn.send(h, REQUEST, b"hello")
    await receive_count(b.conn, TARGET_QUEUE, 1)
    return h


async def no_link(node: Node) -> bool:
    return not any(r["state"] == "ESTABLISHED" for r in await node.view("broker_connections"))


async def status_of(node: Node, service: str) -> str:
    rows = [r for r in await node.view("transmission_queue") if r["to_service_name"] == service]
    return " / ".join(str(r["transmission_status"]) for r in rows if r["transmission_status"])


# ---- healthy -------------------------------------------------------------------------------


async def test_a_healthy_pair_reports_no_problem_and_exits_0(tmp_path: Path) -> None:
    async with pair(tmp_path) as (a, b):
        await begin_and_deliver(a, b)  # a conversation, so its far sides are checked too
        report = await diagnose(urls(a, b))
        assert report.problems == [], format_report(report)
        assert len(report.paths) >= 2  # A -> TargetB and B -> Initiator at least
        code, out, err = await ssb_diagnose(*urls(a, b), "--from", "Initiator", "--to", "TargetB")
        assert (code, err) == (0, ""), out + err
        assert "no problems found" in out
        assert a.process.admin_password() not in out  # the URL's password is never printed


# ---- configuration faults -----------------------------------------------------------------


async def test_a_missing_route_back_is_found(tmp_path: Path) -> None:
    async with pair(tmp_path) as (a, b):
        (back,) = [r["name"] for r in await b.view("routes")]
        await b.conn.drop_route(back)

        # no conversation yet: only the routes say that B cannot answer A
        report = await diagnose(urls(a, b))
        one(
            texts(report, "route"),
            f"broker {label(b)} has no route to any service of broker {label(a)}",
            "create_route(",
        )

        # the dialog named: exact words, and the CLI says so with exit 1
        code, out, err = await ssb_diagnose(*urls(a, b), "--from", "Initiator", "--to", "TargetB")
        assert code == 1 and err == "", out + err
        assert f"broker {label(b)} has no route to service 'Initiator' on broker {label(a)}" in out
        assert f"fix: on {label(b)}: create_route('to_Initiator', 'Initiator'," in out
        assert "1 problem(s) found" in out

        # a conversation whose replies cannot leave B is found without naming services
        await begin_and_deliver(a, b)
        report = await diagnose(urls(a, b))
        one(
            texts(report, "route"),
            f"broker {label(b)} has no route to service 'Initiator'",
            "conversation",
        )


async def test_a_certificate_not_trusted_is_found_on_either_side(tmp_path: Path) -> None:
    async with pair(tmp_path) as (a, b):
        await begin_and_deliver(a, b)
        assert (await diagnose(urls(a, b))).healthy

        # A no longer trusts B: found in A's certificates (before any link fails)
        await a.conn.drop_certificate("cert_B")
        report = await diagnose(urls(a, b))
        one(
            texts(report, "certificate"),
            f"broker {label(a)} does not trust the certificate of broker {label(b)}",
            f"on {label(a)}: create_certificate(",
        )

        # trusted again by A, but B no longer trusts A: found in B's certificates at once
        await trust(a, b)
        await b.conn.drop_certificate("cert_A")
        out = await problems_found(*urls(a, b))
        assert f"broker {label(b)} does not trust the certificate of broker {label(a)}" in out
        assert f"fix: on {label(b)}: create_certificate(" in out
        assert out.count("does not trust") == 1, out  # found twice, reported once


async def test_a_contract_that_differs_between_the_brokers_is_found(tmp_path: Path) -> None:
    async with pair(tmp_path) as (a, b):
        await b.conn.create_message_type("Cancel")
        await a.conn.create_message_type("Note", validation="NONE")
        await b.conn.create_message_type("Note", validation="VALID_JSON")
        await a.conn.create_contract("OrderContract", {REQUEST: "INITIATOR", "Note": "ANY"})
        await b.conn.create_contract(
            "OrderContract", {REQUEST: "INITIATOR", "Note": "ANY", "Cancel": "INITIATOR"}
        )
        await b.conn.create_service("OrderService", queue=TARGET_QUEUE, contracts=["OrderContract"])
        await route(a, "OrderService", b)

        report = await diagnose(urls(a, b), "Initiator", "OrderService")
        found = texts(report, "contract")
        one(
            found,
            "contract 'OrderContract' differs",
            f"on {label(b)} it has message type 'Cancel' (sent by INITIATOR)",
            f"on {label(a)} it does not",
            "create_contract('OrderContract', {",
        )
        one(found, "message type 'Note' of contract 'OrderContract' is validated")
        assert len(report.problems) == 2, format_report(report)

        # without names, the route from A to OrderService leads to the same finding
        report = await diagnose(urls(a, b))
        one(texts(report, "contract"), "'Cancel'")

        # the contract of the healthy dialog is the same on both sides
        assert (await diagnose(urls(a, b), "Initiator", "TargetB")).healthy


async def test_a_disabled_queue_is_found_with_the_messages_it_holds_back(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as (a, b):
        await b.conn.alter_queue(TARGET_QUEUE, status="OFF")
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(h, REQUEST, b"for a queue that is off")
        await wait_until(lambda: status_of(b, "TargetB"), "the message held on B", 15)

        out = await problems_found(*urls(a, b), "--from", "Initiator", "--to", "TargetB")
        assert f"queue '{TARGET_QUEUE}' on {label(b)} is disabled" in out
        assert f"alter_queue('{TARGET_QUEUE}', status='ON')" in out
        report = await diagnose(urls(a, b))
        one(
            texts(report, "queue"),
            f"queue '{TARGET_QUEUE}' on {label(b)} is disabled:"
            " STATUS = OFF; 1 message(s) wait for it in the transmission queue",
        )

        await b.conn.alter_queue(TARGET_QUEUE, status="ON")
        await receive_count(b.conn, TARGET_QUEUE, 1)
        await wait_until(lambda: _healthy(a, b), "a healthy pair once the queue is on", 15)


async def _healthy(a: Node, b: Node) -> bool:
    return (await diagnose(urls(a, b))).healthy


async def test_a_dialog_begun_before_its_route_waits_and_is_found(tmp_path: Path) -> None:
    """BEGIN DIALOG to a service no route leads to succeeds (deployment scripts create
    routes afterwards); its messages wait saying so, diagnose names the missing route, the
    broker logs it once, and they go as soon as the route exists."""
    async with Federation(tmp_path, ["A", "B"]) as fed:
        a, b = fed["A"], fed["B"]
        await dialog_services(a, b)
        await route(b, "Initiator", a)
        handles = await begin_dialogs(a, 2)
        for n, h in enumerate(handles):
            await a.conn.send(h, REQUEST, b"early %d" % n)
        await wait_until(lambda: status_of(a, "TargetB"), "the messages waiting on A", 15)
        assert await status_of(a, "TargetB") == " / ".join(["no route to service 'TargetB'"] * 2)

        out = await problems_found(*urls(a, b))
        assert waiting(2, "TargetB", a, "no route to service 'TargetB'") in out
        assert f"broker {label(a)} has no route to service 'TargetB' on broker {label(b)}" in out
        assert f"fix: on {label(a)}: create_route('to_TargetB', 'TargetB', 'tcp://" in out
        said = "messages for service 'TargetB' wait in the transmission queue: no route"
        assert a.process.log_text().count(said) == 1

        await route(a, "TargetB", b)
        got = await receive_count(b.conn, TARGET_QUEUE, 2)
        assert sorted(m.message_body for m in got) == [b"early 0", b"early 1"]
        await wait_until(lambda: _healthy(a, b), "diagnose to find nothing", 15)


async def test_a_message_held_for_a_service_the_far_broker_lacks_is_found(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as (a, b):
        await b.conn.grant("SEND", "public")  # on every service, even one not there yet
        await route(a, "Ghost", b)
        h = await a.conn.begin_dialog("Initiator", "Ghost", contract=CONTRACT)
        await a.conn.send(h, REQUEST, b"for nobody")
        await wait_until(lambda: status_of(b, "Ghost"), "the message held on B", 15)

        out = await problems_found(*urls(a, b))
        assert waiting(1, "Ghost", b, "service 'Ghost' does not exist") in out
        assert f"broker {label(b)} has no service 'Ghost'" in out
        assert f"on {label(b)}: create_service('Ghost'" in out

        # with the route gone, the conversation alone still says where its messages went
        (ghost_route,) = [r["name"] for r in await a.view("routes") if "Ghost" in r["name"]]
        await a.conn.drop_route(ghost_route)
        report = await diagnose(urls(a, b))
        one(
            texts(report, "service"),
            f"broker {label(b)} has no service 'Ghost', yet"
            f" conversation {h} on {label(a)} is with it",
        )


async def test_a_conversation_ended_with_an_error_by_the_far_side_is_found(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as (a, b):
        h = await begin_and_deliver(a, b)
        (theirs,) = [e["conversation_handle"] for e in await b.view("conversation_endpoints")]
        await b.conn.end_conversation(theirs, error=50000, description="no such order")

        async def in_error() -> bool:
            return any(e["state"] == "ER" for e in await a.view("conversation_endpoints"))

        await wait_until(in_error, "A's endpoint in error", 15)
        report = await diagnose(urls(a, b))
        one(
            texts(report, "conversation"),
            f"conversation {h} of service 'Initiator' with"
            f" 'TargetB' on {label(a)} is in error (ER)",
            f"end_conversation({h})",
        )


# ---- what diagnose itself needs ---------------------------------------------------------------


async def test_a_login_that_may_not_read_the_views_is_told_which_grant_it_needs(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as (a, b):
        await begin_and_deliver(a, b)  # B's side of it leads to A, which watcher cannot read
        await a.conn.create_login("watcher", "watcher-password")
        watcher = a.process.url_for("watcher", "watcher-password")
        report = await diagnose([watcher, b.process.url])
        found = texts(report, "permission")
        one(
            found,
            "login 'watcher' may not read the views",
            "'routes'",
            "'transmission_queue'",
            f"on {label(a)}: grant('VIEW', 'watcher')",
        )
        # nothing is claimed from what could not be read
        assert {p.kind for p in report.problems} == {"permission"}, format_report(report)

        await a.conn.grant("VIEW", "watcher")
        report = await diagnose([watcher, b.process.url])
        assert report.healthy, format_report(report)

        # a login the broker refuses is a broker that cannot be checked: one line, exit 2
        code, out, err = await ssb_diagnose(a.process.url_for("watcher", "not-the-password"))
        assert (code, out) == (2, "") and err.count("\n") == 1, err
        assert f"broker {label(a)} refused the login" in err and "not-the-password" not in err


async def test_an_activation_procedure_that_fails_to_import_is_found(tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path / "solo", durability="os").start()
    try:
        conn = await client.connect(process.url)
        await conn.create_queue("Work", activation={"status": "ON", "procedure": "myprocs:nowhere"})
        await conn.create_service("WorkService", queue="Work", contracts=["DEFAULT"])
        await conn.send(await conn.begin_dialog("WorkService", "WorkService"), body=b"go")

        async def failed() -> bool:
            return any(m["last_task_error"] for m in await conn.view("queue_monitors"))

        await wait_until(failed, "the activated task to fail", 30)
        report = await diagnose([process.url])
        one(texts(report, "activation"), "activated tasks of queue 'Work'", "myprocs")
        # the survey asks with a procedure every broker allows: only a login without
        # EXECUTE is refused it, and is told which grant it needs
        assert not texts(report, "permission"), format_report(report)
        await conn.create_login("watcher", "watcher-password")
        await conn.grant("VIEW", "watcher")
        report = await diagnose([process.url_for("watcher", "watcher-password")])
        one(texts(report, "permission"), "lacks EXECUTE", "grant('EXECUTE', 'watcher')")
        await conn.close()
    finally:
        process.kill()


async def test_an_unreachable_broker_and_a_usage_mistake_exit_2_with_one_line(
    tmp_path: Path,
) -> None:
    code, out, err = await ssb_diagnose("ssb://admin:pw@127.0.0.1:1")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "cannot reach broker 127.0.0.1:1" in err, err
    code, _, err = await ssb_diagnose("http://127.0.0.1:1")
    assert code == 2 and err.count("\n") == 1 and "ssb://" in err, err
    code, _, err = await ssb_diagnose("ssb://admin:pw@127.0.0.1:1", "--from", "X")
    assert code == 2 and "--from and --to go together" in err, err
    code, _, err = await ssb_diagnose()
    assert code == 2 and err.count("\n") == 1, err


async def test_a_malformed_url_is_shown_with_only_its_password_hidden() -> None:
    # a one-letter password: hiding it must not touch the letter elsewhere in the line
    for url, says in (
        ("ssb://admin:a@", "broker URL 'ssb://admin:***@' names no host"),
        ("ssbs://admin:a@h?fingerprint=aa", "'ssbs://admin:***@h?fingerprint=aa': fingerprint"),
        ("ssb://admin:a@[::1:4021", "'ssb://admin:***@[::1:4021' has a malformed IPv6 host"),
    ):
        code, out, err = await ssb_diagnose(url)
        assert (code, out) == (2, ""), err
        assert err.count("\n") == 1 and says in err, err


# ---- trust read from a `certificates` view ------------------------------------------------------


async def test_trust_is_read_from_a_certificates_view_where_the_broker_has_one(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as (a, b):
        report = await diagnose(urls(a, b))
    brokers: list[Broker] = report.brokers
    near, far = brokers
    for broker, other in ((near, far), (far, near)):
        broker.missing.discard("certificates")
        broker.views["certificates"] = [
            {
                "name": "peer",
                "broker_instance": other.instance,
                "fingerprint": fingerprint(other.certificate),
            }
        ]
    paths = named_paths(brokers, "Initiator", "TargetB", [], [])
    assert [(p.near, p.far) for p in paths] == [(near, far), (far, near)]
    notes: list[str] = []
    assert check_trust(paths, brokers, notes) == [] and notes == []

    near.views["certificates"] = []
    (problem,) = check_trust(paths, brokers, notes)
    assert problem.text == (
        f"broker {near.label} does not trust the certificate of broker {far.label}:"
        " they cannot connect"
    )
    assert f"broker_certificate() of {far.label}" in problem.fix
    near.views["certificates"] = [
        {"name": "old", "broker_instance": far.instance, "fingerprint": "00" * 32}
    ]
    (problem,) = check_trust(paths, brokers, notes)
    assert "trusts an older certificate" in problem.text and "'old'" in problem.text

    # the failed link that shows the same distrust does not make it a second problem
    near.views["broker_connections"] = [
        {
            "peer": far.instance,
            "address": "127.0.0.1:9",
            "direction": "outbound",
            "state": "CLOSED",
            "login_state": "TLS with 127.0.0.1:9 failed:"
            " CERTIFICATE_VERIFY_FAILED; both brokers must trust each other's certificate",
        }
    ]
    (problem,) = examine(brokers, "Initiator", "TargetB").problems
    assert problem.text.startswith(f"broker {near.label} trusts an older certificate")


async def test_a_link_that_closed_when_idle_is_not_a_link_down(tmp_path: Path) -> None:
    async with pair(tmp_path) as (a, b):
        report = await diagnose(urls(a, b))
    near, far = report.brokers
    closing = {
        "peer": far.instance,
        "address": "127.0.0.1:9",
        "direction": "outbound",
        "state": "CLOSED",
        "login_state": "AUTHENTICATED",
    }
    near.views["broker_connections"] = [closing, {**closing, "login_state": "NONE"}]
    assert check_links(report.brokers) == []
    near.views["broker_connections"] = [
        {**closing, "login_state": "connection refused by 127.0.0.1:9"}
    ]
    (problem,) = check_links(report.brokers)
    assert problem.text == (
        f"the link from broker {near.label} to broker {far.label} at 127.0.0.1:9 is down:"
        " connection refused by 127.0.0.1:9"
    )


async def test_routes_that_expired_or_lead_elsewhere_are_found(tmp_path: Path) -> None:
    async with pair(tmp_path) as (a, b):
        report = await diagnose(urls(a, b))
    near, far = report.brokers
    forward = named_paths(report.brokers, "Initiator", "TargetB", [], [])[0]
    (good,) = near.views["routes"]
    assert check_route(forward, report.brokers) == []
    stranger = str(uuid.uuid4())
    cases = {
        "expired": {"lifetime": (datetime.now(UTC) - timedelta(seconds=1)).isoformat()},
        "another instance": {"broker_instance": stranger},
        "LOCAL": {"address": "LOCAL"},
    }
    words = {
        "expired": f"broker {near.label} has no route to service 'TargetB' on broker"
        f" {far.label} (the dialog from 'Initiator' to 'TargetB'); route '{good['name']}'"
        " expired at",
        "another instance": f"route '{good['name']}' on {near.label} sends service 'TargetB'"
        f" to broker instance {stranger}, but it is on broker {far.label}",
        "LOCAL": f"route '{good['name']}' on {near.label} says service 'TargetB' is LOCAL",
    }
    for case, change in cases.items():
        near.views["routes"] = [{**good, **change}]
        (problem,) = check_route(forward, report.brokers)
        assert problem.text.startswith(words[case]), (case, problem.text)
        assert "create_route('to_TargetB', 'TargetB', 'tcp://" in problem.fix
    # the route's address is where A met another broker than the one that has the service
    near.views["routes"] = [good]
    near.views["broker_connections"] = [
        {
            "peer": stranger,
            "address": good["address"].removeprefix("tcp://"),
            "direction": "outbound",
            "state": "ESTABLISHED",
            "login_state": "AUTHENTICATED",
        }
    ]
    (problem,) = check_route(forward, report.brokers)
    assert problem.text == (
        f"route '{good['name']}' on {near.label} leads to {good['address']}, which is broker"
        f" instance {stranger}, but service 'TargetB' is on broker {far.label}"
    )


async def test_long_unacknowledged_messages_and_a_refusing_broker_are_found(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as (a, b):
        report = await diagnose(urls(a, b))
    near = report.brokers[0]
    now = datetime.now(UTC)
    row = {"to_service_name": "TargetB", "transmission_status": ""}
    near.views["transmission_queue"] = [
        {**row, "enqueue_time": (now - timedelta(seconds=STUCK_AFTER + 5)).isoformat()},
        {**row, "enqueue_time": now.isoformat()},  # in flight: not a problem yet
    ]
    (stuck,) = check_transmission_queue(report.brokers)
    assert stuck.text == (
        f"1 message(s) for service 'TargetB' wait in the transmission queue of {near.label}"
        f" for over {STUCK_AFTER:g} s, unacknowledged"
    )
    (resources,) = near.views["broker_resources"]
    assert check_resources(report.brokers) == []
    resources.update(accepting_messages=False, refusal="free disk below min_free_disk")
    (refusing,) = check_resources(report.brokers)
    assert refusing.text == (
        f"broker {near.label} refuses new messages: free disk below min_free_disk"
    )
    near.truncated.add("transmission_queue")  # a view with more rows than were read
    (note,) = [n for n in examine(report.brokers).notes if "rows of" in n]
    assert note == (
        f"{near.label}: only the first {VIEW_ROWS} rows of transmission_queue were read;"
        " what lies beyond is unchecked"
    )
