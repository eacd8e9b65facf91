"""The survey: what `ssb diagnose` reads from each broker before it checks anything.

`survey` logs in to one broker (with the login its URL carries) and copies what the checks
need into a `Broker`: its instance id and broker certificate, a fixed set of views, and for
each activation procedure whether the broker may run it (`check_procedure`). A view the login
may not read, or one the broker does not have, is recorded as such instead of failing the
survey. After the survey nothing talks to a broker again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from ssb import client
from ssb.protocol import ErrorCode

CONNECT_TIMEOUT: Final = 10.0
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
OPTIONAL_VIEWS: Final = ("certificates", "broker_nodes")
VIEW_ROWS: Final = 100_000  # rows read of each view (the broker's most)
# the scheduler's reader, which the broker always allows: refused only when the login
# lacks EXECUTE
EXECUTE_PROBE: Final = "ssb.client._scheduler:run_tasks"


class CannotDiagnose(Exception):
    """Nothing can be checked: a broker given cannot be reached or refuses the login, a URL
    is malformed, or two URLs lead to the same broker."""


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

    def peer_at(self, host_port: str | None) -> str | None:
        """The broker instance this broker met at `host_port` when it connected there, if
        it did."""
        for row in self.views.get("broker_connections", []):
            if row["address"] == host_port and row["direction"] == "outbound" and row["peer"]:
                return str(row["peer"])
        return None


def label_of(url: str) -> str:
    """host:port of a broker URL, or its addresses host:port,host:port (never its
    password).

    Raises:
        ValueError: the URL is malformed (the message shows it as USER:***@HOST).
    """
    return ",".join(client.url_addresses(url))


async def survey(url: str, timeout: float = CONNECT_TIMEOUT) -> Broker:
    """Read what the checks need from the broker at `url`.

    Raises:
        CannotDiagnose: the URL is malformed, the broker cannot be reached or refused the login.
    """
    try:
        label = label_of(url)
        conn = await client.connect(url, timeout=timeout, reconnect=False)
    except ValueError as exc:  # a malformed URL: shown as USER:***@HOST
        raise CannotDiagnose(str(exc)) from None
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


def timestamp(iso: str) -> float:
    """A view's time (ISO 8601) as seconds since the epoch."""
    return dt.datetime.fromisoformat(iso).timestamp()
