"""The core's sink before and after the transport connects to it (core only: in-memory
store, fake clock)."""

from __future__ import annotations

from typing import Any

import pytest

from ssb.broker._core.ports import OutboundRelay

from .core_harness import Core

PEER = "11111111-2222-4333-8444-555555555555"


class Heard:
    """A transport that records what the core tells it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def outbound(self, direction: Any) -> None:
        self.calls.append(("outbound", direction))

    def endpoint_removed(self, endpoint: Any) -> None:
        self.calls.append(("endpoint_removed", endpoint))

    def routes_changed(self) -> None:
        self.calls.append(("routes_changed", None))

    def describe(self, direction: Any) -> str:
        return "heard"

    def may_deliver(self, from_broker: str, service: str) -> bool:
        return True


def test_the_core_talks_to_the_transport_connected_after_it() -> None:
    relay = OutboundRelay()
    core = Core(sink=relay)
    core.op("create_queue", "Initiator")
    core.op("create_service", "InitiatorService", "Initiator")
    assert relay.describe(None) == "this broker has no broker-to-broker transport running"
    transport = Heard()
    relay.connect(transport)
    core.op("create_route", "far", "FarService", "tcp://127.0.0.1:1", broker_instance=PEER)
    handle = core.op("begin_dialog", "InitiatorService", "FarService", broker_instance=PEER)
    core.op("send", handle, "DEFAULT", [b"a"])
    (box,) = core.engine.remote.remote_outboxes()
    assert transport.calls == [("routes_changed", None), ("outbound", box)]
    assert relay.describe(None) == "heard"
    with pytest.raises(RuntimeError):
        relay.connect(Heard())
