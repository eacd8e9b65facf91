"""Message forwarding: dialogs between two brokers through one or two brokers that host
neither service (`[transport] forwarding = true`).

Real daemons on 127.0.0.1. The chain is A -> F -> B: A's route for B's service names
broker B and F's address, F's routes lead on to B (and back to A), B's route for A's
service names broker A and F's address. F never opens, acknowledges or stores the dialog:
acks travel end to end, so F's death loses nothing, and what F alters B refuses.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from daemon import one_error_line, serve_once
from federation_setup import (
    CONTRACT,
    FORWARDER,
    PLAIN,
    REPLY,
    REQUEST,
    Federation,
    Node,
    acknowledged,
    dialog_services,
    endpoints,
    forwarding_trio,
    receive_count,
    request_and_reply,
    route,
    route_chain,
    wait_quiet,
)
from prometheus_client.parser import text_string_to_metric_families

from ssb import client
from ssb.tools import wait_until
from ssb.tools.diagnose import diagnose, format_report

BIG = 300 * 1024  # five fragments of 64 KiB


async def _metrics(node: Node) -> dict[str, float]:
    """`node`'s /metrics samples without labels, by name."""

    def scrape() -> str:
        with urllib.request.urlopen(f"{node.process.http_url}/metrics", timeout=10) as answer:
            return str(answer.read().decode())

    text = await asyncio.to_thread(scrape)
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


