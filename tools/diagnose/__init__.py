"""`ssb diagnose`: why messages do not flow between brokers, in the manner of ssbdiagnose.

Theory of operation. Diagnosis is read-only and runs in two steps. First the survey
(`_survey`) logs in to each broker given and copies what the checks need: its instance id
and broker certificate, a fixed set of views, and which activation procedures the broker may
run. Then `examine` (`_report`) works out the paths messages must travel (`_paths`) and runs
the checks (`_checks`), pure functions of the surveys that never touch a broker again: each
returns `Problem` records (what is wrong, on which broker, and what to do). `format_report`
prints them for people; `run` is the command.

What is checked depends on the services named. With `--from S1 --to S2`: the dialog from S1
to S2 and its replies. With none named: every service a broker routes to, and the far service
of every conversation a broker holds with another broker. Each such path (a broker that
sends, the broker that hosts the service, the service) needs a live route on the sending
broker that leads to the hosting broker, mutual trust of the two brokers' certificates, and
(towards the target service) the same contracts on both sides. Whatever the services named,
every broker's queues, activation, transmission queue, conversations in error, broker links
and resources are checked.

The package reaches the brokers only through the public client, `ssb.client`.
"""

from __future__ import annotations

from ._paths import Path
from ._problem import Problem
from ._report import Report, diagnose, examine, format_report, run
from ._survey import Broker, CannotDiagnose, label_of, survey

__all__ = [
    "Broker",
    "CannotDiagnose",
    "Path",
    "Problem",
    "Report",
    "diagnose",
    "examine",
    "format_report",
    "label_of",
    "run",
    "survey",
]
