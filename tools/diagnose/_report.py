"""The diagnosis as a whole: survey every broker, run every check, print the report.

`diagnose` surveys the brokers given (refusing two URLs that lead to the same broker), then
`examine` gathers the paths and runs the checks; both return a `Report`. Problems that
several checks find in other words (a `subject` in common) are reported once. `run` is the
command `ssb diagnose`: the report for people on stdout and an exit status.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._checks import (
    check_activation,
    check_contract,
    check_conversations,
    check_links,
    check_permissions,
    check_queues,
    check_replies,
    check_resources,
    check_route,
    check_transmission_queue,
    check_trust,
)
from ._paths import Path, conversation_paths, named_paths, routed_paths, unique_paths
from ._problem import Problem, unique_problems
from ._survey import CONNECT_TIMEOUT, VIEW_ROWS, Broker, CannotDiagnose, survey


@dataclass
class Report:
    """What a diagnosis found: the brokers surveyed, each problem once, notes on what was
    not checked, and the paths checked."""

    brokers: list[Broker]
    problems: list[Problem]
    notes: list[str]
    paths: list[Path]

    @property
    def healthy(self) -> bool:
        return not self.problems


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
    paths = unique_paths(
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
    return Report(list(brokers), unique_problems(problems), notes, paths)


def format_report(report: Report) -> str:
    """The report for people: each broker and its daemons (which one serves), one problem
    per entry with its fix, then a summary line."""
    lines = []
    for b in report.brokers:
        lines.append(f"broker {b.label}: instance {b.instance}, login '{b.login}'")
        lines += daemon_lines(b)
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


def daemon_lines(broker: Broker) -> list[str]:
    """One line per daemon of a broker whose daemons share a database: which serves (the
    one that answered), which stand by, when each was last seen."""
    rows = broker.views.get("broker_nodes") or []
    if len(rows) < 2 and not any(r.get("node") for r in rows):
        return []  # one daemon, on its own store: nothing to tell
    lines = []
    for row in rows:
        role = row["role"]
        if row.get("this_daemon"):
            age = row.get("lease_age_seconds")
            when = "" if age is None else f", lease renewed {age:.1f} s ago"
            state = f"{role} (answered this diagnosis{when})"
        else:
            state = f"{role}, seen {row['seen_seconds_ago']:.1f} s ago"
        lines.append(f"    daemon {row['node']} ({row['name']}) at {row['address']}: {state}")
    return lines


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