@pytest.mark.timeout(90)
async def test_a_dialog_through_a_forwarder_is_delivered_exactly_once_in_order_both_ways(
    tmp_path: Path,
) -> None:
    async with forwarding_trio(tmp_path, chain=True) as (_, a, f, b, init_q, target_q):
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        bodies = [b"m%d" % n for n in range(200)]
        big = bytes(range(256)) * (BIG // 256)
        await a.conn.send_many(h, REQUEST, bodies[:100])
        await a.conn.send(h, REQUEST, big)
        await a.conn.send_many(h, REQUEST, bodies[100:])

        got = await receive_count(b.conn, target_q, 201)
        assert [m.message_body for m in got] == [*bodies[:100], big, *bodies[100:]]
        assert [m.message_sequence_number for m in got] == list(range(201))
        far = got[0].conversation_handle
        await b.conn.send_many(far, REPLY, [b"re%d" % n for n in range(50)])
        replies = await receive_count(a.conn, init_q, 50)
        assert [m.message_body for m in replies] == [b"re%d" % n for n in range(50)]

        # F relays without being party: no endpoint, a row in its forwarding view
        assert await endpoints(f) == []
        rows = await f.view("forwarded_conversations")
        assert len(rows) == 1, rows
        row = rows[0]
        assert row["initiator_broker"] == a.instance and row["target_broker"] == b.instance
        assert row["target_service"] == "TargetB" and row["priority"] == 5
        assert row["relayed_frames"] > 201
        metrics = await _metrics(f)
        assert metrics["ssb_forward_relayed_frames_total"] >= row["relayed_frames"]
        assert metrics["ssb_forwarded_conversations"] == 1
        assert metrics["ssb_forward_unbundled_total"] == 0  # (B takes relayed bundles)
        # A's and B's dialogs are with each other, carried by F
        a_rows = {r["peer"]: r for r in await a.view("broker_connections")}
        assert a_rows[b.instance]["via"] == f.instance, a_rows
        ends = {e["is_initiator"]: e for e in await endpoints(a) + await endpoints(b)}
        assert len(ends) == 2

        await a.conn.end_conversation(h)
        end = await receive_count(b.conn, target_q, 1)
        assert end[0].message_type_name == client.END_DIALOG
        await b.conn.end_conversation(far)
        await wait_quiet([a, b])


@pytest.mark.timeout(90)
async def test_a_route_through_a_forwarder_needs_no_broker_instance(tmp_path: Path) -> None:
    """As in Service Broker, the routes name addresses only: A asks along its route which
    broker hosts TargetB, B proves it, and the dialog runs end to end between A and B,
    F relaying it without being party to it."""
    async with forwarding_trio(tmp_path, chain=True, named=False) as trio:
        _, a, f, b, init_q, target_q = trio
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        big = bytes(range(256)) * (BIG // 256)
        await a.conn.send_many(h, REQUEST, [b"first", big, b"last"])
        got = await receive_count(b.conn, target_q, 3)
        assert [m.message_body for m in got] == [b"first", big, b"last"]
        await b.conn.send(got[0].conversation_handle, REPLY, b"answer")
        (reply,) = await receive_count(a.conn, init_q, 1)
        assert reply.message_body == b"answer"
        await acknowledged(a)
        await acknowledged(b)

        assert await endpoints(f) == []
        (row,) = await f.view("forwarded_conversations")
        assert row["initiator_broker"] == a.instance and row["target_broker"] == b.instance
        (mine,) = await endpoints(a)
        assert mine["far_broker_instance"] == b.instance
        a_rows = {r["peer"]: r for r in await a.view("broker_connections")}
        assert a_rows[b.instance]["via"] == f.instance, a_rows
        report = await diagnose([n.process.url for n in (a, f, b)])
        assert report.problems == [], format_report(report)


@pytest.mark.timeout(90)
async def test_a_forwarder_without_a_route_on_says_what_to_do(tmp_path: Path) -> None:
    """Without a broker instance in A's route, a forwarder that has no route on for the
    service tells A so when asked: A's transmission status says what to do, F logs it
    once, ssb diagnose names it; with the route on F, the message goes."""
    from test_diagnose import problems_found, urls

    async with forwarding_trio(tmp_path) as (_, a, f, b, _, target_q):
        await route(a, "TargetB", f)
        await route(b, "Initiator", f)
        await route(f, "Initiator", a)
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(h, REQUEST, b"stuck at F")
        said = (
            f"broker {f.instance} forwards, but no route there leads to service 'TargetB':"
            f" create_route for it on broker {f.instance}"
        )

        async def status() -> str:
            rows = await a.view("transmission_queue")
            return str(rows[0]["transmission_status"]) if rows else ""

        await wait_until(status, "A's status to say why", 20, until=lambda now: now == said)
        out = await problems_found(*urls(a, f, b))
        assert said in out
        f_label = f.process.url.split("@")[1]
        assert f"fix: on {f_label}: create_route('to_TargetB', 'TargetB', 'tcp://" in out
        assert await endpoints(f) == [] and await b.conn.receive(target_q, timeout=0) == []
        # asked again meanwhile (every second at most), said once
        assert f.process.log_text().count(said) == 1

        await route(f, "TargetB", b)
        (m,) = await receive_count(b.conn, target_q, 1)
        assert m.message_body == b"stuck at F"


@pytest.mark.timeout(90)
async def test_a_broker_that_does_not_forward_drops_other_brokers_dialogs_and_says_so(
    tmp_path: Path,
) -> None:
    async with Federation(tmp_path, ["A", "F", "B"], transport=PLAIN) as fed:
        a, f, b = fed["A"], fed["F"], fed["B"]
        await dialog_services(a, b)
        await route_chain(a, [f], b)
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(h, REQUEST, b"x")

        async def said() -> bool:
            return "does not forward" in f.process.log_text()

        await wait_until(said, "F saying that it does not forward", timeout=20)
        assert await f.view("forwarded_conversations") == []
        # nothing is lost: the message waits in A's transmission queue
        assert len(await a.view("transmission_queue")) == 1


@pytest.mark.timeout(90)
@pytest.mark.slow
async def test_routes_that_loop_are_reported_and_never_spun(tmp_path: Path) -> None:
    async with forwarding_trio(tmp_path) as (_, a, f, b, _, _):
        # A sends B's service to F, and F's route for it leads back to A
        await route(a, "TargetB", f.address, broker_instance=b.instance)
        await route(f, "TargetB", a.address, broker_instance=b.instance)
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(h, REQUEST, b"round and round")

        async def looped() -> list[dict[str, Any]]:
            rows = await f.view("forwarded_conversations")
            return [r for r in rows if "loop" in r["status"]]

        (row,) = await wait_until(looped, "F to report the loop", timeout=20)
        assert a.instance in row["status"], row
        assert "routes form a loop" in f.process.log_text()
        # (before F first connected to A, it could not tell A's address was A: that one
        # trip ends at A, which drops its own message)
        relayed = row["relayed_frames"]
        assert relayed <= 1, row

        # retransmissions keep coming and are dropped at F each time: nothing circulates
        async def retransmissions() -> int:
            conns = {r["peer"]: r for r in await a.view("broker_connections")}
            return int(conns[b.instance]["retransmissions"])

        seen = await retransmissions()

        async def retried() -> bool:
            return await retransmissions() >= seen + 3

        await wait_until(retried, "A to retransmit", timeout=20)
        (row,) = await f.view("forwarded_conversations")
        assert row["relayed_frames"] == relayed, row
        # nothing is lost: the message still waits at A, and goes once the route is right
        assert len(await a.view("transmission_queue")) == 1
        for r in await f.view("routes"):
            await f.conn.drop_route(r["name"])
        await route(f, "TargetB", b.address, broker_instance=b.instance)
        await route(f, "Initiator", a.address, broker_instance=a.instance)
        await route(b, "Initiator", f.address, broker_instance=a.instance)
        (got,) = await receive_count(b.conn, "TargetBQueue", 1)
        assert got.message_body == b"round and round"
        await acknowledged(a)


@pytest.mark.timeout(120)
async def test_a_forwarder_past_forward_size_holds_back_and_loses_nothing(tmp_path: Path) -> None:
    overrides = {"F": {**FORWARDER, "forward_size": 1}}
    async with Federation(tmp_path, ["A", "F", "B"], transport=PLAIN, overrides=overrides) as fed:
        a, f, b = fed["A"], fed["F"], fed["B"]
        _, target_q = await dialog_services(a, b)
        await route_chain(a, [f], b)
        b.process.kill()  # F cannot pass anything on: it holds what it can
        h = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        bodies = [bytes([n]) * (100 * 1024) for n in range(30)]  # 3 MB, F holds 1 MiB
        for body in bodies:
            await a.conn.send(h, REQUEST, body)

        async def refusing() -> list[dict[str, Any]]:
            rows = await f.view("forwarded_conversations")
            return [r for r in rows if r["refused_frames"] > 0]

        (row,) = await wait_until(refusing, "F to refuse frames past forward_size", timeout=30)
        # (what is held may already have been dropped: held longer than retry_max, which
        # the origin's retransmissions replace anyway)
        assert row["held_bytes"] <= 1024 * 1024, row
        assert "forward_size" in row["status"], row
        assert "forward_size" in f.process.log_text()

        await fed.restart("B")
        got = await receive_count(b.conn, target_q, len(bodies), timeout=60)
        assert [m.message_body for m in got] == bodies
        assert [m.message_sequence_number for m in got] == list(range(len(bodies)))
        await acknowledged(a)


@pytest.mark.timeout(90)
async def test_an_encrypted_dialog_through_a_forwarder_is_unreadable_to_it(tmp_path: Path) -> None:
    from test_dialog_encryption import Relay

    async with forwarding_trio(tmp_path) as (_, a, f, b, init_q, target_q):
        # everything between A and F is captured, whichever of them opened the connection
        # that stays (A to F's port, or F to A's)
        taps = [await Relay(f.broker_port).start(), await Relay(a.broker_port).start()]
        await route(a, "TargetB", taps[0].address, broker_instance=b.instance)
        await route(f, "TargetB", b.address, broker_instance=b.instance)
        await route(f, "Initiator", taps[1].address, broker_instance=a.instance)
        await route(b, "Initiator", f.address, broker_instance=a.instance)
        await a.conn.create_remote_service_binding("b", "TargetB", b.certificate)
        secret = await a.conn.begin_dialog(
            "Initiator", "TargetB", contract=CONTRACT, encryption=True
        )
        request = b"SECRET-REQUEST only B may read"
        await a.conn.send(secret, REQUEST, request)
        await request_and_reply(a, b, init_q, target_q, request, b"SECRET-REPLY only A may read")
        assert [e["is_encrypted"] for e in await endpoints(b)] == [True]

        # the control: without encryption a forwarder sees the body
        plain = await a.conn.begin_dialog("Initiator", "TargetB", contract=CONTRACT)
        await a.conn.send(plain, REQUEST, b"PLAIN-REQUEST")
        await receive_count(b.conn, target_q, 1)
        for tap in taps:
            await tap.stop()
        captured = b"".join(bytes(tap.captured) for tap in taps)
        assert b"PLAIN-REQUEST" in captured
        assert b"SECRET" not in captured


def test_forward_size_without_forwarding_is_refused_at_start(tmp_path: Path) -> None:
    """forward_size bounds what a forwarder holds: on a broker that does not forward it
    would be accepted and do nothing, so the start refuses it in one line."""
    config = tmp_path / "ssb.toml"
    config.write_text("[transport]\nforward_size = 50\n")
    line = one_error_line(serve_once(tmp_path / "data", "--config", str(config)))
    assert "forward_size" in line and "forwarding = true" in line, line
